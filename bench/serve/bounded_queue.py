"""The bounded queue of `refinery serve` in front of an EvaluatorPool, and its counters.

At most `workers` evaluations run at once (one thread each, calling the pool) and at most
`queue_size` more wait; a request that would go past that is refused whole (the server answers
429), so a burst never piles up unbounded work. Candidates run in the pool's worker processes only.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import structlog

from kernel_refinery.bench.serve.protocol import ServerMetrics
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.tools.results import EvalResult

log = structlog.get_logger()

_RATE_WINDOW_S = 60.0


@dataclass(frozen=True)
class EvaluationJob:
    task: TaskProgram
    candidate: str
    config: EvalConfig


class QueueFull(Exception):
    """The request's evaluations do not fit: running plus queued would pass the capacity."""


Evaluate = Callable[[TaskProgram, str, EvalConfig], EvalResult]
"""What runs one job: EvaluatorPool.evaluate with its per-candidate config."""


class EvaluationQueue:
    def __init__(self, evaluate: Evaluate, workers: int, queue_size: int, busy_fraction: Callable[[], float] = lambda: 0.0):
        self._evaluate = evaluate
        self._busy_fraction = busy_fraction
        self.workers = workers
        self.capacity = workers + queue_size
        self._threads = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="serve-eval")
        self._lock = threading.Lock()
        self._waiting = 0
        self._running = 0
        self._finished_at: deque[float] = deque()
        self._verdicts: Counter[str] = Counter()
        self._refused_full = 0
        self._timed_out = 0
        self._failed = 0
        self._started = time.monotonic()

    def submit(self, jobs: list[EvaluationJob]) -> list[Future[EvalResult]]:
        """All of `jobs` admitted, or none (QueueFull)."""
        with self._lock:
            admitted = self._waiting + self._running
            if admitted + len(jobs) > self.capacity:
                self._refused_full += 1
                raise QueueFull(
                    f"the evaluation queue is full ({admitted} of {self.capacity} admitted, {len(jobs)} asked for); retry later"
                )
            self._waiting += len(jobs)
        futures = [self._threads.submit(self._run, job) for job in jobs]
        for future in futures:
            future.add_done_callback(self._done)
        return futures

    def _run(self, job: EvaluationJob) -> EvalResult:
        with self._lock:
            self._waiting -= 1
            self._running += 1
        try:
            return self._evaluate(job.task, job.candidate, job.config)
        finally:
            with self._lock:
                self._running -= 1

    def _done(self, future: Future[EvalResult]) -> None:
        with self._lock:
            if future.cancelled():  # it never started: it leaves the queue here
                self._waiting -= 1
                return
            self._finished_at.append(time.monotonic())
            error = future.exception()
            if error is not None:
                self._failed += 1
                log.error("serve_evaluation_failed", error=repr(error))
                return
            status = future.result().status
            self._verdicts[status.value if status is not None else "open"] += 1

    def note_timed_out(self) -> None:
        with self._lock:
            self._timed_out += 1

    def metrics(self) -> ServerMetrics:
        now = time.monotonic()
        with self._lock:
            while self._finished_at and self._finished_at[0] < now - _RATE_WINDOW_S:
                self._finished_at.popleft()
            return ServerMetrics(
                workers=self.workers,
                capacity=self.capacity,
                running=self._running,
                queue_depth=self._waiting,
                evaluations_total=sum(self._verdicts.values()) + self._failed,
                evaluations_per_minute=float(len(self._finished_at)) * 60.0 / _RATE_WINDOW_S,
                verdicts=dict(self._verdicts),
                refused_full=self._refused_full,
                timed_out=self._timed_out,
                failed=self._failed,
                busy_fraction=self._busy_fraction(),
                uptime_s=now - self._started,
            )

    def close(self) -> None:
        """Waiting jobs are dropped; running ones end with their evaluation."""
        self._threads.shutdown(wait=True, cancel_futures=True)
