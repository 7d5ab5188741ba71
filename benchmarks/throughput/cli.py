"""Candidates per hour: our evaluator pool against KernelBench's batch evaluation, on one GPU.

    python -m benchmarks.throughput [--workers N] [--candidates GLOB] [--out FILE.json]
    python -m benchmarks.throughput --side kernelbench --out kb.json       # one side per command
    python -m benchmarks.throughput --side ours --out ours.json
    python -m benchmarks.throughput --combine kb.json ours.json [--out both.json]
    python -m benchmarks.throughput --side kernelbench --candidates 'level1_*' --out kb1.json   # a side in parts:
    python -m benchmarks.throughput --side kernelbench --candidates 'level2_*' --out kb2.json   # --combine adds them up
    python -m benchmarks.throughput --check                                # CPU: manifest, tasks, candidates, imports

The same candidates (manifest.toml: KernelBench tasks, CUDA candidates in its ModelNew format,
mostly correct, some wrong, some that do not compile, one that faults) go through both, one after
the other in this process, each cold (a fresh build directory, fresh processes):

- ours: kernel_refinery.tools.processes.pool.EvaluatorPool, N workers on GPU 0 (default: the host's cores, at most 16),
  the experiment's stages (compile; correctness; timing and profile when correct);
- KernelBench: scripts/eval_from_generations.py's flow through the vendored code
  (benchmarks/kernelbench_vendor): batch_compile with build_cache on the host's cores, then
  batch_eval on one GPU at its defaults (kernelbench_driver.py).

It prints candidates per hour of each, their ratio, our device's busy fraction (the device lock's
held time over the wall time) and NVML's utilization, and every candidate's verdict on each side
beside the expected one. What each side prints goes to log files (--verbose: to the terminal).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from rich.console import Console

from benchmarks.throughput import manifest
from benchmarks.throughput.report import SCHEMA, combine, per_hour, ratio, render

MAX_WORKERS = 16
"""Our pool's default ceiling: each worker holds a CUDA context and, while it compiles, nvcc and cc1plus."""

ARCH_NAMES = {7: "Volta", 8: "Ampere", 9: "Hopper", 10: "Blackwell", 12: "Blackwell"}
"""What KernelBench's set_gpu_arch takes for a compute capability's major version (8.9 is Ada)."""


def host_cores() -> int:
    return len(os.sched_getaffinity(0))


def default_workers(candidates: int) -> int:
    return max(1, min(host_cores(), MAX_WORKERS, candidates))


def gpu_arch_name(major: int, minor: int) -> str:
    if (major, minor) == (8, 9):
        return "Ada"
    if major == 7 and minor == 5:
        return "Turing"
    if major not in ARCH_NAMES:
        raise SystemExit(f"no KernelBench architecture name for compute capability {major}.{minor}; pass --gpu-arch")
    return ARCH_NAMES[major]


def host_info() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "cpu_cores": host_cores(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    nvcc = shutil.which("nvcc") or (Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc").as_posix()
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        lines = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout.strip().splitlines()
        info["nvcc"] = lines[-1] if lines else None
    return info


@contextlib.contextmanager
def output_to(path: Path | None) -> Iterator[None]:
    """File descriptors 1 and 2, and so every child process's output, into `path` for a while."""
    if path is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for each in (*saved, fd):
            os.close(each)


def _trimmed(value: Any, limit: int = 2000) -> Any:
    """JSON-ready, long strings (KernelBench keeps whole tracebacks and compiler logs) cut short."""
    if isinstance(value, str):
        return value if len(value) <= limit else value[:limit] + f"... ({len(value)} chars)"
    if isinstance(value, dict):
        return {str(k): _trimmed(v, limit) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_trimmed(v, limit) for v in value]
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    return _trimmed(str(value), limit)


def run_side_ours(selected: list[manifest.Candidate], workers: int, work_root: Path, log: Path | None, say: Console) -> dict[str, Any]:
    from benchmarks.throughput.gpu_sampler import GpuSampler
    from benchmarks.throughput.manifest import Work
    from benchmarks.throughput.ours import CompileTracker, run_ours
    from kernel_refinery.bench.logs import configure_logging

    configure_logging()
    work = [Work(candidate=c.name, task=c.task.key, task_source=c.task.source, kernel_source=c.source) for c in selected]
    tracker = CompileTracker()
    sampler = GpuSampler(label=lambda: "compiling" if tracker.active else "not_compiling").start()
    say.print(f"ours: {len(work)} candidates through EvaluatorPool, {workers} workers on GPU 0")

    def progress(name: str, verdict: str, done: int) -> None:
        say.print(f"  ours {done}/{len(work)}: {name}: {verdict}")

    try:
        with output_to(log):
            run = run_ours(work, workers, work_root / "ours-cache", tracker=tracker, on_result=progress)
    finally:
        sampler.stop()
    say.print(f"ours: {run.wall_s:.1f} s, device lock held {run.busy_s:.1f} s ({100 * run.busy_fraction:.0f}%)")
    starts = run.starts
    say.print(
        f"ours: {starts.get('runner_starts')} runner starts ({starts.get('from_spares')} from spares, "
        f"{starts.get('runner_wait_s')} s waited in all), {starts.get('judge_starts')} judge start(s), template {starts.get('template')}"
    )
    return {
        "count": len(work),
        "workers": run.workers,
        "wall_s": run.wall_s,
        "candidates_per_hour": per_hour(len(work), run.wall_s),
        "busy_s": run.busy_s,
        "busy_fraction": run.busy_fraction,
        "timing_s": run.timing_s,
        "worker_starts": run.worker_starts,
        "starts": run.starts,
        "timeline": run.timeline,
        "gpu": sampler.summary(labels=("compiling", "not_compiling")),
        "settings": run.settings,
        "results": _trimmed(run.results),
        "log": str(log) if log else None,
    }


def run_side_kernelbench(
    selected: list[manifest.Candidate],
    cpu_workers: int,
    gpu_arch: str,
    timeout_s: int | None,
    work_root: Path,
    log: Path | None,
    say: Console,
) -> dict[str, Any]:
    from benchmarks.throughput.gpu_sampler import GpuSampler
    from benchmarks.throughput.kernelbench_driver import run_kernelbench, verdict
    from benchmarks.throughput.manifest import Work

    work = [Work(candidate=c.name, task=c.task.key, task_source=c.task.source, kernel_source=c.source) for c in selected]
    phase = {"now": "setup"}
    sampler = GpuSampler(label=lambda: phase["now"]).start()
    say.print(f"KernelBench: {len(work)} candidates through eval_from_generations' flow, {cpu_workers} CPU workers, arch {gpu_arch}")

    def on_phase(name: str, message: str) -> None:
        phase["now"] = name
        say.print(f"  {message}")

    try:
        with output_to(log):
            run = run_kernelbench(work, work_root / "kernelbench", cpu_workers, [gpu_arch], timeout_s=timeout_s, on_phase=on_phase)
    finally:
        sampler.stop()
    results = {name: {**entry, "verdict": verdict(entry)} for name, entry in run.results.items()}
    for name in run.harness_errors:
        results.setdefault(name, {"verdict": "harness_error", "error": run.harness_errors[name]})
    say.print(f"KernelBench: {run.wall_s:.1f} s ({run.compile_s:.1f} s compiling, {run.eval_s:.1f} s evaluating)")
    return {
        "count": len(work),
        "cpu_workers": cpu_workers,
        "gpu_arch": gpu_arch,
        "wall_s": run.wall_s,
        "compile_s": run.compile_s,
        "eval_s": run.eval_s,
        "candidates_per_hour": per_hour(len(work), run.wall_s),
        "compiled_in_cache": run.compiled_in_cache,
        "harness_errors": _trimmed(run.harness_errors),
        "gpu": sampler.summary(labels=("setup", "compile", "eval")),
        "settings": run.settings,
        "results": _trimmed(results),
        "log": str(log) if log else None,
    }


def check(say: Console) -> int:
    """The CPU check: manifest, every task and candidate parsed, the vendored driver imported."""
    problems = manifest.check()
    try:
        from benchmarks.kernelbench_vendor import eval_from_generations as efg
        from benchmarks.throughput import kernelbench_driver

        for needed in ("batch_eval", "evaluate_single_sample", "EvalConfig", "add_to_eval_results_file"):
            if not hasattr(efg, needed):
                problems.append(f"the vendored eval_from_generations has no {needed}")
        for needed in ("batch_compile", "compile_single_sample"):
            if not hasattr(efg.compile, needed):
                problems.append(f"the vendored compile module has no {needed}")
        if not callable(kernelbench_driver.run_kernelbench):
            problems.append("kernelbench_driver.run_kernelbench is missing")
    except Exception as exc:  # noqa: BLE001 - any import failure is the finding
        problems.append(f"importing the vendored KernelBench driver failed: {type(exc).__name__}: {exc}")
    if problems:
        for problem in problems:
            say.print(f"[red]{problem}[/]")
        return 1
    tasks, candidates = manifest.load()
    counts = {v: sum(1 for c in candidates if c.expected == v) for v in manifest.EXPECTABLE}
    say.print(
        f"ok: {len(tasks)} tasks, {len(candidates)} candidates ("
        + ", ".join(f"{n} {v}" for v, n in counts.items())
        + "); the vendored KernelBench driver imports"
    )
    return 0


def _write(out: Path | None, report: dict[str, Any]) -> None:
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1, default=str))


def _console_on_stdout() -> Console:
    """A console on a copy of the terminal's stdout, so it still reaches the terminal while fd 1
    is redirected into a side's log."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # a captured stdout (io.UnsupportedOperation)
        return Console(width=160)
    stream: IO[str] = os.fdopen(os.dup(fd), "w", buffering=1)
    return Console(file=stream, width=160)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.throughput", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, help=f"our pool's workers (default: the host's cores, at most {MAX_WORKERS})")
    parser.add_argument("--candidates", metavar="GLOB", help="only candidates whose file matches, e.g. 'level2_*' or '*layernorm*'")
    parser.add_argument(
        "--out", type=Path, help="write every figure here as JSON (after each side, so one that is cut short keeps the other)"
    )
    parser.add_argument("--side", choices=("both", "ours", "kernelbench"), default="both")
    parser.add_argument("--order", choices=("ours-first", "kernelbench-first"), default="ours-first")
    parser.add_argument("--cpu-workers", type=int, help="KernelBench's num_cpu_workers for batch_compile (default: the host's cores)")
    parser.add_argument("--gpu-arch", help="KernelBench's gpu_arch (default: from the GPU's compute capability, Hopper on an H100/H200)")
    parser.add_argument("--kb-timeout", type=int, help="KernelBench's per-candidate timeout in s (default: its own, 180)")
    parser.add_argument("--logs", type=Path, help="where each side's output goes (default: beside --out, else the work directory)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (build caches, KernelBench's run files)")
    parser.add_argument("--verbose", action="store_true", help="each side's output on the terminal instead of in log files")
    parser.add_argument(
        "--combine", type=Path, nargs="+", metavar="REPORT", help="show (and with --out, write) reports of earlier runs side by side"
    )
    parser.add_argument("--check", action="store_true", help="CPU only: the manifest, tasks, candidates and the vendored driver's imports")
    args = parser.parse_args(argv)
    say = _console_on_stdout()

    if args.check:
        return check(say)
    if args.combine:
        merged = combine([json.loads(p.read_text()) for p in args.combine])
        render(merged, say)
        _write(args.out, merged)
        return 0

    _, candidates = manifest.load()
    selected = manifest.select(candidates, args.candidates)
    if not selected:
        say.print(f"no candidate matches {args.candidates!r}")
        return 2
    import torch

    if not torch.cuda.is_available():
        say.print("this benchmark runs on a CUDA GPU (use --check on a CPU machine)")
        return 2
    major, minor = torch.cuda.get_device_capability(0)
    gpu_arch = args.gpu_arch or gpu_arch_name(major, minor)
    workers = args.workers or default_workers(len(selected))
    cpu_workers = args.cpu_workers or host_cores()

    work_root = Path(tempfile.mkdtemp(prefix="throughput-"))
    while "lock" in str(work_root).lower():  # KernelBench reads "lock" in a compile error as a lock-file race
        work_root = Path(tempfile.mkdtemp(prefix="throughput-"))
    logs = args.logs or (args.out.with_name(args.out.stem + "-logs") if args.out else work_root / "logs")
    if args.verbose:
        logs = None
    else:
        logs.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "host": host_info(),
        "candidates": [{"name": c.name, "task": c.task.key, "expected": c.expected, "file": c.file} for c in selected],
        "ours": None,
        "kernelbench": None,
        "order": args.order,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    say.print(f"{len(selected)} candidates; work directory {work_root}" + (f"; logs in {logs}" if logs else ""))
    sides = ["ours", "kernelbench"] if args.order == "ours-first" else ["kernelbench", "ours"]
    if args.side != "both":
        sides = [args.side]
    try:
        for side in sides:
            if side == "ours":
                report["ours"] = run_side_ours(selected, workers, work_root, logs / "ours.log" if logs else None, say)
            else:
                report["kernelbench"] = run_side_kernelbench(
                    selected, cpu_workers, gpu_arch, args.kb_timeout, work_root, logs / "kernelbench.log" if logs else None, say
                )
            report["ratio"] = ratio(report)
            _write(args.out, report)
    finally:
        if args.keep:
            say.print(f"kept {work_root}")
        else:
            shutil.rmtree(work_root / "ours-cache", ignore_errors=True)
            shutil.rmtree(work_root / "kernelbench", ignore_errors=True)
            if not logs or not logs.is_relative_to(work_root):
                shutil.rmtree(work_root, ignore_errors=True)
    render(report, say)
    if args.out:
        say.print(f"wrote {args.out}")
    return 0
