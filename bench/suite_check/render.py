"""What a person reads of `refinery suite check`: a line per task as it ends, the table, the summary."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kernel_refinery.bench.suite_check.types import CheckOptions, Stage, Status, TaskCheck, Timing
from kernel_refinery.tools.steps.degenerate import KIND_TEXT, PROBE_INPUTS

_STATUS_LABEL = {
    Status.OK: "ok",
    Status.COMPILE_ERROR: "compile error",
    Status.IMPORT_ERROR: "import error",
    Status.ERROR: "error",
    Status.CUDA_OOM: "CUDA out of memory",
    Status.HOST_OOM: "host out of memory",
    Status.CRASH: "crash",
    Status.TIMEOUT: "timeout",
    Status.INVALID: "not a task",
}
_STATUS_STYLE = {Status.OK: "green", Status.COMPILE_ERROR: "yellow"}


def ms_text(ms: float) -> str:
    """Three significant figures or so, without exponents."""
    if ms >= 100:
        return f"{ms:.0f}"
    if ms >= 10:
        return f"{ms:.1f}"
    if ms >= 1:
        return f"{ms:.2f}"
    return f"{ms:.3f}"


def _timing(timing: Timing | None, row: TaskCheck, compiled: bool) -> str:
    if timing is not None:
        return ms_text(timing.median_ms)
    if compiled and row.status is Status.COMPILE_ERROR:
        return "failed"
    return "-"


def _peak(row: TaskCheck) -> str:
    peaks = [t.peak_mb for t in (row.eager, row.compiled) if t is not None]
    return f"{max(peaks):.0f}" if peaks else "-"


def _outputs(row: TaskCheck, options: CheckOptions) -> Text:
    """What the probe found of the reference's outputs: `varies`, or how they are degenerate."""
    if not options.probe:
        return Text("off")
    if row.degenerate:
        return Text(KIND_TEXT[row.degenerate], style="yellow")
    return Text("varies" if row.stage in (Stage.COMPILE, Stage.DONE) else "-")


def _label(status: Status) -> Text:
    return Text(_STATUS_LABEL[status], style=_STATUS_STYLE.get(status, "red"))


def _status(row: TaskCheck, limit: int | None = None) -> Text:
    message = row.message
    if limit is not None and len(message) > limit:
        message = message[: limit - 1] + "…"
    text = _label(row.status)
    if message:
        text.append(f": {message}")
    return text


def print_progress(console: Console, row: TaskCheck, done: int, total: int) -> None:
    """One line as a task ends: its times when it has them, else why not (cut to the width)."""
    line = Text(f"[{done}/{total}] {row.key}  ")
    line.append_text(_label(row.status))
    for name, timing in (("eager", row.eager), ("compiled", row.compiled)):
        if timing is not None:
            line.append(f"  {name} {ms_text(timing.median_ms)} ms")
    if row.compile_s is not None:
        line.append(f" (compiled in {row.compile_s:.0f} s)")
    if row.degenerate:
        line.append(f"  degenerate: {KIND_TEXT[row.degenerate]}", style="yellow")
    line.append(f"  {row.wall_s:.0f} s")
    if row.message:
        line.append(f"  {row.message}")
    console.print(line, highlight=False, overflow="ellipsis", no_wrap=True)


def print_table(console: Console, rows: list[TaskCheck], options: CheckOptions) -> None:
    """The numbers, a row per task; the reason of each failure follows, a line per task, where it
    has the terminal's width rather than a column's."""
    seen = next((row for row in rows if row.device_name), None)
    where = f"{seen.device_name}, torch {seen.torch_version}" if seen else options.device
    table = Table(title=f"Suite check on {where}", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("level", justify="right")
    table.add_column("task", overflow="fold")
    table.add_column("eager ms", justify="right")
    table.add_column("compiled ms", justify="right")
    table.add_column("peak MB", justify="right")
    table.add_column("outputs", no_wrap=True)
    table.add_column("status", no_wrap=True)
    for row in rows:
        table.add_row(
            str(row.level),
            row.name,
            _timing(row.eager, row, compiled=False) if options.time else "off",
            _timing(row.compiled, row, compiled=True) if options.compile else "off",
            _peak(row),
            _outputs(row, options),
            _label(row.status),
        )
    console.print(table)
    degenerate = [row for row in rows if row.degenerate]
    if degenerate:
        console.print(f"[bold]Degenerate references[/] (outputs on {PROBE_INPUTS} random inputs that a kernel needs no computing to match)")
        for row in degenerate:
            console.print(Text(f"{row.key}: {KIND_TEXT[row.degenerate]}: {row.degenerate_detail}"), highlight=False)
    failed = [row for row in rows if row.status is not Status.OK]
    if failed:
        console.print("[bold]Why[/]")
        for row in failed:
            line = Text(f"{row.key}: ")
            line.append_text(_status(row))
            console.print(line, highlight=False)


def print_summary(console: Console, rows: list[TaskCheck], options: CheckOptions) -> None:
    counts = {status: sum(row.status is status for row in rows) for status in Status}
    console.print(f"\n[bold]{counts[Status.OK]} of {len(rows)} tasks ok[/]", highlight=False)
    if options.probe:
        flagged = sum(1 for row in rows if row.degenerate)
        console.print(
            f"{flagged} degenerate: the reference's outputs are all zeros, one constant, or the same on every input "
            f"within atol = rtol = {options.tolerance:g}",
            highlight=False,
        )
    if counts[Status.OK] < len(rows):
        table = Table(box=None, pad_edge=False)
        table.add_column("not ok")
        table.add_column("tasks", justify="right")
        for status, count in counts.items():
            if count and status is not Status.OK:
                table.add_row(_label(status), str(count))
        console.print(table)
    memory = "the GPU memory the task allocated" if options.device == "cuda" else "the process's peak resident memory"
    clock = "CUDA events" if options.device == "cuda" else "time.perf_counter"
    console.print(f"Times: median of timed forward calls under no_grad after warm-up ({clock}); peak MB: {memory}.", highlight=False)
    if options.jobs > 1:
        console.print(
            f"[yellow]{options.jobs} tasks ran at once (--jobs {options.jobs}): their times share the "
            f"{'GPU' if options.device == 'cuda' else 'CPU cores'}; run with --jobs 1 for uncontended times.[/]",
            highlight=False,
        )
