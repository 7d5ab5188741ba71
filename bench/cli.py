"""The `refinery` command: thin subcommands that parse, build a config and call the library.

A user error (traces/errors.py: a bad file, flag, config value, endpoint, key or run directory)
prints `error: <what failed, where, what to do>` on stderr and exits 2; `--debug` or
REFINERY_DEBUG=1 shows its traceback instead. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import math
import os
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from typer.core import TyperGroup

from agent.config import RunConfig
from bench.logs import configure_logging
from bench.settings import describe_validation, load_settings
from bench.tasks import SuiteError
from tools.config import PRECISION_DTYPES, EvalConfig
from traces.cli import traces_app
from traces.errors import ConfigError, InputFileError, UserError
from traces.schema import UnknownSchemaVersion

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
RoundsOpt = Annotated[int | None, typer.Option("--rounds", help="beam: rounds (default 3)")]
IdeasOpt = Annotated[int | None, typer.Option("--ideas", help="beam: ideas K per seed kernel and round (default 3)")]
WidthOpt = Annotated[int | None, typer.Option("--beam-width", help="beam: the W best kernels seed the next round (default 2)")]
EvalsOpt = Annotated[int | None, typer.Option("--budget-evals", help="at most this many candidate evaluations per task")]
TokensOpt = Annotated[int | None, typer.Option("--budget-tokens", help="no model call starts past this many tokens per task")]
PrecisionOpt = Annotated[
    str | None,
    typer.Option("--precision", help="fp32 (default), fp16 or bf16: inputs, parameters and buffers of both models are cast to it"),
]
ToleranceOpt = Annotated[
    str | None, typer.Option("--tolerance", help="atol = rtol for every dtype (default: fp32 1e-4, fp16/bf16 1e-2), e.g. 1e-2")
]
TF32Opt = Annotated[bool, typer.Option("--allow-tf32", help="allow TF32 in fp32 matmul and convolution (off by default)")]


def precision_settings(precision: str | None = None, tolerance: str | None = None, allow_tf32: bool = False) -> dict[str, object]:
    """The EvalConfig fields that --precision, --tolerance and --allow-tf32 set (only those given)."""
    out: dict[str, object] = {}
    if precision is not None:
        if precision not in PRECISION_DTYPES:
            raise ConfigError(
                f"--precision must be {', '.join(list(PRECISION_DTYPES)[:-1])} or {list(PRECISION_DTYPES)[-1]}, not {precision!r}"
            )
        out["precision"] = precision
    if tolerance is not None:
        try:
            value = float(tolerance)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"--tolerance must be a positive number (atol = rtol), e.g. 1e-2; not {tolerance!r}")
        out["tolerance"] = value
    if allow_tf32:
        out["allow_tf32"] = True
    return out


def _eval_config(device: str, backend: str | None = None, /, **overrides: object) -> EvalConfig:
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"--device must be cpu or cuda, not {device!r}")
    if backend not in (None, "cpp", "cuda", "triton"):
        raise ConfigError(f"--backend must be cpp, cuda or triton, not {backend!r}")
    try:
        return EvalConfig(device=device, backend=backend, **overrides)
    except ValidationError as exc:
        raise ConfigError(f"evaluator settings: {describe_validation(exc)}") from exc


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
    from agent.scripted import load_script

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
    device: DeviceOpt = "cpu",
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    trials: Annotated[int, typer.Option(help="timed calls of each side")] = 100,
    correctness_trials: Annotated[int, typer.Option(help="trials with fresh inputs and weights")] = 5,
    compiled_baseline: Annotated[bool, typer.Option(help="also time torch.compile of the reference")] = True,
    precision: PrecisionOpt = None,
    tolerance: ToleranceOpt = None,
    allow_tf32: TF32Opt = False,
) -> None:
    """Evaluate one candidate against its reference: static check, compile, correctness, timing, profile."""
    from bench.tasks import load_task_file
    from tools.evaluator import Evaluator
    from tools.jobs import TaskProgram

    configure_logging(quiet=as_json)
    numerics = precision_settings(precision, tolerance, allow_tf32)
    task = load_task_file(task_file, level=_level_of(task_file))
    candidate = _read_text(candidate_file, "candidate file")
    config = _eval_config(
        device, trials=trials, correctness_trials=correctness_trials, time_compiled_reference=compiled_baseline, **numerics
    )
    with Evaluator(config) as evaluator:
        result = evaluator.evaluate(TaskProgram(name=task.name, source=task.source_for(device)), candidate)
    if as_json:
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
    else:
        from bench.render import print_result

        print_result(console, task.name, result)
    raise typer.Exit(0 if result.correct else 1)


FLAG_KEYS = {
    "model": "llm.model",
    "base_url": "llm.base_url",
    "api_key_env": "llm.api_key_env",
    "temperature": "llm.temperature",
    "max_tokens": "llm.max_tokens",
    "retries": "llm.retries",
    "variant": "loop.variant",
    "turns": "loop.turns",
    "target_speedup": "loop.target_speedup",
    "hardware_prompt": "loop.hardware_prompt",
    "device": "eval.device",
    "backend": "eval.backend",
    "trials": "eval.trials",
    "precision": "eval.precision",
    "tolerance": "eval.tolerance",
    "allow_tf32": "eval.allow_tf32",
    "n": "search.n",
    "rounds": "search.rounds",
    "ideas": "search.ideas",
    "beam_width": "search.beam_width",
    "budget_evals": "search.budget_evals",
    "budget_tokens": "search.budget_tokens",
}
"""The config key each flag of `run` and `experiment` sets; any other flag sets the key of its own
name (--strategy, --suite, --workers, ...)."""


def given_flags(**values: object) -> dict[str, tuple[str, object]]:
    """The flags given (not None), by the config key each sets, with the flag's name for messages."""
    return {FLAG_KEYS.get(name, name): ("--" + name.replace("_", "-"), value) for name, value in values.items() if value is not None}


ConfigOpt = Annotated[Path | None, typer.Option("--config", exists=True, dir_okay=False, help="TOML settings; flags given override them")]
ModelOpt = Annotated[str | None, typer.Option(help="model name; 'local' (embedded, default), 'local-0.5b' or 'scripted:FILE'")]
BaseUrlOpt = Annotated[str | None, typer.Option(help="OpenAI-compatible endpoint")]
KeyEnvOpt = Annotated[str | None, typer.Option(help="environment variable holding the API key (default OPENAI_API_KEY)")]
TemperatureOpt = Annotated[float | None, typer.Option(help="sampling temperature (default 0)")]
MaxTokensOpt = Annotated[int | None, typer.Option(help="longest reply in tokens (default 4096)")]
RetriesOpt = Annotated[
    int | None, typer.Option(min=1, help="attempts per model call on rate limits, timeouts, dropped connections and 5xx (default 6)")
]
TurnsOpt = Annotated[int | None, typer.Option(help="turn budget (default 10)")]
TargetOpt = Annotated[float | None, typer.Option(help="stop once a correct kernel is this fast (default 1.0)")]
HardwareOpt = Annotated[
    bool | None, typer.Option("--hardware-prompt/--no-hardware-prompt", help="describe the device in the prompt (default on)")
]
BackendOpt = Annotated[str | None, typer.Option(help="cpp, cuda or triton; default: the device's")]
OptDeviceOpt = Annotated[str | None, typer.Option("--device", help="cpu (default) or cuda")]


@app.command("run")
def run_command(
    task_file: Annotated[Path, typer.Option("--task", exists=True, dir_okay=False, help="a task file of a suite")],
    config_file: ConfigOpt = None,
    variant: Annotated[str | None, typer.Option(help="feedback: G, G+E, G+E+P (default; +N on CUDA with ncu)")] = None,
    turns: TurnsOpt = None,
    device: OptDeviceOpt = None,
    backend: BackendOpt = None,
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    api_key_env: KeyEnvOpt = None,
    temperature: TemperatureOpt = None,
    max_tokens: MaxTokensOpt = None,
    retries: RetriesOpt = None,
    target_speedup: TargetOpt = None,
    hardware_prompt: HardwareOpt = None,
    run_dir: Annotated[Path | None, typer.Option(help="where traces and checkpoints go")] = None,
    resume: Annotated[bool, typer.Option(help="continue this run directory's trajectory")] = False,
    strategy: Annotated[str | None, typer.Option(help="refine (default), best-of-n or beam")] = None,
    n: Annotated[int | None, typer.Option("--n", "--samples", help="best-of-n: independent trajectories (default 4)")] = None,
    rounds: RoundsOpt = None,
    ideas: IdeasOpt = None,
    beam_width: WidthOpt = None,
    budget_evals: EvalsOpt = None,
    budget_tokens: TokensOpt = None,
    precision: PrecisionOpt = None,
    tolerance: ToleranceOpt = None,
    allow_tf32: TF32Opt = False,
) -> None:
    """One task with one strategy (default: one refinement trajectory), printing each verdict as it happens."""
    from bench.launch import launch_run
    from bench.tasks import load_task_file

    configure_logging()
    flags = given_flags(
        variant=variant,
        turns=turns,
        device=device,
        backend=backend,
        model=model,
        base_url=base_url,
        api_key_env=api_key_env,
        temperature=temperature,
        max_tokens=max_tokens,
        retries=retries,
        target_speedup=target_speedup,
        hardware_prompt=hardware_prompt,
        strategy=strategy,
        n=n,
        rounds=rounds,
        ideas=ideas,
        beam_width=beam_width,
        budget_evals=budget_evals,
        budget_tokens=budget_tokens,
        **precision_settings(precision, tolerance, allow_tf32),
    )
    task = load_task_file(task_file, level=_level_of(task_file))
    config, file_run_dir = load_settings(RunConfig, config_file, flags)
    check_model(config.llm.model)
    run_dir = run_dir or file_run_dir or Path("runs") / f"run-{task.name}-{uuid.uuid4().hex[:6]}"
    launch_run(config, task, run_dir, console, resume=resume)


@app.command("experiment")
def experiment_command(
    config_file: ConfigOpt = None,
    suite: Annotated[str | None, typer.Option(help="'builtin' or a KernelBench checkout's KernelBench/ folder")] = None,
    levels: Annotated[str | None, typer.Option(help="comma-separated, e.g. 1,2")] = None,
    tasks: Annotated[str | None, typer.Option(help="task name filter (substring or glob)")] = None,
    variants: Annotated[str | None, typer.Option(help="comma-separated, e.g. G,G+E,G+E+P")] = None,
    turns: TurnsOpt = None,
    samples: Annotated[int | None, typer.Option(help="independent trajectories per task, variant and strategy")] = None,
    strategies: Annotated[str | None, typer.Option(help="comma-separated: refine,best-of-n,beam")] = None,
    n: Annotated[int | None, typer.Option("--n", help="best-of-n: independent trajectories (default 4)")] = None,
    rounds: RoundsOpt = None,
    ideas: IdeasOpt = None,
    beam_width: WidthOpt = None,
    budget_evals: EvalsOpt = None,
    budget_tokens: TokensOpt = None,
    device: OptDeviceOpt = None,
    backend: BackendOpt = None,
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    api_key_env: KeyEnvOpt = None,
    temperature: TemperatureOpt = None,
    max_tokens: MaxTokensOpt = None,
    retries: RetriesOpt = None,
    target_speedup: TargetOpt = None,
    hardware_prompt: HardwareOpt = None,
    workers: Annotated[int | None, typer.Option(help="evaluation workers (default: per GPU / per core)")] = None,
    concurrency: Annotated[int | None, typer.Option(help="trajectories and LLM calls in flight")] = None,
    executor: Annotated[str | None, typer.Option(help="local or ray")] = None,
    trials: Annotated[int | None, typer.Option(help="timed calls of each side")] = None,
    run_dir: Annotated[Path | None, typer.Option(help="re-running on an existing directory resumes it")] = None,
    wide: Annotated[bool, typer.Option("--wide", help="the final table with every p, one line per row")] = False,
    precision: Annotated[
        str | None, typer.Option("--precision", help="fp32 (default), fp16 or bf16; another precision may share a --run-dir")
    ] = None,
    tolerance: ToleranceOpt = None,
    allow_tf32: TF32Opt = False,
) -> None:
    """Run suites × variants × samples in parallel, resumable, and print the fast_p table."""
    from bench.experiment import ExperimentConfig
    from bench.launch import launch

    configure_logging(quiet=True)
    flags = given_flags(
        suite=suite,
        levels=_ints(levels),
        tasks=tasks,
        variants=_list(variants),
        turns=turns,
        samples=samples,
        strategies=_list(strategies),
        n=n,
        rounds=rounds,
        ideas=ideas,
        beam_width=beam_width,
        budget_evals=budget_evals,
        budget_tokens=budget_tokens,
        device=device,
        backend=backend,
        model=model,
        base_url=base_url,
        api_key_env=api_key_env,
        temperature=temperature,
        max_tokens=max_tokens,
        retries=retries,
        target_speedup=target_speedup,
        hardware_prompt=hardware_prompt,
        workers=workers,
        concurrency=concurrency,
        executor=executor,
        trials=trials,
        **precision_settings(precision, tolerance, allow_tf32),
    )
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
        from bench.compare import compare as paired
        from bench.compare import render, resolve_sides

        a, b, key, paired_on = resolve_sides(run_dir, *compare)
        render(paired(a, b, key, paired_on), console, wide=wide)
        return
    if run_dir is None:
        raise ConfigError("give a run directory (refinery report RUN_DIR), or --compare A B with two run directories")
    from bench.report import report

    report(run_dir, console=console, plots=plots, wide=wide)
    console.print(f"written: {run_dir / 'report.json'}", highlight=False)


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
    from agent.local_model import serve_local

    configure_logging()
    serve_local(model, port, threads)


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
) -> None:
    """Run each task's reference eager and with torch.compile, each in its own process: ok or why not, and its time."""
    from bench.suite_check import JsonReport, check_device, check_suite, default_jobs, find_tasks
    from bench.suite_check_render import print_progress, print_summary, print_table
    from bench.suite_check_types import CheckOptions, TaskCheck

    configure_logging()
    check_device(device)
    found = find_tasks(suite, _ints(levels), tasks)
    options = CheckOptions(device=device, compile=compile_reference, timeout_s=timeout_s, jobs=jobs or default_jobs(device))
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
