"""The judge's timing of the reference, in process: a torch.compile baseline that fails says why."""

from __future__ import annotations

import random
import types
from typing import Any

import pytest
import torch

from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.processes.programs import Program
from kernel_refinery.tools.steps.timing import Timer, stats
from kernel_refinery.tools.steps.timing_stage import args_for_calls, measure_baseline

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
    from kernel_refinery.tools.processes.jobs import Rejected
    from kernel_refinery.tools.steps.timing_stage import CLOCK_ATTEMPTS, Calibration, ClockedTiming

    task = types.ModuleType("task")
    exec(TASK, task.__dict__)  # noqa: S102 - the test's own task program
    program = Program(task=task, candidate=None, device=torch.device("cpu"))
    cfg = EvalConfig(trials=20, warmup=1)
    reference = program.reference(cfg.seed)
    calls = args_for_calls(program, cfg, reference)
    remote = BurstyRemote(bursts, calls_per_timing=cfg.warmup + cfg.trials)
    clocked = ClockedTiming(program, cfg, reference, remote, calls.make, (), Timer(program.device), Calibration(0.05, 0.05))  # type: ignore[arg-type]  # a stand-in runner
    if passes:
        run, _ = clocked.time(cfg.trials)
        assert clocked.attempts == bursts + 1 and max(run.walls_ms) < 1.0
    else:
        with pytest.raises(Rejected, match="the judge's clock saw"):
            clocked.time(cfg.trials)
        assert clocked.attempts == CLOCK_ATTEMPTS


class ReferenceAsCandidate:
    """Stands in for the runner with a candidate identical to the reference: the same module,
    timed by the same timer, its outputs handed back as they are."""

    def __init__(self, model: Any, timer: Timer, scale: float = 1.0) -> None:
        self.model = model
        self.timer = timer
        self.scale = scale
        self.link = types.SimpleNamespace(device=torch.device("cpu"))
        self.arena: torch.Tensor | None = None

    def call(self, args: list[Any], specs: Any, timed: bool) -> tuple[Any, list[torch.Tensor]]:
        out, ms = self.timer.time_call(self.model, args)
        # As the runner does: the output copied into the shared arena, its own memory freed.
        if self.arena is None:
            self.arena = torch.empty_like(out)
        self.arena.copy_(out)
        del out
        reply = types.SimpleNamespace(elapsed_ms=ms * self.scale)
        return types.SimpleNamespace(reply=reply, mismatch="", wall_ms=ms * self.scale + 0.01), [self.arena]


class SimulatedTimer(Timer):
    """Runs each call but reports a time drawn from one seeded distribution, whatever ran: the
    reference and a candidate identical to it are then alike by construction, on a loaded
    machine too (a unit test checks the band's logic, not this machine's noise)."""

    def __init__(self, device: torch.device, seed: int = 7) -> None:
        super().__init__(device)
        self.rng = random.Random(seed)

    def _ms(self) -> float:
        return self.rng.lognormvariate(0.0, 0.05)

    def time_call(self, fn: Any, args: list[Any]) -> tuple[Any, float]:
        with torch.no_grad():
            return fn(*args), self._ms()

    def _time_cpu(self, fn: Any, make_args: Any, warmup: int, trials: int, after_call: Any) -> list[float]:
        with torch.no_grad():
            for i in range(trials):
                fn(*make_args(warmup + i))
        return [self._ms() for _ in range(trials)]


def _relu_program() -> Program:
    task = types.ModuleType("task")
    exec(TASK.replace("torch.randn(256)", "torch.randn(64, 4096)"), task.__dict__)  # noqa: S102 - the test's own task program
    return Program(task=task, candidate=None, device=torch.device("cpu"))


def test_the_reference_against_itself_is_no_difference() -> None:
    """The A/A run: the reference timed twice gives the band; a candidate that is the reference lies inside it."""
    from kernel_refinery.tools.steps.timing_stage import calibrate, time_candidate

    program = _relu_program()
    cfg = EvalConfig(trials=30, warmup=2, time_compiled_reference=False, cpu_threads=1)
    reference = program.reference(cfg.seed)
    timer = SimulatedTimer(program.device)
    remote = ReferenceAsCandidate(reference, timer)
    report = time_candidate(timer, program, cfg, reference, remote, {}, ("relu",), calibrate(timer))  # type: ignore[arg-type]  # a stand-in runner
    assert report.noise_band is not None and report.noise_band[0] < 1 < report.noise_band[1]
    assert report.within_noise is True, (report.speedup, report.noise_band)
    assert report.baseline == "eager"
    # A candidate a fifth faster on the same noise is a difference.
    faster = ReferenceAsCandidate(reference, timer, scale=0.8)
    report = time_candidate(timer, program, cfg, reference, faster, {}, ("relu",), calibrate(timer))  # type: ignore[arg-type]  # a stand-in runner
    assert report.within_noise is False and report.speedup > report.noise_band[1], (report.speedup, report.noise_band)  # type: ignore[index]  # checked above
    # Off: no A/A run, nothing marked.
    off = time_candidate(timer, program, cfg.model_copy(update={"noise_band": False}), reference, remote, {}, ("relu",), calibrate(timer))  # type: ignore[arg-type]  # a stand-in runner
    assert off.noise_band is None and off.within_noise is None


def test_the_speedup_is_against_the_chosen_baseline() -> None:
    """baseline "compile": against torch.compile's time; "best": the faster of the two; compile
    missing: against eager, saying why."""
    from kernel_refinery.tools.steps.timing import Timed
    from kernel_refinery.tools.steps.timing_stage import Baseline, chosen_baseline

    def timed(ms: float) -> Timed:
        samples = [ms * (1 + 0.01 * (i % 3)) for i in range(10)]
        return Timed(stats(samples, "monotonic"), tuple(samples))

    eager, compiled = timed(2.0), timed(1.0)
    base = Baseline(eager, compiled.stats, None, compiled_samples=compiled.samples_ms)
    assert chosen_baseline(EvalConfig(), base)[0] == "eager"
    assert chosen_baseline(EvalConfig(baseline="compile"), base)[:2] == ("compile", compiled.samples_ms)
    assert chosen_baseline(EvalConfig(baseline="best"), base)[0] == "compile"
    slow_compile = Baseline(eager, timed(3.0).stats, None, compiled_samples=timed(3.0).samples_ms)
    assert chosen_baseline(EvalConfig(baseline="best"), slow_compile)[0] == "eager"
    assert chosen_baseline(EvalConfig(baseline="compile"), slow_compile)[0] == "compile"
    failed = Baseline(eager, None, None, compiled_error="RuntimeError: no C++ compiler found")
    against, samples, why = chosen_baseline(EvalConfig(baseline="compile"), failed)
    assert (against, samples) == ("eager", eager.samples_ms) and why is not None and "no C++ compiler found" in why
