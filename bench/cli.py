"""The `refinery` command: thin subcommands that parse, build a config and call the library."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from agent.config import LoopSettings, ModelSettings, RunConfig, SearchSettings
from agent.state import Attempt, TaskSpec
from bench.logs import configure_logging
from tools.config import EvalConfig
from traces.cli import traces_app

app = typer.Typer(no_args_is_help=True, add_completion=False, help="LLM kernel refinement with an honest evaluator.")
console = Console()
app.add_typer(traces_app, name="traces")

DeviceOpt = Annotated[str, typer.Option("--device", help="cpu or cuda")]
RoundsOpt = Annotated[Optional[int], typer.Option("--rounds", help="beam: rounds (default 3)")]
IdeasOpt = Annotated[Optional[int], typer.Option("--ideas", help="beam: ideas K per seed kernel and round (default 3)")]
WidthOpt = Annotated[Optional[int], typer.Option("--beam-width", help="beam: the W best kernels seed the next round (default 2)")]
EvalsOpt = Annotated[Optional[int], typer.Option("--budget-evals", help="at most this many candidate evaluations per task")]
TokensOpt = Annotated[Optional[int], typer.Option("--budget-tokens", help="no model call starts past this many tokens per task")]


def _search(**options: int | None) -> dict[str, int]:
    return {k: v for k, v in options.items() if v is not None}


def _eval_config(device: str, backend: str | None = None, **overrides: object) -> EvalConfig:
    if device not in ("cpu", "cuda"):
        raise typer.BadParameter(f"--device must be cpu or cuda, not {device!r}")
    return EvalConfig(device=device, backend=backend, **overrides)  # type: ignore[arg-type]


@app.command("eval")
def eval_command(
    task_file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="KernelBench-format reference program")],
    candidate_file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="module defining ModelNew")],
    device: DeviceOpt = "cpu",
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    trials: Annotated[int, typer.Option(help="timed calls of each side")] = 100,
    correctness_trials: Annotated[int, typer.Option(help="trials with fresh inputs and weights")] = 5,
    compiled_baseline: Annotated[bool, typer.Option(help="also time torch.compile of the reference")] = True,
) -> None:
    """Evaluate one candidate against its reference: static check, compile, correctness, timing, profile."""
    from bench.tasks import load_task_file
    from tools.evaluator import Evaluator
    from tools.jobs import TaskProgram

    configure_logging(quiet=as_json)
    task = load_task_file(task_file, level=_level_of(task_file))
    config = _eval_config(device, trials=trials, correctness_trials=correctness_trials, time_compiled_reference=compiled_baseline)
    with Evaluator(config) as evaluator:
        result = evaluator.evaluate(TaskProgram(name=task.name, source=task.source_for(device)), candidate_file.read_text())
    if as_json:
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
    else:
        from bench.render import print_result

        print_result(console, task.name, result)
    raise typer.Exit(0 if result.correct else 1)


@app.command("run")
def run_command(
    task_file: Annotated[Path, typer.Option("--task", exists=True, dir_okay=False, help="a task file of a suite")],
    variant: Annotated[str, typer.Option(help="feedback: G, G+E, G+E+P (+N on CUDA with ncu)")] = "G+E+P",
    turns: Annotated[int, typer.Option(help="turn budget")] = 10,
    device: DeviceOpt = "cpu",
    backend: Annotated[Optional[str], typer.Option(help="cpp, cuda or triton; default: the device's")] = None,
    model: Annotated[str, typer.Option(help="model name; 'local' (embedded) or 'scripted:FILE'")] = "local",
    base_url: Annotated[Optional[str], typer.Option(help="OpenAI-compatible endpoint")] = None,
    api_key_env: Annotated[str, typer.Option(help="environment variable holding the API key")] = "OPENAI_API_KEY",
    temperature: float = 0.0,
    max_tokens: int = 4096,
    target_speedup: Annotated[float, typer.Option(help="stop once a correct kernel is this fast")] = 1.0,
    hardware_prompt: Annotated[bool, typer.Option(help="describe the device in the prompt")] = True,
    run_dir: Annotated[Optional[Path], typer.Option(help="where traces and checkpoints go")] = None,
    resume: Annotated[bool, typer.Option(help="continue this run directory's trajectory")] = False,
    strategy: Annotated[str, typer.Option(help="refine, best-of-n or beam")] = "refine",
    n: Annotated[Optional[int], typer.Option("--n", "--samples", help="best-of-n: independent trajectories (default 4)")] = None,
    rounds: RoundsOpt = None,
    ideas: IdeasOpt = None,
    beam_width: WidthOpt = None,
    budget_evals: EvalsOpt = None,
    budget_tokens: TokensOpt = None,
) -> None:
    """One task with one strategy (default: one refinement trajectory), printing each verdict as it happens."""
    from agent.models import open_chat_model
    from agent.strategies import StrategyRun, run_strategy
    from bench.render import print_trajectory_end, turn_line
    from bench.tasks import load_task_file
    from tools.evaluator import Evaluator
    from tools.hardware import describe
    from traces.schema import TrajectoryId

    configure_logging()
    task = load_task_file(task_file, level=_level_of(task_file))
    search = _search(n=n, rounds=rounds, ideas=ideas, beam_width=beam_width, budget_evals=budget_evals, budget_tokens=budget_tokens)
    try:
        config = RunConfig(
            llm=ModelSettings(model=model, base_url=base_url, api_key_env=api_key_env, temperature=temperature, max_tokens=max_tokens),
            loop=LoopSettings(variant=variant, turns=turns, target_speedup=target_speedup, hardware_prompt=hardware_prompt),
            eval=_eval_config(device, backend),
            strategy=strategy,  # type: ignore[arg-type]
            search=SearchSettings(**search),
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    run_dir = run_dir or Path("runs") / f"run-{task.name}-{uuid.uuid4().hex[:6]}"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(config.model_dump_json(indent=2))
    trajectory = TrajectoryId(task=task.key, variant=config.loop.variant)

    def on_turn(attempt: Attempt) -> None:
        console.print(turn_line(attempt, turns))

    console.print(f"[bold]{task.key}[/] · {config.loop.variant} · {strategy} · {turns} turns · {device} · model {model}")
    with open_chat_model(config.llm) as chat, Evaluator(config.eval) as evaluator:
        result = run_strategy(
            StrategyRun(
                task=TaskSpec(name=task.name, source=task.source_for(device), level=task.level), config=config, model=chat,
                evaluator=evaluator, run_dir=run_dir, trajectory=trajectory, run_id=run_dir.name,
                hardware=describe(device).block(), resume=resume, on_turn=on_turn,
            )
        )
    print_trajectory_end(console, result)


@app.command("experiment")
def experiment_command(
    config_file: Annotated[Optional[Path], typer.Option("--config", exists=True, dir_okay=False, help="TOML settings")] = None,
    suite: Annotated[Optional[str], typer.Option(help="'builtin' or a KernelBench checkout's KernelBench/ folder")] = None,
    levels: Annotated[Optional[str], typer.Option(help="comma-separated, e.g. 1,2")] = None,
    tasks: Annotated[Optional[str], typer.Option(help="task name filter (substring or glob)")] = None,
    variants: Annotated[Optional[str], typer.Option(help="comma-separated, e.g. G,G+E,G+E+P")] = None,
    turns: Optional[int] = None,
    samples: Annotated[Optional[int], typer.Option(help="independent trajectories per task, variant and strategy")] = None,
    strategies: Annotated[Optional[str], typer.Option(help="comma-separated: refine,best-of-n,beam")] = None,
    n: Annotated[Optional[int], typer.Option("--n", help="best-of-n: independent trajectories (default 4)")] = None,
    rounds: RoundsOpt = None,
    ideas: IdeasOpt = None,
    beam_width: WidthOpt = None,
    budget_evals: EvalsOpt = None,
    budget_tokens: TokensOpt = None,
    device: Annotated[Optional[str], typer.Option(help="cpu or cuda")] = None,
    backend: Optional[str] = None,
    model: Optional[str] = None,
    base_url: Optional[str] = None,
    api_key_env: Optional[str] = None,
    temperature: Optional[float] = None,
    max_tokens: Optional[int] = None,
    target_speedup: Optional[float] = None,
    workers: Annotated[Optional[int], typer.Option(help="evaluation workers (default: per GPU / per core)")] = None,
    concurrency: Annotated[Optional[int], typer.Option(help="trajectories and LLM calls in flight")] = None,
    executor: Annotated[Optional[str], typer.Option(help="local or ray")] = None,
    trials: Annotated[Optional[int], typer.Option(help="timed calls of each side")] = None,
    run_dir: Annotated[Optional[Path], typer.Option(help="re-running on an existing directory resumes it")] = None,
) -> None:
    """Run suites × variants × samples in parallel, resumable, and print the fast_p table."""
    from bench.experiment import ExperimentConfig
    from bench.launch import launch

    configure_logging(quiet=True)
    overrides: dict[str, object] = {
        "suite": suite, "levels": _ints(levels), "tasks": tasks, "variants": _list(variants), "turns": turns,
        "samples": samples, "strategies": _list(strategies), "device": device, "backend": backend, "target_speedup": target_speedup,
        "workers": workers, "concurrency": concurrency, "executor": executor,
    }
    llm = {"model": model, "base_url": base_url, "api_key_env": api_key_env, "temperature": temperature, "max_tokens": max_tokens}
    data: dict[str, object] = {}
    if config_file is not None:
        import tomllib

        data = tomllib.loads(config_file.read_text())
    data.update({k: v for k, v in overrides.items() if v is not None})
    data["llm"] = {**dict(data.get("llm", {})), **{k: v for k, v in llm.items() if v is not None}}  # type: ignore[arg-type]
    search = _search(n=n, rounds=rounds, ideas=ideas, beam_width=beam_width, budget_evals=budget_evals, budget_tokens=budget_tokens)
    data["search"] = {**dict(data.get("search", {})), **search}  # type: ignore[arg-type]
    if trials is not None:
        data["eval"] = {**dict(data.get("eval", {})), "trials": trials}  # type: ignore[arg-type]
    run_dir = run_dir or Path(str(data.pop("run_dir", "") or f"runs/experiment-{uuid.uuid4().hex[:6]}"))
    data.pop("run_dir", None)
    try:
        config = ExperimentConfig.model_validate(data)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    launch(config, run_dir, console)


@app.command("report")
def report_command(
    run_dir: Annotated[Path, typer.Argument(exists=True, file_okay=False, help="an experiment's run directory")],
    plots: Annotated[bool, typer.Option(help="write PNG plots to RUN_DIR/plots")] = True,
) -> None:
    """fast_p per level × variant, rates, geometric-mean speedup and tokens; JSON and PNG plots too."""
    from bench.report import report

    report(run_dir, console=console, plots=plots)
    console.print(f"written: {run_dir / 'report.json'}")


def _list(text: str | None) -> list[str] | None:
    return [p.strip() for p in text.split(",") if p.strip()] if text else None


def _ints(text: str | None) -> list[int] | None:
    items = _list(text)
    return [int(i) for i in items] if items else None


@app.command("serve-local")
def serve_local_command(
    model: Annotated[str, typer.Option(help="local or local-0.5b")] = "local",
    port: Annotated[Optional[int], typer.Option(help="port on 127.0.0.1; default: a free one")] = None,
    threads: Annotated[Optional[int], typer.Option(help="CPU threads for the model")] = None,
) -> None:
    """Run the embedded model's OpenAI-compatible server in the foreground, for reuse across runs."""
    from agent.local_model import serve_local

    configure_logging()
    serve_local(model, port, threads)


def _level_of(path: Path) -> int:
    parent = path.resolve().parent.name
    # A task file outside a levelN folder is scored as level 1.
    return int(parent.removeprefix("level")) if parent.startswith("level") and parent[5:].isdigit() else 1


def main() -> None:
    app()


if __name__ == "__main__":
    main()
