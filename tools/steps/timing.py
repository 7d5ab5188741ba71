"""Timing: one call the same way wherever it runs, many trials, the median.

On CUDA each call sits between CUDA events, with a device-wide synchronize before the end event
so that work a candidate put on another stream is counted, and an L2 flush before each trial.
On CPU a monotonic clock. The judge times the reference with `Timer.time`; the candidate's process
times each call the judge hands it with `Timer.time_call`, the same steps one call at a time, and
the judge checks those figures against its own clock (tools/steps/timing_stage.py).
"""

from __future__ import annotations

import inspect
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from kernel_refinery.tools.results import TimingStats

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


TimingMethod = Literal["events", "host", "graph"]
"""How a call is timed on CUDA (tools/config.py, EvalConfig.timing); on CPU every method is the
monotonic clock around the call."""


class GraphCaptureFailed(RuntimeError):
    """The callable cannot be captured in a CUDA graph: time it with events instead."""


class Timer:
    """Times callables on one device; holds the L2 flush buffer across calls.

    Methods on CUDA (all with an L2 flush and a device-wide synchronize around the call):
    - "events": CUDA events around the call (the default, as KernelBench's cuda_event);
    - "host": the host's monotonic clock around the synchronized call, a cross-check that counts
      launch overhead the way a user's program meets it;
    - "graph": the call captured once in a CUDA graph and replayed between events, for kernels of
      tens of microseconds where launch overhead would dominate. New inputs are copied into the
      captured ones before each replay (outside the timed span); what is replayed is exactly the
      captured launches, so Python-side work in forward is not timed (nor repeated)."""

    def __init__(self, device: torch.device, method: TimingMethod = "events", flush: bool = True):
        self.device = device
        self.method: TimingMethod = method
        self.flush = flush
        """Flush L2 before each call. The runner's calls within a judge's batch are not flushed: the
        judge flushes before handing a batch over, where the candidate cannot skip it."""
        self._flush: torch.Tensor | None = None
        self._graphs: dict[Callable[..., Any], tuple[list[Any], Any, Any]] = {}
        """Per callable: its captured inputs, the graph and the graph's output."""
        if device.type == "cuda":
            self._flush = torch.empty(_L2_FLUSH_BYTES // 4 if flush else 1, dtype=torch.float32, device=device)

    def use(self, method: TimingMethod) -> None:
        """The method for the next calls; graphs captured so far are dropped (with the models they hold)."""
        self.method = method
        self._graphs.clear()

    @property
    def clock(self) -> str:
        return (
            {"events": "cuda-events", "host": "host-wall", "graph": "cuda-graph"}[self.method]
            if self.device.type == "cuda"
            else "monotonic"
        )

    def time(self, fn: Callable[..., Any], make_args: MakeArgs, warmup: int, trials: int, after_call: AfterCall | None = None) -> Timed:
        with torch.no_grad():
            for i in range(warmup):
                fn(*make_args(i))
            if self.device.type == "cuda" and self.method == "events":
                samples = self._time_cuda(fn, make_args, warmup, trials, after_call)
            elif self.device.type == "cuda":
                samples = self._time_each(fn, make_args, warmup, trials, after_call)
            else:
                samples = self._time_cpu(fn, make_args, warmup, trials, after_call)
            return Timed(stats(samples, self.clock), tuple(samples))

    def _time_each(
        self, fn: Callable[..., Any], make_args: MakeArgs, warmup: int, trials: int, after_call: AfterCall | None
    ) -> list[float]:
        samples = []
        for i in range(trials):
            args = make_args(warmup + i)
            out, ms = self.time_call(fn, args)
            samples.append(ms)
            if after_call is not None:
                after_call(i, args, out)
            del args, out
        return samples

    def _host(self, fn: Callable[..., Any], args: list[Any]) -> tuple[Any, float]:
        self._flush_l2()
        start_ns = time.perf_counter_ns()
        out = fn(*args)
        torch.cuda.synchronize(self.device)
        return out, (time.perf_counter_ns() - start_ns) / 1e6

    def _flush_l2(self) -> None:
        """The L2 flush before a call (when this timer flushes), then a device-wide synchronize."""
        assert self._flush is not None
        if self.flush:
            self._flush.zero_()
        torch.cuda.synchronize(self.device)

    def _graph(self, fn: Callable[..., Any], args: list[Any]) -> tuple[Any, float]:
        """Captured on the first call of this callable (after a warm-up on a side stream), replayed after."""
        assert self._flush is not None
        entry = self._graphs.get(fn)
        if entry is None:
            static = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            try:
                with torch.cuda.stream(side):
                    fn(*static)
                torch.cuda.current_stream(self.device).wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    output = fn(*static)
            except Exception as exc:  # whatever the capture refused, this method cannot time it
                raise GraphCaptureFailed(
                    f"its forward cannot be captured in a CUDA graph ({type(exc).__name__}: {str(exc).strip()[:300]}); "
                    "time it with events (--set eval.timing=events)"
                ) from exc
            entry = self._graphs[fn] = (static, graph, output)
        static, graph, output = entry
        for slot, arg in zip(static, args, strict=True):
            if isinstance(slot, torch.Tensor) and isinstance(arg, torch.Tensor) and slot.data_ptr() != arg.data_ptr():
                slot.copy_(arg)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self._flush_l2()
        start.record()
        graph.replay()
        torch.cuda.synchronize(self.device)
        end.record()
        end.synchronize()
        return output, start.elapsed_time(end)

    def time_call(self, fn: Callable[..., Any], args: list[Any]) -> tuple[Any, float]:
        """One call and its milliseconds, as `time` takes each of its samples."""
        with torch.no_grad():
            if self.device.type != "cuda":
                start_ns = time.perf_counter_ns()
                out = fn(*args)
                return out, (time.perf_counter_ns() - start_ns) / 1e6
            if self.method == "host":
                return self._host(fn, args)
            if self.method == "graph":
                return self._graph(fn, args)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self._flush_l2()
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
