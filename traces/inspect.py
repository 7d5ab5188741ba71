"""Reading a run's traces back: trajectory summaries, lookups, turn views and code diffs.

The functions here are pure over `TurnRecord`s; the `*_view` functions turn their results into
rich renderables for the terminal. The HTML report (traces/html.py) builds on the same functions.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.rule import Rule
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from kernel_refinery.core.errors import UserError
from kernel_refinery.core.verdict import EvalStatus, Verdict, best
from kernel_refinery.traces.outcome import TrajectoryRecord, trajectory_record
from kernel_refinery.traces.schema import TokenUsage, TrajectoryId, TurnRecord
from kernel_refinery.traces.store import iter_trajectories, traces_dir
from kernel_refinery.traces.terminal import add_name_column, add_number_column, badge_text, compact_table


class TraceLookupError(UserError, LookupError):
    """Something asked for (a run, task, variant, turn) is not in the traces; the message lists what is."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Trajectory:
    """One trajectory's records, in turn order, as read from its JSONL file."""

    id: TrajectoryId
    path: Path
    records: tuple[TurnRecord, ...]

    @property
    def label(self) -> str:
        return self.id.label


@dataclass(frozen=True)
class TrajectorySummary:
    trajectory: Trajectory
    best: TurnRecord | None
    """The best turn (kernel_refinery.core.verdict.best): the fastest correct one; without one, the one that got furthest."""
    tokens: TokenUsage
    seconds: float

    @property
    def id(self) -> TrajectoryId:
        return self.trajectory.id

    @property
    def turns(self) -> int:
        return len(self.trajectory.records)

    @property
    def best_status(self) -> Verdict:
        return self.best.status if self.best is not None else Verdict.NO_CODE

    @property
    def status(self) -> Verdict:
        """The best turn's verdict, under the name kernel_refinery.core.verdict.best reads (the best of several samples)."""
        return self.best_status

    @property
    def speedup(self) -> float | None:
        return self.best_speedup

    @property
    def best_speedup(self) -> float | None:
        return self.best.speedup if self.best is not None else None

    @property
    def best_turn(self) -> int | None:
        return self.best.turn if self.best is not None else None

    @property
    def best_interval(self) -> tuple[float, float] | None:
        """The evaluator's 95% interval of the best speedup, where its result carries one."""
        return speedup_interval(self.best) if self.best is not None else None

    def record(self) -> TrajectoryRecord:
        """The trajectory's outcome as results.jsonl keeps it, built as an experiment builds it, so the
        HTML report scores what `refinery report` scores (traces/scoring.py)."""
        records = self.trajectory.records
        level = next((r.level for r in records if r.level is not None), 0)  # traces before levels: 0
        evals = sum(1 for r in records if r.result is not None)
        return trajectory_record(self.id, level, records, tokens=self.tokens.total, evals=evals)


class SortKey(str, Enum):
    """Numbers sort largest first (a missing speedup last); task sorts alphabetically."""

    SPEEDUP = "speedup"
    TURNS = "turns"
    TOKENS = "tokens"
    TASK = "task"


def load_run(run_dir: Path) -> list[Trajectory]:
    """Every trajectory with at least one record under RUN_DIR/traces."""
    folder = traces_dir(Path(run_dir))
    if not folder.is_dir():
        raise TraceLookupError(f"no traces folder at {folder}: is {run_dir} a run directory written by `refinery run`?")
    trajectories = [
        Trajectory(id=records[0].trajectory, path=path, records=tuple(records))
        for path, records in iter_trajectories(Path(run_dir))
        if records
    ]
    if not trajectories:
        raise TraceLookupError(f"no trace records in {folder} (expected *.jsonl files written by `refinery run`)")
    return trajectories


def summarise(trajectory: Trajectory) -> TrajectorySummary:
    tokens = sum((r.tokens for r in trajectory.records), TokenUsage())
    seconds = sum(sum(r.phase_seconds.values()) for r in trajectory.records)
    # Records are in turn order, so a tie goes to the earliest turn.
    return TrajectorySummary(trajectory=trajectory, best=best(trajectory.records), tokens=tokens, seconds=seconds)


def variants_of(trajectories: Iterable[Trajectory]) -> list[str]:
    return sorted({t.id.variant for t in trajectories})


def tasks_of(trajectories: Iterable[Trajectory]) -> list[str]:
    return sorted({t.id.task for t in trajectories})


def filter_summaries(
    summaries: Iterable[TrajectorySummary],
    status: Verdict | None = None,
    variant: str | None = None,
    strategy: str | None = None,
    precision: str | None = None,
) -> list[TrajectorySummary]:
    return [
        s
        for s in summaries
        if (status is None or s.best_status == status)
        and (variant is None or s.id.variant == variant)
        and (strategy is None or s.id.strategy == strategy)
        and (precision is None or s.id.precision == precision)
    ]


def sort_summaries(summaries: Iterable[TrajectorySummary], key: SortKey = SortKey.TASK) -> list[TrajectorySummary]:
    by_identity = sorted(summaries, key=lambda s: s.id)
    if key is SortKey.SPEEDUP:
        # Stable sorts: within equal keys the identity order holds.
        return sorted(by_identity, key=lambda s: (s.best_speedup is None, -(s.best_speedup or 0.0)))
    if key is SortKey.TURNS:
        return sorted(by_identity, key=lambda s: -s.turns)
    if key is SortKey.TOKENS:
        return sorted(by_identity, key=lambda s: -s.tokens.total)
    return by_identity


def _name_of(task_key: str) -> str:
    return task_key.rsplit("/", 1)[-1]


_NUMBER = re.compile(r"^\d+_")  # KernelBench's task numbers: 4_softmax


def _named_tasks(trajectories: Sequence[Trajectory], task: str) -> list[str]:
    """The task keys that `task` may name: the key itself ("level1/4_softmax"), or every task with
    that bare name, with its number ("4_softmax") or without it ("softmax")."""
    keys = tasks_of(trajectories)
    if task in keys:
        return [task]
    named = [k for k in keys if _name_of(k) == task] or [k for k in keys if _NUMBER.sub("", _name_of(k)) == task]
    if not named:
        raise TraceLookupError(f"no task {task!r} in these traces; tasks: {', '.join(keys)}")
    return named


def resolve_task(trajectories: Sequence[Trajectory], task: str) -> str:
    """The task key that `task` names: the key itself, or an unambiguous bare name."""
    named = _named_tasks(trajectories, task)
    if len(named) > 1:
        raise TraceLookupError(f"task name {task!r} is ambiguous: {', '.join(named)}; give the full key")
    return named[0]


_SELECTORS = ("variant", "sample", "strategy", "precision")
"""The fields of a trajectory's id that `refinery traces show/diff` select with a flag of that name."""


def find_trajectories(
    trajectories: Sequence[Trajectory],
    task: str,
    variant: str | None = None,
    sample: int | None = None,
    precision: str | None = None,
    strategy: str | None = None,
) -> list[Trajectory]:
    """The trajectories of one task, narrowed by variant, sample, strategy and precision; never empty.

    A bare task name that fits several tasks is refused only where the flags leave trajectories of
    more than one of them."""
    named = _named_tasks(trajectories, task)
    what = named[0] if len(named) == 1 else repr(task)
    found = [t for t in trajectories if t.id.task in named]
    wanted: dict[str, str | int | None] = {"variant": variant, "sample": sample, "strategy": strategy, "precision": precision}
    for field in _SELECTORS:
        value = wanted[field]
        if value is None:
            continue
        narrowed = [t for t in found if getattr(t.id, field) == value]
        if not narrowed:
            present = ", ".join(str(v) for v in sorted({getattr(t.id, field) for t in found}))
            shown = value if field == "sample" else repr(value)
            raise TraceLookupError(f"task {what} has no {field} {shown}; {field}s: {present}")
        found = narrowed
    tasks = sorted({t.id.task for t in found})
    if len(tasks) > 1:
        raise TraceLookupError(f"task name {task!r} is ambiguous: {', '.join(tasks)}; give the full key")
    return sorted(found, key=lambda t: t.id)


def picking_flags(trajectory: TrajectoryId, among: Sequence[TrajectoryId]) -> str:
    """The flags that pick `trajectory` out of `among`: those of the fields in which they differ."""
    varying = [f for f in _SELECTORS if len({getattr(t, f) for t in among}) > 1]
    return " ".join(f"--{f} {getattr(trajectory, f)}" for f in varying)


def one_trajectory(
    trajectories: Sequence[Trajectory],
    task: str,
    variant: str | None = None,
    sample: int | None = None,
    precision: str | None = None,
    strategy: str | None = None,
) -> Trajectory:
    found = find_trajectories(trajectories, task, variant, sample, precision, strategy)
    if len(found) > 1:
        ids = [t.id for t in found]
        names = "; ".join(f"{i.variant} sample {i.sample}{i.qualifier}: {picking_flags(i, ids)}" for i in ids)
        raise TraceLookupError(f"task {found[0].id.task} has {len(found)} trajectories; pick one with its flags: {names}")
    return found[0]


def records_at(trajectory: Trajectory, turn: int) -> list[TurnRecord]:
    """The records of one turn (one for refine; a beam search has a record per node)."""
    found = [r for r in trajectory.records if r.turn == turn]
    if not found:
        turns = ", ".join(str(t) for t in sorted({r.turn for r in trajectory.records}))
        raise TraceLookupError(f"{trajectory.label} has no turn {turn}; turns: {turns}")
    return found


def record_at(trajectory: Trajectory, turn: int) -> TurnRecord:
    found = records_at(trajectory, turn)
    if len(found) > 1:
        nodes = ", ".join(r.node_id or "?" for r in found)
        raise TraceLookupError(f"turn {turn} of {trajectory.label} has {len(found)} nodes ({nodes}); this view needs one")
    return found[0]


def parent_of(record: TurnRecord, records: Sequence[TurnRecord]) -> TurnRecord | None:
    """The attempt this one refined: its parent node in a search tree, else the previous turn."""
    if record.parent_id is not None:
        return next((r for r in records if r.node_id == record.parent_id), None)
    earlier = [r for r in records if r.turn < record.turn]
    return max(earlier, key=lambda r: r.turn) if earlier else None


def diff_base(record: TurnRecord, records: Sequence[TurnRecord]) -> TurnRecord | None:
    """The nearest ancestor with code: a turn whose reply had no code has nothing to diff."""
    parent = parent_of(record, records)
    while parent is not None and parent.code is None:
        parent = parent_of(parent, records)
    return parent


def human_prompt(record: TurnRecord) -> str:
    return next((m.content for m in record.messages if m.role == "human"), "")


# The parts of prompts/task.j2 around a turn's feedback. Before it: the task's source (and the
# line on its dtype), then the previous attempt's code when there was code; traces written before
# prompts dropped the turn number also have "This is attempt N of M." there. After it: the
# closing instruction.
_TASK_BLOCK = re.compile(
    r"^Now optimise this architecture, named [^\n]*:\n```python\n.*?\n```\n(?:The inputs, parameters and buffers of [^\n]*\n)?",
    re.S | re.M,
)
_PREVIOUS = re.compile(r"\A\s*(?:This is attempt \d+ of \d+\.\s*)?(?:Your previous attempt was:\n```python\n.*?\n```\n)?", re.S)
_CLOSING = re.compile(r"\n*^Write (?:an improved ModelNew|ModelNew with custom kernels)[^\n.]*\..*\Z", re.S | re.M)


def feedback_of(record: TurnRecord) -> str:
    """What the prompt said about the previous attempt ("" on a first turn, or under variant G)."""
    prompt = human_prompt(record)
    task = _TASK_BLOCK.search(prompt)
    if task is None:
        return ""
    rest = prompt[task.end() :]
    previous = _PREVIOUS.match(rest)  # matches at least ""
    return _CLOSING.sub("", rest[previous.end() if previous else 0 :]).strip()


@dataclass(frozen=True)
class TurnVerdict:
    """A turn's verdict in words: a headline, labelled details, and a log when it failed."""

    status: Verdict
    headline: str
    details: tuple[tuple[str, str], ...]
    log: str


_HEADLINE_CHARS = 140


def verdict_of(record: TurnRecord) -> TurnVerdict:
    result = record.result
    if result is None:
        what = record.extract_error or ("no code in the reply" if record.code is None else "not evaluated")
        return TurnVerdict(status=record.status, headline=what, details=(), log="")
    details: list[tuple[str, str]] = [("precision", result.judged_at())]
    if result.static is not None:
        details += [("rejected", r) for r in result.static.rejections]
        details += [("warning", w) for w in result.static.warnings]
    if result.compile is not None:
        hit = "cached" if result.compile.cache_hits and not result.compile.cache_misses else "built"
        details.append(("compile", f"{result.compile.seconds:.1f} s ({hit})" if result.compile.ok else "failed"))
    if result.correctness is not None:
        details.append(("correctness", result.correctness.summary()))
    if result.timing is not None:
        t = result.timing
        details.append(("candidate", f"{t.candidate.median:.4f} ms median ({t.candidate.trials} trials, {t.candidate.clock})"))
        details.append(
            ("reference", f"{t.reference.median:.4f} ms median" + (" (cached, spot-checked)" if t.reference_source == "cached" else ""))
        )
        if t.reference_compiled is not None:
            details.append(("torch.compile", f"{t.reference_compiled.median:.4f} ms median"))
        elif t.compiled_error:
            details.append(("torch.compile", f"no baseline: {t.compiled_error}"))
        interval = speedup_interval(record)
        shown = f"{t.speedup:.3g}x" + (f" (95% interval {format_interval(interval)})" if interval else "")
        details.append(("speedup", shown + (" (re-verified)" if t.suspicious else "")))
    log = ""
    if result.status is EvalStatus.COMPILE_ERROR and result.compile is not None and result.compile.log:
        log = result.compile.log
    elif result.status not in (EvalStatus.CORRECT, EvalStatus.INCORRECT, None):
        # A wrong result is told in full by the correctness line; other failures by their log.
        log = "\n".join(part for part in (result.message.strip(), result.worker_log.strip()) if part)
    headline = result.headline()
    if len(headline) > _HEADLINE_CHARS:
        headline = headline[: _HEADLINE_CHARS - 1].rstrip() + "…"
    return TurnVerdict(status=record.status, headline=headline, details=tuple(details), log=log)


def profile_table(record: TurnRecord) -> str:
    profile = record.result.profile if record.result is not None else None
    return profile.table if profile is not None else ""


@dataclass(frozen=True)
class TurnDiff:
    before: TurnRecord
    after: TurnRecord
    lines: tuple[str, ...]
    """A unified diff of the code, without line terminators."""

    @property
    def status_change(self) -> str:
        return f"{self.before.status} → {self.after.status}"

    @property
    def speedup_change(self) -> str:
        return f"{format_speedup(self.before.speedup)} → {format_speedup(self.after.speedup)}"


def diff_records(before: TurnRecord, after: TurnRecord) -> TurnDiff:
    lines = difflib.unified_diff(
        (before.code or "").splitlines(),
        (after.code or "").splitlines(),
        fromfile=f"turn {before.turn}" + ("" if before.code is not None else " (no code)"),
        tofile=f"turn {after.turn}" + ("" if after.code is not None else " (no code)"),
        lineterm="",
    )
    return TurnDiff(before=before, after=after, lines=tuple(lines))


def format_speedup(speedup: float | None) -> str:
    return "-" if speedup is None else f"{speedup:.3g}x"


def speedup_interval(record: TurnRecord) -> tuple[float, float] | None:
    """The 95% interval of a turn's speedup, from results that carry one (`speedup_ci95`; older ones do not)."""
    timing = record.result.timing if record.result is not None else None
    interval = getattr(timing, "speedup_ci95", None) if timing is not None else None
    if not interval or len(interval) != 2 or record.speedup is None:
        return None
    return float(interval[0]), float(interval[1])


def format_interval(interval: tuple[float, float] | None) -> str:
    return "-" if interval is None else f"{interval[0]:.3g}–{interval[1]:.3g}x"


_badge = badge_text


def summary_table(summaries: Sequence[TrajectorySummary], wide: bool = False) -> Table:
    """Speedup and turn are the best attempt's ("3/5": turn 3 of 5). Fits 80 columns: a long task name
    folds, numbers never do; `wide` adds the best speedup's 95% interval (where the evaluator gave one) and the prompt and
    completion tokens."""
    table = compact_table()
    add_name_column(table, "task")
    add_number_column(table, "variant", justify="left")
    add_number_column(table, "sample")
    add_number_column(table, "best", justify="left")
    add_number_column(table, "speedup")
    if wide:
        add_number_column(table, "95% interval")
    add_number_column(table, "turn")  # the best attempt's turn / the trajectory's turns
    add_number_column(table, "tokens")
    if wide:
        add_number_column(table, "prompt")
        add_number_column(table, "completion")
    for s in summaries:
        table.add_row(
            s.id.task + s.id.qualifier,
            s.id.variant,
            str(s.id.sample),
            _badge(s.best_status),
            format_speedup(s.best_speedup),
            *([format_interval(s.best_interval)] if wide else []),
            f"{'-' if s.best_turn is None else s.best_turn}/{s.turns}",
            str(s.tokens.total),
            *([str(s.tokens.prompt), str(s.tokens.completion)] if wide else []),
        )
    return table


def turn_view(record: TurnRecord, full_prompt: bool = False) -> RenderableType:
    """One turn for the terminal: the feedback the model saw, its code, and the verdict."""
    verdict = verdict_of(record)
    seconds = sum(record.phase_seconds.values())
    title = Text.assemble(
        (f"turn {record.turn}", "bold"),
        "  ",
        _badge(record.status),
        f"  {format_speedup(record.speedup)}",
        f"  {record.tokens.total} tok  {seconds:.1f} s",
        f"  node {record.node_id}" if record.node_id else "",
    )
    parts: list[RenderableType] = [Rule(title, align="left", style="dim")]
    if full_prompt:
        parts.append(Panel(Text(human_prompt(record)), title="prompt", title_align="left", border_style="dim"))
    feedback = feedback_of(record)
    if feedback:
        parts.append(Panel(Text(feedback), title="feedback the model saw", title_align="left", border_style="cyan"))
    elif record.turn > 1:
        parts.append(Text("(no evaluation feedback in the prompt: only the previous code)", style="dim"))
    if record.code is not None:
        parts.append(Syntax(record.code, "python", line_numbers=True, word_wrap=True, theme="ansi_dark"))
    else:
        parts.append(
            Panel(Text(record.reply.strip()[:2000] or "(empty reply)"), title="reply (no code)", title_align="left", border_style="dim")
        )
    lines = Table.grid(padding=(0, 2))
    lines.add_row(Text("verdict", style="bold"), Text(verdict.headline, style=verdict.status.style))
    for label, text in verdict.details:
        lines.add_row(label, text)
    parts.append(lines)
    if verdict.log:
        parts.append(Panel(Text(verdict.log), title="log", title_align="left", border_style="red"))
    table = profile_table(record)
    if table:
        parts.append(Panel(Text(table), title="profile", title_align="left", border_style="dim"))
    return Group(*parts)


def diff_view(diff: TurnDiff) -> RenderableType:
    before, after = diff.before, diff.after
    head = Table.grid(padding=(0, 2))
    head.add_row(Text("status", style="bold"), Text.assemble(_badge(before.status), " → ", _badge(after.status)))
    head.add_row(Text("speedup", style="bold"), diff.speedup_change)
    body: RenderableType
    if diff.lines:
        body = Syntax("\n".join(diff.lines), "diff", theme="ansi_dark", word_wrap=True)
    else:
        body = Text(f"the code of turns {before.turn} and {after.turn} is identical", style="dim")
    return Group(Text(f"turn {before.turn} → turn {after.turn}", style="bold"), head, body)
