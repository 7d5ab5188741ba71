"""The paper's tables from results.jsonl: fast_p per level × variant × strategy, rates, geomean,
tokens, the best speedup against evaluations spent, plots."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from pydantic import BaseModel, ConfigDict
from rich.console import Console
from rich.table import Table

from bench.experiment import TrajectoryRecord, is_correct, read_results
from tools.metrics import TaskOutcome, compile_rate, correctness_rate, fast_p, fast_p_at_k, geomean_speedup

P_VALUES = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)


class GroupScores(BaseModel):
    """Scores of one level × variant group, over its tasks (sample 0 unless samples are pooled)."""

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


class StrategyScores(BaseModel):
    """One strategy over every task and variant it ran (sample 0), for a budget-matched comparison."""

    model_config = ConfigDict(frozen=True)
    strategy: str
    trajectories: int
    fast_p: dict[str, float]
    correct: float
    geomean_speedup: float | None
    mean_evals: float
    tokens: int
    best_by_evals: list[float]
    """Mean over trajectories of the best correct speedup within the first e evaluations (0 before
    any correct kernel), for e = 1, 2, …"""


def _outcome(record: TrajectoryRecord) -> TaskOutcome:
    return TaskOutcome(task=record.task, correct=is_correct(record), speedup=record.best_speedup, compiled=record.compiled)


def _fast1_by_turn(records: list[TrajectoryRecord], n_tasks: int) -> list[float]:
    """fast_1 of the best correct kernel found within the first k turns, for each k."""
    horizon = max((len(r.per_turn) for r in records), default=0)
    curve = []
    for k in range(1, horizon + 1):
        hits = 0
        for r in records:
            speeds = [s for status, s in r.per_turn[:k] if status == "correct" and s is not None]
            hits += bool(speeds) and max(speeds) > 1.0
        curve.append(hits / n_tasks if n_tasks else 0.0)
    return curve


def best_by_evals(records: list[TrajectoryRecord], horizon: int | None = None) -> list[float]:
    """Mean best correct speedup after e evaluations, e = 1..horizon (a reply without code costs none)."""
    series = []
    for r in records:
        best, curve = 0.0, []
        for status, speedup in r.per_turn:
            if status == "no_code":
                continue
            if status == "correct" and speedup is not None:
                best = max(best, speedup)
            curve.append(best)
        series.append(curve)
    horizon = horizon if horizon is not None else max((len(c) for c in series), default=0)
    # A trajectory that stopped early keeps its best for the evaluations it did not spend.
    return [
        sum((c[min(e, len(c)) - 1] if c else 0.0) for c in series) / len(series) if series else 0.0
        for e in range(1, horizon + 1)
    ]


def score_strategies(records: list[TrajectoryRecord]) -> list[StrategyScores]:
    by_strategy: dict[str, list[TrajectoryRecord]] = defaultdict(list)
    for r in records:
        if r.sample == 0:
            by_strategy[r.strategy].append(r)
    horizon = max((r.evaluations for r in records), default=0)
    scores = []
    for strategy, group in sorted(by_strategy.items()):
        outcomes = [_outcome(r) for r in group]
        scores.append(
            StrategyScores(
                strategy=strategy, trajectories=len(group),
                fast_p={f"{p:g}": fast_p(outcomes, p, total=len(group)) for p in P_VALUES},
                correct=correctness_rate(outcomes, total=len(group)),
                geomean_speedup=geomean_speedup(outcomes),
                mean_evals=sum(r.evaluations for r in group) / len(group),
                tokens=sum(r.tokens for r in group),
                best_by_evals=best_by_evals(group, horizon),
            )
        )
    return scores


def score(records: list[TrajectoryRecord]) -> list[GroupScores]:
    groups: dict[tuple[int, str, str], list[TrajectoryRecord]] = defaultdict(list)
    for r in records:
        groups[(r.level, r.variant, r.strategy)].append(r)
    scores = []
    for (level, variant, strategy), group in sorted(groups.items()):
        first = [r for r in group if r.sample == 0]
        tasks = sorted({r.task for r in group})
        outcomes = [_outcome(r) for r in first]
        samples = max(r.sample for r in group) + 1
        at_k: dict[str, dict[str, float]] = {}
        if samples > 1:
            per_task = [[_outcome(r) for r in group if r.task == t] for t in tasks]
            for k in range(1, samples + 1):
                at_k[str(k)] = {f"{p:g}": fast_p_at_k(per_task, p, k, total=len(tasks)) for p in P_VALUES}
        scores.append(
            GroupScores(
                level=level, variant=variant, tasks=len(tasks),
                fast_p={f"{p:g}": fast_p(outcomes, p, total=len(tasks)) for p in P_VALUES},
                correct=correctness_rate(outcomes, total=len(tasks)),
                compiled=compile_rate(outcomes, total=len(tasks)),
                geomean_speedup=geomean_speedup(outcomes),
                tokens=sum(r.tokens for r in group),
                fast_p_at_k=at_k,
                fast1_by_turn=_fast1_by_turn(first, len(tasks)),
                strategy=strategy,
            )
        )
    return scores


def render_table(scores: list[GroupScores]) -> Table:
    table = Table(title="fast_p by level and feedback variant (KernelBench definition: correct and speedup > p, over all tasks)")
    strategies = len({s.strategy for s in scores}) > 1 or any(s.strategy != "refine" for s in scores)
    table.add_column("level")
    table.add_column("variant")
    if strategies:
        table.add_column("strategy")
    table.add_column("tasks", justify="right")
    for p in P_VALUES:
        table.add_column(f"fast_{p:g}", justify="right")
    for name in ("correct", "compiled", "geomean", "tokens"):
        table.add_column(name, justify="right")
    for s in scores:
        table.add_row(
            str(s.level), s.variant, *([s.strategy] if strategies else []), str(s.tasks), *[f"{s.fast_p[f'{p:g}']:.2f}" for p in P_VALUES],
            f"{s.correct:.2f}", f"{s.compiled:.2f}", f"{s.geomean_speedup:.2f}x" if s.geomean_speedup else "-", str(s.tokens),
        )
    return table


def render_strategies(scores: list[StrategyScores]) -> Table:
    table = Table(title="strategies: fast_p over every task and variant, cost, and the best speedup after e evaluations")
    for col in ("strategy", "runs", *[f"fast_{p:g}" for p in P_VALUES], "correct", "geomean", "evals", "tokens"):
        table.add_column(col, justify="right")
    for s in scores:
        table.add_row(
            s.strategy, str(s.trajectories), *[f"{s.fast_p[f'{p:g}']:.2f}" for p in P_VALUES], f"{s.correct:.2f}",
            f"{s.geomean_speedup:.2f}x" if s.geomean_speedup else "-", f"{s.mean_evals:.1f}", str(s.tokens),
        )
    return table


def render_by_evals(scores: list[StrategyScores]) -> Table:
    horizon = max((len(s.best_by_evals) for s in scores), default=0)
    table = Table(title="mean best speedup after e evaluations (0 until a correct kernel)")
    table.add_column("strategy")
    for e in range(1, horizon + 1):
        table.add_column(f"e={e}", justify="right")
    for s in scores:
        table.add_row(s.strategy, *[f"{v:.2f}" for v in s.best_by_evals])
    return table


def render_at_k(scores: list[GroupScores]) -> Table | None:
    rows = [(s, k, v) for s in scores for k, v in s.fast_p_at_k.items()]
    if not rows:
        return None
    table = Table(title="fast_p@k (repeated sampling)")
    for col in ("level", "variant", "k", *[f"fast_{p:g}@k" for p in P_VALUES]):
        table.add_column(col, justify="right")
    for s, k, values in rows:
        table.add_row(str(s.level), s.variant, k, *[f"{values[f'{p:g}']:.2f}" for p in P_VALUES])
    return table


def plot(scores: list[GroupScores], records: list[TrajectoryRecord], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []

    def line_plot(name: str, series: list[tuple[str, list[float], list[float]]], **labels: object) -> None:
        fig, ax = plt.subplots(figsize=(6, 4))
        for label, xs, ys in series:
            ax.plot(xs, ys, marker="o", label=label)
        ax.set(ylim=(-0.02, 1.02), **labels)
        ax.legend()
        ax.grid(alpha=0.3)
        written.append(out_dir / name)
        fig.savefig(written[-1], dpi=120, bbox_inches="tight")
        plt.close(fig)

    line_plot(
        "fast_p.png",
        [(f"L{s.level} {s.variant}", list(P_VALUES), [s.fast_p[f"{p:g}"] for p in P_VALUES]) for s in scores],
        xlabel="speedup threshold p", ylabel="fast_p", title="fast_p against p",
    )
    line_plot(
        "fast1_by_turn.png",
        [(f"L{s.level} {s.variant}", list(range(1, len(s.fast1_by_turn) + 1)), s.fast1_by_turn) for s in scores if s.fast1_by_turn],
        xlabel="turn", ylabel="fast_1", title="fast_1 against refinement turns",
    )

    fig, ax = plt.subplots(figsize=(6, 4))
    by_variant: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if is_correct(r) and r.best_speedup:
            by_variant[r.variant].append(r.best_speedup)
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
            ax.plot(range(1, len(s.best_by_evals) + 1), s.best_by_evals, marker="o", label=s.strategy)
        ax.axhline(1.0, color="grey", linestyle="--")
        ax.set(xlabel="evaluations spent", ylabel="mean best speedup", title="best speedup against evaluations spent")
        ax.legend()
        ax.grid(alpha=0.3)
        written.append(out_dir / "best_by_evals.png")
        fig.savefig(written[-1], dpi=120, bbox_inches="tight")
        plt.close(fig)
    return written


def report(run_dir: Path, console: Console | None = None, plots: bool = True) -> list[GroupScores]:
    records = read_results(run_dir)
    if not records:
        raise FileNotFoundError(f"{run_dir} has no finished trajectories (no results.jsonl); run `refinery experiment` first")
    scores = score(records)
    strategies = score_strategies(records)
    (Path(run_dir) / "report.json").write_text(json.dumps([s.model_dump() for s in scores], indent=2))
    if len(strategies) > 1 or any(s.strategy != "refine" for s in strategies):
        (Path(run_dir) / "strategies.json").write_text(json.dumps([s.model_dump() for s in strategies], indent=2))
    if console is not None:
        console.print(render_table(scores))
        if len(strategies) > 1 or any(s.strategy != "refine" for s in strategies):
            console.print(render_strategies(strategies))
            console.print(render_by_evals(strategies))
        at_k = render_at_k(scores)
        if at_k is not None:
            console.print(at_k)
    if plots:
        for path in plot(scores, records, Path(run_dir) / "plots"):
            if console is not None:
                console.print(f"plot: {path}")
    return scores
