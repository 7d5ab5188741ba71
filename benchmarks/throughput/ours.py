"""Our side: every candidate through `kernel_refinery.tools.processes.pool.EvaluatorPool` on one GPU, with the experiment's stages.

Each candidate goes through the stages as the agent's graph runs them (agent/nodes.py): static check
and compile; then correctness; then, if correct, timing and profile. The pool's workers share the
GPU: correctness, timing and profile hold the device's lock, compiles do not, so one candidate's
compile overlaps another's timing. The device's busy fraction is the lock's held seconds over the
wall time; an NVML sampler (gpu_sampler.py) reports what the GPU itself said meanwhile.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, MutableMapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from benchmarks.throughput.manifest import Work
from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.tools.processes.pool import EvaluatorPool
from kernel_refinery.tools.results import EvalResult, Stage

COMPILE_STAGES = (Stage.STATIC, Stage.COMPILE)
CHECK_STAGES = (Stage.CORRECTNESS,)
MEASURE_STAGES = (Stage.TIMING, Stage.PROFILE)

_VERDICTS = {
    EvalStatus.CORRECT: "correct",
    EvalStatus.INCORRECT: "incorrect",
    EvalStatus.COMPILE_ERROR: "compile_error",
    EvalStatus.RUNTIME_ERROR: "runtime_error",
    EvalStatus.CUDA_FAULT: "runtime_error",
    EvalStatus.OOM: "runtime_error",
    EvalStatus.TIMEOUT: "timeout",
    EvalStatus.REJECTED: "rejected",
}


def verdict(status: EvalStatus | None) -> str:
    """The benchmark's verdict for one of our results (see manifest.VERDICTS)."""
    return "missing" if status is None else _VERDICTS[status]


def eval_config(cache_dir: Path, **overrides: Any) -> EvalConfig:
    """The evaluator settings of the experiment configs (bench/configs/*.toml), on the GPU.

    Defaults otherwise: 5 correctness trials, 100 timed calls of each side, every guard on. The
    torch.compile baseline is off, as in every experiment config (KernelBench times no such thing).
    """
    return EvalConfig(device="cuda", cache_dir=cache_dir, time_compiled_reference=False, **overrides)


class CompileTracker:
    """How many candidates are in their static-check-and-compile call right now (read by the GPU
    sampler); a worker's first call also starts the worker (importing torch, a CUDA context)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.active = 0

    def __enter__(self) -> None:
        with self._lock:
            self.active += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.active -= 1


START_EVENTS = ("template_started", "template_failed_plain_processes_instead", "worker_started", "judge_started", "judge_replaced")


class StartTimeline:
    """The evaluator's start-up events (tools/processes/worker.py logs them), seconds since the run
    began: where a run's time goes before the stages, so that the next regression shows where it is."""

    def __init__(self, origin: float) -> None:
        self.origin = origin
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def __call__(self, _: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        if event.get("event") in START_EVENTS:
            kept = {k: v for k, v in event.items() if k in ("event", "pid", "seconds", "spare", "error", "reason", "reference_runner")}
            with self._lock:
                self.events.append({"at_s": round(time.monotonic() - self.origin, 2), **kept})
        return event

    def summary(self) -> dict[str, Any]:
        runners = [e for e in self.events if e["event"] == "worker_started"]
        template = "started" if any(e["event"] == "template_started" for e in self.events) else "not started"
        failed = [e for e in self.events if e["event"] == "template_failed_plain_processes_instead"]
        if failed:
            template = f"failed: {str(failed[0].get('error', ''))[:200]}"
        waits = [float(e["seconds"]) for e in runners if isinstance(e.get("seconds"), (int, float))]
        return {
            "runner_starts": len(runners),
            "from_spares": sum(1 for e in runners if e.get("spare")),
            "runner_wait_s": round(sum(waits), 2),
            "template": template,
            "judge_starts": sum(1 for e in self.events if e["event"] == "judge_started"),
        }


@contextlib.contextmanager
def recording(timeline: StartTimeline) -> Iterator[None]:
    """structlog's processors with `timeline` first, for the block."""
    saved = structlog.get_config()
    structlog.configure(processors=[timeline, *saved["processors"]])
    try:
        yield
    finally:
        structlog.configure(**saved)


@dataclass
class OursRun:
    wall_s: float
    workers: int
    busy_s: float
    timing_s: float
    results: dict[str, dict[str, Any]]
    worker_starts: int
    settings: dict[str, Any] = field(default_factory=dict)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    starts: dict[str, Any] = field(default_factory=dict)
    """Runner starts (and how many came from spares), the template's status, judge starts."""

    @property
    def busy_fraction(self) -> float:
        return self.busy_s / self.wall_s if self.wall_s > 0 else 0.0


def evaluate(pool: EvaluatorPool, item: Work, tracker: CompileTracker) -> tuple[EvalResult, float, float]:
    """One candidate through the experiment's stages; its result, start and end (monotonic s)."""
    program = TaskProgram(name=item.task, source=item.task_source)
    started = time.monotonic()
    with tracker:
        result = pool.run(program, item.kernel_source, COMPILE_STAGES)
    if result.status is None:
        result = result.merge(pool.run(program, item.kernel_source, CHECK_STAGES))
        if result.status is EvalStatus.CORRECT:
            result = result.merge(pool.run(program, item.kernel_source, MEASURE_STAGES))
    return result, started, time.monotonic()


def summary(result: EvalResult, started: float, ended: float, origin: float) -> dict[str, Any]:
    timing = result.timing
    return {
        "status": result.status.value if result.status else None,
        "verdict": verdict(result.status),
        "headline": result.headline()[:300],
        "started_s": round(started - origin, 3),
        "ended_s": round(ended - origin, 3),
        "stage_seconds": {k: round(v, 3) for k, v in result.stage_seconds.items()},
        "compile_cache": {"hits": result.compile.cache_hits, "misses": result.compile.cache_misses} if result.compile else None,
        "candidate_ms": timing.candidate.median if timing else None,
        "reference_ms": timing.reference.median if timing else None,
        "speedup": timing.speedup if timing else None,
    }


def run_ours(
    work: list[Work],
    workers: int,
    cache_dir: Path,
    tracker: CompileTracker | None = None,
    on_result: Callable[[str, str, int], None] | None = None,
    config: EvalConfig | None = None,
    devices: int | None = 1,
) -> OursRun:
    """All of `work` through a fresh pool of `workers` on GPU 0 (or `config`'s device; `devices=None`
    lets the pool choose, as `refinery serve` does); the clock starts before any worker does."""
    tracker = tracker or CompileTracker()
    config = config or eval_config(cache_dir)
    results: dict[str, dict[str, Any]] = {}
    started = time.monotonic()
    timeline = StartTimeline(started)
    with recording(timeline):
        run = _run_pool(work, workers, config, devices, tracker, on_result, results, started)
    return replace(run, timeline=timeline.events, starts=timeline.summary())


def _run_pool(
    work: list[Work],
    workers: int,
    config: EvalConfig,
    devices: int | None,
    tracker: CompileTracker,
    on_result: Callable[[str, str, int], None] | None,
    results: dict[str, dict[str, Any]],
    started: float,
) -> OursRun:
    pool = EvaluatorPool(config, workers=workers, devices=devices)
    try:
        # Every candidate at once, as KernelBench's batch has them all: the pool decides what runs.
        with ThreadPoolExecutor(max_workers=max(1, len(work)), thread_name_prefix="candidate") as threads:
            futures = {threads.submit(evaluate, pool, item, tracker): item for item in work}
            for future in as_completed(futures):
                item = futures[future]
                try:
                    result, began, ended = future.result()
                except Exception as exc:  # noqa: BLE001 - the pool itself failed (e.g. a worker did not start): recorded, the run goes on
                    results[item.candidate] = {"status": None, "verdict": "harness_error", "headline": f"{type(exc).__name__}: {exc}"[:300]}
                else:
                    results[item.candidate] = summary(result, began, ended, started)
                if on_result:
                    on_result(item.candidate, results[item.candidate]["verdict"], len(results))
        wall = time.monotonic() - started
        device = pool.devices[0]
        busy_s, timing_s, starts = device.busy_s, device.timing_s, pool.worker_starts
    finally:
        pool.close()
    settings = config.model_dump(mode="json", exclude={"cache_dir", "tolerances"})
    return OursRun(wall_s=wall, workers=workers, busy_s=busy_s, timing_s=timing_s, results=results, worker_starts=starts, settings=settings)
