"""One candidate, evaluated side by side: ours, the evaluator before the judge/runner split, and
KernelBench HEAD's `eval_kernel_against_ref`, each in a fresh Python process (its start, imports
and device set-up are part of the wall time), cold (empty build cache) and then cached.

    python -m benchmarks.side_by_side --device cuda --json results/side_by_side_h200.json \\
        [--before PATH]   # a checkout of the evaluator before the split (git archive of its commit)

KernelBench's side runs the vendored `benchmarks/kernelbench_vendor/eval.py` at the settings of its
batch evaluation: 5 correctness trials, 100 timed calls of each side, cuda_event timing. Ours runs
the evaluator's defaults (5 correctness trials and 100 timed calls too), with every guard on and
no torch.compile baseline (KernelBench times none).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks import REPO_ROOT
from benchmarks.throughput.manifest import MANIFEST

HERE = Path(__file__).resolve().parent
KB_TASKS = MANIFEST.parent / "tasks"  # the throughput benchmark's copies, where its manifest reads them
THROUGHPUT = MANIFEST.parent / "candidates"
CPU_RELU = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.rand(64, 65536)]


def get_init_inputs():
    return []
"""

CASES: dict[str, list[tuple[str, Path | None, Path]]] = {
    "cuda": [
        (
            "level1/1_Square_matrix_multiplication_",
            KB_TASKS / "level1" / "1_Square_matrix_multiplication_.py",
            HERE / "candidates" / "level1_1_matmul_tiled.py",
        ),
        ("level1/19_ReLU", KB_TASKS / "level1" / "19_ReLU.py", HERE / "candidates" / "level1_19_relu.py"),
        # Kernels of a millisecond or more, where the judge's figure must agree with KernelBench's cuda_event.
        ("level1/40_LayerNorm", KB_TASKS / "level1" / "40_LayerNorm.py", THROUGHPUT / "level1_40_layernorm_twopass.py"),
        ("level1/42_Max_Pooling_2D", KB_TASKS / "level1" / "42_Max_Pooling_2D.py", THROUGHPUT / "level1_42_maxpool2d.py"),
    ],
    "cpu": [("relu 64x65536", None, REPO_ROOT / "tests" / "fixtures" / "cpu_solutions" / "1_relu.py")],
}

OURS = """
import json, sys, time
T0 = time.time()
import structlog
EVENTS = []
def keep(_, name, event):
    EVENTS.append({"at_s": round(time.time() - T0, 2), **{k: v for k, v in event.items() if k not in ("timestamp", "level")}})
    raise structlog.DropEvent
structlog.configure(processors=[keep])
from pathlib import Path
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.evaluator import Evaluator
from kernel_refinery.tools.processes.jobs import TaskProgram
device, task, candidate, cache = sys.argv[1:5]
config = EvalConfig(device=device, cache_dir=Path(cache), time_compiled_reference=False)
with Evaluator(config) as ev:
    r = ev.evaluate(TaskProgram(name="task", source=Path(task).read_text()), Path(candidate).read_text())
    judge = getattr(ev, "judge", None)  # the evaluator before the split has none
    log = Path(judge.log_path).read_text() if judge is not None and judge.log_path else ""
t = r.timing
print("RESULT " + json.dumps({"status": r.status.value if r.status else None, "speedup": t.speedup if t else None,
      "candidate_ms": t.candidate.median if t else None, "reference_ms": t.reference.median if t else None,
      "noise_band": getattr(t, "noise_band", None), "batch_calls": getattr(t, "batch_calls", None),
      "message": r.message[:300], "stages": r.stage_seconds,
      "judge_log": [ln for ln in log.splitlines() if "judged" in ln or "correctness_phases" in ln],
      "timeline": [e for e in EVENTS if e.get("event") in ("template_started", "worker_started", "judge_started", "evaluated")]
                  + [{"at_s": round(time.time() - T0, 2), "event": "done"}]}, default=str))
"""

KERNELBENCH = """
import json, sys
from pathlib import Path
import torch
from benchmarks.kernelbench_vendor.eval import eval_kernel_against_ref
task, candidate, build = sys.argv[1:4]
r = eval_kernel_against_ref(Path(task).read_text(), Path(candidate).read_text(), seed_num=42, num_correct_trials=5,
    num_perf_trials=100, measure_performance=True, timing_method="cuda_event", build_dir=build, device=0, backend="cuda")
ok = r is not None and r.correctness
print("RESULT " + json.dumps({"status": "correct" if ok else ("compile_error" if r is None or not r.compiled else "incorrect"),
      "speedup": (r.ref_runtime / r.runtime) if ok and r.runtime > 0 else None, "message": str(r.metadata)[:300] if r else "None",
      "candidate_ms": r.runtime if ok else None, "reference_ms": r.ref_runtime if ok else None,
      "stages": {}}))
"""


@dataclass(frozen=True)
class Run:
    task: str
    side: str
    cache: str
    wall_s: float
    status: str | None
    speedup: float | None
    message: str
    stages: dict[str, float]
    candidate_ms: float | None = None
    """Per call, median: ours the judge's clock, KernelBench's its cuda_event mean."""
    reference_ms: float | None = None
    noise_band: tuple[float, float] | None = None
    """Ours: the reference's A/A band."""
    batch_calls: int | None = None
    judge_log: tuple[str, ...] = ()
    timeline: tuple[dict[str, object], ...] = ()
    """Seconds since the evaluating process began, at each start-up and stage event (ours only)."""


def run_side(side: str, code: str, args: list[str], pythonpath: Path) -> tuple[float, dict[str, object]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pythonpath), os.environ.get("PYTHONPATH", "")]), "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=pythonpath, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - started
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        return wall, {"status": "harness_error", "speedup": None, "message": (proc.stdout + proc.stderr)[-600:], "stages": {}}
    return wall, json.loads(line.removeprefix("RESULT "))


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def agreement(runs: list[Run]) -> Table:
    """Per task, cached runs: our per-call times (the judge's clock) against KernelBench's
    cuda_event, and whether KernelBench's speedup lies in our A/A band around ours."""
    table = Table(title="the same kernels timed by both: ms per call (cached runs)")
    for column in ("task", "ours ref", "ours cand", "K", "kb ref", "kb cand", "ours x", "kb x", "kb/ours", "A/A band", "agree"):
        table.add_column(column, justify="left" if column == "task" else "right")
    for name in dict.fromkeys(r.task for r in runs):
        ours = next((r for r in runs if r.task == name and r.side == "ours" and r.cache == "cached"), None)
        kb = next((r for r in runs if r.task == name and r.side == "kernelbench" and r.cache == "cached"), None)
        if ours is None or kb is None or ours.speedup is None or kb.speedup is None:
            continue
        ratio = kb.speedup / ours.speedup
        band = ours.noise_band
        inside = "" if band is None else ("yes" if band[0] <= ratio <= band[1] else "no")
        table.add_row(
            name,
            f"{ours.reference_ms:.4g}",
            f"{ours.candidate_ms:.4g}",
            str(ours.batch_calls),
            f"{kb.reference_ms:.4g}",
            f"{kb.candidate_ms:.4g}",
            f"{ours.speedup:.3f}",
            f"{kb.speedup:.3f}",
            f"{ratio:.3f}",
            "" if band is None else f"{band[0]:.3f}-{band[1]:.3f}",
            inside,
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--before", type=Path, help="a checkout of the evaluator before the judge/runner split")
    parser.add_argument("--sides", default="ours,kernelbench,before")
    parser.add_argument("--tasks", default="", help="only cases whose name contains this")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sides = [s for s in args.sides.split(",") if s != "kernelbench" or args.device == "cuda"]
    if args.before is None:
        sides = [s for s in sides if s != "before"]
    runs: list[Run] = []
    console = Console()
    with tempfile.TemporaryDirectory(prefix="side-by-side-") as scratch:
        for name, given, candidate in CASES[args.device]:
            if args.tasks not in name:
                continue
            task_path = given
            if task_path is None:
                task_path = Path(scratch) / "cpu_relu.py"
                task_path.write_text(CPU_RELU)
            for side in sides:
                cache = Path(scratch) / f"{side}-{candidate.stem}"
                for label in ("cold", "cached"):
                    if side == "kernelbench":
                        wall, out = run_side(side, KERNELBENCH, [str(task_path), str(candidate), str(cache)], REPO_ROOT)
                    else:
                        root = REPO_ROOT if side == "ours" else args.before
                        assert root is not None
                        wall, out = run_side(side, OURS, [args.device, str(task_path), str(candidate), str(cache)], root)
                    status, speedup, stages = out.get("status"), out.get("speedup"), out.get("stages")
                    run = Run(
                        task=name,
                        side=side,
                        cache=label,
                        wall_s=wall,
                        status=str(status) if status is not None else None,
                        speedup=float(speedup) if isinstance(speedup, (int, float)) else None,
                        message=str(out.get("message", "")),
                        stages=dict(stages) if isinstance(stages, dict) else {},
                        candidate_ms=_number(out.get("candidate_ms")),
                        reference_ms=_number(out.get("reference_ms")),
                        noise_band=tuple(out["noise_band"]) if isinstance(out.get("noise_band"), list) else None,  # type: ignore[arg-type]  # two floats from the child's JSON
                        batch_calls=int(_number(out.get("batch_calls")) or 0) or None,
                        judge_log=tuple(str(line) for line in out.get("judge_log") or ()),  # type: ignore[attr-defined]  # a list from the child's JSON
                        timeline=tuple(out.get("timeline") or ()),  # type: ignore[arg-type]  # a list of dicts from the child JSON
                    )
                    runs.append(run)
                    if args.json:  # after every run: a device call's time limit may end the benchmark early
                        args.json.write_text(json.dumps({"device": args.device, "runs": [asdict(r) for r in runs]}, indent=1))
                    console.print(f"{name} {side} {label}: {wall:.1f} s, {run.status}, speedup {run.speedup}")
                    if run.status != "correct" and run.message:
                        console.print(f"    {run.message}", markup=False)
                    for event in run.timeline:
                        console.print(f"    {event}", highlight=False)
    table = Table(title=f"one evaluation in a fresh process, {args.device}: wall seconds")
    for column in ("task", "cache", *sides, *(f"ours / {s}" for s in sides if s != "ours")):
        table.add_column(column, justify="left" if column in ("task", "cache") else "right")
    for name in [case[0] for case in CASES[args.device]]:
        for label in ("cold", "cached"):
            walls = {r.side: r.wall_s for r in runs if r.task == name and r.cache == label}
            if not walls:
                continue
            ratios = [f"{walls['ours'] / walls[s]:.2f}" for s in sides if s != "ours" and s in walls and "ours" in walls]
            table.add_row(name, label, *(f"{walls.get(s, float('nan')):.1f}" for s in sides), *ratios)
    console.print(table)
    console.print(agreement(runs))
    if args.json:
        args.json.write_text(json.dumps({"device": args.device, "runs": [asdict(r) for r in runs]}, indent=1))


if __name__ == "__main__":
    main()
