"""95% intervals for the scores of a run: bootstrap over tasks with scipy.stats.bootstrap.

The unit of resampling is the task. A rate (fast_p, correct, compiled) is the mean over tasks of
each task's value, which with several samples per task is the share of its samples that count: so
the interval covers both the spread over tasks and over samples (a cluster bootstrap). The
geometric-mean speedup is over correct attempts only: its interval resamples the tasks with at
least one correct attempt. A paired comparison resamples the tasks both sides ran.

Every bootstrap uses the same fixed seed, so a report is the same each time it is made. Intervals
are BCa (bias-corrected and accelerated); where BCa is undefined (e.g. all but one task equal) the
percentile interval stands in, and where every task has the same value the interval is that value.
Over a handful of tasks any interval is rough: it says how much the tasks of this run disagree,
and says nothing of tasks no run saw.

This module lives in traces/ so the HTML report (traces/html.py) can use it without importing bench/.
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict
from scipy import stats

CONFIDENCE = 0.95
RESAMPLES = 9999
SEED = 0
METHOD = f"{CONFIDENCE:.0%} BCa bootstrap over tasks ({RESAMPLES} resamples, seed {SEED})"


class Estimate(BaseModel):
    """A score with its 95% interval; `low`/`high` are None when fewer than two tasks give a value."""

    model_config = ConfigDict(frozen=True)
    value: float | None
    low: float | None = None
    high: float | None = None
    n: int = 0
    """How many tasks (resampling units) the estimate rests on."""

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None

    def excludes(self, point: float) -> bool:
        """Whether the interval lies wholly on one side of `point` (False without an interval)."""
        return self.low is not None and self.high is not None and (self.low > point or self.high < point)


def _rng_argument() -> dict[str, object]:
    # SciPy 1.15 renamed random_state to rng; both take a numpy Generator.
    name = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"
    return {name: np.random.default_rng(SEED)}


def _bootstrap(data: tuple[np.ndarray, ...], statistic: Callable[..., npt.ArrayLike]) -> tuple[float, float] | None:
    """The interval of `statistic` over the units (paired across `data`), or None if it cannot be had."""
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")  # degenerate-data and small-sample warnings: checked below
            try:
                result = stats.bootstrap(
                    data,
                    statistic,
                    n_resamples=RESAMPLES,
                    confidence_level=CONFIDENCE,
                    method=method,
                    paired=True,
                    vectorized=True,
                    **_rng_argument(),
                )
            except ValueError:
                continue
        low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
        if math.isfinite(low) and math.isfinite(high):
            return low, high
    return None


def _constant(values: np.ndarray) -> bool:
    return bool(np.ptp(values) <= 1e-12 * max(1.0, float(np.abs(values).max())))


def mean_interval(values: Sequence[float]) -> Estimate:
    """The mean over units, with its 95% bootstrap interval."""
    array = np.asarray(values, dtype=float)
    if array.size == 0:
        return Estimate(value=None, n=0)
    value = float(array.mean())
    if array.size < 2:
        return Estimate(value=value, n=1)
    if _constant(array):
        # Every resample has the same mean: the interval is the value (scipy would warn and give NaN).
        return Estimate(value=value, low=value, high=value, n=int(array.size))
    interval = _bootstrap((array,), lambda x, axis: np.mean(x, axis=axis))
    low, high = interval if interval is not None else (None, None)
    return Estimate(value=value, low=low, high=high, n=int(array.size))


def rate_estimate(per_task: Sequence[Sequence[bool]], total: int | None = None) -> Estimate:
    """A rate over tasks: each task scores the share of its samples that hit; missing tasks score 0.

    `total` is the number of tasks the run planned; tasks beyond `per_task` count as misses, as
    tools/metrics.py scores a missing result.
    """
    values = [sum(hits) / len(hits) if hits else 0.0 for hits in per_task]
    values += [0.0] * max(0, (total or 0) - len(values))
    return mean_interval(values)


def geomean_estimate(per_task_speedups: Sequence[Sequence[float]]) -> Estimate:
    """Geometric mean of the correct attempts' speedups, resampling the tasks that have any.

    The statistic is exp(sum of log speedups / number of speedups) over the resampled tasks, so a
    task with three correct samples weighs three times one with a single correct sample.
    """
    logs = [[math.log(s) for s in speeds if s and s > 0] for speeds in per_task_speedups]
    logs = [task for task in logs if task]
    if not logs:
        return Estimate(value=None, n=0)
    sums = np.array([sum(task) for task in logs])
    counts = np.array([len(task) for task in logs], dtype=float)
    value = math.exp(sums.sum() / counts.sum())
    if len(logs) < 2:
        return Estimate(value=value, n=1)
    if _constant(sums / counts):
        return Estimate(value=value, low=value, high=value, n=len(logs))
    interval = _bootstrap((sums, counts), lambda s, c, axis: np.exp(np.sum(s, axis=axis) / np.sum(c, axis=axis)))
    low, high = interval if interval is not None else (None, None)
    return Estimate(value=value, low=low, high=high, n=len(logs))


def paired_difference(a: Sequence[float], b: Sequence[float]) -> Estimate:
    """The mean of b - a over paired units (the same tasks), with its interval."""
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} and {len(b)}")
    return mean_interval([y - x for x, y in zip(a, b, strict=True)])


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> Estimate:
    """The geometric mean of b / a over paired units with positive values on both sides, and its interval."""
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} and {len(b)}")
    logs = [math.log(y) - math.log(x) for x, y in zip(a, b, strict=True) if x > 0 and y > 0]
    on_log = mean_interval(logs)
    if on_log.value is None:
        return on_log

    def exp(v: float | None) -> float | None:
        return None if v is None else math.exp(v)

    return Estimate(value=exp(on_log.value), low=exp(on_log.low), high=exp(on_log.high), n=on_log.n)
