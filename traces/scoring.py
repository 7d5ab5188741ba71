"""The one scorer: fast_p, rates, the geometric-mean speedup and their 95% intervals, grouped by
level × variant × strategy × precision, from trajectory records (traces/outcome.py).

`refinery report` (bench/report.py), `refinery report --compare` (bench/compare.py) and the HTML
report (`refinery traces html`, traces/html.py) all score here, so the same run gives the same
numbers in each. It lives in traces/ so the HTML report can use it without importing bench/.

Conventions: fast_p counts a trajectory that is correct with a speedup above p; a group's
fast_p is over its sample-0 trajectories, and its intervals resample its tasks over all samples
(kernel_refinery/core/stats.py); the geometric mean is over correct trajectories only.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence

from pydantic import BaseModel, ConfigDict

from kernel_refinery.core.numerics import Numerics, Precision
from kernel_refinery.core.stats import Estimate, geomean_estimate, rate_estimate
from kernel_refinery.core.strategy import Strategy
from kernel_refinery.core.verdict import Verdict
from kernel_refinery.tools.metrics import TaskOutcome, compile_rate, correctness_rate, fast_p, fast_p_at_k, geomean_speedup
from kernel_refinery.traces.outcome import TrajectoryRecord, TurnOutcome

P_VALUES = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)


def numerics_of(records: Sequence[TrajectoryRecord | GroupScores]) -> Numerics:
    """The numerics of one precision's records (or groups): the tolerance None where none recorded
    one (results from before it was recorded) or they disagree; TF32 allowed where any allowed it."""
    tolerances = {r.tolerance for r in records}
    precision = records[0].precision if records else Precision.FP32
    return Numerics.recorded(precision, tolerances.pop() if len(tolerances) == 1 else None, any(r.allow_tf32 for r in records))


class GroupScores(BaseModel):
    """Scores of one level × variant × strategy × precision group, over its tasks (sample 0 unless samples are pooled)."""

    model_config = ConfigDict(frozen=True)
    level: int
    variant: str
    tasks: int
    fast_p: dict[str, float]
    correct: float
    compiled: float
    geomean_speedup: float | None
    tokens: int
    fast_p_at_k: dict[str, dict[str, float]] = {}
    fast1_by_turn: list[float] = []
    strategy: Strategy = Strategy.REFINE
    samples: int = 1
    intervals: dict[str, Estimate] = {}
    """95% intervals, keyed fast_0 … fast_2, correct, compiled, geomean. Over all samples of each
    task: with one sample each value equals the field above; with several, it is the mean over them."""
    fast1_by_turn_intervals: list[Estimate] = []
    correct_by_turn: list[Estimate] = []
    """Share of tasks with a correct kernel within the first k turns, k = 1, 2, ...; empty in reports
    made before it was kept."""
    precision: Precision = Precision.FP32
    tolerance: float | None = None
    """atol = rtol the group's results were judged at; None where the results do not record it."""
    allow_tf32: bool = False
    fast_1_within_noise: int = 0
    """fast_1 trajectories (sample 0) whose speedup lies inside the task's A/A noise band: counted
    in fast_1, but "no difference from the reference" the timing could show."""
    general: float | None = None
    """Share of tasks whose best kernel is correct and passed every shape and init variant that
    applies (TrajectoryRecord.best_general; its interval under intervals["general"]); None where
    the variants were off for the whole group (or the results predate them)."""
    degenerate_tasks: list[str] = []
    """The group's tasks whose reference measures nothing (TrajectoryRecord.degenerate): a correct
    kernel there needs no computing; the tables mark them."""

    def estimates(self) -> dict[str, Estimate]:
        """The intervals, or the bare values for scores made without them; `general` always (no value
        where the variants were off)."""
        if self.intervals:
            return {**self.intervals, "general": self.intervals.get("general", Estimate(value=self.general, n=self.tasks))}
        bare = {f"fast_{p}": Estimate(value=v, n=self.tasks) for p, v in self.fast_p.items()}
        return {
            **bare,
            "correct": Estimate(value=self.correct, n=self.tasks),
            "general": Estimate(value=self.general, n=self.tasks),
            "compiled": Estimate(value=self.compiled, n=self.tasks),
            "geomean": Estimate(value=self.geomean_speedup),
        }

    def general_estimate(self) -> Estimate:
        """The general share with its interval: "-" (no value) where the variants were off."""
        return self.estimates()["general"]


class StrategyScores(BaseModel):
    """One strategy over every task and variant it ran (sample 0), for a budget-matched comparison;
    one per precision where the run holds several."""

    model_config = ConfigDict(frozen=True)
    strategy: Strategy
    precision: Precision = Precision.FP32
    trajectories: int
    fast_p: dict[str, float]
    correct: float
    geomean_speedup: float | None
    mean_evals: float
    tokens: int
    best_by_evals: list[float]
    """Mean over trajectories of the best correct speedup within the first e evaluations (0 before
    any correct kernel), for e = 1, 2, …"""
    intervals: dict[str, Estimate] = {}
    """95% intervals resampling tasks (a task's value: the mean over its variants), keyed like
    GroupScores.intervals; with one variant each value equals the field above."""

    def label(self, precisions: bool) -> str:
        return f"{self.strategy} {self.precision}" if precisions else self.strategy

    def estimates(self) -> dict[str, Estimate]:
        if self.intervals:
            return self.intervals
        bare = {f"fast_{p}": Estimate(value=v, n=self.trajectories) for p, v in self.fast_p.items()}
        return {**bare, "correct": Estimate(value=self.correct, n=self.trajectories), "geomean": Estimate(value=self.geomean_speedup)}


def _outcome(record: TrajectoryRecord) -> TaskOutcome:
    return TaskOutcome(task=record.task, correct=record.correct, speedup=record.best_speedup, compiled=record.compiled)


def is_fast(record: TrajectoryRecord, p: float) -> bool:
    """Correct, and more than p times as fast as the reference: what fast_p counts."""
    return record.correct and record.best_speedup is not None and record.best_speedup > p


def _faster_than(p: float) -> Callable[[TrajectoryRecord], bool]:
    return lambda r: is_fast(r, p)


def rate_hits() -> dict[str, Callable[[TrajectoryRecord], bool]]:
    """Every rate the scores give, by name (fast_0 … fast_2, correct, compiled): what a trajectory must be to count."""
    hits: dict[str, Callable[[TrajectoryRecord], bool]] = {f"fast_{p:g}": _faster_than(p) for p in P_VALUES}
    hits["correct"] = lambda r: r.correct
    hits["compiled"] = lambda r: r.compiled
    return hits


def is_general(record: TrajectoryRecord) -> bool:
    """Correct, and its best kernel passed every shape and init variant that applies: what `general` counts."""
    return record.best_general is True


def has_general(records: Sequence[TrajectoryRecord]) -> bool:
    """Any of the records was checked on shape and init variants (else `general` is "-", not 0)."""
    return any(r.best_general is not None for r in records)


def correct_speedups(records: Sequence[TrajectoryRecord]) -> list[float]:
    """The best speedups of the correct trajectories: what a geometric mean is taken over."""
    return [r.best_speedup for r in records if r.correct and r.best_speedup is not None and r.best_speedup > 0]


def geomean(records: Sequence[TrajectoryRecord]) -> float | None:
    """The geometric-mean speedup over the correct trajectories; None without one."""
    speeds = correct_speedups(records)
    return math.exp(sum(map(math.log, speeds)) / len(speeds)) if speeds else None


def unit_estimates(units: list[list[TrajectoryRecord]], total: int | None = None) -> dict[str, Estimate]:
    """fast_p for every p, correct, compiled and geomean with 95% intervals; a unit is a task's samples."""
    out = {name: rate_estimate([[hit(r) for r in unit] for unit in units], total) for name, hit in rate_hits().items()}
    out["geomean"] = geomean_estimate([correct_speedups(unit) for unit in units])
    return out


def _fast_1_within(turns: Sequence[TurnOutcome]) -> bool:
    return any(t.status is Verdict.CORRECT and t.speedup is not None and t.speedup > 1.0 for t in turns)


def _correct_within(turns: Sequence[TurnOutcome]) -> bool:
    return any(t.status is Verdict.CORRECT for t in turns)


def _by_turn(records: list[TrajectoryRecord], tasks: list[str], hit: Callable[[Sequence[TurnOutcome]], bool]) -> list[Estimate]:
    """For each k, the share of tasks whose first k turns `hit`, with a 95% interval (a task
    without a record scores 0; a trajectory that ended early keeps its last answer)."""
    horizon = max((len(r.per_turn) for r in records), default=0)
    by_task = {r.task: r for r in records}
    curve = []
    for k in range(1, horizon + 1):
        hits = [[r is not None and hit(r.per_turn[:k])] for r in (by_task.get(t) for t in tasks)]
        curve.append(rate_estimate(hits))
    return curve


def best_by_evals(records: list[TrajectoryRecord], horizon: int | None = None) -> list[float]:
    """Mean best correct speedup after e evaluations, e = 1..horizon (a reply without code costs none)."""
    series = []
    for r in records:
        best, curve = 0.0, []
        for t in r.per_turn:
            if t.status is Verdict.NO_CODE:
                continue
            if t.status is Verdict.CORRECT and t.speedup is not None:
                best = max(best, t.speedup)
            curve.append(best)
        series.append(curve)
    horizon = horizon if horizon is not None else max((len(c) for c in series), default=0)
    # A trajectory that stopped early keeps its best for the evaluations it did not spend.
    return [sum((c[min(e, len(c)) - 1] if c else 0.0) for c in series) / len(series) if series else 0.0 for e in range(1, horizon + 1)]


def _by_task(records: list[TrajectoryRecord]) -> list[list[TrajectoryRecord]]:
    tasks: dict[str, list[TrajectoryRecord]] = defaultdict(list)
    for r in records:
        tasks[r.task].append(r)
    return [tasks[t] for t in sorted(tasks)]


def score_strategies(records: list[TrajectoryRecord]) -> list[StrategyScores]:
    by_strategy: dict[tuple[str | int, ...], list[TrajectoryRecord]] = defaultdict(list)
    for r in records:
        if r.sample == 0:
            by_strategy[r.id.without("task", "variant", "sample")].append(r)
    horizon = max((r.evaluations for r in records), default=0)
    scores = []
    for group in sorted(by_strategy.values(), key=lambda g: (g[0].strategy, Precision(g[0].precision).order)):
        strategy, precision = group[0].strategy, group[0].precision
        outcomes = [_outcome(r) for r in group]
        scores.append(
            StrategyScores(
                strategy=strategy,
                precision=precision,
                trajectories=len(group),
                fast_p={f"{p:g}": fast_p(outcomes, p, total=len(group)) for p in P_VALUES},
                correct=correctness_rate(outcomes, total=len(group)),
                geomean_speedup=geomean_speedup(outcomes),
                mean_evals=sum(r.evaluations for r in group) / len(group),
                tokens=sum(r.tokens for r in group),
                best_by_evals=best_by_evals(group, horizon),
                # Resampled by task: a task's variants share its difficulty.
                intervals={k: v for k, v in unit_estimates(_by_task(group)).items() if k != "compiled"},
            )
        )
    return scores


def group_records(records: Sequence[TrajectoryRecord]) -> list[list[TrajectoryRecord]]:
    """The records by level × variant × strategy × precision (every task and sample of each), in
    report order: one precision's group next to the other's, for the same level, variant and strategy."""
    groups: dict[tuple[int | str, ...], list[TrajectoryRecord]] = defaultdict(list)
    for r in records:
        groups[(r.level, *r.id.without("task", "sample"))].append(r)
    return sorted(groups.values(), key=lambda g: (g[0].level, g[0].variant, g[0].strategy, Precision(g[0].precision).order))


def score(records: list[TrajectoryRecord]) -> list[GroupScores]:
    """The scores of each level × variant × strategy × precision group (group_records)."""
    scores = []
    for group in group_records(records):
        level, variant, strategy, precision = group[0].level, group[0].variant, group[0].strategy, group[0].precision
        numerics = numerics_of(group)
        first = [r for r in group if r.sample == 0]
        tasks = sorted({r.task for r in group})
        outcomes = [_outcome(r) for r in first]
        samples = max(r.sample for r in group) + 1
        fast1_curve = _by_turn(first, tasks, _fast_1_within)
        at_k: dict[str, dict[str, float]] = {}
        if samples > 1:
            per_task = [[_outcome(r) for r in group if r.task == t] for t in tasks]
            for k in range(1, samples + 1):
                at_k[str(k)] = {f"{p:g}": fast_p_at_k(per_task, p, k, total=len(tasks)) for p in P_VALUES}
        intervals = unit_estimates([[r for r in group if r.task == t] for t in tasks])
        general = None
        if has_general(group):
            general = sum(1 for r in first if is_general(r)) / len(tasks)
            intervals["general"] = rate_estimate([[is_general(r) for r in group if r.task == t] for t in tasks])
        scores.append(
            GroupScores(
                level=level,
                variant=variant,
                tasks=len(tasks),
                fast_p={f"{p:g}": fast_p(outcomes, p, total=len(tasks)) for p in P_VALUES},
                correct=correctness_rate(outcomes, total=len(tasks)),
                compiled=compile_rate(outcomes, total=len(tasks)),
                geomean_speedup=geomean_speedup(outcomes),
                tokens=sum(r.tokens for r in group),
                fast_p_at_k=at_k,
                fast1_by_turn=[e.value or 0.0 for e in fast1_curve],
                strategy=strategy,
                samples=samples,
                intervals=intervals,
                fast1_by_turn_intervals=fast1_curve,
                correct_by_turn=_by_turn(first, tasks, _correct_within),
                precision=precision,
                tolerance=numerics.tolerance,
                allow_tf32=numerics.allow_tf32,
                fast_1_within_noise=sum(1 for r in first if _faster_than(1.0)(r) and r.best_within_noise),
                general=general,
                degenerate_tasks=sorted({r.task for r in group if r.degenerate}),
            )
        )
    return scores


def several_precisions(scores: list[GroupScores] | list[StrategyScores]) -> bool:
    return len({s.precision for s in scores}) > 1


def has_strategies(strategies: list[StrategyScores]) -> bool:
    return len({s.strategy for s in strategies}) > 1 or any(s.strategy != Strategy.REFINE for s in strategies)
