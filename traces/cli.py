"""`refinery traces ...`: list, show and diff a run's trajectories, or write its HTML report."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.rule import Rule

from kernel_refinery.core.errors import ConfigError, RunDirError, UserError
from kernel_refinery.core.verdict import Verdict
from kernel_refinery.traces.inspect import (
    SortKey,
    Trajectory,
    diff_records,
    diff_view,
    filter_summaries,
    load_run,
    one_trajectory,
    record_at,
    records_at,
    sort_summaries,
    summarise,
    summary_table,
    turn_view,
)
from kernel_refinery.traces.terminal import print_table

STATUSES = ", ".join(Verdict)

traces_app = typer.Typer(no_args_is_help=True, add_completion=False, help="Inspect the traces of a run directory.")

RunDirArg = Annotated[Path, typer.Argument(help="a run directory (its traces/ folder is read)")]
TaskArg = Annotated[str, typer.Argument(help='task key ("level1/relu_task") or its bare name when unambiguous')]
VariantOpt = Annotated[str | None, typer.Option("--variant", help="feedback variant, e.g. G+E+P")]
PrecisionOpt = Annotated[str | None, typer.Option("--precision", help="fp32, fp16 or bf16, where the run holds several")]
StrategyOpt = Annotated[str | None, typer.Option("--strategy", help="refine, best-of-n or beam, where the run holds several")]


def _console() -> Console:
    # Built per command so the terminal width (COLUMNS) is read when the command runs.
    return Console()


def _fail(message: str) -> UserError:
    """A user error; `refinery` prints it on one line and exits 2."""
    return ConfigError(message)


def _load(run_dir: Path) -> list[Trajectory]:
    try:
        return load_run(run_dir)  # TraceLookupError (no traces there) is a user error already
    except ValueError as exc:
        # A trace line that is not a record, or of an unknown schema version.
        raise RunDirError(str(exc)) from exc


@traces_app.command("list")
def list_command(
    run_dir: RunDirArg,
    status: Annotated[str | None, typer.Option(help=f"only trajectories whose best attempt has this status ({STATUSES})")] = None,
    sort: Annotated[SortKey, typer.Option(help="speedup, turns and tokens sort largest first")] = SortKey.TASK,
    variant: VariantOpt = None,
    strategy: StrategyOpt = None,
    precision: PrecisionOpt = None,
    wide: Annotated[bool, typer.Option("--wide", help="also the best speedup's 95% interval and prompt/completion tokens")] = False,
) -> None:
    """A table of trajectories: best status and speedup, turns and tokens."""
    trajectories = _load(run_dir)
    if status is not None and status not in {v.value for v in Verdict}:
        raise _fail(f"unknown status {status!r}; statuses: {STATUSES}")
    for field, wanted in (("variant", variant), ("strategy", strategy), ("precision", precision)):
        held = sorted({getattr(t.id, field) for t in trajectories})
        if wanted is not None and wanted not in held:
            raise _fail(f"no trajectory of {field} {wanted!r} in {run_dir}; {field}s: {', '.join(held)}")
    summaries = [summarise(t) for t in trajectories]
    chosen = filter_summaries(
        summaries, status=None if status is None else Verdict(status), variant=variant, strategy=strategy, precision=precision
    )
    shown = sort_summaries(chosen, sort)
    console = _console()
    if not shown:
        present = ", ".join(sorted({s.best_status for s in summaries}))
        console.print(f"no trajectory matches; best statuses in this run: {present}")
        return
    print_table(console, summary_table(shown, wide=wide), wide=wide)


@traces_app.command("show")
def show_command(
    run_dir: RunDirArg,
    task: TaskArg,
    variant: VariantOpt = None,
    sample: Annotated[int | None, typer.Option(help="sample index")] = None,
    strategy: StrategyOpt = None,
    precision: PrecisionOpt = None,
    turn: Annotated[int | None, typer.Option(help="only this turn")] = None,
    raw: Annotated[bool, typer.Option("--raw", help="print the JSON records, one per line")] = False,
    prompt: Annotated[bool, typer.Option("--prompt", help="also print each turn's whole prompt")] = False,
) -> None:
    """Each turn of one trajectory: the feedback the model saw, its code and the verdict."""
    trajectories = _load(run_dir)
    trajectory = one_trajectory(trajectories, task, variant, sample, precision, strategy)  # TraceLookupError: a user error
    records = records_at(trajectory, turn) if turn is not None else list(trajectory.records)
    if raw:
        for record in records:
            sys.stdout.write(record.model_dump_json() + "\n")
        return
    console = _console()
    console.print(Rule(f"[bold]{trajectory.label}[/] · {trajectory.path.name}", characters="═"))
    for record in records:
        console.print(turn_view(record, full_prompt=prompt))
        console.print()


@traces_app.command("diff")
def diff_command(
    run_dir: RunDirArg,
    task: TaskArg,
    turns: Annotated[tuple[int, int], typer.Option("--turns", help="the two turns to compare, e.g. --turns 3 4")],
    variant: VariantOpt = None,
    sample: Annotated[int | None, typer.Option(help="sample index")] = None,
    strategy: StrategyOpt = None,
    precision: PrecisionOpt = None,
) -> None:
    """The code diff between two turns, and how the verdict and the speedup changed."""
    trajectories = _load(run_dir)
    trajectory = one_trajectory(trajectories, task, variant, sample, precision, strategy)  # TraceLookupError: a user error
    before, after = record_at(trajectory, turns[0]), record_at(trajectory, turns[1])
    console = _console()
    console.print(Rule(trajectory.label))
    console.print(diff_view(diff_records(before, after)))


@traces_app.command("html")
def html_command(
    run_dir: RunDirArg,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="the HTML file; default RUN_DIR/report.html")] = None,
) -> None:
    """One self-contained HTML report: the run overview and every trajectory's turns."""
    from kernel_refinery.traces.html import render_report
    from kernel_refinery.traces.manifest import read_manifest

    trajectories = _load(run_dir)
    target = output or Path(run_dir) / "report.html"
    target.parent.mkdir(parents=True, exist_ok=True)
    page = render_report(trajectories, title=Path(run_dir).resolve().name, manifest=read_manifest(run_dir))
    target.write_text(page, encoding="utf-8")
    _console().print(f"wrote {target} ({len(trajectories)} trajectories)")
