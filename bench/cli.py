"""The `refinery` command: thin subcommands that parse, build a config and call the library.

A user error (kernel_refinery/core/errors.py: a bad file, flag, config value, endpoint, key or run directory)
prints `error: <what failed, where, what to do>` on stderr and exits 2; `--debug` or
REFINERY_DEBUG=1 shows its traceback instead. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from typer.core import TyperGroup

from kernel_refinery.agent.config import RunConfig
from kernel_refinery.bench.logs import configure_logging
from kernel_refinery.bench.settings import EvalSettings, describe_validation, load_settings, parse_overrides
from kernel_refinery.bench.tasks import SuiteError
from kernel_refinery.core.errors import ConfigError, InputFileError, UserError
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.traces.cli import traces_app
from kernel_refinery.traces.schema import UnknownSchemaVersion

if TYPE_CHECKING:
    # The Context that typer's groups create and pass: its own copy of click's.
    from typer._click import Context

USER_ERRORS: tuple[type[BaseException], ...] = (UserError, SuiteError, UnknownSchemaVersion)
"""What the CLI reports as a one-line error (exit 2): UserError, plus the typed errors of modules
that predate it (SuiteError: a task file or suite that is not one; UnknownSchemaVersion: traces
written by another version)."""


def debugging(ctx: Context | None = None) -> bool:
    if ctx is not None and ctx.find_root().params.get("debug"):
        return True
    return os.environ.get("REFINERY_DEBUG", "").strip() not in ("", "0")


class RefineryGroup(TyperGroup):
    """Reports user errors in one line (exit 2) wherever in a subcommand they are raised."""

    def invoke(self, ctx: Context) -> Any:
        try:
            return super().invoke(ctx)
        except USER_ERRORS as exc:
            if debugging(ctx):
                raise
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None


app = typer.Typer(cls=RefineryGroup, no_args_is_help=True, add_completion=False, help="LLM kernel refinement with an honest evaluator.")
console = Console()
app.add_typer(traces_app, name="traces")


@app.callback()
def main_options(
    debug: Annotated[
        bool, typer.Option("--debug", envvar="REFINERY_DEBUG", help="show the traceback of a user error too (or REFINERY_DEBUG=1)")
    ] = False,
) -> None:
    """LLM kernel refinement with an honest evaluator."""


DeviceOpt = Annotated[str, typer.Option("--device", help="cpu or cuda")]
PrecisionOpt = Annotated[
    str | None,
    typer.Option("--precision", help="fp32 (default), fp16 or bf16: inputs, parameters and buffers of both models are cast to it"),
]


def _eval_config(device: str, /, **overrides: object) -> EvalConfig:
    try:
        return EvalConfig(device=device, **overrides)  # checked by the model: a bad device is named below
    except ValidationError as exc:
        raise ConfigError(f"evaluator settings: {describe_validation(exc, {'device': '--device'})}") from exc


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(f"{what} {path} is not UTF-8 text (byte {exc.start}); give a text file") from exc
    except OSError as exc:
        raise InputFileError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc


def check_model(model: str) -> None:
    """A scripted model's file must exist and hold replies; found before any worker starts."""
    if not model.startswith("scripted:"):
        return
    from kernel_refinery.agent.chat.scripted import load_script

    path = Path(model.removeprefix("scripted:"))
    if not path.exists():
        raise InputFileError(f"--model {model}: no file or folder {path}; give scripted:FILE with a JSON list of replies")
    try:
        load_script(path)
    except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        raise InputFileError(
            f"--model {model}: {path} is not a reply script ({exc}); give a JSON list of replies or a folder of reply files"
        ) from exc


@app.command("eval")
def eval_command(
    task_file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="KernelBench-format reference program")],
    candidate_file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="module defining ModelNew")],
    config_file: ConfigOpt = None,
    overrides: SetOpt = None,
    device: OptDeviceOpt = None,
    backend: BackendOpt = None,
    precision: PrecisionOpt = None,
    baseline: BaselineOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Evaluate one candidate against its reference: static check, compile, correctness, timing, profile.
    Settings: the eval table of --config, then --set eval.KEY=VALUE (e.g. eval.trials=50, eval.tolerance=1e-2)."""
    from kernel_refinery.bench.tasks import load_task_file
    from kernel_refinery.tools.evaluator import Evaluator
    from kernel_refinery.tools.processes.jobs import TaskProgram

    configure_logging(quiet=as_json)
    flags = {**given_flags(device=device, backend=backend, precision=precision, baseline=baseline), **parse_overrides(overrides or [])}
    settings, _ = load_settings(EvalSettings, config_file, flags)
    config = settings.eval
    device = config.device
    task = load_task_file(task_file, level=_level_of(task_file))
    candidate = _read_text(candidate_file, "candidate file")
    with Evaluator(config) as evaluator:
        result = evaluator.evaluate(TaskProgram(name=task.name, source=task.source_for(device)), candidate)
    if as_json:
        from kernel_refinery.bench.provenance import collect_manifest

        # The result's own fields stay at the top (readers of earlier output keep working); the
        # manifest says where and how it was measured.
        manifest = collect_manifest(config, [(task.key, task_file)])
        payload = {**json.loads(result.model_dump_json()), "manifest": manifest.model_dump(mode="json")}
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
    else:
        from kernel_refinery.bench.render import print_result

        print_result(console, task.name, result)
    raise typer.Exit(0 if result.correct else 1)


FLAG_KEYS = {
    "model": "llm.model",
    "variant": "loop.variant",
    "turns": "loop.turns",
    "device": "eval.device",
    "backend": "eval.backend",
    "precision": "eval.precision",
    "baseline": "eval.baseline",
}
"""The config key each everyday flag of `run`, `experiment` and `eval` sets; any other flag sets the
key of its own name (--strategy, --suite, ...). Every other setting: --set KEY=VALUE."""


def given_flags(**values: object) -> dict[str, tuple[str, object]]:
    """The flags given (not None), by the config key each sets, with the flag's name for messages."""
    return {FLAG_KEYS.get(name, name): ("--" + name.replace("_", "-"), value) for name, value in values.items() if value is not None}


ConfigOpt = Annotated[Path | None, typer.Option("--config", exists=True, dir_okay=False, help="TOML settings; flags given override them")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="any setting by its config key, over --config and the flags; repeatable. "
        "E.g. --set loop.target_speedup=1.5 --set llm.base_url=http://host/v1 --set eval.tolerance=1e-2",
    ),
]
ModelOpt = Annotated[str | None, typer.Option(help="model name; 'local' (embedded, default), 'local-0.5b' or 'scripted:FILE'")]
TurnsOpt = Annotated[int | None, typer.Option(help="turn budget (default 10)")]
BackendOpt = Annotated[str | None, typer.Option(help="cpp, cuda or triton; default: the device's")]
OptDeviceOpt = Annotated[str | None, typer.Option("--device", help="cpu (default) or cuda")]
BaselineOpt = Annotated[
    str | None, typer.Option("--baseline", help="what speedups are against: eager (default), compile (torch.compile) or best (the faster)")
]


@app.command("run")
def run_command(
    task_file: Annotated[Path, typer.Option("--task", exists=True, dir_okay=False, help="a task file of a suite")],
    config_file: ConfigOpt = None,
    overrides: SetOpt = None,
    variant: Annotated[str | None, typer.Option(help="feedback: G, G+E, G+E+P (default; +N on CUDA with ncu)")] = None,
    turns: TurnsOpt = None,
    strategy: Annotated[str | None, typer.Option(help="refine (default), best-of-n or beam")] = None,
    model: ModelOpt = None,
    device: OptDeviceOpt = None,
    precision: PrecisionOpt = None,
    run_dir: Annotated[Path | None, typer.Option(help="where traces and checkpoints go")] = None,
    resume: Annotated[bool, typer.Option(help="continue this run directory's trajectory")] = False,
) -> None:
    """One task with one strategy (default: one refinement trajectory), printing each verdict as it happens."""
    from kernel_refinery.bench.launch import launch_run
    from kernel_refinery.bench.tasks import load_task_file

    configure_logging()
    flags = given_flags(variant=variant, turns=turns, strategy=strategy, model=model, device=device, precision=precision)
    flags.update(parse_overrides(overrides or []))
    task = load_task_file(task_file, level=_level_of(task_file))
    config, file_run_dir = load_settings(RunConfig, config_file, flags)
    check_model(config.llm.model)
    run_dir = run_dir or file_run_dir or Path("runs") / f"run-{task.name}-{uuid.uuid4().hex[:6]}"
    launch_run(config, task, run_dir, console, resume=resume)


@app.command("experiment")
def experiment_command(
    config_file: ConfigOpt = None,
    overrides: SetOpt = None,
    suite: Annotated[str | None, typer.Option(help="'builtin' or a KernelBench checkout's KernelBench/ folder")] = None,
    levels: Annotated[str | None, typer.Option(help="comma-separated, e.g. 1,2")] = None,
    tasks: Annotated[str | None, typer.Option(help="task name filter (substring or glob)")] = None,
    variants: Annotated[str | None, typer.Option(help="comma-separated, e.g. G,G+E,G+E+P")] = None,
    turns: TurnsOpt = None,
    model: ModelOpt = None,
    device: OptDeviceOpt = None,
    precision: Annotated[
        str | None, typer.Option("--precision", help="fp32 (default), fp16 or bf16; another precision may share a --run-dir")
    ] = None,
    baseline: BaselineOpt = None,
    run_dir: Annotated[Path | None, typer.Option(help="re-running on an existing directory resumes it")] = None,
    wide: Annotated[bool, typer.Option("--wide", help="the final table with every p, one line per row")] = False,
) -> None:
    """Run suites × variants × samples in parallel, resumable, and print the fast_p table.
    Every other setting by its key: --set samples=3 --set strategies='["refine","beam"]' --set workers=2 --set eval.trials=50."""
    from kernel_refinery.bench.experiment import ExperimentConfig
    from kernel_refinery.bench.launch import launch

    configure_logging(quiet=True)
    flags = given_flags(suite=suite, levels=_ints(levels), tasks=tasks, variants=_list(variants), turns=turns, model=model, device=device)
    flags.update(given_flags(precision=precision, baseline=baseline))
    flags.update(parse_overrides(overrides or []))
    config, file_run_dir = load_settings(ExperimentConfig, config_file, flags)
    check_model(config.llm.model)
    launch(config, run_dir or file_run_dir or Path(f"runs/experiment-{uuid.uuid4().hex[:6]}"), console, wide=wide)


@app.command("report")
def report_command(
    run_dir: Annotated[
        Path | None, typer.Argument(exists=True, file_okay=False, help="an experiment's run directory (optional when comparing two)")
    ] = None,
    plots: Annotated[bool, typer.Option(help="write PNG plots to RUN_DIR/plots")] = True,
    wide: Annotated[bool, typer.Option("--wide", help="every p and exact tokens, intervals on the same line")] = False,
    compare: Annotated[
        tuple[str, str] | None,
        typer.Option(
            "--compare",
            metavar="A B",
            help="paired difference B - A per score with its 95% interval: two variants or strategies of RUN_DIR, or two run directories",
        ),
    ] = None,
) -> None:
    """fast_p per level × variant with 95% intervals, rates, geometric-mean speedup and tokens; JSON and PNG plots too."""
    if compare is not None:
        from kernel_refinery.bench.compare import compare as paired
        from kernel_refinery.bench.compare import render, resolve_sides

        a, b, key, paired_on = resolve_sides(run_dir, *compare)
        render(paired(a, b, key, paired_on), console, wide=wide)
        return
    if run_dir is None:
        raise ConfigError("give a run directory (refinery report RUN_DIR), or --compare A B with two run directories")
    from kernel_refinery.bench.report import report

    report(run_dir, console=console, plots=plots, wide=wide)
    console.print(f"written: {run_dir / 'report.json'}", highlight=False)


@app.command("reverify")
def reverify_command(
    run_dir: Annotated[Path, typer.Argument(exists=True, file_okay=False, help="a run directory (its traces/ and config.json are read)")],
    task: Annotated[str | None, typer.Option(help="only these tasks: key, substring or glob")] = None,
    variant: Annotated[str | None, typer.Option(help="only this feedback variant, e.g. G+E")] = None,
    precision: Annotated[str | None, typer.Option(help="only this precision: fp32, fp16 or bf16")] = None,
    record: Annotated[str | None, typer.Option(help="re-check only this trace record, by the id the table shows (FILE-STEM:TURN)")] = None,
    suite: Annotated[str | None, typer.Option(help="where the task files are, when not where the run's manifest says")] = None,
    workers: Annotated[int | None, typer.Option(min=1, help="evaluation workers (default: the experiment's)")] = None,
    restart: Annotated[bool, typer.Option("--restart", help="forget reverify.json and judge every kernel again")] = False,
    wide: Annotated[bool, typer.Option("--wide", help="the table in the width it needs")] = False,
    timing: Annotated[
        str | None, typer.Option(help="time with this method instead of the run's: events, host or graph (its own reverify file)")
    ] = None,
) -> None:
    """Judge each trajectory's best kernel again on this machine, with fresh seeds, beside its recorded verdict.
    Exits 1 when a verdict changed."""
    from kernel_refinery.bench.reverify_render import reverify_and_report

    configure_logging(quiet=True)
    rechecks = reverify_and_report(console, run_dir, task, variant, precision, record, suite, workers, restart, wide, timing)
    raise typer.Exit(1 if any(r.verdict_changed for r in rechecks) else 0)


def _list(text: str | None) -> list[str] | None:
    return [p.strip() for p in text.split(",") if p.strip()] if text else None


def _ints(text: str | None) -> list[int] | None:
    items = _list(text)
    try:
        return [int(i) for i in items] if items else None
    except ValueError:
        raise ConfigError(f"--levels takes comma-separated level numbers, e.g. 1,2; not {text!r}") from None


@app.command("serve-local")
def serve_local_command(
    model: Annotated[str, typer.Option(help="local or local-0.5b")] = "local",
    port: Annotated[int | None, typer.Option(help="port on 127.0.0.1; default: a free one")] = None,
    threads: Annotated[int | None, typer.Option(help="CPU threads for the model")] = None,
) -> None:
    """Run the embedded model's OpenAI-compatible server in the foreground, for reuse across runs."""
    from kernel_refinery.agent.chat.local_model import serve_local

    configure_logging()
    serve_local(model, port, threads)


@app.command("serve")
def serve_command(
    token: Annotated[
        str | None, typer.Option(envvar="REFINERY_SERVE_TOKEN", help="bearer token requests must carry (or REFINERY_SERVE_TOKEN)")
    ] = None,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8000,
    device: DeviceOpt = "cpu",
    workers: Annotated[int, typer.Option(min=1, help="evaluations at once (the pool's workers)")] = 1,
    queue_size: Annotated[int, typer.Option(min=0, help="evaluations that may wait; more are answered 429")] = 8,
    max_request_bytes: Annotated[int, typer.Option(min=1024, help="largest request body; larger ones are answered 413")] = 2_000_000,
    request_timeout_s: Annotated[float, typer.Option(min=1, help="a request's answer within this many seconds, or 504")] = 1800.0,
) -> None:
    """The evaluator as an HTTP service: POST /evaluate and /evaluate/batch, GET /health and /metrics (the `serve` extra)."""
    if not token:
        raise ConfigError("refinery serve needs a token: give --token or set REFINERY_SERVE_TOKEN (clients send it as a bearer token)")
    try:
        from kernel_refinery.bench.serve.server import ServeOptions, run_server
    except ModuleNotFoundError as exc:
        raise ConfigError(f"refinery serve needs {exc.name}: pip install 'kernel-refinery[serve]'") from exc

    configure_logging()
    options = ServeOptions(
        token=token,
        eval=_eval_config(device),
        workers=workers,
        queue_size=queue_size,
        max_request_bytes=max_request_bytes,
        request_timeout_s=request_timeout_s,
    )
    run_server(options, host, port)


suite_app = typer.Typer(no_args_is_help=True, add_completion=False, help="Check the tasks of a suite.")
app.add_typer(suite_app, name="suite")


@suite_app.command("check")
def suite_check_command(
    suite: Annotated[str, typer.Option(help="'builtin' or a KernelBench checkout's KernelBench/ folder")] = "builtin",
    device: DeviceOpt = "cpu",
    levels: Annotated[str | None, typer.Option(help="comma-separated, e.g. 1,2 (default: every level folder)")] = None,
    tasks: Annotated[str | None, typer.Option(help="task name filter (substring or glob)")] = None,
    jobs: Annotated[int | None, typer.Option(min=1, help="tasks at once (default: half the cores on cuda, 1 on cpu)")] = None,
    compile_reference: Annotated[bool, typer.Option("--compile/--no-compile", help="also time torch.compile of each reference")] = True,
    timeout_s: Annotated[float, typer.Option("--timeout-s", min=1, help="wall-clock limit per task, after torch is imported")] = 300.0,
    json_path: Annotated[Path | None, typer.Option("--json", dir_okay=False, help="write every row to this JSON file")] = None,
    time_eager: Annotated[bool, typer.Option("--time/--no-time", help="time the eager reference (off: build and probe only)")] = True,
    probe: Annotated[bool, typer.Option("--probe/--no-probe", help="flag references whose outputs do not vary with their inputs")] = True,
    tolerance: Annotated[float, typer.Option(min=0, help="atol = rtol of the probe (a candidate's fp32 tolerance)")] = 1e-4,
) -> None:
    """Run each task's reference eager and with torch.compile, each in its own process: ok or why not, and its time;
    and flag a reference whose outputs on a few random inputs are all zeros, one constant, or the same on each."""
    from kernel_refinery.bench.suite_check.render import print_progress, print_summary, print_table
    from kernel_refinery.bench.suite_check.run import JsonReport, check_device, check_suite, default_jobs, find_tasks
    from kernel_refinery.bench.suite_check.types import CheckOptions, TaskCheck

    configure_logging()
    check_device(device)
    found = find_tasks(suite, _ints(levels), tasks)
    options = CheckOptions(
        device=device,
        compile=compile_reference,
        timeout_s=timeout_s,
        jobs=jobs or default_jobs(device),
        time=time_eager,
        probe=probe,
        tolerance=tolerance,
    )
    report = JsonReport(json_path, suite, options, len(found)) if json_path else None
    plural = "" if len(found) == 1 else "s"
    console.print(f"checking {len(found)} task{plural} of {suite} on {device}, {options.jobs} at a time", highlight=False)
    finished: list[TaskCheck] = []

    def progress(row: TaskCheck) -> None:
        finished.append(row)
        print_progress(console, row, len(finished), len(found))
        if report is not None:
            report.add(row)

    rows = check_suite(found, options, on_done=progress)
    print_table(console, rows, options)
    print_summary(console, rows, options)
    if report is not None:
        report.finish(rows)
        console.print(f"written: {json_path}", highlight=False)


def _level_of(path: Path) -> int:
    parent = path.resolve().parent.name
    # A task file outside a levelN folder is scored as level 1.
    return int(parent.removeprefix("level")) if parent.startswith("level") and parent[5:].isdigit() else 1


def main() -> None:
    app()


if __name__ == "__main__":
    main()
