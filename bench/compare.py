"""`refinery report --compare A B`: the paired difference of each score between two sides.

A side is a feedback variant, a strategy or a precision of one run directory, or a whole run
directory. The two sides are paired on the tasks both ran (for variants: the same task, strategy and
precision; for strategies: the same task, variant and precision; for precisions: the same task,
variant and strategy; for runs: the same task, variant, strategy and precision). Per pair, a rate is the share
of the pair's samples that hit; the geometric-mean speedup is compared as the ratio B / A over the
pairs correct on both sides. Each difference has a 95% bootstrap interval over the pairs
(kernel_refinery/core/stats.py), and the report says whether it excludes zero (one, for the ratio).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict
from rich.console import Console

from kernel_refinery.agent.config import Variant
from kernel_refinery.bench.experiment import TrajectoryRecord, read_results, results_path
from kernel_refinery.core.errors import ConfigError, RunDirError
from kernel_refinery.core.stats import METHOD, Estimate, mean_interval, paired_difference, paired_ratio
from kernel_refinery.traces.manifest import Difference, differences, read_manifest
from kernel_refinery.traces.scoring import geomean, has_general, is_general, rate_hits
from kernel_refinery.traces.terminal import add_name_column, add_number_column, compact_table, print_table

Key = tuple[str | int, ...]
"""A trajectory's id less the sample and the side's own field (TrajectoryId.without); the task first."""
ROUGH = 10
"""Below this many tasks the report says an interval is rough."""


class Side(BaseModel):
    model_config = ConfigDict(frozen=True)
    label: str
    records: list[TrajectoryRecord]
    run_dir: Path | None = None
    """Set where the side is a whole run directory: its manifest tells how it was measured."""


class MetricDifference(BaseModel):
    """One score on both sides over the paired tasks, and B against A with its interval."""

    model_config = ConfigDict(frozen=True)
    metric: str
    kind: str
    """"rate": a share of tasks, compared as B - A; "ratio": the geomean speedup, compared as B / A."""
    a: float | None
    b: float | None
    difference: Estimate
    tasks: int
    """The tasks (resampling units) behind the comparison: for geomean, those correct on both sides."""

    @property
    def null(self) -> float:
        return 0.0 if self.kind == "rate" else 1.0

    @property
    def excludes_null(self) -> bool:
        return self.difference.excludes(self.null)


class Comparison(BaseModel):
    model_config = ConfigDict(frozen=True)
    a: str
    b: str
    paired_on: str
    pairs: int
    tasks: int
    only_a: int
    only_b: int
    metrics: list[MetricDifference]
    measured_differently: list[Difference] = []
    """Two run directories: what differs between their manifests (machine, software, settings, code)."""
    unrecorded: list[str] = []
    """Two run directories: the labels of those without a manifest, which cannot be checked."""


def _runs(path: str) -> bool:
    return results_path(Path(path)).is_file()


def _variant(text: str) -> str | None:
    try:
        return str(Variant.parse(text))
    except ValueError:
        return None


def resolve_sides(run_dir: Path | None, a: str, b: str) -> tuple[Side, Side, Callable[[TrajectoryRecord], Key], str]:
    """The two sides, the pairing key of a record, and what the pairs are made of."""
    if _runs(a) and _runs(b):
        sides = [Side(label=x, records=read_results(Path(x)), run_dir=Path(x)) for x in (a, b)]
        several = len({r.precision for side in sides for r in side.records}) > 1
        paired_on = "task, variant, strategy and precision" if several else "task, variant and strategy"
        return sides[0], sides[1], lambda r: r.id.without("sample"), paired_on
    if run_dir is None:
        missing = next(x for x in (a, b) if not _runs(x))
        raise ConfigError(
            f"--compare {a} {b}: {missing} is not a run directory with results.jsonl; compare two run directories, "
            "or give RUN_DIR to compare two of its variants or strategies (refinery report RUN_DIR --compare G G+E)"
        )
    records = read_results(run_dir)
    if not records:
        raise RunDirError(f"{run_dir} has no finished trajectories (no records in {results_path(run_dir)})")
    variants = sorted({r.variant for r in records})
    strategies = sorted({r.strategy for r in records})
    precisions = sorted({r.precision for r in records})
    # A run of one precision says what it always said.
    and_precision = " and precision" if len(precisions) > 1 else ""
    va, vb = _variant(a), _variant(b)
    if va in variants and vb in variants:
        return (
            Side(label=va, records=[r for r in records if r.variant == va]),
            Side(label=vb, records=[r for r in records if r.variant == vb]),
            lambda r: r.id.without("sample", "variant"),
            ("task, strategy" + and_precision) if and_precision else "task and strategy",
        )
    if a in strategies and b in strategies:
        return (
            Side(label=a, records=[r for r in records if r.strategy == a]),
            Side(label=b, records=[r for r in records if r.strategy == b]),
            lambda r: r.id.without("sample", "strategy"),
            ("task, variant" + and_precision) if and_precision else "task and variant",
        )
    if a in precisions and b in precisions:
        return (
            Side(label=a, records=[r for r in records if r.precision == a]),
            Side(label=b, records=[r for r in records if r.precision == b]),
            lambda r: r.id.without("sample", "precision"),
            "task, variant and strategy",
        )
    unknown = next((x for x in (a, b) if _variant(x) not in variants and x not in strategies and x not in precisions), a)
    raise ConfigError(
        f"--compare {a} {b}: {unknown!r} is neither a variant ({', '.join(variants)}) nor a strategy "
        f"({', '.join(strategies)})"
        + (f" nor a precision ({', '.join(precisions)})" if and_precision else "")
        + f" of {run_dir}, nor a run directory; both sides must be of one kind"
    )


def _by_key(records: list[TrajectoryRecord], key: Callable[[TrajectoryRecord], Key]) -> dict[Key, list[TrajectoryRecord]]:
    out: dict[Key, list[TrajectoryRecord]] = defaultdict(list)
    for r in records:
        out[key(r)].append(r)
    return out


def _share(records: list[TrajectoryRecord], hit: Callable[[TrajectoryRecord], bool]) -> float:
    return sum(map(hit, records)) / len(records)


def compare(a: Side, b: Side, key: Callable[[TrajectoryRecord], Key], paired_on: str) -> Comparison:
    """B against A over the keys both sides ran; the key's first part is the task.

    The resampling unit is the task: where a task has several pairs (other variants or strategies
    of two runs), its value is the mean over them, since they share the task's difficulty.
    """
    side_a, side_b = _by_key(a.records, key), _by_key(b.records, key)
    pairs = sorted(set(side_a) & set(side_b))
    by_task: dict[str | int, list[Key]] = defaultdict(list)
    for k in pairs:
        by_task[k[0]].append(k)
    tasks = sorted(by_task)
    metrics: list[MetricDifference] = []

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    def rate(name: str, hit: Callable[[TrajectoryRecord], bool]) -> None:
        xs = [mean([_share(side_a[k], hit) for k in by_task[t]]) for t in tasks]
        ys = [mean([_share(side_b[k], hit) for k in by_task[t]]) for t in tasks]
        metrics.append(
            MetricDifference(
                metric=name,
                kind="rate",
                a=mean_interval(xs).value,
                b=mean_interval(ys).value,
                difference=paired_difference(xs, ys),
                tasks=len(tasks),
            )
        )

    for name, hit in rate_hits().items():
        rate(name, hit)
    if has_general(a.records) or has_general(b.records):
        rate("general", is_general)
    xs, ys = [], []
    for t in tasks:
        both = [(ga, gb) for k in by_task[t] if (ga := geomean(side_a[k])) is not None and (gb := geomean(side_b[k])) is not None]
        if both:
            xs.append(math.exp(mean([math.log(x) for x, _ in both])))
            ys.append(math.exp(mean([math.log(y) for _, y in both])))
    metrics.append(
        MetricDifference(
            metric="geomean",
            kind="ratio",
            a=math.exp(mean([math.log(x) for x in xs])) if xs else None,
            b=math.exp(mean([math.log(y) for y in ys])) if ys else None,
            difference=paired_ratio(xs, ys),
            tasks=len(xs),
        )
    )
    manifests = {side.label: read_manifest(side.run_dir) for side in (a, b) if side.run_dir is not None}
    recorded = [m for m in manifests.values() if m is not None]
    return Comparison(
        measured_differently=differences(recorded[0], recorded[1]) if len(recorded) == 2 else [],
        unrecorded=[label for label, m in manifests.items() if m is None],
        a=a.label,
        b=b.label,
        paired_on=paired_on,
        pairs=len(pairs),
        tasks=len(tasks),
        only_a=len(set(side_a) - set(side_b)),
        only_b=len(set(side_b) - set(side_a)),
        metrics=metrics,
    )


def _rate(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _points(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:+.1f}"


def _times(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _verdict(m: MetricDifference) -> str:
    d = m.difference
    if d.value is None:
        return "no pairs"
    if not d.has_interval:
        return "no interval (under 2 tasks)"
    if not m.excludes_null:
        return f"includes {m.null:g}: no difference shown"
    if m.kind == "rate":
        return f"excludes 0: B {'higher' if d.value > 0 else 'lower'}"
    return f"excludes 1: B {'faster' if d.value > 1 else 'slower'}"


def render(c: Comparison, console: Console, wide: bool = False) -> None:
    left_out = f"; left out: {c.only_a} only in A, {c.only_b} only in B" if c.only_a or c.only_b else ""
    console.print(
        f"[bold]compare[/] A = {c.a}, B = {c.b}: {c.tasks} tasks, {c.pairs} pairs (same {c.paired_on}){left_out}",
        highlight=False,
    )
    if c.measured_differently:
        console.print(
            "[bold yellow]warning: A and B were measured differently[/] (their manifest.json): "
            + "; ".join(d.describe() for d in c.measured_differently)
            + ". A difference below may come from these as much as from the runs themselves.",
            highlight=False,
        )
    if c.unrecorded:
        console.print(
            f"[yellow]note:[/] {' and '.join(c.unrecorded)} has no manifest.json (made before manifests were written): "
            "whether both were measured on the same machine and settings cannot be checked",
            highlight=False,
        )
    table = compact_table(
        caption=(
            "n: tasks; rates in % of tasks (a task's pairs averaged), B − A in percentage points; geomean over "
            f"the tasks correct on both sides, compared as B / A; 95% interval: {METHOD}"
        )
    )
    add_name_column(table, "metric")
    for header in ("n", "A", "B", "B − A", "95% interval"):
        add_number_column(table, header)
    add_name_column(table, "verdict")
    for m in c.metrics:
        d = m.difference
        if m.kind == "rate":
            a, b, change = _rate(m.a), _rate(m.b), _points(d.value)
            low_high = f"[{_points(d.low)}, {_points(d.high)}]" if d.has_interval else "-"
        else:
            a, b = _times(m.a), _times(m.b)
            change = "-" if d.value is None else f"×{d.value:.2f}"
            low_high = f"[×{d.low:.2f}, ×{d.high:.2f}]" if d.has_interval else "-"
        table.add_row(m.metric, str(m.tasks), a, b, change, low_high, _verdict(m))
    print_table(console, table, wide)
    shown = [m for m in c.metrics if m.excludes_null]
    if shown:
        said = "; ".join(
            f"{m.metric} ({_verdict(m).split(': ', 1)[1]}" + ("; B / A excludes 1)" if m.kind == "ratio" else ")") for m in shown
        )
        rest = len(c.metrics) - len(shown)
        console.print(
            f"[bold]the 95% interval of B − A excludes zero for:[/] {said}; the other {rest} scores show no difference",
            highlight=False,
        )
    else:
        console.print(
            f"[bold]no difference excludes zero[/]: over these {c.tasks} tasks no score tells {c.b} from {c.a} "
            "(more tasks or samples narrow the intervals)",
            highlight=False,
        )
    if min((m.tasks for m in c.metrics if m.difference.has_interval), default=ROUGH) < ROUGH:
        console.print(
            f"(fewer than {ROUGH} tasks: a bootstrap interval is rough there, and tends to be too narrow)",
            highlight=False,
        )
