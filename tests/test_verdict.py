"""One verdict vocabulary: the evaluator's statuses plus no_code and unfinished, one rank, one label
for each attempt in the loop, the traces, the results and the terminal."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from kernel_refinery.agent.state import Attempt
from kernel_refinery.agent.strategies import BeamNode, StrategyResult
from kernel_refinery.bench.experiment import record_of
from kernel_refinery.bench.render import print_result, turn_line
from kernel_refinery.bench.tasks import Task
from kernel_refinery.core.verdict import EvalStatus, Verdict, best_verdict, merit
from kernel_refinery.tools.results import EvalResult, TimingReport, TimingStats
from kernel_refinery.traces.inspect import Trajectory, summarise
from kernel_refinery.traces.schema import TokenUsage, TrajectoryId, TurnRecord

STATS = TimingStats(median=1.0, mean=1.0, std=0.0, min=1.0, max=1.0, trials=3, clock="monotonic")
TIMED = TimingReport(candidate=STATS, reference=STATS, speedup=1.0)
TRAJECTORY = TrajectoryId(task="level1/1_relu", variant="G+E")


def test_the_vocabulary_is_the_evaluators_plus_no_code_and_unfinished() -> None:
    assert {v.value for v in Verdict} == {s.value for s in EvalStatus} | {"no_code", "unfinished"}
    assert all(Verdict(s.value).compiled == s.compiled for s in EvalStatus)


def test_one_rank_order_best_to_worst() -> None:
    assert sorted(Verdict, key=lambda v: v.rank, reverse=True) == [
        Verdict.CORRECT,
        Verdict.INCORRECT,
        Verdict.RUNTIME_ERROR,
        Verdict.CUDA_FAULT,
        Verdict.OOM,
        Verdict.TIMEOUT,
        Verdict.COMPILE_ERROR,
        Verdict.REJECTED,
        Verdict.UNFINISHED,
        Verdict.NO_CODE,
    ]
    assert len({v.rank for v in Verdict}) == len(Verdict), "no two verdicts tie"
    assert min(v.rank for v in Verdict if v.compiled) > max(v.rank for v in Verdict if not v.compiled)
    assert best_verdict([Verdict.TIMEOUT, Verdict.CUDA_FAULT, Verdict.OOM]) is Verdict.CUDA_FAULT
    assert best_verdict([]) is Verdict.NO_CODE


@pytest.mark.parametrize(
    "result",
    [
        None,  # the evaluation never came back
        EvalResult(status=None),  # the steps run so far passed
        EvalResult(status=EvalStatus.CORRECT),  # correct but never timed
    ],
    ids=["no-result", "no-status", "untimed"],
)
def test_code_without_a_final_verdict_is_unfinished_everywhere(result: EvalResult | None, tmp_path: Path) -> None:
    attempt = Attempt(turn=1, reply="```python\nx\n```", code="x", result=result)
    record = TurnRecord(
        run_id="r",
        trajectory=TRAJECTORY,
        turn=1,
        model="m",
        messages=(),
        reply=attempt.reply,
        code=attempt.code,
        result=result,
        started_at="",
    )
    assert attempt.verdict is record.status is Verdict.UNFINISHED
    assert summarise(Trajectory(id=TRAJECTORY, path=tmp_path, records=(record,))).best_status is Verdict.UNFINISHED
    task = Task(name="1_relu", level=1, path=tmp_path / "1_relu.py", source="")
    strategy = StrategyResult(strategy="refine", trajectory=TRAJECTORY, attempts=(attempt,), tokens=TokenUsage(), traces=(tmp_path,))
    results = record_of(task, "G+E", 0, strategy)
    assert results.best_status is results.per_turn[0].status is Verdict.UNFINISHED and not results.compiled
    assert merit(BeamNode("n", None, None, attempt))[2] == Verdict.UNFINISHED.rank
    console = Console(file=io.StringIO(), width=80, record=True)
    console.print(turn_line(attempt, 3))
    if result is not None:
        print_result(console, "1_relu", result)
    text = console.export_text()
    assert "turn 1/3  unfinished" in text and "?" not in text and "runtime_error" not in text
    assert result is None or "1_relu: unfinished" in text


def test_the_loop_and_the_traces_agree_on_every_evaluator_status() -> None:
    for status in EvalStatus:
        result = EvalResult(status=status, timing=TIMED if status is EvalStatus.CORRECT else None)
        attempt = Attempt(turn=1, code="x", result=result)
        record = TurnRecord(
            run_id="r", trajectory=TRAJECTORY, turn=1, model="m", messages=(), reply="", code="x", result=result, started_at=""
        )
        assert attempt.verdict is record.status is Verdict(status.value)
    assert Attempt(turn=1).verdict is Verdict.NO_CODE
