"""The one table of the evaluator's steps (tools/stages.py), and the parent, the runner, the judge and
docs/ARCHITECTURE.md held to it."""

from __future__ import annotations

import re
from pathlib import Path

from kernel_refinery.tools import evaluator
from kernel_refinery.tools.processes import judge, worker_main
from kernel_refinery.tools.processes.jobs import JobReply
from kernel_refinery.tools.results import EvalResult, Stage
from kernel_refinery.tools.stages import STEP, STEPS, order, steps_in

ROOT = Path(__file__).resolve().parent.parent


def test_the_table_lists_every_stage_once_in_the_enums_order() -> None:
    assert [step.stage for step in STEPS] == list(Stage)
    assert all(sum(step.stage is stage for step in STEPS) == 1 for stage in Stage)
    assert set(STEP) == set(Stage)


def test_each_step_fills_a_field_and_names_a_file_that_exists() -> None:
    for step in STEPS:
        assert step.fills in EvalResult.model_fields, step
        if step.runs_in != "parent":
            assert step.fills in JobReply.model_fields, step  # what crosses the pipe to the parent
        assert (ROOT / step.file).is_file(), step
        assert step.what and "\n" not in step.what


def test_the_parent_runs_the_static_check_only() -> None:
    assert steps_in("parent") == (Stage.STATIC,)
    assert tuple(Stage) == evaluator.ALL_STAGES


def test_the_runner_loads_and_the_judge_has_a_handler_for_each_of_its_steps_and_no_other() -> None:
    assert steps_in("runner") == (worker_main.LOAD,)
    assert tuple(judge.HANDLERS) == steps_in("judge")
    assert steps_in("parent") + steps_in("runner") + steps_in("judge") == tuple(Stage)


def test_order_sorts_and_dedupes() -> None:
    assert order([Stage.PROFILE, Stage.STATIC, Stage.PROFILE, Stage.CORRECTNESS]) == (Stage.STATIC, Stage.CORRECTNESS, Stage.PROFILE)
    assert order([]) == ()


def test_the_architecture_lists_the_steps_in_the_tables_order() -> None:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    start = text.index("## The evaluator's steps")
    section = text[start : text.index("\n## ", start)]
    named = [(m.group(1), line) for line in section.splitlines() if (m := re.match(r"\| \d+\. `(\w+)`", line))]
    assert [name for name, _ in named] == [s.stage.value for s in STEPS]
    rows = [line for _, line in named]
    positions = [section.index(f"`{s.stage.value}`") for s in STEPS]
    assert positions == sorted(positions)
    for row, step in zip(rows, STEPS, strict=True):
        _, runs_in, file, _ = (cell.strip() for cell in row.strip().strip("|").split("|"))
        assert runs_in.split()[0] == step.runs_in, row
        assert file.startswith(step.file), row
