"""The outcome of one trajectory: what results.jsonl keeps, and the one thing every score reads.

An experiment writes a `TrajectoryRecord` per finished trajectory (bench/experiment.py); the HTML
report builds the same record from a trajectory's trace (traces/inspect.py). Both go through
`trajectory_record`, so a trajectory's best attempt is decided once (kernel_refinery.core.verdict.best), and
`refinery report`, `report --compare` and `refinery traces html` score the same records
(traces/scoring.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from kernel_refinery.core.numerics import Numerics, Precision
from kernel_refinery.core.strategy import Strategy
from kernel_refinery.core.verdict import Judged, Verdict, best
from kernel_refinery.tools.results import NONFINITE_AS_STRINGS, CorrectnessReport, EvalResult
from kernel_refinery.traces.schema import TrajectoryId

RESULTS_SCHEMA_VERSION = 1
"""Version history of results.jsonl records (bench/experiment.read_result migrates older ones):
- 0: before the version field: `per_turn` as [status, speedup] pairs.
- 1: `schema_version`; `per_turn` as TurnOutcome objects."""


class TurnOutcome(BaseModel):
    """One attempt of a trajectory, as the results keep it."""

    model_config = ConfigDict(frozen=True, extra="forbid", **NONFINITE_AS_STRINGS)
    status: Verdict
    speedup: float | None = None
    """None unless correct."""


class TrajectoryRecord(BaseModel):
    """One line of results.jsonl: the outcome of one trajectory."""

    model_config = ConfigDict(frozen=True, **NONFINITE_AS_STRINGS)
    schema_version: int = RESULTS_SCHEMA_VERSION
    task: str
    level: int
    variant: str
    sample: int
    best_status: Verdict
    best_speedup: float | None
    best_turn: int | None
    best_within_noise: bool | None = None
    """The best kernel's speedup lies inside its task's A/A noise band ("no difference from the
    reference"); None where the evaluation ran no A/A run (or predates it)."""
    turns: int
    compiled: bool
    tokens: int
    per_turn: tuple[TurnOutcome, ...]
    """Each turn's verdict and speedup, for fast_p against the turn; in evaluation order for search
    strategies, so it also gives the best speedup per evaluation spent."""
    strategy: Strategy = Strategy.REFINE
    evals: int | None = None
    """Candidate evaluations spent; None in results written before strategies (count per_turn)."""
    precision: Precision = Precision.FP32
    """fp32, fp16 or bf16 (results written before precisions were fp32)."""
    tolerance: float | None = None
    """atol = rtol in force for outputs of that precision; None in results written before it was recorded."""
    allow_tf32: bool = False
    best_general: bool | None = None
    """The best kernel is correct and failed none of the task's shape and init variants it was
    checked on (CorrectnessReport.shapes, EvalConfig.shapes); False where no kernel was correct
    while the variants were on; None where they were off (or in results from before them)."""
    degenerate: str | None = None
    """Why the task's reference measures nothing (its outputs on a few random inputs all zeros, one
    constant, or the same on every input: tools/steps/degenerate.py), "" where they vary; None where
    no evaluation of the trajectory probed it."""
    # The numerics stay three flat fields, not an embedded Numerics: results.jsonl keeps the format
    # older runs wrote and older versions read; `numerics` gives them as the one value.

    @property
    def numerics(self) -> Numerics:
        """The precision, tolerance and TF32 policy the record's kernels were judged at."""
        return Numerics.recorded(self.precision, self.tolerance, self.allow_tf32)

    @property
    def id(self) -> TrajectoryId:
        """The trajectory's identity: unique within a run directory (results before strategies
        were all refine, before precisions fp32)."""
        return TrajectoryId(task=self.task, variant=self.variant, sample=self.sample, strategy=self.strategy, precision=self.precision)

    @property
    def correct(self) -> bool:
        return self.best_status is Verdict.CORRECT

    @property
    def evaluations(self) -> int:
        return self.evals if self.evals is not None else sum(1 for t in self.per_turn if t.status is not Verdict.NO_CODE)


class Attempted(Judged, Protocol):
    """An attempt as `trajectory_record` reads it: a loop's Attempt, or a trace's TurnRecord."""

    @property
    def turn(self) -> int: ...

    @property
    def result(self) -> EvalResult | None: ...


def _checks(attempts: Sequence[Attempted]) -> list[CorrectnessReport]:
    return [a.result.correctness for a in attempts if a.result is not None and a.result.correctness is not None]


def _general(correct: Attempted | None, attempts: Sequence[Attempted]) -> bool | None:
    """The best correct kernel's generality; False without one where the variants were on."""
    checks = _checks(attempts)
    if correct is not None and correct.result is not None and correct.result.correctness is not None:
        shapes = correct.result.correctness.shapes
        if shapes is not None:
            return shapes.general
    # A check that failed before its variants says they were on (CorrectnessReport.shapes.reached).
    return False if correct is None and any(c.shapes is not None for c in checks) else None


def _degenerate(attempts: Sequence[Attempted]) -> str | None:
    """The reference's degeneracy as any evaluation found it (a task's reference is the same for every turn)."""
    found = [c.degenerate for c in _checks(attempts) if c.degenerate is not None]
    return next((d for d in found if d), found[0] if found else None)


def _within_noise(attempt: Attempted | None) -> bool | None:
    timing = attempt.result.timing if attempt is not None and attempt.result is not None else None
    return getattr(timing, "within_noise", None) if timing is not None else None


def trajectory_record(
    trajectory: TrajectoryId,
    level: int,
    attempts: Sequence[Attempted],
    tokens: int,
    evals: int,
    tolerance: float | None = None,
    allow_tf32: bool = False,
) -> TrajectoryRecord:
    """The record of a trajectory's attempts, given in evaluation order.

    The best attempt is `best`'s (ties to the earliest turn); the record keeps its turn and speedup
    only when it is correct, and its verdict always (the furthest any attempt got)."""
    # A stable sort by turn: best-of-n's samples each start again at turn 1.
    found = best(sorted(attempts, key=lambda a: a.turn))
    best_status = found.status if found is not None else Verdict.NO_CODE
    correct = found if found is not None and best_status is Verdict.CORRECT else None
    return TrajectoryRecord(
        task=trajectory.task,
        level=level,
        variant=trajectory.variant,
        sample=trajectory.sample,
        best_status=best_status,
        best_speedup=correct.speedup if correct is not None else None,
        best_turn=correct.turn if correct is not None else None,
        best_within_noise=_within_noise(correct),
        turns=len(attempts),
        compiled=best_status.compiled,
        tokens=tokens,
        per_turn=tuple(TurnOutcome(status=a.status, speedup=a.speedup if a.status is Verdict.CORRECT else None) for a in attempts),
        strategy=trajectory.strategy,
        evals=evals,
        precision=trajectory.precision,
        tolerance=tolerance,
        allow_tf32=allow_tf32,
        best_general=_general(correct, attempts),
        degenerate=_degenerate(attempts),
    )
