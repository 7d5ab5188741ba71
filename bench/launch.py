"""Launching an experiment: the model, the evaluation pool, progress, and the table at the end."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agent.models import open_chat_model
from bench.experiment import ExperimentConfig, TrajectoryRecord, is_correct, plan, prepare_run_dir, read_results, run_experiment
from bench.report import report
from tools.hardware import describe


def make_pool(config: ExperimentConfig) -> object:
    eval_config = config.eval_config()
    if config.executor == "ray":
        from bench.ray_pool import RayEvaluatorPool

        return RayEvaluatorPool(eval_config, workers=config.worker_count())
    from tools.pool import EvaluatorPool

    return EvaluatorPool(eval_config, workers=config.worker_count())


def launch(config: ExperimentConfig, run_dir: Path, console: Console, wide: bool = False) -> None:
    prepare_run_dir(run_dir, config)
    total = len(plan(config))
    numerics = config.eval_config()
    done = [r for r in read_results(run_dir) if r.precision == numerics.precision]
    console.print(
        f"[bold]experiment[/] {run_dir}: {total} trajectories ({len(done)} already finished) · "
        f"variants {', '.join(config.variants)} · strategies {', '.join(config.strategies)} · {config.turns} turns · {config.device} · "
        f"{numerics.precision} (atol = rtol = {numerics.precision_tolerance.atol:g}{', TF32 allowed' if numerics.allow_tf32 else ''}) · "
        f"model {config.llm.model}",
        highlight=False,
    )
    counts = {"done": len(done), "correct": sum(map(is_correct, done)), "fast1": sum(1 for r in done if is_correct(r) and (r.best_speedup or 0) > 1)}
    columns = (
        TextColumn("[progress.description]{task.description}"), BarColumn(bar_width=20), MofNCompleteColumn(),
        TextColumn("correct {task.fields[correct]} · fast_1 {task.fields[fast1]}"), TimeElapsedColumn(),
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
                    + ("" if record.strategy == "refine" else f" {record.strategy}")
                    + ("" if record.precision == "fp32" else f" {record.precision}") + f": {record.best_status}{speed}",
                    highlight=False, markup=False,
                )

        pool = make_pool(config)
        try:
            run_experiment(config, run_dir, lambda: chat, pool, on_done=on_done, hardware=describe(config.device).block())
        finally:
            pool.close()  # type: ignore[attr-defined]
    report(run_dir, console=console, wide=wide)
