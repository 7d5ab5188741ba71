"""The paper's tables from results.jsonl, as traces/scoring.py scores them: fast_p per level ×
variant × strategy with 95% intervals, rates, geomean, tokens, the best speedup against
evaluations spent, plots."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kernel_refinery.bench.experiment import TrajectoryRecord, read_results
from kernel_refinery.core.errors import RunDirError
from kernel_refinery.core.numerics import Precision
from kernel_refinery.core.stats import RESAMPLES, SEED, Estimate
from kernel_refinery.core.strategy import Strategy
from kernel_refinery.traces.manifest import RunManifest, read_manifest
from kernel_refinery.traces.scoring import (  # the scores themselves live in traces/scoring.py (shared with the HTML report)
    P_VALUES,
    GroupScores,
    StrategyScores,
    best_by_evals,
    has_strategies,
    numerics_of,
    score,
    score_strategies,
    several_precisions,
    unit_estimates,
)
from kernel_refinery.traces.terminal import add_name_column, add_number_column, compact_table, print_table

__all__ = [
    "P_VALUES",
    "GroupScores",
    "StrategyScores",
    "best_by_evals",
    "numerics_of",
    "report",
    "score",
    "score_strategies",
    "unit_estimates",
]


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


def _tasks_cell(s: GroupScores, wide: bool) -> str:
    """The group's task count; `*` and how many where some tasks' references are degenerate."""
    if not s.degenerate_tasks:
        return str(s.tasks)
    return f"{s.tasks} ({len(s.degenerate_tasks)}*)" if wide else f"{s.tasks}\n[yellow]{len(s.degenerate_tasks)}*[/]"


def degenerate_line(scores: list[GroupScores]) -> str | None:
    """The tasks the table marks with `*`: their references measure nothing (tools/steps/degenerate.py)."""
    tasks = sorted({t for s in scores for t in s.degenerate_tasks})
    if not tasks:
        return None
    return (
        f"*: degenerate tasks, whose reference's outputs on random inputs are all zeros, one constant or the same "
        f"on every input (a correct kernel there needs no computing): {', '.join(tasks)}"
    )


def general_line(scores: list[GroupScores]) -> str:
    """What the general column counts."""
    if all(s.general is None for s in scores):
        return "general: - (shape and init variants were off: eval.shapes = off, or results from before them)"
    return (
        "general: correct, and the best kernel passed every shape and init variant of the task's constants "
        "that applies (eval.shapes; the other sizes and hyper-parameters tools/steps/shape_variants.py chose)"
    )


def _caption(samples: int, wide: bool, what_wide_adds: str = "every p, exact tokens") -> str:
    over = f" (each task: the share of its {samples} samples)" if samples > 1 else ""
    where = "[low–high]" if wide else "second line"
    more = "" if wide else f"; --wide: {what_wide_adds}"
    return (
        f"rates in % of tasks{over}; {where}: 95% interval, BCa bootstrap over tasks "
        f"({RESAMPLES} resamples, seed {SEED}), '-' under 2 tasks{more}"
    )


def numerics_lines(scores: list[GroupScores]) -> list[str]:
    """The report's header: each precision's tolerance and TF32 policy, one line each."""
    lines = []
    for precision in sorted({s.precision for s in scores}, key=lambda p: Precision(p).order):
        lines.append(f"precision {numerics_of([s for s in scores if s.precision == precision]).describe()}")
    return lines


def measured_line(manifest: RunManifest | None) -> str:
    """The report's first line: where and how the run was measured (traces/manifest.py)."""
    if manifest is None:
        return "measured: no manifest.json (a run made before manifests were written)"
    return f"measured: {manifest.summary()}"


def noise_line(scores: list[GroupScores]) -> str:
    """How many fast_1 entries lie within their task's A/A noise band (tools/steps/timing_stage.py)."""
    fast_1 = sum(round(s.fast_p.get("1", 0.0) * s.tasks) for s in scores)
    within = sum(s.fast_1_within_noise for s in scores)
    return (
        f"fast_1 within the noise band: {within} of {fast_1} (a speedup inside its task's A/A band: "
        "above 1, but no difference from the reference the timing could show)"
    )


def render_table(scores: list[GroupScores], wide: bool = False) -> Table:
    """fast_p per level × variant (× strategy × precision) with 95% intervals; compact fits 80 columns.

    `general` (shape and init variants passed, next to `correct`) is shown where the run checked
    variants; in the compact table it then takes the place of `compiled`, which --wide keeps."""
    samples = max((s.samples for s in scores), default=1)
    general = any(s.general is not None for s in scores)
    compiled = wide or not general
    table = compact_table(
        title="fast_p by level and feedback variant: share of tasks correct and faster than p times PyTorch",
        caption=_caption(samples, wide, "every p, exact tokens" + ("" if compiled else ", compiled")),
    )
    strategies = len({s.strategy for s in scores}) > 1 or any(s.strategy != Strategy.REFINE for s in scores)
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
    for name in ("correct", *(["general"] if general else []), *(["compiled"] if compiled else []), "geomean", "tokens"):
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
            _tasks_cell(s, wide),
            *[_cell(estimates[f"fast_{p:g}"], "rate", wide) for p in p_values],
            _cell(estimates["correct"], "rate", wide),
            *([_cell(s.general_estimate(), "rate", wide)] if general else []),
            *([_cell(estimates["compiled"], "rate", wide)] if compiled else []),
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
        variant = s.variant + (f" {s.strategy}" if s.strategy != Strategy.REFINE else "") + (f" {s.precision}" if precisions else "")
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
        strategy = "" if s.strategy == Strategy.REFINE else f" {s.strategy}"
        return f"L{s.level} {s.variant}{strategy}" + (f" {s.precision}" if precisions else "")

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
        if r.correct and r.best_speedup:
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
    if any(s.strategy != Strategy.REFINE for s in strategies):
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


def report(run_dir: Path, console: Console | None = None, plots: bool = True, wide: bool = False) -> list[GroupScores]:
    records = read_results(run_dir)
    if not records:
        raise RunDirError(
            f"{run_dir} has no finished trajectories (no records in {Path(run_dir) / 'results.jsonl'}); "
            "run `refinery experiment --run-dir` on it first"
        )
    scores = score(records)
    strategies = score_strategies(records)
    manifest = read_manifest(run_dir)
    saved = {"manifest": manifest.model_dump(mode="json") if manifest else None, "groups": [s.model_dump() for s in scores]}
    (Path(run_dir) / "report.json").write_text(json.dumps(saved, indent=2))
    if has_strategies(strategies):
        (Path(run_dir) / "strategies.json").write_text(json.dumps([s.model_dump() for s in strategies], indent=2))
    if console is not None:
        console.print(measured_line(manifest), highlight=False, markup=False)
        for line in numerics_lines(scores):
            console.print(line, highlight=False, markup=False)
        print_table(console, render_table(scores, wide=wide), wide)
        console.print(noise_line(scores), highlight=False, markup=False)
        console.print(general_line(scores), highlight=False, markup=False)
        degenerate = degenerate_line(scores)
        if degenerate is not None:
            console.print(degenerate, highlight=False, markup=False)
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
