"""What `refinery reverify` prints: the recorded and the new verdict side by side, and what changed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kernel_refinery.bench.reverify import Measured, Recheck, ReverifyPlan
from kernel_refinery.core.numerics import Precision
from kernel_refinery.core.strategy import Strategy
from kernel_refinery.traces.terminal import add_name_column, compact_table, print_table


def _measured(m: Measured, one_line: bool = False) -> str:
    """`correct 1.42x` over its interval `1.38–1.47` (on one line: `[1.38–1.47]`); the verdict alone
    where there is no speedup."""
    head = f"[{m.verdict.style}]{m.verdict.words}[/]"
    if m.speedup is None:
        return head
    if m.interval is None:
        return f"{head} {m.speedup:.3g}x"
    low_high = f"{m.interval[0]:.3g}–{m.interval[1]:.3g}"
    return f"{head} {m.speedup:.3g}x " + (f"[dim]\\[{low_high}][/]" if one_line else f"\n[dim]{low_high}[/]")


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"


def print_header(console: Console, run_dir: Path, plan: ReverifyPlan) -> None:
    resumed = f" ({len(plan.done)} already in reverify.json)" if plan.done else ""
    console.print(f"[bold]reverify[/] {run_dir}: {_count(len(plan.todo) + len(plan.done), 'kernel')}{resumed}", highlight=False)
    console.print(f"on this machine: {plan.manifest.summary()}", highlight=False, markup=False)
    if plan.measured_differently:
        console.print(
            "[bold yellow]warning: measured differently from the run[/] (its manifest.json): "
            + "; ".join(d.describe() for d in plan.measured_differently),
            highlight=False,
        )


def progress_line(recheck: Recheck, done: int, total: int) -> str:
    flags = f" · [bold red]{'; '.join(recheck.flags)}[/]" if recheck.flags else ""
    return (
        f"{done}/{total} {recheck.trajectory.task} {recheck.trajectory.variant} s{recheck.trajectory.sample}: "
        f"{_measured(recheck.recorded, one_line=True)} → {_measured(recheck.now, one_line=True)}{flags}"
    )


def render_table(rechecks: Sequence[Recheck]) -> Table:
    """One row per kernel: its id, the recorded verdict, the new one, and what did not reproduce."""
    table = compact_table(
        title="recorded (then) and re-checked (now) verdicts of the best kernels",
        caption="speedup over its 95% interval (second line); ids for --record under each kernel",
    )
    add_name_column(table, "kernel")
    table.add_column("then", no_wrap=True)
    table.add_column("now", no_wrap=True)
    add_name_column(table, "flags")
    for r in rechecks:
        t = r.trajectory
        shown = (t.strategy if t.strategy != Strategy.REFINE else "", t.precision if t.precision != Precision.FP32 else "")
        more = "".join(f" · {x}" for x in shown if x)
        kernel = f"{t.task} · {t.variant} · s{t.sample}{more} · turn {r.turn}\n[dim]{r.record_id}[/]"
        flags = "\n".join(f"[bold red]{f}[/]" for f in r.flags) or "[green]reproduced[/]"
        table.add_row(kernel, _measured(r.recorded), _measured(r.now), flags)
    return table


def summary_line(rechecks: Sequence[Recheck]) -> str:
    verdicts = sum(r.verdict_changed for r in rechecks)
    moved = sum(r.speedup_moved for r in rechecks)
    fast_1 = sum(1.0 in r.fast_p_changed for r in rechecks)
    fast_any = sum(bool(r.fast_p_changed) for r in rechecks)
    return (
        f"{_count(len(rechecks), 'kernel')} re-checked: {_count(verdicts, 'verdict')} changed, "
        f"{_count(moved, 'speedup')} outside the recorded interval, "
        f"fast_1 membership changed for {fast_1} (fast_p at any threshold for {fast_any})"
    )


def print_rechecks(console: Console, rechecks: Sequence[Recheck], written: Path, wide: bool = False) -> None:
    print_table(console, render_table(rechecks), wide)
    bad = any(r.verdict_changed for r in rechecks)
    console.print(f"[bold {'red' if bad else 'green'}]{summary_line(rechecks)}[/]", highlight=False)
    console.print(f"written: {written}", highlight=False)


def reverify_and_report(
    console: Console,
    run_dir: Path,
    task: str | None = None,
    variant: str | None = None,
    precision: str | None = None,
    record: str | None = None,
    suite: str | None = None,
    workers: int | None = None,
    start_over: bool = False,
    wide: bool = False,
    timing: str | None = None,
) -> list[Recheck]:
    """`refinery reverify`: choose the kernels, judge them again with a line each as they finish, then the table."""
    from kernel_refinery.bench.reverify import choose_targets, plan_reverify, restart, reverify, reverify_path

    if start_over:
        restart(run_dir, timing)
    targets = choose_targets(run_dir, task=task, variant=variant, precision=precision, record=record, suite=suite)
    # A record named by its id is judged again even when reverify.json has it.
    plan = plan_reverify(run_dir, targets, again=record is not None, timing=timing)
    print_header(console, run_dir, plan)
    total, finished = len(plan.todo) + len(plan.done), [len(plan.done)]

    def on_done(recheck: Recheck) -> None:
        finished[0] += 1
        console.print(progress_line(recheck, finished[0], total), highlight=False)

    rechecks = reverify(run_dir, plan, workers=workers, on_done=on_done, timing=timing)
    print_rechecks(console, rechecks, reverify_path(run_dir, timing), wide)
    return rechecks
