"""Timing: reference and candidate in the same process, the same way, many trials, the median.

On CUDA each call sits between CUDA events, with a device-wide synchronize before the end event
so that work a candidate put on another stream is counted, and an L2 flush before each trial.
On CPU a monotonic clock. Each trial gets fresh clones of inputs, rotating between two seeded
input sets, so an output cached across calls gains nothing.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from tools.programs import clone_args
from tools.results import TimingStats

_L2_FLUSH_BYTES = 256 * 1024 * 1024  # several times any current GPU's L2


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


class Timer:
    """Times callables on one device; holds the L2 flush buffer across calls."""

    def __init__(self, device: torch.device):
        self.device = device
        self._flush: torch.Tensor | None = None
        if device.type == "cuda":
            self._flush = torch.empty(_L2_FLUSH_BYTES // 4, dtype=torch.float32, device=device)

    def time(self, fn: Callable[..., Any], input_sets: list[list[Any]], warmup: int, trials: int) -> TimingStats:
        with torch.no_grad():
            for i in range(warmup):
                fn(*clone_args(input_sets[i % len(input_sets)]))
            if self.device.type == "cuda":
                return self._time_cuda(fn, input_sets, trials)
            return self._time_cpu(fn, input_sets, trials)

    def _time_cpu(self, fn: Callable[..., Any], input_sets: list[list[Any]], trials: int) -> TimingStats:
        samples = []
        for i in range(trials):
            args = clone_args(input_sets[i % len(input_sets)])
            start = time.perf_counter_ns()
            fn(*args)
            samples.append((time.perf_counter_ns() - start) / 1e6)
            del args
        return stats(samples, "monotonic")

    def _time_cuda(self, fn: Callable[..., Any], input_sets: list[list[Any]], trials: int) -> TimingStats:
        assert self._flush is not None
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(trials)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(trials)]
        torch.cuda.synchronize(self.device)
        for i in range(trials):
            args = clone_args(input_sets[i % len(input_sets)])
            self._flush.zero_()
            torch.cuda.synchronize(self.device)
            starts[i].record()
            fn(*args)
            torch.cuda.synchronize(self.device)
            ends[i].record()
            del args
        torch.cuda.synchronize(self.device)
        return stats([s.elapsed_time(e) for s, e in zip(starts, ends)], "cuda-events")
