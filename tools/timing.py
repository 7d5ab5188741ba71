"""Timing: one call the same way wherever it runs, many trials, the median.

On CUDA each call sits between CUDA events, with a device-wide synchronize before the end event
so that work a candidate put on another stream is counted, and an L2 flush before each trial.
On CPU a monotonic clock. The judge times the reference with `Timer.time`; the candidate's process
times each call the judge hands it with `Timer.time_call`, the same steps one call at a time, and
the judge checks those figures against its own clock (tools/timing_stage.py).
"""

from __future__ import annotations

import inspect
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tools.results import TimingStats

_L2_FLUSH_BYTES = 256 * 1024 * 1024  # several times any current GPU's L2

MakeArgs = Callable[[int], list[Any]]
"""Arguments for call number i (warm-ups first, then timed calls)."""
AfterCall = Callable[[int, list[Any], Any], None]
"""Sees timed call i's arguments and output once its time is taken; may raise to end the timing."""


def stats(samples_ms: list[float], clock: str) -> TimingStats:
    return TimingStats(
        median=statistics.median(samples_ms),
        mean=statistics.fmean(samples_ms),
        std=statistics.pstdev(samples_ms) if len(samples_ms) > 1 else 0.0,
        min=min(samples_ms),
        max=max(samples_ms),
        trials=len(samples_ms),
        clock=clock,
    )


@dataclass(frozen=True)
class Timed:
    stats: TimingStats
    samples_ms: tuple[float, ...]


def speedup_interval(reference_ms: tuple[float, ...], candidate_ms: tuple[float, ...], seed: int = 0) -> tuple[float, float] | None:
    """95% bootstrap interval of median(reference) / median(candidate), resampling each side."""
    if len(reference_ms) < 5 or len(candidate_ms) < 5 or min(candidate_ms) <= 0:
        return None
    try:
        import numpy as np
        from scipy.stats import bootstrap
    except ImportError:  # scipy is a dependency; a stripped environment still gets its speedup
        return None

    def ratio(ref: Any, cand: Any, axis: int = -1) -> Any:
        return np.median(ref, axis=axis) / np.median(cand, axis=axis)

    # scipy before 1.15 names the generator random_state.
    generator = {"rng" if "rng" in inspect.signature(bootstrap).parameters else "random_state": np.random.default_rng(seed)}
    result = bootstrap(
        (np.asarray(reference_ms), np.asarray(candidate_ms)),
        ratio,
        paired=False,
        vectorized=True,
        n_resamples=2000,
        confidence_level=0.95,
        method="percentile",
        **generator,
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


class Timer:
    """Times callables on one device; holds the L2 flush buffer across calls."""

    def __init__(self, device: torch.device):
        self.device = device
        self._flush: torch.Tensor | None = None
        if device.type == "cuda":
            self._flush = torch.empty(_L2_FLUSH_BYTES // 4, dtype=torch.float32, device=device)

    def time(self, fn: Callable[..., Any], make_args: MakeArgs, warmup: int, trials: int, after_call: AfterCall | None = None) -> Timed:
        with torch.no_grad():
            for i in range(warmup):
                fn(*make_args(i))
            if self.device.type == "cuda":
                samples = self._time_cuda(fn, make_args, warmup, trials, after_call)
                return Timed(stats(samples, "cuda-events"), tuple(samples))
            samples = self._time_cpu(fn, make_args, warmup, trials, after_call)
            return Timed(stats(samples, "monotonic"), tuple(samples))

    def time_call(self, fn: Callable[..., Any], args: list[Any]) -> tuple[Any, float]:
        """One call and its milliseconds, as `time` takes each of its samples."""
        with torch.no_grad():
            if self.device.type != "cuda":
                start_ns = time.perf_counter_ns()
                out = fn(*args)
                return out, (time.perf_counter_ns() - start_ns) / 1e6
            assert self._flush is not None
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self._flush.zero_()
            torch.cuda.synchronize(self.device)
            start.record()
            out = fn(*args)
            torch.cuda.synchronize(self.device)
            end.record()
            end.synchronize()
            return out, start.elapsed_time(end)

    def _time_cpu(self, fn: Callable[..., Any], make_args: MakeArgs, warmup: int, trials: int, after_call: AfterCall | None) -> list[float]:
        samples = []
        for i in range(trials):
            args = make_args(warmup + i)
            start = time.perf_counter_ns()
            out = fn(*args)
            samples.append((time.perf_counter_ns() - start) / 1e6)
            if after_call is not None:
                after_call(i, args, out)
            del args, out
        return samples

    def _time_cuda(
        self, fn: Callable[..., Any], make_args: MakeArgs, warmup: int, trials: int, after_call: AfterCall | None
    ) -> list[float]:
        assert self._flush is not None
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(trials)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(trials)]
        torch.cuda.synchronize(self.device)
        for i in range(trials):
            args = make_args(warmup + i)
            self._flush.zero_()
            torch.cuda.synchronize(self.device)
            starts[i].record()
            out = fn(*args)
            torch.cuda.synchronize(self.device)
            ends[i].record()
            if after_call is not None:
                # Queued after the end event: checking a call never adds to its time.
                after_call(i, args, out)
            del args, out
        torch.cuda.synchronize(self.device)
        return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
