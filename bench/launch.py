"""Launching what the CLI asked for: the model, the evaluator or evaluation pool, progress, and the
results at the end, for `refinery run` (one task) and `refinery experiment`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from langchain_core.language_models.chat_models import BaseChatModel
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kernel_refinery.agent.chat.models import open_chat_model
from kernel_refinery.agent.config import RunConfig, needs_quiet_host
from kernel_refinery.agent.context import CandidateEvaluator, RunContext
from kernel_refinery.agent.quiet import QuietHost
from kernel_refinery.agent.state import Attempt, TaskSpec
from kernel_refinery.agent.strategies import StrategyResult, run_strategy
from kernel_refinery.bench.experiment import (
    ExperimentConfig,
    TrajectoryRecord,
    is_correct,
    plan,
    prepare_run_dir,
    read_results,
    run_experiment,
)
from kernel_refinery.bench.provenance import collect_manifest
from kernel_refinery.bench.render import print_trajectory_end, turn_line
from kernel_refinery.bench.report import report
from kernel_refinery.bench.tasks import Task
from kernel_refinery.core.numerics import Precision
from kernel_refinery.core.strategy import Strategy
from kernel_refinery.tools.hardware import describe
from kernel_refinery.traces.manifest import write_manifest
from kernel_refinery.traces.schema import TrajectoryId

QUIET_NOTE = " · LLM calls and evaluations take turns (embedded model on this CPU)"


class EvaluationPool(CandidateEvaluator, Protocol):
    """An experiment's shared evaluator: tools.processes.pool.EvaluatorPool or bench.ray_pool.RayEvaluatorPool."""

    def close(self) -> None: ...


def make_pool(config: ExperimentConfig) -> EvaluationPool:
    if config.executor == "ray":
        from kernel_refinery.bench.ray_pool import RayEvaluatorPool

        # 0: one actor per GPU of the Ray cluster, which this machine's GPU count does not tell.
        return RayEvaluatorPool(config.eval, workers=config.workers)
    from kernel_refinery.tools.processes.pool import EvaluatorPool

    return EvaluatorPool(config.eval, workers=config.worker_count())


def launch_run(config: RunConfig, task: Task, run_dir: Path, console: Console, resume: bool = False) -> None:
    """One task with the config's strategy, printing each verdict as it happens."""
    quiet = QUIET_NOTE if needs_quiet_host(config.llm, config.eval) else ""
    console.print(
        f"[bold]{task.key}[/] · {config.loop.variant} · {config.strategy} · {config.loop.turns} turns · {config.eval.device} · "
        f"{config.eval.numerics.describe()} · model {config.llm.model}{quiet}",
        highlight=False,
    )

    def on_turn(attempt: Attempt) -> None:
        console.print(turn_line(attempt, config.loop.turns))

    with open_chat_model(config.llm) as chat:
        result = refine_task(config, task, run_dir, chat, resume=resume, on_turn=on_turn)
    print_trajectory_end(console, result)


def refine_task(
    config: RunConfig,
    task: Task,
    run_dir: Path,
    chat: BaseChatModel,
    resume: bool = False,
    on_turn: Callable[[Attempt], None] | None = None,
) -> StrategyResult:
    """The config's strategy on one task with this chat model and an evaluator of its own, in
    run_dir (which holds its checkpoints and traces): `refinery run` and the API's `refine`."""
    from kernel_refinery.tools.evaluator import Evaluator

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(config.model_dump_json(indent=2))
    write_manifest(run_dir, collect_manifest(config.eval, [(task.key, task.path)]))
    trajectory = TrajectoryId(task=task.key, variant=str(config.loop.variant), precision=config.eval.precision)
    with Evaluator(config.eval) as evaluator:
        run = RunContext(
            config=config,
            model=chat,
            evaluator=evaluator,
            run_dir=run_dir,
            run_id=run_dir.name,
            hardware=describe(config.eval.device).block(),
            resume=resume,
            on_turn=on_turn,
            host=QuietHost.for_settings(config.llm, config.eval),
        )
        return run_strategy(run, TaskSpec(name=task.name, source=task.source_for(config.eval.device), level=task.level), trajectory)


def launch(config: ExperimentConfig, run_dir: Path, console: Console, wide: bool = False) -> None:
    changed = prepare_run_dir(run_dir, config)
    if changed:
        console.print(
            f"[bold yellow]warning:[/] {run_dir} was run before with other facts ({'; '.join(d.describe() for d in changed)}); "
            "its results mix both (the earlier manifest is kept as manifest-before-*.json)",
            highlight=False,
        )
    total = len(plan(config))
    numerics = config.eval.numerics
    done = [r for r in read_results(run_dir) if r.precision == numerics.precision]
    quiet = QUIET_NOTE if needs_quiet_host(config.llm, config.eval) else ""
    console.print(
        f"[bold]experiment[/] {run_dir}: {total} trajectories ({len(done)} already finished) · "
        f"variants {', '.join(config.variants)} · strategies {', '.join(config.strategies)} · {config.loop.turns} turns · "
        f"{config.eval.device} · {numerics.describe()} · model {config.llm.model}{quiet}",
        highlight=False,
    )
    counts = {
        "done": len(done),
        "correct": sum(map(is_correct, done)),
        "fast1": sum(1 for r in done if is_correct(r) and (r.best_speedup or 0) > 1),
    }
    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(bar_width=20),
        MofNCompleteColumn(),
        TextColumn("correct {task.fields[correct]} · fast_1 {task.fields[fast1]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress, open_chat_model(config.llm) as chat:
        bar = progress.add_task("trajectories", total=total, completed=counts["done"], correct=counts["correct"], fast1=counts["fast1"])

        def on_done(record: TrajectoryRecord) -> None:
            counts["done"] += 1
            counts["correct"] += is_correct(record)
            counts["fast1"] += is_correct(record) and (record.best_speedup or 0) > 1
            progress.update(bar, completed=counts["done"], correct=counts["correct"], fast1=counts["fast1"])
            if not console.is_terminal:
                # No live bar in a file or a pipe: one line per finished trajectory instead.
                speed = f" {record.best_speedup:.2f}x" if record.best_speedup is not None else ""
                progress.console.print(
                    f"{counts['done']}/{total} {record.task} {record.variant} sample {record.sample}"
                    + ("" if record.strategy == Strategy.REFINE else f" {record.strategy}")
                    + (f" {record.precision}" if record.precision != Precision.FP32 else "")
                    + f": {record.best_status}{speed}",
                    highlight=False,
                    markup=False,
                )

        pool = make_pool(config)
        try:
            run_experiment(config, run_dir, chat, pool, on_done=on_done, hardware=describe(config.eval.device).block())
        finally:
            pool.close()
    report(run_dir, console=console, wide=wide)
