"""The timing stage's logic with the runners and the clock simulated (tools/steps/timing_stage.py):
batches and the harness's cost, the A/A band, single calls where batching pays, checks afterwards,
a torch.compile baseline that fails. The real runners and clock: tests/test_judge_clock.py."""

from __future__ import annotations

import random
import types
from typing import Any

import pytest
import torch

from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.processes.channel import Spec
from kernel_refinery.tools.processes.jobs import StageFailed
from kernel_refinery.tools.processes.programs import Program, tensors_of
from kernel_refinery.tools.results import WindowReport
from kernel_refinery.tools.steps.timing import stats
from kernel_refinery.tools.steps.timing_stage import JudgedTiming, TimedPath, args_for_calls, time_candidate

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


class Local:
    """Stands in for a model in a runner: runs here, and takes `ms` a call on the simulated clock."""

    def __init__(self, fn: Any, ms: float, fails: str = "", single_ms: float | None = None) -> None:
        self.fn, self.ms, self.fails = fn, ms, fails
        self.single_ms = single_ms
        """When set, this model's single-call hand-overs take this long a call."""


class SimulatedPath(TimedPath):
    """The judge's path with the runner and the clock simulated: each hand-over runs its calls here and
    takes HARNESS_MS plus the model's time per call, each drawn from one seeded distribution, whatever
    ran. A unit test checks the stage's logic (batches, subtraction, band, overlap, checks), not this
    machine's noise."""

    HARNESS_MS = 0.2

    def __post_init__(self) -> None:
        super().__post_init__()
        self.rng = random.Random(7)
        self.single_ms: float | None = None
        """When set, a candidate's single-call hand-overs take this long a call (its batches overlapped)."""

    def _noise(self) -> float:
        return self.rng.lognormvariate(0.0, 0.03)

    def hand_over(self, model: Any, first: int, calls: int) -> tuple[float, Any, tuple[float, ...]]:
        if model.fails:
            raise StageFailed(EvalStatus.RUNTIME_ERROR, model.fails)
        outs = [tensors_of(model.fn(*self.make_args(first + j))) for j in range(calls)]
        snapshot = tuple((None, torch.stack([o[k].reshape(-1) for o in outs])) for k in range(len(self.specs)))
        single = model.single_ms if model.single_ms is not None else self.single_ms
        per_call = model.ms if calls > 1 or single is None or model.ms == 0 else single
        wall = self.HARNESS_MS * self._noise() + calls * per_call * self._noise()
        return wall, snapshot, (per_call,) * calls


class LocalReference:
    """Stands in for the reference runner."""

    def __init__(self, reference: Any, ms: float, compiled_fails: str = "") -> None:
        self.compile_failure: str | None = None
        self.models = {
            "reference": Local(reference, ms),
            "null": Local(reference, 0.0),
            "compiled": Local(reference, ms / 2, compiled_fails),
        }

    def model(self, role: str) -> Local:
        return self.models[role]


class NoWindows:
    def run(self, what: Any, hold_runner: bool, measure: Any) -> tuple[Any, WindowReport]:
        return measure(), WindowReport(what=what, seconds=0.0, others_cpu_ms=0.0)


def _relu_program() -> Program:
    task = types.ModuleType("task")
    exec(TASK.replace("torch.randn(256)", "torch.randn(16, 256)"), task.__dict__)  # noqa: S102 - the test's own task program
    return Program(task=task, candidate=None, device=torch.device("cpu"))


def _timed(cfg: EvalConfig, reference_ms: float = 0.05, compiled_fails: str = "") -> tuple[SimulatedPath, JudgedTiming, Any]:
    program = _relu_program()
    reference = program.reference(cfg.seed)
    calls = args_for_calls(program, cfg, reference)
    specs = tuple(Spec.of(t) for t in tensors_of(reference(*calls.make(0))))
    path = SimulatedPath(program, cfg, calls.make, specs, calls.source)
    return path, JudgedTiming(path, LocalReference(reference, reference_ms, compiled_fails), NoWindows()), reference  # type: ignore[arg-type]  # stand-ins for the runners


CFG = EvalConfig(trials=20, warmup=1, time_compiled_reference=False, cpu_threads=1)


def test_a_failed_compiled_baseline_records_why() -> None:
    """torch.compile of the reference failing in the reference runner (no toolchain, say): the baseline
    says why, and the speedup is against eager."""
    cfg = CFG.model_copy(update={"time_compiled_reference": True})
    _, timed, reference = _timed(cfg, compiled_fails="RuntimeError: no C++ compiler found\nmore lines")
    report = time_candidate(timed, reference, Local(reference, 0.05), {}, ("relu",))  # type: ignore[arg-type]  # a stand-in runner
    assert report.reference_compiled is None
    assert report.compiled_error == "RuntimeError: no C++ compiler found"
    _, timed, reference = _timed(CFG)
    report = time_candidate(timed, reference, Local(reference, 0.05), {}, ("relu",))  # type: ignore[arg-type]  # a stand-in runner
    assert report.reference_compiled is None and report.compiled_error is None


def test_short_calls_are_batched_and_the_harness_subtracted() -> None:
    """A reference of 50 us against a 200 us hand-over: K is chosen so that a batch's calls take ten
    hand-overs' worth, and the per-call times come out as the calls', not the harness's."""
    _, timed, reference = _timed(CFG, reference_ms=0.05)
    report = time_candidate(timed, reference, Local(reference, 0.025), {}, ("relu",))  # type: ignore[arg-type]  # a stand-in runner
    assert report.timed_by == "judge"
    assert report.batch_calls >= 10 * SimulatedPath.HARNESS_MS / 0.05 * 0.8
    assert report.reference.median == pytest.approx(0.05, rel=0.1)
    assert report.candidate.median == pytest.approx(0.025, rel=0.1)
    assert report.speedup == pytest.approx(2.0, rel=0.1)
    assert report.scored_from == "batches" and len(report.checked_calls) == CFG.guards.checked_timed_calls + 1


def test_a_candidate_whose_batches_gain_more_than_the_references_is_scored_from_single_calls() -> None:
    """Calls that overlap within a batch (or read ahead) make a batch faster than its calls one by
    one; the reference's do not. Both sides are then scored from single calls, and the report says why."""
    path, timed, reference = _timed(CFG, reference_ms=0.05)
    path.single_ms = 0.05  # one call at a time the candidate is the reference's equal
    report = time_candidate(timed, reference, Local(reference, 0.0125), {}, ("relu",))  # type: ignore[arg-type]  # a stand-in runner
    assert report.scored_from == "single_calls", report
    assert report.speedup == pytest.approx(1.0, rel=0.15)
    assert "gained more from batching" in report.note


def test_single_calls_never_score_a_candidate_above_its_batches() -> None:
    """Single calls carry a fixed cost that pulls both sides toward 1 (seen on an H100: a kernel at
    0.15x batched read 0.26x from single calls). Scored from single calls is a defence against gains
    from batching: where the single calls would read higher, the batches' figure stands, and the
    report says both."""
    _, timed, reference = _timed(CFG, reference_ms=0.05)
    timed.ref.models["reference"].single_ms = 0.30  # type: ignore[attr-defined]  # the stand-in reference runner's model
    candidate = Local(reference, 0.2, single_ms=0.6)  # gains 0.4 ms a call from batching, the reference 0.25
    report = time_candidate(timed, reference, candidate, {}, ("relu",))  # type: ignore[arg-type]  # a stand-in runner
    assert report.scored_from == "batches", report
    assert report.speedup == pytest.approx(0.25, rel=0.15)
    assert "gained more from batching" in report.note and "scored from the batches" in report.note


def test_a_reference_too_short_for_single_calls_is_compared_by_its_batches() -> None:
    """The reference's single calls read 0 (shorter than the harness's jitter: seen in CI, where an
    honest kernel then read 0.000x from single calls). Scored from single calls, the candidate's are
    compared with the reference's batches, which are no shorter than its calls one at a time."""
    _, timed, reference = _timed(CFG, reference_ms=0.05)
    timed.ref.models["reference"].single_ms = 1e-6  # type: ignore[attr-defined]  # the stand-in reference runner's model
    report = time_candidate(timed, reference, Local(reference, 0.2, single_ms=0.6), {}, ("relu",))  # type: ignore[arg-type]  # a stand-in runner
    assert report.scored_from == "single_calls", report
    assert report.speedup == pytest.approx(0.05 / 0.6, rel=0.2)


def test_the_reference_against_itself_is_no_difference() -> None:
    """The A/A run: the reference timed twice gives the band; a candidate that is the reference lies inside it."""
    _, timed, reference = _timed(CFG, reference_ms=5.0)
    report = time_candidate(timed, reference, Local(reference, 5.0), {}, ("relu",))  # type: ignore[arg-type]  # a stand-in runner
    assert report.batch_calls == 1
    assert report.noise_band is not None and report.noise_band[0] < 1 < report.noise_band[1]
    assert report.within_noise is True, (report.speedup, report.noise_band)
    assert report.baseline == "eager"
    # A candidate a fifth faster on the same noise is a difference.
    _, timed, reference = _timed(CFG, reference_ms=5.0)
    report = time_candidate(timed, reference, Local(reference, 4.0), {}, ("relu",))  # type: ignore[arg-type]  # a stand-in runner
    assert report.within_noise is False and report.speedup > report.noise_band[1], (report.speedup, report.noise_band)  # type: ignore[index]  # checked above
    # Off: no A/A run, nothing marked.
    _, timed, reference = _timed(CFG.model_copy(update={"noise_band": False}), reference_ms=5.0)
    off = time_candidate(timed, reference, Local(reference, 5.0), {}, ("relu",))  # type: ignore[arg-type]  # a stand-in runner
    assert off.noise_band is None and off.within_noise is None


def test_a_stale_output_in_a_batch_is_found_by_the_calls_checked_afterwards() -> None:
    """Every slot of a batch is sampled when it ends; the calls compared are drawn afterwards. A
    candidate that returns the first call's output on every later call fails on one of them."""
    _, timed, reference = _timed(CFG, reference_ms=0.05)
    memo: list[torch.Tensor] = []

    def stale(x: torch.Tensor) -> torch.Tensor:
        if not memo:
            memo.append(torch.relu(x))
        return memo[0].clone()

    with pytest.raises(StageFailed, match="returned a wrong output for its own inputs"):
        time_candidate(timed, reference, Local(stale, 0.01), {}, ("relu",))  # type: ignore[arg-type]  # a stand-in runner


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
