"""What the guards against stale, aliased, deferred and decoy outputs cost, measured side by side.

    python -m benchmarks.guards --device cuda    # KernelBench level-1 ReLU shape, 4096 x 393216 fp32
    python -m benchmarks.guards --device cpu     # the same program at a CPU size

One cold evaluation fills the build cache; then each round evaluates the same correct candidate
twice in fresh workers (the cached evaluation), once with every guard off (as before them: two
rotating input sets, no timed-output checks, no extra distributions, no output, floor or share
checks) and once with the defaults, in alternating order. It prints each phase's median over the
rounds, both ways, and the ratio; the target is a cached evaluation at most 1.2x the cost before.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks.eval import CANDIDATES, PHASES, RELU_TASK, SIZES, timed_evaluation
from kernel_refinery.tools.config import EvalConfig, Guards
from kernel_refinery.tools.processes.jobs import TaskProgram

GUARDS_OFF = Guards(
    fresh_inputs=False,
    checked_timed_calls=0,
    input_distributions=(),
    plain_outputs=False,
    speed_of_light=False,
    min_kernel_share=0.0,
)
TARGET = 1.2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    batch, dim = SIZES[args.device]
    task = TaskProgram(name="relu", source=RELU_TASK.format(batch=batch, dim=dim))
    candidate = CANDIDATES[args.device].read_text()
    console = Console()
    walls: dict[str, list[float]] = {"off": [], "on": []}
    phases: dict[str, dict[str, list[float]]] = {"off": {}, "on": {}}
    with tempfile.TemporaryDirectory(prefix="refinery-perf-") as cache:
        base = EvalConfig(device=args.device, cache_dir=Path(cache), trials=100, correctness_trials=5, time_compiled_reference=False)
        configs = {"off": base.model_copy(update={"guards": GUARDS_OFF}), "on": base}
        cold, _, _ = timed_evaluation(configs["on"], task, candidate)
        if not cold.correct:
            raise SystemExit(f"the candidate is not correct: {cold.headline()}")
        for round_ in range(args.rounds):
            order = ("off", "on") if round_ % 2 == 0 else ("on", "off")
            for which in order:
                result, wall, start = timed_evaluation(configs[which], task, candidate)
                if not result.correct:
                    raise SystemExit(f"guards {which}: the candidate is not correct: {result.headline()}")
                walls[which].append(wall)
                for phase in ("worker start", *PHASES):
                    value = start if phase == "worker start" else result.stage_seconds.get(phase, 0.0)
                    phases[which].setdefault(phase, []).append(value)
                console.print(f"round {round_ + 1} guards {which}: {wall:.2f} s")

    table = Table(title=f"cached evaluation of relu {batch}x{dim} fp32 on {args.device}, median of {args.rounds} rounds")
    for column in ("phase", "guards off s", "guards on s", "ratio"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    figures: dict[str, dict[str, float]] = {}
    for phase in phases["on"]:
        off, on = statistics.median(phases["off"][phase]), statistics.median(phases["on"][phase])
        figures[phase] = {"off_s": off, "on_s": on}
        table.add_row(phase, f"{off:.2f}", f"{on:.2f}", f"{on / off:.2f}x" if off > 0 else "-")
    off_wall, on_wall = statistics.median(walls["off"]), statistics.median(walls["on"])
    ratio = on_wall / off_wall
    table.add_row("[bold]whole cached evaluation[/]", f"[bold]{off_wall:.2f}[/]", f"[bold]{on_wall:.2f}[/]", f"[bold]{ratio:.2f}x[/]")
    console.print(table)
    verdict = "within" if ratio <= TARGET else "over"
    console.print(f"guards cost {ratio:.2f}x the cached evaluation before them ({verdict} the {TARGET}x target)")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "device": args.device,
                    "rounds": args.rounds,
                    "off_wall_s": walls["off"],
                    "on_wall_s": walls["on"],
                    "phases": figures,
                    "ratio": ratio,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
