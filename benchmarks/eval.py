"""Where an evaluation's wall time goes: cold compile, cached compile, correctness, timing, profile.

    python -m benchmarks.eval --device cuda     # KernelBench level-1 ReLU shape, 4096 x 393216 fp32
    python -m benchmarks.eval --device cpu      # the same program at a CPU size

Each evaluation runs in a fresh worker process (its start is part of the wall time): first with
an empty build cache (cold), then with the cache the first one filled (cached).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks import REPO_ROOT
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.evaluator import Evaluator
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.tools.results import EvalResult

RELU_TASK = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


batch_size = {batch}
dim = {dim}


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
"""

SIZES = {"cuda": (4096, 393216), "cpu": (64, 65536)}
FIXTURES = REPO_ROOT / "tests" / "fixtures"
CANDIDATES = {"cuda": FIXTURES / "cuda_solutions" / "1_relu.py", "cpu": FIXTURES / "cpu_solutions" / "1_relu.py"}
PHASES = ("static", "compile", "correctness", "timing", "profile")


def timed_evaluation(config: EvalConfig, task: TaskProgram, candidate: str) -> tuple[EvalResult, float, float]:
    """The result, the wall time until it arrived (worker start included), and the worker's start."""
    evaluator = Evaluator(config)
    try:
        started = time.perf_counter()
        result = evaluator.evaluate(task, candidate)
        wall = time.perf_counter() - started
    finally:
        evaluator.close()
    return result, wall, evaluator.worker.last_start_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--candidate", type=Path, help="module defining ModelNew for relu(x)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--compiled-baseline",
        action="store_true",
        help="also time torch.compile of the reference (not part of the target's definition)",
    )
    args = parser.parse_args()

    batch, dim = SIZES[args.device]
    task = TaskProgram(name="relu", source=RELU_TASK.format(batch=batch, dim=dim))
    candidate = (args.candidate or CANDIDATES[args.device]).read_text()
    with tempfile.TemporaryDirectory(prefix="refinery-perf-") as cache:
        config = EvalConfig(
            device=args.device,
            cache_dir=Path(cache),
            trials=100,
            correctness_trials=5,
            time_compiled_reference=args.compiled_baseline,
        )
        cold, cold_wall, cold_start = timed_evaluation(config, task, candidate)
        cached, cached_wall, cached_start = timed_evaluation(config, task, candidate)
    for result in (cold, cached):
        if not result.correct:
            raise SystemExit(f"the candidate is not correct: {result.headline()}")

    table = Table(title=f"evaluation of relu {batch}x{dim} fp32 on {args.device}: where the wall time goes")
    for column in ("phase", "cold s", "cold %", "cached s", "cached %"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    figures: dict[str, dict[str, float]] = {}
    rows = [(p, cold.stage_seconds.get(p, 0.0), cached.stage_seconds.get(p, 0.0)) for p in PHASES]
    rows.insert(0, ("worker start (python, torch, device)", cold_start, cached_start))
    rows.append(
        (
            "pipe, orchestration",
            cold_wall - cold_start - sum(cold.stage_seconds.values()),
            cached_wall - cached_start - sum(cached.stage_seconds.values()),
        )
    )
    for phase, a, b in rows:
        figures[phase] = {"cold_s": a, "cached_s": b}
        table.add_row(phase, f"{a:.2f}", f"{100 * a / cold_wall:.0f}%", f"{b:.2f}", f"{100 * b / cached_wall:.0f}%")
    table.add_row("[bold]whole evaluation[/]", f"[bold]{cold_wall:.2f}[/]", "100%", f"[bold]{cached_wall:.2f}[/]", "100%")
    table.add_row("with a running worker", f"{cold_wall - cold_start:.2f}", "", f"{cached_wall - cached_start:.2f}", "")
    console = Console()
    console.print(table)
    t = cached.timing
    assert t is not None
    console.print(
        f"candidate {t.candidate.median:.3f} ms, reference {t.reference.median:.3f} ms, "
        f"speedup {t.speedup:.2f}x; compile cache: cold {cold.compile.cache_misses if cold.compile else '?'} built, "
        f"cached {cached.compile.cache_hits if cached.compile else '?'} hit"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "cold_wall_s": cold_wall,
                    "cached_wall_s": cached_wall,
                    "phases": figures,
                    "stage_seconds": {"cold": cold.stage_seconds, "cached": cached.stage_seconds},
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
