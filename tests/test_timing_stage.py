"""The judge's timing of the reference, in process: a torch.compile baseline that fails says why."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

from tools.config import EvalConfig
from tools.programs import Program
from tools.timing import Timer
from tools.timing_stage import args_for_calls, measure_baseline

TASK = """
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn(256)]

def get_init_inputs():
    return []
"""


def test_a_failed_compiled_baseline_records_why(monkeypatch: pytest.MonkeyPatch) -> None:
    task = types.ModuleType("task")
    exec(TASK, task.__dict__)  # noqa: S102 - the test's own task program
    program = Program(task=task, candidate=task, device=torch.device("cpu"))

    def no_toolchain(model: Any, **_: Any) -> Any:
        raise RuntimeError("no C++ compiler found\n")

    # As on a machine without a toolchain: torch.compile raises.
    monkeypatch.setattr(torch, "compile", no_toolchain)
    cfg = EvalConfig(trials=3, warmup=1, time_compiled_reference=True)
    cfg = cfg.model_copy(update={"guards": cfg.guards.model_copy(update={"speed_of_light": False})})
    reference = program.reference(cfg.seed)
    calls = args_for_calls(program, cfg, reference)
    base = measure_baseline(Timer(program.device), program, cfg, reference, calls.make)
    assert base.compiled is None
    assert base.compiled_error == "RuntimeError: no C++ compiler found"
    # Not asked for, nothing to explain.
    off = cfg.model_copy(update={"time_compiled_reference": False})
    base = measure_baseline(Timer(program.device), program, off, reference, calls.make)
    assert base.compiled is None and base.compiled_error is None


class BurstyRemote:
    """Stands in for the runner: right outputs, a reported time, and a judge's clock that a burst of
    load stretches by 5 ms on every call of the first `bursts` timings (or of all, when a liar)."""

    def __init__(self, bursts: int, calls_per_timing: int) -> None:
        self.bursts = bursts
        self.calls_per_timing = calls_per_timing
        self.calls = 0
        self.link = types.SimpleNamespace(device=torch.device("cpu"))

    def call(self, args: list[Any], specs: Any, timed: bool) -> tuple[Any, list[torch.Tensor]]:
        timing = self.calls // self.calls_per_timing
        self.calls += 1
        stretched = 5.0 if timing < self.bursts else 0.0
        reply = types.SimpleNamespace(elapsed_ms=0.01)
        return types.SimpleNamespace(reply=reply, mismatch="", wall_ms=0.02 + stretched), [torch.relu(args[0])]


@pytest.mark.parametrize(("bursts", "passes"), [(0, True), (1, True), (2, True), (3, False)])
def test_a_clock_check_failed_under_a_burst_of_load_is_timed_again(bursts: int, passes: bool) -> None:
    """One timing of a fast kernel spans milliseconds: a burst of other work can stretch all of its
    round trips. The candidate is timed again (up to CLOCK_ATTEMPTS timings); one that misreports on
    every timing is rejected."""
    from tools.jobs import Rejected
    from tools.timing_stage import CLOCK_ATTEMPTS, Calibration, ClockedTiming

    task = types.ModuleType("task")
    exec(TASK, task.__dict__)  # noqa: S102 - the test's own task program
    program = Program(task=task, candidate=None, device=torch.device("cpu"))
    cfg = EvalConfig(trials=20, warmup=1)
    reference = program.reference(cfg.seed)
    calls = args_for_calls(program, cfg, reference)
    remote = BurstyRemote(bursts, calls_per_timing=cfg.warmup + cfg.trials)
    clocked = ClockedTiming(program, cfg, reference, remote, calls.make, (), Timer(program.device), Calibration(0.05, 0.05))  # type: ignore[arg-type]
    if passes:
        run, _ = clocked.time(cfg.trials)
        assert clocked.attempts == bursts + 1 and max(run.walls_ms) < 1.0
    else:
        with pytest.raises(Rejected, match="the judge's clock saw"):
            clocked.time(cfg.trials)
        assert clocked.attempts == CLOCK_ATTEMPTS
