"""The evaluator's steps in one table: which exist, the order they run in, the process that runs
each and the field of EvalResult each fills.

The parent (tools/evaluator.py), the runner (tools/processes/worker_main.py) and the judge
(tools/processes/judge.py) take from `STEPS` what they run and in what order; docs/ARCHITECTURE.md
lists the same steps, and tests/test_stages.py holds the three and the document to it.

- parent: the evaluator's own process, which never runs candidate code (and imports no torch);
- runner: the candidate's process, hostile: it loads and builds the candidate and answers the
  judge's requests, and decides nothing;
- judge: the trusted process, which never loads candidate code: it drives the runner through the
  device steps and decides their verdicts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from kernel_refinery.tools.results import EvalResult, Stage

Process = Literal["parent", "runner", "judge"]


@dataclass(frozen=True)
class Step:
    stage: Stage
    runs_in: Process
    fills: str
    """The field of EvalResult (and, for the runner's and the judge's steps, of JobReply) its report goes to."""
    what: str
    """One line: what the step does."""
    file: str
    """Where it runs from, relative to the repository."""


STEPS: tuple[Step, ...] = (
    Step(Stage.STATIC, "parent", "static", "the AST check (and kernelguard, optional) of the candidate's text", "tools/evaluator.py"),
    Step(Stage.COMPILE, "runner", "compile", "load the candidate and build its kernels", "tools/processes/worker_main.py"),
    Step(Stage.CORRECTNESS, "judge", "correctness", "compare the candidate's outputs with the reference's", "tools/processes/judge.py"),
    Step(Stage.TIMING, "judge", "timing", "time the candidate against the reference", "tools/processes/judge.py"),
    Step(Stage.PROFILE, "judge", "profile", "profile the candidate's forward", "tools/processes/judge.py"),
)
"""Every step, in the order they run."""

STEP: dict[Stage, Step] = {step.stage: step for step in STEPS}


def steps_in(process: Process) -> tuple[Stage, ...]:
    """The stages `process` runs, in order."""
    return tuple(step.stage for step in STEPS if step.runs_in == process)


def order(stages: Iterable[Stage]) -> tuple[Stage, ...]:
    """The given stages in the table's order, each once."""
    wanted = set(stages)
    return tuple(step.stage for step in STEPS if step.stage in wanted)


def _check() -> None:
    """The table itself, at import: every stage once, in the enum's order, filling a field of EvalResult."""
    if tuple(step.stage for step in STEPS) != tuple(Stage):
        raise RuntimeError("tools/stages.py: STEPS must list every Stage once, in the enum's order")
    unknown = [step.fills for step in STEPS if step.fills not in EvalResult.model_fields]
    if unknown:
        raise RuntimeError(f"tools/stages.py: no EvalResult field {', '.join(unknown)}")


_check()
