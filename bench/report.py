"""The paper's tables from results.jsonl: fast_p per level × variant × strategy with 95% intervals,
rates, geomean, tokens, the best speedup against evaluations spent, plots."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict
from rich.console import Console
from rich.table import Table

from bench.experiment import TrajectoryRecord, TurnOutcome, is_correct, read_results
from tools.metrics import TaskOutcome, compile_rate, correctness_rate, fast_p, fast_p_at_k, geomean_speedup
from traces.errors import RunDirError
from traces.stats import RESAMPLES, SEED, Estimate, geomean_estimate, rate_estimate
from traces.terminal import add_name_column, add_number_column, compact_table, print_table
from traces.verdict import Verdict

P_VALUES = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)
PRECISIONS = ("fp32", "fp16", "bf16")


def _precision_order(precision: str) -> tuple[int, str]:
    return (PRECISIONS.index(precision) if precision in PRECISIONS else len(PRECISIONS), precision)


def numerics_of(records: list[TrajectoryRecord]) -> tuple[float | None, bool]:
    """The tolerance and TF32 policy of one precision's records: (None, …) where none recorded one
    (results from before it was recorded) or they disagree."""
    tolerances = {r.tolerance for r in records}
    return (tolerances.pop() if len(tolerances) == 1 else None), any(r.allow_tf32 for r in records)


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
    strategy: str = "refine"
    samples: int = 1
    intervals: dict[str, Estimate] = {}
    """95% intervals, keyed fast_0 … fast_2, correct, compiled, geomean. Over all samples of each
    task: with one sample each value equals the field above; with several, it is the mean over them."""
    fast1_by_turn_intervals: list[Estimate] = []
    correct_by_turn: list[Estimate] = []
    """Share of tasks with a correct kernel within the first k turns, k = 1, 2, ...; empty in reports
    made before it was kept."""
    precision: str = "fp32"
    tolerance: float | None = None
    """atol = rtol the group's results were judged at; None where the results do not record it."""
    allow_tf32: bool = False

    def estimates(self) -> dict[str, Estimate]:
        """The intervals, or the bare values for scores made without them."""
        if self.intervals:
            return self.intervals
        bare = {f"fast_{p}": Estimate(value=v, n=self.tasks) for p, v in self.fast_p.items()}
        return {
            **bare,
            "correct": Estimate(value=self.correct, n=self.tasks),
            "compiled": Estimate(value=self.compiled, n=self.tasks),
            "geomean": Estimate(value=self.geomean_speedup),
        }


class StrategyScores(BaseModel):
    """One strategy over every task and variant it ran (sample 0), for a budget-matched comparison;
    one per precision where the run holds several."""

    model_config = ConfigDict(frozen=True)
    strategy: str
    precision: str = "fp32"
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
    return TaskOutcome(task=record.task, correct=is_correct(record), speedup=record.best_speedup, compiled=record.compiled)


def _is_fast(record: TrajectoryRecord, p: float) -> bool:
    return is_correct(record) and record.best_speedup is not None and record.best_speedup > p


def unit_estimates(units: list[list[TrajectoryRecord]], total: int | None = None) -> dict[str, Estimate]:
    """fast_p for every p, correct, compiled and geomean with 95% intervals; a unit is a task's samples."""
    out = {f"fast_{p:g}": rate_estimate([[_is_fast(r, p) for r in unit] for unit in units], total) for p in P_VALUES}
    out["correct"] = rate_estimate([[is_correct(r) for r in unit] for unit in units], total)
    out["compiled"] = rate_estimate([[r.compiled for r in unit] for unit in units], total)
    out["geomean"] = geomean_estimate([[r.best_speedup for r in unit if is_correct(r) and r.best_speedup] for unit in units])
    return out


def _correct_speedups(turns: Sequence[TurnOutcome]) -> list[float]:
    return [t.speedup for t in turns if t.status is Verdict.CORRECT and t.speedup is not None]


def _fast_1_within(turns: Sequence[TurnOutcome]) -> bool:
    return any(v > 1.0 for v in _correct_speedups(turns))


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
    by_strategy: dict[tuple[str, str], list[TrajectoryRecord]] = defaultdict(list)
    for r in records:
        if r.sample == 0:
            by_strategy[(r.strategy, r.precision)].append(r)
    horizon = max((r.evaluations for r in records), default=0)
    scores = []
    for (strategy, precision), group in sorted(by_strategy.items(), key=lambda item: (item[0][0], _precision_order(item[0][1]))):
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


def score(records: list[TrajectoryRecord]) -> list[GroupScores]:
    groups: dict[tuple[int, str, str, str], list[TrajectoryRecord]] = defaultdict(list)
    for r in records:
        groups[(r.level, r.variant, r.strategy, r.precision)].append(r)
    scores = []
    # One precision's row next to the other's, for the same level, variant and strategy.
    for (level, variant, strategy, precision), group in sorted(
        groups.items(), key=lambda item: (*item[0][:3], _precision_order(item[0][3]))
    ):
        tolerance, allow_tf32 = numerics_of(group)
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
                intervals=unit_estimates([[r for r in group if r.task == t] for t in tasks]),
                fast1_by_turn_intervals=fast1_curve,
                correct_by_turn=_by_turn(first, tasks, _correct_within),
                precision=precision,
                tolerance=tolerance,
                allow_tf32=allow_tf32,
            )
        )
    return scores


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _times(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if value < 10 else f"{value:.3g}"


def _interval(e: Estimate, fmt: Callable[[float | None], str]) -> str:
    """`low–high` in the value's own format, without its unit (the caption gives it)."""
    if not e.has_interval:
        return "-"
    return f"{fmt(e.low).rstrip('%')}–{fmt(e.high).rstrip('%')}"


def _tokens(n: int) -> str:
    if n >= 10_000_000:
        return f"{n / 1e6:.0f}M"
    if n >= 1_000_000:
        return f"{n / 1e6:.1f}M"
    return f"{n / 1e3:.1f}k" if n >= 10_000 else str(n)


def _cell(e: Estimate, kind: str, wide: bool) -> str:
    """A score over its interval: two lines in the compact table, one line in the wide one."""
    fmt = _pct if kind == "rate" else _times
    head = fmt(e.value) + ("x" if kind == "times" and e.value is not None else "")
    low_high = _interval(e, fmt)
    if wide:
        return head if low_high == "-" else f"{head} [{low_high}]"
    return f"{head}\n[dim]{low_high}[/]"


COMPACT_P = (0.0, 1.0, 2.0)


def _caption(samples: int, wide: bool, what_wide_adds: str = "every p, exact tokens") -> str:
    over = f" (each task: the share of its {samples} samples)" if samples > 1 else ""
    where = "[low–high]" if wide else "second line"
    more = "" if wide else f"; --wide: {what_wide_adds}"
    return (
        f"rates in % of tasks{over}; {where}: 95% interval, BCa bootstrap over tasks "
        f"({RESAMPLES} resamples, seed {SEED}), '-' under 2 tasks{more}"
    )


def several_precisions(scores: list[GroupScores] | list[StrategyScores]) -> bool:
    return len({s.precision for s in scores}) > 1


def numerics_lines(scores: list[GroupScores]) -> list[str]:
    """The report's header: each precision's tolerance and TF32 policy, one line each."""
    lines = []
    for precision in sorted({s.precision for s in scores}, key=_precision_order):
        group = [s for s in scores if s.precision == precision]
        tolerances = {s.tolerance for s in group}
        tolerance = tolerances.pop() if len(tolerances) == 1 else None
        judged = "tolerance not recorded (results from before it was)" if tolerance is None else f"atol = rtol = {tolerance:g}"
        tf32 = "allowed" if any(s.allow_tf32 for s in group) else "off"
        lines.append(f"precision {precision}: {judged}, TF32 {tf32}")
    return lines


def render_table(scores: list[GroupScores], wide: bool = False) -> Table:
    """fast_p per level × variant (× strategy × precision) with 95% intervals; compact fits 80 columns."""
    samples = max((s.samples for s in scores), default=1)
    table = compact_table(
        title="fast_p by level and feedback variant: share of tasks correct and faster than p times PyTorch",
        caption=_caption(samples, wide),
    )
    strategies = len({s.strategy for s in scores}) > 1 or any(s.strategy != "refine" for s in scores)
    precisions = several_precisions(scores)
    p_values = P_VALUES if wide else COMPACT_P
    add_number_column(table, "level", justify="left")
    # Compact: strategy and precision are further lines of the variant's cell, so the table keeps its width.
    add_name_column(
        table, "variant" + ("\nstrategy" if strategies and not wide else "") + ("\nprecision" if precisions and not wide else "")
    )
    if strategies and wide:
        add_name_column(table, "strategy")
    if precisions and wide:
        add_name_column(table, "precision")
    add_number_column(table, "tasks")
    for p in p_values:
        add_number_column(table, f"fast_{p:g}")
    for name in ("correct", "compiled", "geomean", "tokens"):
        add_number_column(table, name)
    for s in scores:
        estimates = s.estimates()
        name = s.variant + (f"\n[dim]{s.strategy}[/]" if strategies and not wide else "")
        name += f"\n[bold]{s.precision}[/]" if precisions and not wide else ""
        table.add_row(
            str(s.level),
            name,
            *([s.strategy] if strategies and wide else []),
            *([s.precision] if precisions and wide else []),
            str(s.tasks),
            *[_cell(estimates[f"fast_{p:g}"], "rate", wide) for p in p_values],
            _cell(estimates["correct"], "rate", wide),
            _cell(estimates["compiled"], "rate", wide),
            _cell(estimates["geomean"], "times", wide),
            str(s.tokens) if wide else _tokens(s.tokens),
        )
    return table


COMPACT_TURNS = 8


def _shown_turns(horizon: int, wide: bool) -> list[int]:
    """Every turn, or in the compact table at most COMPACT_TURNS of them, evenly spaced, the last included."""
    if wide or horizon <= COMPACT_TURNS:
        return list(range(1, horizon + 1))
    step = (horizon - 1) / (COMPACT_TURNS - 1)
    return sorted({1 + round(i * step) for i in range(COMPACT_TURNS)})


def render_by_turn(scores: list[GroupScores], wide: bool = False) -> Table | None:
    """fast_1 and the correct rate within the first k turns, per level × variant (None before
    reports kept the correct rate by turn, or with one turn)."""
    shown = [s for s in scores if s.correct_by_turn and s.fast1_by_turn_intervals]
    horizon = max((len(s.correct_by_turn) for s in shown), default=0)
    if horizon < 2:
        return None
    turns = _shown_turns(horizon, wide)
    table = compact_table(
        title="fast_1 and correct by turn: share of tasks with such a kernel within the first k turns",
        caption=_caption(1, wide, what_wide_adds="every turn, intervals on one line"),
    )
    add_number_column(table, "level", justify="left")
    add_name_column(table, "variant")
    add_name_column(table, "score")
    for k in turns:
        add_number_column(table, f"turn {k}" if wide else str(k))
    precisions = several_precisions(scores)
    for s in shown:
        variant = s.variant + (f" {s.strategy}" if s.strategy != "refine" else "") + (f" {s.precision}" if precisions else "")
        for i, (name, curve) in enumerate((("fast_1", s.fast1_by_turn_intervals), ("correct", s.correct_by_turn))):
            # A trajectory that stopped at a correct kernel keeps it: its last value holds for later turns.
            cells = [_cell(curve[min(k, len(curve)) - 1], "rate", wide) for k in turns]
            table.add_row(str(s.level) if i == 0 else "", variant if i == 0 else "", name, *cells)
    return table


def render_strategies(scores: list[StrategyScores], wide: bool = False) -> Table:
    p_values = P_VALUES if wide else COMPACT_P
    table = compact_table(
        title="strategies: fast_p over every task and variant (sample 0), and what each spent",
        caption=_caption(1, wide) + "; evals: mean per run",
    )
    add_name_column(table, "strategy")
    for col in ("runs", *[f"fast_{p:g}" for p in p_values], "correct", "geomean", "evals", "tokens"):
        add_number_column(table, col)
    precisions = several_precisions(scores)
    for s in scores:
        estimates = s.estimates()
        table.add_row(
            s.label(precisions),
            str(s.trajectories),
            *[_cell(estimates[f"fast_{p:g}"], "rate", wide) for p in p_values],
            _cell(estimates["correct"], "rate", wide),
            _cell(estimates["geomean"], "times", wide),
            f"{s.mean_evals:.1f}",
            str(s.tokens) if wide else _tokens(s.tokens),
        )
    return table


def render_by_evals(scores: list[StrategyScores]) -> Table:
    """One row per evaluation count e, one column per strategy: as many evaluations as there are, in 80 columns."""
    horizon = max((len(s.best_by_evals) for s in scores), default=0)
    table = compact_table(title="mean best speedup after e evaluations (0 until a correct kernel)")
    add_number_column(table, "e")
    precisions = several_precisions(scores)
    for s in scores:
        add_number_column(table, s.label(precisions))
    for e in range(horizon):
        table.add_row(str(e + 1), *[f"{s.best_by_evals[e]:.2f}" if e < len(s.best_by_evals) else "-" for s in scores])
    return table


def render_at_k(scores: list[GroupScores], wide: bool = False) -> Table | None:
    rows = [(s, k, v) for s in scores for k, v in s.fast_p_at_k.items()]
    if not rows:
        return None
    p_values = P_VALUES if wide else COMPACT_P
    table = compact_table(title="fast_p@k (repeated sampling; unbiased pass@k estimator over each task's samples)")
    add_number_column(table, "level", justify="left")
    add_name_column(table, "variant")
    add_number_column(table, "k")
    for p in p_values:
        add_number_column(table, f"fast_{p:g}@k")
    precisions = several_precisions(scores)
    for s, k, values in rows:
        variant = s.variant + (f" {s.precision}" if precisions else "")
        table.add_row(str(s.level), variant, k, *[_pct(values[f"{p:g}"]) for p in p_values])
    return table


def plot(scores: list[GroupScores], records: list[TrajectoryRecord], out_dir: Path) -> list[Path]:
    """PNG plots; fast_p and fast_1 carry their 95% intervals as error bars (a band where there are many points)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []

    def line_plot(name: str, series: list[tuple[str, list[float], list[Estimate]]], **labels: object) -> None:
        fig, ax = plt.subplots(figsize=(6, 4))
        for i, (label, xs, estimates) in enumerate(series):
            # Shift each series a little so the error bars of equal values do not hide each other.
            shift = (i - (len(series) - 1) / 2) * 0.02 * ((max(xs) - min(xs)) or 1) if len(series) > 1 and xs else 0.0
            ys = [e.value if e.value is not None else float("nan") for e in estimates]
            lows = [e.value - e.low if e.value is not None and e.low is not None and e.high is not None else 0.0 for e in estimates]
            highs = [e.high - e.value if e.value is not None and e.low is not None and e.high is not None else 0.0 for e in estimates]
            ax.errorbar([x + shift for x in xs], ys, yerr=[lows, highs], marker="o", capsize=3, label=label)
        ax.set(ylim=(-0.02, 1.02), **labels)
        ax.legend()
        ax.grid(alpha=0.3)
        written.append(out_dir / name)
        fig.savefig(written[-1], dpi=120, bbox_inches="tight")
        plt.close(fig)

    precisions = several_precisions(scores)

    def label(s: GroupScores) -> str:
        return f"L{s.level} {s.variant}" + ("" if s.strategy == "refine" else f" {s.strategy}") + (f" {s.precision}" if precisions else "")

    line_plot(
        "fast_p.png",
        [(label(s), list(P_VALUES), [s.estimates()[f"fast_{p:g}"] for p in P_VALUES]) for s in scores],
        xlabel="speedup threshold p",
        ylabel="fast_p",
        title="fast_p against p (bars: 95% interval over tasks)",
    )
    line_plot(
        "fast1_by_turn.png",
        [
            (label(s), list(range(1, len(s.fast1_by_turn) + 1)), s.fast1_by_turn_intervals or [Estimate(value=v) for v in s.fast1_by_turn])
            for s in scores
            if s.fast1_by_turn
        ],
        xlabel="turn",
        ylabel="fast_1",
        title="fast_1 against refinement turns (bars: 95% interval over tasks)",
    )
    if any(s.correct_by_turn for s in scores):
        line_plot(
            "correct_by_turn.png",
            [(label(s), list(range(1, len(s.correct_by_turn) + 1)), s.correct_by_turn) for s in scores if s.correct_by_turn],
            xlabel="turn",
            ylabel="correct rate",
            title="tasks with a correct kernel within k turns (bars: 95% interval)",
        )

    fig, ax = plt.subplots(figsize=(6, 4))
    by_variant: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if is_correct(r) and r.best_speedup:
            by_variant[r.variant + (f" {r.precision}" if precisions else "")].append(r.best_speedup)
    if by_variant:
        ax.hist(list(by_variant.values()), label=list(by_variant), bins=12)
        ax.legend()
    ax.axvline(1.0, color="grey", linestyle="--")
    ax.set(xlabel="speedup of the best correct kernel", ylabel="trajectories", title="speedup distribution")
    written.append(out_dir / "speedups.png")
    fig.savefig(written[-1], dpi=120, bbox_inches="tight")
    plt.close(fig)

    strategies = score_strategies(records)
    if any(s.strategy != "refine" for s in strategies):
        fig, ax = plt.subplots(figsize=(6, 4))
        for s in strategies:
            ax.plot(range(1, len(s.best_by_evals) + 1), s.best_by_evals, marker="o", label=s.label(several_precisions(strategies)))
        ax.axhline(1.0, color="grey", linestyle="--")
        ax.set(xlabel="evaluations spent", ylabel="mean best speedup", title="best speedup against evaluations spent")
        ax.legend()
        ax.grid(alpha=0.3)
        written.append(out_dir / "best_by_evals.png")
        fig.savefig(written[-1], dpi=120, bbox_inches="tight")
        plt.close(fig)
    return written


def has_strategies(strategies: list[StrategyScores]) -> bool:
    return len({s.strategy for s in strategies}) > 1 or any(s.strategy != "refine" for s in strategies)


def report(run_dir: Path, console: Console | None = None, plots: bool = True, wide: bool = False) -> list[GroupScores]:
    records = read_results(run_dir)
    if not records:
        raise RunDirError(
            f"{run_dir} has no finished trajectories (no records in {Path(run_dir) / 'results.jsonl'}); "
            "run `refinery experiment --run-dir` on it first"
        )
    scores = score(records)
    strategies = score_strategies(records)
    (Path(run_dir) / "report.json").write_text(json.dumps([s.model_dump() for s in scores], indent=2))
    if has_strategies(strategies):
        (Path(run_dir) / "strategies.json").write_text(json.dumps([s.model_dump() for s in strategies], indent=2))
    if console is not None:
        for line in numerics_lines(scores):
            console.print(line, highlight=False, markup=False)
        print_table(console, render_table(scores, wide=wide), wide)
        by_turn = render_by_turn(scores, wide=wide)
        if by_turn is not None:
            print_table(console, by_turn, wide)
        if has_strategies(strategies):
            print_table(console, render_strategies(strategies, wide=wide), wide)
            print_table(console, render_by_evals(strategies), wide)
        at_k = render_at_k(scores, wide=wide)
        if at_k is not None:
            print_table(console, at_k, wide)
    if plots:
        for path in plot(scores, records, Path(run_dir) / "plots"):
            if console is not None:
                console.print(f"plot: {path}", highlight=False)
    return scores
