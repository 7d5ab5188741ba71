"""KernelBench's scores as pure functions of per-task outcomes.

fast_p: the fraction of ALL tasks whose result is correct with speedup > p; a task with no
result counts as a failure. The geometric mean is over correct tasks only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TaskOutcome:
    """The best verdict for one task: enough to score it."""

    task: str
    correct: bool
    speedup: float | None = None
    compiled: bool = True


def fast_p(results: Sequence[TaskOutcome | None], p: float, total: int | None = None) -> float:
    """Share of tasks that are correct and faster than p times the reference.

    `total` is the number of tasks attempted; results missing from `results` count as failures.
    """
    n = total if total is not None else len(results)
    if n == 0:
        return 0.0
    hits = sum(1 for r in results if r is not None and r.correct and r.speedup is not None and r.speedup > p)
    return hits / n


def correctness_rate(results: Sequence[TaskOutcome | None], total: int | None = None) -> float:
    n = total if total is not None else len(results)
    return sum(1 for r in results if r is not None and r.correct) / n if n else 0.0


def compile_rate(results: Sequence[TaskOutcome | None], total: int | None = None) -> float:
    n = total if total is not None else len(results)
    return sum(1 for r in results if r is not None and r.compiled) / n if n else 0.0


def geomean_speedup(results: Sequence[TaskOutcome | None]) -> float | None:
    """Geometric mean of the speedups of correct tasks; None when none is correct."""
    speedups = [r.speedup for r in results if r is not None and r.correct and r.speedup and r.speedup > 0]
    if not speedups:
        return None
    return math.exp(sum(math.log(s) for s in speedups) / len(speedups))


def fast_p_at_k(samples: Sequence[Sequence[TaskOutcome]], p: float, k: int, total: int | None = None) -> float:
    """Unbiased pass@k estimator applied to fast_p: per task, n samples of which c are fast.

    The chance that at least one of k samples drawn without replacement is fast is
    1 - C(n-c, k) / C(n, k); averaged over tasks (missing tasks count as 0).
    """
    n_tasks = total if total is not None else len(samples)
    if n_tasks == 0:
        return 0.0
    score = 0.0
    for task_samples in samples:
        n = len(task_samples)
        if n == 0 or k > n:
            continue
        c = sum(1 for r in task_samples if r.correct and r.speedup is not None and r.speedup > p)
        score += 1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k)
    return score / n_tasks
