"""The 95% intervals of the report (kernel_refinery/core/stats.py) against cases whose answer is known."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from kernel_refinery.bench.compare import Side, compare
from kernel_refinery.bench.experiment import TrajectoryRecord, TurnOutcome
from kernel_refinery.bench.report import score
from kernel_refinery.core.stats import Estimate, geomean_estimate, mean_interval, paired_difference, paired_ratio, rate_estimate


def test_mean_of_a_normal_sample_matches_the_t_interval() -> None:
    # 400 draws from N(10, 2): the mean's 95% interval is mean ± t(0.975, 399) · s / √n, about ±0.196.
    sample = np.random.default_rng(7).normal(10.0, 2.0, 400)
    known = scipy_stats.t.interval(0.95, len(sample) - 1, loc=sample.mean(), scale=scipy_stats.sem(sample))
    e = mean_interval(sample)
    assert e.value == pytest.approx(sample.mean())
    assert e.n == 400
    assert e.low == pytest.approx(known[0], abs=0.02) and e.high == pytest.approx(known[1], abs=0.02)
    assert (e.high - e.low) == pytest.approx(2 * 1.966 * 2.0 / math.sqrt(400), rel=0.15)


def test_a_proportion_matches_the_normal_approximation() -> None:
    # 300 of 1000 tasks fast: p ± 1.96·√(p(1-p)/n) = 0.3 ± 0.0284.
    hits = [[True]] * 300 + [[False]] * 700
    e = rate_estimate(hits)
    assert e.value == pytest.approx(0.3)
    assert e.low == pytest.approx(0.3 - 0.0284, abs=0.004) and e.high == pytest.approx(0.3 + 0.0284, abs=0.004)


def test_intervals_are_reproducible() -> None:
    sample = np.random.default_rng(3).exponential(1.0, 50)
    assert mean_interval(sample) == mean_interval(sample), "a fixed seed: the same report every time"


def test_identical_sides_differ_by_zero_with_zero_inside() -> None:
    values = [0.0, 1.0, 1.0, 0.0, 1.0, 0.5]
    d = paired_difference(values, values)
    assert d.value == 0.0 and d.low is not None and d.high is not None
    assert d.low <= 0.0 <= d.high and not d.excludes(0.0)
    speedups = [0.8, 1.3, 2.0, 0.5]
    r = paired_ratio(speedups, speedups)
    assert r.value == pytest.approx(1.0) and r.low <= 1.0 <= r.high and not r.excludes(1.0)  # type: ignore[operator]  # low and high are set: the data give an interval


def test_a_consistent_difference_excludes_zero() -> None:
    rng = np.random.default_rng(11)
    a = rng.normal(1.0, 0.3, 40)
    b = a + 0.5 + rng.normal(0.0, 0.05, 40)  # every pair B ≈ A + 0.5
    d = paired_difference(list(a), list(b))
    assert d.value == pytest.approx(0.5, abs=0.03) and d.excludes(0.0) and d.low > 0.4  # type: ignore[operator]  # low and high are set: the data give an interval
    # Unpaired, the spread of A (0.3) would swamp it far less: pairing is what makes it tight.
    assert d.high - d.low < 0.1  # type: ignore[operator]  # low and high are set: the data give an interval


def test_geomean_interval_is_on_the_log_scale() -> None:
    # Speedups 2x and 0.5x: geomean 1; the interval is symmetric in log around 1.
    e = geomean_estimate([[2.0], [0.5], [2.0], [0.5], [2.0], [0.5], [2.0], [0.5]])
    assert e.value == pytest.approx(1.0)
    assert e.low is not None and e.high is not None
    assert math.log(e.low) == pytest.approx(-math.log(e.high), abs=0.15)
    one = geomean_estimate([[3.0]])
    assert one.value == pytest.approx(3.0) and not one.has_interval and one.n == 1, "one task: a value, no interval"
    assert geomean_estimate([[], []]).value is None, "no correct attempt: no geomean"


def test_degenerate_and_tiny_samples() -> None:
    assert mean_interval([]) == Estimate(value=None, n=0)
    assert mean_interval([0.4]) == Estimate(value=0.4, n=1), "one task: no interval"
    assert mean_interval([0.0] * 5) == Estimate(value=0.0, low=0.0, high=0.0, n=5)
    # Tasks beyond those given count as misses (total), like tools/metrics.fast_p.
    assert rate_estimate([[True], [True]], total=4).value == 0.5


def test_samples_of_a_task_resample_together() -> None:
    # Two tasks, 4 samples each: a task's share of hits is its value; the mean is over tasks.
    e = rate_estimate([[True, True, True, False], [False, False, False, False]])
    assert e.value == pytest.approx(0.375) and e.n == 2


def _record(task: str, variant: str, status: str, speedup: float | None, sample: int = 0) -> TrajectoryRecord:
    return TrajectoryRecord(
        task=task,
        level=1,
        variant=variant,
        sample=sample,
        best_status=status,
        best_speedup=speedup,
        best_turn=1,
        turns=1,
        compiled=status != "compile_error",
        tokens=10,
        per_turn=(TurnOutcome(status=status, speedup=speedup),),
    )


def test_report_scores_carry_intervals_that_match_their_values() -> None:
    records = [
        _record("a", "G", "correct", 2.0),
        _record("b", "G", "correct", 0.5),
        _record("c", "G", "incorrect", None),
        _record("d", "G", "compile_error", None),
    ]
    (s,) = score(records)
    e = s.intervals
    assert e["fast_0"].value == s.fast_p["0"] == 0.5 and e["fast_1"].value == s.fast_p["1"] == 0.25
    assert e["correct"].value == s.correct and e["compiled"].value == s.compiled == 0.75
    assert e["geomean"].value == pytest.approx(1.0)
    for key in ("fast_0", "fast_1", "correct", "compiled"):
        assert e[key].low <= e[key].value <= e[key].high, key  # type: ignore[operator]  # low and high are set: the data give an interval


def test_compare_identical_runs_finds_no_difference() -> None:
    records = [
        _record(t, "G", s, x) for t, s, x in [("a", "correct", 1.5), ("b", "incorrect", None), ("c", "correct", 0.7), ("d", "correct", 3.0)]
    ]
    result = compare(Side(label="A", records=records), Side(label="B", records=records), lambda r: (r.task,), "task")
    assert result.pairs == result.tasks == 4
    for m in result.metrics:
        assert m.difference.value == pytest.approx(m.null) and not m.excludes_null, m.metric
    geomean = next(m for m in result.metrics if m.metric == "geomean")
    assert geomean.tasks == 3, "over the tasks correct on both sides"


def test_compare_pairs_only_common_tasks_and_sees_a_clear_gain() -> None:
    a = [_record(f"t{i}", "G", "incorrect", None) for i in range(12)] + [_record("only_a", "G", "correct", 2.0)]
    b = [_record(f"t{i}", "G+E", "correct", 1.5) for i in range(12)]
    result = compare(Side(label="G", records=a), Side(label="G+E", records=b), lambda r: (r.task,), "task")
    assert (result.pairs, result.only_a, result.only_b) == (12, 1, 0)
    correct = next(m for m in result.metrics if m.metric == "correct")
    assert (correct.a, correct.b) == (0.0, 1.0) and correct.difference.value == 1.0
    # Every pair moved by +1: the interval is [1, 1] and excludes 0.
    assert correct.excludes_null


def test_compare_resamples_tasks_not_the_pairs_within_a_task() -> None:
    # Two runs, two variants each, on 2 tasks: 4 pairs, but only 2 independent tasks. The same
    # kernel timed twice (3.9x, then 2.5x and 3.0x) must not read as a significant slowdown.
    before = [_record("t", v, "correct", 3.9) for v in ("G", "G+E")] + [_record("u", v, "incorrect", None) for v in ("G", "G+E")]
    after = [_record("t", "G", "correct", 2.5), _record("t", "G+E", "correct", 3.0)] + [
        _record("u", v, "correct", 0.1) for v in ("G", "G+E")
    ]
    result = compare(
        Side(label="before", records=before),
        Side(label="after", records=after),
        lambda r: (r.task, r.variant, r.strategy),
        "task, variant and strategy",
    )
    assert (result.pairs, result.tasks) == (4, 2)
    geomean = next(m for m in result.metrics if m.metric == "geomean")
    assert geomean.tasks == 1 and not geomean.difference.has_interval, "one task correct on both sides: no interval"
    assert geomean.difference.value == pytest.approx(math.sqrt(2.5 * 3.0) / 3.9)
    correct = next(m for m in result.metrics if m.metric == "correct")
    assert correct.difference.value == pytest.approx(0.5) and correct.tasks == 2
