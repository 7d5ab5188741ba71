"""Experiment runner throughput, device busy fraction and per-turn overhead, measured side by side.

    python -m benchmarks.experiment            # CPU, scripted model, built-in tasks

1. Throughput: the same scripted experiment with 1 and with 2 evaluation workers (each pinned to
   its own cores), kernels already built; evaluations per minute and their ratio.
2. Busy fraction: candidates that each need a fresh compile, 2 workers sharing one device: the
   share of wall time the device spends running candidates while the other worker compiles.
3. Overhead: per turn, wall time less the LLM call and the worker's own stage times (compile,
   correctness, timing, profile): graph, checkpoints, traces, IPC.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks import REPO_ROOT
from kernel_refinery.agent.chat.scripted import scripted_model
from kernel_refinery.agent.config import LoopSettings, ModelSettings
from kernel_refinery.bench.experiment import ExperimentConfig, run_experiment
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.tools.processes.pool import EvaluatorPool, cpu_groups
from kernel_refinery.traces.store import iter_trajectories

SOLUTIONS = REPO_ROOT / "tests" / "fixtures" / "cpu_solutions"
CHAIN = "level2/9_bias_tanh_clamp_chain"


def fence(code: str) -> str:
    return f"```python\n{code}```\n"


def experiment(
    run_dir: Path, cache: Path, workers: int, samples: int, trials: int, turns: int = 1, concurrency: int | None = None
) -> tuple[float, int, float]:
    """Run `samples` trajectories of the fused-chain task; returns wall s, evaluations, overhead per turn.

    Overhead is the wall time not spent in the LLM call or inside the worker's stages (compile,
    correctness, timing, profile): graph steps, checkpoints, traces, static check, the pipe. It is
    only meaningful with concurrency 1, where no trajectory waits for another's worker.
    """
    config = ExperimentConfig(
        suite="builtin",
        levels=[2],
        tasks="9_bias_tanh_clamp_chain",
        variants=["G+E"],
        loop=LoopSettings(turns=turns, hardware_prompt=False, target_speedup=1e9 if turns > 1 else 0.0),
        samples=samples,
        workers=workers,
        concurrency=concurrency or max(2, 2 * workers),
        llm=ModelSettings(model="scripted:inline"),
        eval=EvalConfig(trials=trials, warmup=2, correctness_trials=3, time_compiled_reference=False, cache_dir=cache),
    )
    model = scripted_model([fence((SOLUTIONS / "9_bias_tanh_clamp_chain.py").read_text())])
    # Each worker gets one core of its own in both runs, so the ratio measures workers, not threads.
    with EvaluatorPool(config.eval_config(), workers=workers, devices=len(cpu_groups(2))) as pool:
        for slot in pool.slots:  # workers started before the clock runs
            slot.evaluator.worker.start()
        started = time.perf_counter()
        records = run_experiment(config, run_dir, model, pool)
        wall = time.perf_counter() - started
    turns_run = 0
    accounted = 0.0
    for _, trace in iter_trajectories(run_dir):
        for record in trace:
            turns_run += 1
            accounted += record.phase_seconds.get("generate", 0.0)
            if record.result is not None:
                accounted += sum(v for k, v in record.result.stage_seconds.items() if k != "static")
    evaluations = sum(r.turns for r in records)
    return wall, evaluations, (wall - accounted) / max(1, turns_run)


def busy_fraction(cache: Path, candidates: int, trials: int) -> tuple[float, float]:
    """Fresh-compile candidates through 2 workers on one device; returns (busy fraction, wall s)."""
    from kernel_refinery.bench.tasks import builtin_suite_root, load_suite

    task = next(t for t in load_suite(builtin_suite_root(), levels=[2]) if t.name == "9_bias_tanh_clamp_chain")
    program = TaskProgram(name=task.name, source=task.source_for("cpu"))
    base = (SOLUTIONS / "9_bias_tanh_clamp_chain.py").read_text()
    sources = [base.replace("#include <cmath>", f"#include <cmath>\n// build {uuid.uuid4().hex}", 1) for _ in range(candidates)]
    config = EvalConfig(trials=trials, warmup=2, correctness_trials=3, time_compiled_reference=False, cache_dir=cache)
    from concurrent.futures import ThreadPoolExecutor

    with EvaluatorPool(config, workers=2, devices=1) as pool:
        pool.evaluate(program, base)  # warm both the reference baseline and the worker start
        pool.started = time.monotonic()
        pool.devices[0].busy_s = 0.0
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=2) as threads:
            results = list(threads.map(lambda s: pool.evaluate(program, s), sources))
        wall = time.perf_counter() - started
        assert all(r.correct for r in results), [r.headline() for r in results]
        return pool.busy_fraction(), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=12, help="trajectories per throughput run")
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--compile-candidates", type=int, default=4)
    parser.add_argument("--busy-trials", type=int, default=1500, help="timed calls per side in the busy-fraction run")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory(prefix="refinery-perfx-") as tmp:
        cache = Path(tmp) / "cache"
        experiment(Path(tmp) / "warm", cache, workers=1, samples=1, trials=5)  # build the kernel once
        one_wall, one_n, _ = experiment(Path(tmp) / "w1", cache, 1, args.samples, args.trials)
        two_wall, two_n, _ = experiment(Path(tmp) / "w2", cache, 2, args.samples, args.trials)
        _, _, overhead = experiment(Path(tmp) / "alone", cache, 1, 2, args.trials, turns=3, concurrency=1)
        fraction, busy_wall = busy_fraction(cache, args.compile_candidates, args.busy_trials)
    per_min_1 = 60 * one_n / one_wall
    per_min_2 = 60 * two_n / two_wall
    table = Table(title="experiment runner on CPU (scripted model, fused-chain kernel)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("evaluations / min, 1 worker", f"{per_min_1:.1f}")
    table.add_row("evaluations / min, 2 workers", f"{per_min_2:.1f}")
    table.add_row("[bold]throughput ratio 2 : 1[/]", f"[bold]{per_min_2 / per_min_1:.2f}x[/]")
    table.add_row("device busy fraction (fresh compiles overlapping timing)", f"{100 * fraction:.0f}% of {busy_wall:.0f} s")
    table.add_row("framework overhead per turn (graph, checkpoints, traces, pipe)", f"{overhead:.3f} s")
    console.print(table)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "per_min_1": per_min_1,
                    "per_min_2": per_min_2,
                    "ratio": per_min_2 / per_min_1,
                    "busy_fraction": fraction,
                    "overhead_s": overhead,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
