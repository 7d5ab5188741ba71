"""Time each task's reference at its CPU size and estimate its cost at its GPU size.

    python -m benchmarks.measure_suite [--suite builtin] [--levels 1,2] [--filter relu] [--device cuda]

The times are medians over eager forward calls under no_grad, on one CPU thread at the CPU
size: wall clock, and the thread's own CPU time, which leaves out waiting for a core on a
busy machine. With --device cuda the reference is timed on the GPU at the GPU size. The GPU
numbers come from running the forward on the meta device (shapes only, nothing allocated)
and adding up, per aten op, the bytes it reads and writes and the FLOPs torch's flop
counter assigns it; the estimate charges each op the larger of its memory and compute time
on an H200. Use it to keep CPU sizes in the 5-50 ms window and GPU sizes at 1 ms or more.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from kernel_refinery.bench.tasks import SuiteError, Task, load_suite, resolve_suite
from kernel_refinery.tools.steps.roofline import OpCost

H200_BYTES_PER_S = 4.3e12
FP32_FLOPS_PER_S = 50e12
"""Matmuls: torch keeps TF32 off for them by default, so they run on the fp32 cores."""


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _program(task: Task, device: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": f"refinery_measure_{task.name}"}
    exec(compile(task.source_for(device), str(task.path), "exec"), namespace)  # noqa: S102 - a built-in task program
    return namespace


def reference_ms(task: Task, device: str, repeats: int, budget_s: float) -> tuple[float, float]:
    """Median wall-clock and thread CPU milliseconds of the reference forward on `device`."""
    program = _program(task, device)
    torch.manual_seed(0)
    with torch.device(device):
        model = program["Model"](*program["get_init_inputs"]())
        inputs = program["get_inputs"]()
    # Without a sync the GPU clock would time the launch, not the kernels.
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    wall: list[float] = []
    thread: list[float] = []
    with torch.no_grad():
        for _ in range(2):
            model(*inputs)
        sync()
        deadline = time.perf_counter() + budget_s
        while len(wall) < repeats and (len(wall) < 3 or time.perf_counter() < deadline):
            start, start_cpu = time.perf_counter(), time.thread_time()
            model(*inputs)
            sync()
            wall.append(time.perf_counter() - start)
            thread.append(time.thread_time() - start_cpu)
    del model, inputs
    if device == "cuda":
        torch.cuda.empty_cache()
    return statistics.median(wall) * 1e3, statistics.median(thread) * 1e3


def gpu_estimate(task: Task) -> dict[str, float]:
    """Bytes and FLOPs of the reference at its GPU size, counted on the meta device (nothing is
    allocated). Raises where the forward needs real values (`.item()`, data-dependent shapes)."""
    program = _program(task, "cuda")
    with torch.device("meta"):
        model = program["Model"](*program["get_init_inputs"]())
        inputs = program["get_inputs"]()
        with torch.no_grad(), OpCost() as cost:
            model(*inputs)
    input_bytes = sum(_nbytes(t) for t in tree_leaves(inputs) if isinstance(t, torch.Tensor))
    return {
        "input_gb": input_bytes / 1e9,
        "traffic_gb": cost.bytes / 1e9,
        "gflop": cost.flops / 1e9,
        "est_ms": max(cost.bytes / H200_BYTES_PER_S, cost.flops / FP32_FLOPS_PER_S) * 1e3,
    }


def _levels(text: str) -> list[int]:
    try:
        return [int(level) for level in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give levels as numbers separated by commas, e.g. 1,2") from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="builtin", help="'builtin' or a folder with levelN/ subfolders")
    parser.add_argument("--levels", type=_levels, default=None, help="comma-separated levels, e.g. 1,2 (default: all)")
    parser.add_argument("--filter", default=None, help="substring or glob over task names")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to time the reference")
    parser.add_argument("--repeats", type=int, default=21, help="timed CPU calls per task, at most")
    parser.add_argument("--budget", type=float, default=3.0, help="seconds of timed CPU calls per task, about")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    try:
        tasks = load_suite(resolve_suite(args.suite), levels=args.levels, name_filter=args.filter)
    except SuiteError as exc:
        parser.exit(2, f"error: {exc}\n")
    if not tasks:
        parser.exit(1, f"no task in {args.suite} matches --levels/--filter; run without them to list all\n")

    width = max(len(task.key) for task in tasks)
    columns = (f"{args.device} ms", "thread", "gpu in GB", "traffic GB", "GFLOP", "H200 ms")
    header = f"{'task':<{width}}  " + "  ".join(f"{c:>7}" for c in columns)
    print(header)
    print("-" * len(header))
    failed = 0
    for task in tasks:
        # A task that cannot run here (memory, a missing package, a forward that needs real values on
        # the meta device) is a row with its reason, never the end of the listing.
        try:
            wall_ms, thread_ms = reference_ms(task, args.device, args.repeats, args.budget)
        except Exception as exc:  # noqa: BLE001 - any error of the task's own code is that task's row
            failed += 1
            print(f"{task.key:<{width}}  reference failed: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}", flush=True)
            continue
        try:
            gpu = gpu_estimate(task)
            estimate = f"{gpu['input_gb']:9.2f}  {gpu['traffic_gb']:10.2f}  {gpu['gflop']:7.1f}  {gpu['est_ms']:7.2f}"
        except Exception as exc:  # noqa: BLE001 - the meta-device count is an estimate; the timing above stands
            estimate = f"no estimate: {type(exc).__name__}: {str(exc).splitlines()[0][:60]}"
        print(f"{task.key:<{width}}  {wall_ms:7.1f}  {thread_ms:7.1f}  {estimate}", flush=True)
    print(f"{len(tasks) - failed} of {len(tasks)} tasks ran")


if __name__ == "__main__":
    main()
