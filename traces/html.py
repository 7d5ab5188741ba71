"""A run's traces as one self-contained HTML page: CSS and JS inlined, charts as inline SVG.

The page is built from typed views of the records (below) and the jinja template in
traces/assets/report.html.j2. Every turn carries `data-node-id` / `data-parent-id`, and diffs
go against `parent_of`, so a beam search's records can later be drawn as a tree on the same page.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup, escape
from pygments import lex
from pygments.formatters import HtmlFormatter
from pygments.lexers import CppLexer, CudaLexer, DiffLexer, PythonLexer
from pygments.token import String

from kernel_refinery.core.stats import METHOD, Estimate
from kernel_refinery.core.strategy import Strategy
from kernel_refinery.core.verdict import Verdict, best
from kernel_refinery.traces.inspect import (
    Trajectory,
    TrajectorySummary,
    TurnVerdict,
    diff_base,
    diff_records,
    feedback_of,
    format_interval,
    format_speedup,
    human_prompt,
    profile_table,
    summarise,
    tasks_of,
    variants_of,
    verdict_of,
)
from kernel_refinery.traces.manifest import RunManifest
from kernel_refinery.traces.schema import TrajectoryId, TurnRecord
from kernel_refinery.traces.scoring import P_VALUES, GroupScores, score

ASSETS = Path(__file__).parent / "assets"
_FORMATTER = HtmlFormatter(cssclass="hl", linenos="inline", style="default")
_DIFF_FORMATTER = HtmlFormatter(cssclass="hl", style="default")


def _anchor(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-")


def _trajectory_anchor(trajectory: TrajectoryId) -> str:
    return "traj-" + _anchor(trajectory.slug)


# A triple-quoted string that holds C++ or CUDA source, as load_inline candidates embed it.
_EMBEDDED = re.compile(r'([rR]?""")(.*?)(""")', re.S)
_NATIVE_MARKERS = ("#include", "torch::", "__global__", "at::")


def _code_tokens(code: str) -> Iterator[tuple[Any, str]]:
    """Python tokens, with the C++/CUDA inside a kernel's source string lexed as C++/CUDA."""
    python = PythonLexer(stripnl=False, ensurenl=False)
    position = 0
    for found in _EMBEDDED.finditer(code):
        body = found.group(2)
        if not any(marker in body for marker in _NATIVE_MARKERS):
            continue
        native = CudaLexer if "__global__" in body else CppLexer
        yield from lex(code[position : found.end(1)], python)
        yield from lex(body, native(stripnl=False, ensurenl=False))
        yield (String.Double, found.group(3))
        position = found.end()
    yield from lex(code[position:], python)


def _format(formatter: HtmlFormatter, tokens: Iterable[tuple[Any, str]]) -> Markup:
    out = io.StringIO()
    formatter.format(tokens, out)
    # The formatter escapes every token, so its output is safe markup.
    return Markup(out.getvalue())  # noqa: S704 - escaped by the formatter


def highlight_code(code: str) -> Markup:
    return _format(_FORMATTER, _code_tokens(code))


def highlight_diff(lines: Sequence[str]) -> Markup:
    return _format(_DIFF_FORMATTER, lex("\n".join(lines) + "\n", DiffLexer(stripnl=False)))


@dataclass(frozen=True)
class ChartPoint:
    turn: int
    status: Verdict
    speedup: float | None
    anchor: str


_CHART_W, _CHART_H = 560, 200
_PAD_L, _PAD_R, _PAD_T, _PAD_B = 52, 16, 14, 58
_MARK_Y = 8
"""Turns without a timed kernel are marked this far below the plot, apart from low speedups."""
_TICKS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


def speedup_chart(points: Sequence[ChartPoint]) -> Markup:
    """An inline SVG: speedup per turn on a log scale; turns without a timed kernel as status marks."""
    turns = sorted({p.turn for p in points}) or [1]
    first, last = turns[0], turns[-1]
    plot_w = _CHART_W - _PAD_L - _PAD_R
    plot_h = _CHART_H - _PAD_T - _PAD_B
    timed = [p for p in points if p.speedup is not None and p.speedup > 0]
    values = [p.speedup for p in timed if p.speedup is not None] + [1.0]
    low, high = math.log10(min(values)) - 0.15, math.log10(max(values)) + 0.15

    def x(turn: int) -> float:
        return _PAD_L + (plot_w / 2 if first == last else (turn - first) / (last - first) * plot_w)

    def y(speedup: float) -> float:
        return _PAD_T + (high - math.log10(speedup)) / (high - low) * plot_h

    parts = [
        f'<svg class="speedup-chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_CHART_W} {_CHART_H}" '
        f'width="{_CHART_W}" height="{_CHART_H}" role="img" aria-label="speedup per turn">',
        f'<rect class="plot" x="{_PAD_L}" y="{_PAD_T}" width="{plot_w}" height="{plot_h}"/>',
    ]
    ticks = [t for t in _TICKS if low <= math.log10(t) <= high]
    while len(ticks) > 6:
        ticks = ticks[::2] if 1 in ticks[::2] else ticks[1::2]
    for tick in ticks:
        cls = "ref" if tick == 1 else "grid"
        parts.append(f'<line class="{cls}" x1="{_PAD_L}" x2="{_PAD_L + plot_w}" y1="{y(tick):.1f}" y2="{y(tick):.1f}"/>')
        parts.append(f'<text class="tick" x="{_PAD_L - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick:g}x</text>')
    step = max(1, math.ceil(len(turns) / 12))
    for turn in turns[::step]:
        parts.append(f'<text class="tick" x="{x(turn):.1f}" y="{_PAD_T + plot_h + 32}" text-anchor="middle">{turn}</text>')
    parts.append(f'<text class="axis" x="{_PAD_L + plot_w / 2:.1f}" y="{_CHART_H - 6}" text-anchor="middle">turn</text>')
    if len(timed) > 1:
        path = " ".join(f"{x(p.turn):.1f},{y(p.speedup or 1):.1f}" for p in sorted(timed, key=lambda p: p.turn))
        parts.append(f'<polyline class="line" points="{path}"/>')
    for p in timed:
        title = escape(f"turn {p.turn}: {format_speedup(p.speedup)}")
        parts.append(
            f'<a href="#{p.anchor}"><circle class="point status-{p.status}" cx="{x(p.turn):.1f}" cy="{y(p.speedup or 1):.1f}" r="5">'
            f"<title>{title}</title></circle></a>"
        )
    if len(timed) < len(points):
        parts.append(f'<text class="tick" x="{_PAD_L - 6}" y="{_PAD_T + plot_h + _MARK_Y + 8}" text-anchor="end">untimed</text>')
    for p in points:
        if p in timed:
            continue
        title = escape(f"turn {p.turn}: {p.status}")
        parts.append(
            f'<a href="#{p.anchor}"><rect class="mark status-{p.status}" x="{x(p.turn) - 4:.1f}" y="{_PAD_T + plot_h + _MARK_Y}" '
            f'width="8" height="8"><title>{title}</title></rect></a>'
        )
    if not timed:
        parts.append(
            f'<text class="empty" x="{_PAD_L + plot_w / 2:.1f}" y="{_PAD_T + plot_h / 2:.1f}" text-anchor="middle">no correct turn</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704 - every interpolated text is escaped


@dataclass(frozen=True)
class TurnView:
    anchor: str
    record: TurnRecord
    verdict: TurnVerdict
    feedback: str
    prompt: str
    code_html: Markup | None
    diff_html: Markup | None
    diff_base_turn: int | None
    diff_change: str
    profile: str
    seconds: float
    open: bool

    @property
    def speedup(self) -> str:
        return format_speedup(self.record.speedup)


@dataclass(frozen=True)
class TrajectoryView:
    anchor: str
    summary: TrajectorySummary
    turns: tuple[TurnView, ...]
    chart: Markup
    tree: Markup | None = None
    """A search strategy's tree of kernels (nested lists by parent_id); None for a refinement trajectory."""

    @property
    def label(self) -> str:
        return self.summary.trajectory.label


@dataclass(frozen=True)
class GridCell:
    summary: TrajectorySummary
    anchor: str
    samples: int

    @property
    def fast(self) -> bool:
        return (self.summary.best_speedup or 0.0) > 1.0


@dataclass(frozen=True)
class GridColumn:
    """One column of the overview: a variant, with the strategy and precision where the run holds several."""

    variant: str
    strategy: str
    precision: str
    label: str

    def holds(self, trajectory: TrajectoryId) -> bool:
        return (trajectory.variant, trajectory.strategy, trajectory.precision) == (self.variant, self.strategy, self.precision)


@dataclass(frozen=True)
class GridRow:
    task: str
    cells: tuple[GridCell | None, ...]


@dataclass(frozen=True)
class FastPRow:
    """One group's scores as `refinery report` gives them (traces/scoring.py), for the page."""

    group: GroupScores
    label: str
    correct: Estimate
    general: Estimate
    """Correct and passed every shape and init variant that applies; no value where they were off."""
    fast: tuple[Estimate, ...]
    geomean: Estimate


@dataclass(frozen=True)
class ReportView:
    title: str
    generated: str
    models: tuple[str, ...]
    variants: tuple[str, ...]
    columns: tuple[GridColumn, ...]
    grid: tuple[GridRow, ...]
    p_values: tuple[float, ...]
    fast_p: tuple[FastPRow, ...]
    degenerate: tuple[str, ...]
    """Tasks whose reference measures nothing (GroupScores.degenerate_tasks), marked `*` in the fast_p table."""
    interval_method: str
    trajectories: tuple[TrajectoryView, ...]
    tokens: int
    turns: int


def _turn_anchor(trajectory_anchor: str, record: TurnRecord) -> str:
    node = f"-{_anchor(record.node_id)}" if record.node_id else ""
    return f"{trajectory_anchor}-turn-{record.turn}{node}"


def trajectory_view(summary: TrajectorySummary) -> TrajectoryView:
    trajectory = summary.trajectory
    anchor = _trajectory_anchor(trajectory.id)
    records = trajectory.records
    # The best turn starts open; without one, the last turn (how it ended).
    focus = summary.best if summary.best is not None and summary.best.status is Verdict.CORRECT else (records[-1] if records else None)
    turns = []
    for record in records:
        base = diff_base(record, records)
        diff_html: Markup | None = None
        change = ""
        if base is not None and record.code is not None:
            diff = diff_records(base, record)
            diff_html = highlight_diff(diff.lines) if diff.lines else None
            change = f"{diff.status_change}, speedup {diff.speedup_change}"
        turns.append(
            TurnView(
                anchor=_turn_anchor(anchor, record),
                record=record,
                verdict=verdict_of(record),
                feedback=feedback_of(record),
                prompt=human_prompt(record),
                code_html=highlight_code(record.code) if record.code is not None else None,
                diff_html=diff_html,
                diff_base_turn=base.turn if base is not None and record.code is not None else None,
                diff_change=change,
                profile=profile_table(record),
                seconds=sum(record.phase_seconds.values()),
                open=record is focus,
            )
        )
    points = [ChartPoint(turn=t.record.turn, status=t.record.status, speedup=t.record.speedup, anchor=t.anchor) for t in turns]
    return TrajectoryView(anchor=anchor, summary=summary, turns=tuple(turns), chart=speedup_chart(points), tree=search_tree(turns))


def search_tree(turns: Sequence[TurnView]) -> Markup | None:
    """Nested lists of the kernels by parent_id, each with its idea, verdict and a link to its turn."""
    nodes = [t for t in turns if t.record.node_id is not None]
    if not nodes:
        return None
    ids = {t.record.node_id for t in nodes}
    children: dict[str | None, list[TurnView]] = {}
    for t in nodes:
        # A parent missing from the trace (a torn file) hangs its children from the root.
        parent = t.record.parent_id if t.record.parent_id in ids else None
        children.setdefault(parent, []).append(t)

    def items(parent: str | None) -> str:
        out = []
        for t in children.get(parent, []):
            r = t.record
            speed = f" · {escape(format_speedup(r.speedup))}" if r.speedup is not None else ""
            idea = f' <span class="idea">{escape(r.idea)}</span>' if r.idea else ""
            below = items(r.node_id)
            out.append(
                f'<li><a class="badge status-{escape(r.status)}" href="#{escape(t.anchor)}">'
                f"<b>{escape(r.node_id or '')}</b> {escape(r.status.words)}{speed}</a>{idea}"
                + (f"<ul>{below}</ul>" if below else "")
                + "</li>"
            )
        return "".join(out)

    # Every string above is escaped, so the tree is safe markup.
    return Markup(f'<ul class="search-tree"><li><span class="root">reference</span><ul>{items(None)}</ul></li></ul>')  # noqa: S704 - escaped above


def _several(values: Iterable[object]) -> bool:
    return len(set(values)) > 1


def grid_columns(ids: Sequence[TrajectoryId]) -> tuple[GridColumn, ...]:
    """Variant × strategy × precision, as the run holds them; a column names only what varies."""
    strategies = _several(i.strategy for i in ids) or any(i.strategy != Strategy.REFINE for i in ids)
    precisions = _several(i.precision for i in ids)
    kinds = sorted({i.without("task", "sample") for i in ids})
    columns = []
    for variant, strategy, precision in (tuple(map(str, k)) for k in kinds):
        label = " · ".join([variant, *([strategy] if strategies else []), *([precision] if precisions else [])])
        columns.append(GridColumn(variant=variant, strategy=strategy, precision=precision, label=label))
    return tuple(columns)


def overview_grid(summaries: Sequence[TrajectorySummary], columns: Sequence[GridColumn]) -> tuple[GridRow, ...]:
    """Tasks × columns; a cell holds the best of that task's samples in the column (kernel_refinery.core.verdict.best)."""
    rows = []
    for task in tasks_of(s.trajectory for s in summaries):
        cells: list[GridCell | None] = []
        for column in columns:
            group = [s for s in summaries if s.id.task == task and column.holds(s.id)]
            found = best(group)
            cells.append(None if found is None else GridCell(summary=found, anchor=_trajectory_anchor(found.id), samples=len(group)))
        rows.append(GridRow(task=task, cells=tuple(cells)))
    return tuple(rows)


def fast_p_rows(summaries: Sequence[TrajectorySummary]) -> tuple[FastPRow, ...]:
    """fast_p per level × variant × strategy × precision, scored as `refinery report` scores the
    run's results (traces/scoring.py), from each trajectory's record built from its trace."""
    scores = score([s.record() for s in summaries])
    levels = _several(g.level for g in scores)
    strategies = _several(g.strategy for g in scores) or any(g.strategy != Strategy.REFINE for g in scores)
    precisions = _several(g.precision for g in scores)
    rows = []
    for g in scores:
        parts = [
            *([f"L{g.level}"] if levels else []),
            g.variant,
            *([g.strategy] if strategies else []),
            *([g.precision] if precisions else []),
        ]
        estimates = g.estimates()
        rows.append(
            FastPRow(
                group=g,
                label=" · ".join(parts),
                correct=estimates["correct"],
                general=g.general_estimate(),
                fast=tuple(estimates[f"fast_{p:g}"] for p in P_VALUES),
                geomean=estimates["geomean"],
            )
        )
    return tuple(rows)


def build_report(trajectories: Sequence[Trajectory], title: str) -> ReportView:
    summaries = [summarise(t) for t in sorted(trajectories, key=lambda t: t.id)]
    columns = grid_columns([s.id for s in summaries])
    views = tuple(trajectory_view(s) for s in summaries)
    return ReportView(
        title=title,
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        models=tuple(sorted({r.model for t in trajectories for r in t.records})),
        variants=tuple(variants_of(trajectories)),
        columns=columns,
        grid=overview_grid(summaries, columns),
        p_values=P_VALUES,
        fast_p=(rows := fast_p_rows(summaries)),
        degenerate=tuple(sorted({t for row in rows for t in row.group.degenerate_tasks})),
        interval_method=METHOD,
        trajectories=views,
        tokens=sum(s.tokens.total for s in summaries),
        turns=sum(s.turns for s in summaries),
    )


def _rate_ci(e: Estimate | None) -> str:
    """`33–100%`, or "" without an interval."""
    if e is None or e.low is None or e.high is None:
        return ""
    return f"{100 * e.low:.0f}–{100 * e.high:.0f}%"


def _times_ci(e: Estimate | None) -> str:
    if e is None or not e.has_interval:
        return ""
    return f"{e.low:.3g}–{e.high:.3g}x"


def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(ASSETS), autoescape=True, undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["speedup"] = format_speedup
    env.filters["percent"] = lambda value: "-" if value is None else f"{100 * value:.0f}%"
    env.filters["rate_ci"] = _rate_ci
    env.filters["times_ci"] = _times_ci
    env.filters["interval"] = format_interval
    return env


def render_report(trajectories: Sequence[Trajectory], title: str, manifest: RunManifest | None = None) -> str:
    """The whole page as one string; nothing in it refers to a file or a network address. The run's
    manifest, where it has one, heads the page: where and how its numbers were measured."""
    css = (ASSETS / "report.css").read_text(encoding="utf-8") + "\n" + _FORMATTER.get_style_defs(".hl")
    js = (ASSETS / "report.js").read_text(encoding="utf-8")
    return (
        _environment()
        .get_template("report.html.j2")
        .render(
            report=build_report(trajectories, title),
            verdicts=list(Verdict),
            manifest=manifest,
            css=Markup(css),  # noqa: S704 - the package's own stylesheet
            js=Markup(js),  # noqa: S704 - the package's own script
        )
    )
