"""One task of `refinery suite check`, in a fresh interpreter: `python -m kernel_refinery.bench.suite_check.child WORKDIR`.

kernel_refinery.bench.suite_check.run writes WORKDIR/job.json and the task's program as WORKDIR/task.py. This process
imports the task, builds its model and inputs (seeded) on the CPU, moves them to the device, and
times the forward under no_grad, eager; then it runs the model on a few more input sets and judges
whether its outputs vary at all (tools/steps/degenerate.py); then it times the compiled forward. It rewrites WORKDIR/result.json at each
stage, so that whatever ends it (a signal, the parent's timeout) leaves the stage it reached and
the times it already took. A Python exception is recorded there with its status; the process
then exits 0, and anything else that ends it is for the parent to describe.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import resource
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch.utils._pytree import tree_map

from kernel_refinery.bench.suite_check.types import JOB_FILE, RESULT_FILE, TASK_FILE, Stage, Status
from kernel_refinery.tools.steps.degenerate import PROBE_INPUTS, probe
from kernel_refinery.tools.steps.timing import Timer

WARMUP_CALLS = 3
MIN_CALLS = 3
MAX_CALLS = 100
_HOST_OOM_MARKERS = ("can't allocate memory", "Cannot allocate memory", "std::bad_alloc", "DefaultCPUAllocator")
_CUDA_OOM_MARKERS = ("CUDA out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")


class Report:
    """result.json, rewritten whole at each update."""

    def __init__(self, path: Path):
        self.path = path
        self.data: dict[str, Any] = {}

    def update(self, **fields: Any) -> None:
        self.data.update({k: v.value if isinstance(v, Stage | Status) else v for k, v in fields.items()})
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(self.data), encoding="utf-8")
        os.replace(partial, self.path)


def main(argv: list[str] | None = None) -> int:
    workdir = Path((argv if argv is not None else sys.argv[1:])[0])
    job = json.loads((workdir / JOB_FILE).read_text(encoding="utf-8"))
    _die_with_parent(int(job["parent_pid"]))
    report = Report(workdir / RESULT_FILE)
    device = torch.device(job["device"])
    stage = Stage.STARTUP
    try:
        _set_up(device, int(job["threads"]))
        report.update(stage=Stage.IMPORT, torch=torch.__version__, device_name=_device_name(device))
        stage = Stage.IMPORT
        module = _import(workdir / TASK_FILE)
        stage = Stage.INIT
        report.update(stage=stage)
        timer = Timer(device)
        baseline = _allocated(device)
        # Inputs for the timed calls only where something is timed: a task's inputs can take gigabytes.
        model, inputs = _build(module, device, int(job["seed"]), with_inputs=bool(job.get("time", True) or job["compile"]))
        if job.get("time", True):
            stage = Stage.EAGER
            report.update(stage=stage)
            report.update(eager=_measure(model, inputs, timer, device, baseline, float(job["budget_s"])))
        if job.get("probe", True):
            stage = Stage.PROBE
            report.update(stage=stage)
            report.update(degenerate=_probe(module, model, device, int(job["seed"]), float(job["tolerance"])))
        if job["compile"]:
            stage = Stage.COMPILE
            report.update(stage=stage)
            compiled = torch.compile(model)
            report.update(compile_s=round(_call_s(compiled, inputs, device), 3))
            report.update(compiled=_measure(compiled, inputs, timer, device, baseline, float(job["budget_s"])))
            del compiled
        stage = Stage.DONE
        del model, inputs, timer
        _free(device)
        report.update(stage=stage)
    except BaseException as exc:  # noqa: BLE001 - whatever the task raises (SystemExit too) is its row
        status, message = classify(exc, stage, device, workdir / TASK_FILE)
        report.update(stage=stage, failure={"status": status.value, "message": message})
    return 0


def _die_with_parent(parent_pid: int) -> None:
    # As kernel_refinery.tools.processes.worker_main.die_with_parent (not imported: it pulls in the evaluator, seconds of
    # start-up per task): a killed check leaves no task running on, holding a GPU's memory.
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:
        os._exit(1)


def _set_up(device: torch.device, threads: int) -> None:
    torch.set_num_threads(max(1, threads))
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"CUDA is not available to torch {torch.__version__} in this process")
        # The evaluator's default: no TF32, so the reference is timed at the precision it is judged at.
        from kernel_refinery.tools.processes.worker_main import apply_tf32_policy

        apply_tf32_policy(False)


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _import(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("refinery_task", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered, as an import would: dataclasses and torch.compile look a class's module up.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _build(module: ModuleType, device: torch.device, seed: int, with_inputs: bool = True) -> tuple[torch.nn.Module, list[Any]]:
    """Model and inputs as KernelBench makes them: seeded, on the CPU, then moved to the device."""
    torch.manual_seed(seed)
    model = module.Model(*module.get_init_inputs())
    torch.manual_seed(seed)
    inputs = list(module.get_inputs()) if with_inputs else []
    moved = tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, inputs)
    return model.to(device), moved


def _probe(module: ModuleType, model: torch.nn.Module, device: torch.device, seed: int, tolerance: float) -> dict[str, str] | None:
    """The model on PROBE_INPUTS more input sets (seeds after the timed one's), in eval mode as the
    evaluator runs it: its outputs' degeneracy, or None where they vary."""

    def input_set(k: int) -> list[Any]:
        torch.manual_seed(seed + 1 + k)
        return list(tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, list(module.get_inputs())))

    training = model.training
    model.eval()
    try:
        found = probe(model, (input_set(k) for k in range(PROBE_INPUTS)), tolerance, tolerance)
    finally:
        model.train(training)
    return {"kind": found.kind, "detail": found.detail} if found is not None else None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _call_s(fn: Callable[..., Any], inputs: list[Any], device: torch.device) -> float:
    """Seconds of one call, synchronized; its output is dropped at once."""
    start = time.perf_counter()
    with torch.no_grad():
        fn(*inputs)
    _sync(device)
    return time.perf_counter() - start


def _measure(
    fn: Callable[..., Any], inputs: list[Any], timer: Timer, device: torch.device, baseline: int, budget_s: float
) -> dict[str, float | int]:
    """Warm-up, then the median of timed calls (CUDA events on cuda, perf_counter on cpu).

    Two probe calls size the rest: about `budget_s` of timed calls, at least MIN_CALLS, so a
    task that takes seconds per call (a GPU size run on a CPU) still ends within its timeout."""
    # The second call: a first one pays for lazy set-up (allocations, kernel choice) that
    # would shrink the number of timed calls for nothing.
    probe_s = min(_call_s(fn, inputs, device), _call_s(fn, inputs, device))
    calls = max(MIN_CALLS, min(MAX_CALLS, int(budget_s / max(probe_s, 1e-6))))
    warmup = WARMUP_CALLS if probe_s * WARMUP_CALLS <= budget_s else 0
    timed = timer.time(fn, lambda _: inputs, warmup, calls)
    peak = _peak_mb(device, baseline)
    _reset_peak(device)
    return {"median_ms": timed.stats.median, "min_ms": timed.stats.min, "calls": calls, "peak_mb": round(peak, 1)}


def _allocated(device: torch.device) -> int:
    """What is allocated before the task's model: the timer's L2 flush buffer, left out of its peak."""
    if device.type != "cuda":
        return 0
    _reset_peak(device)
    return torch.cuda.memory_allocated(device)


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak_mb(device: torch.device, baseline: int) -> float:
    if device.type == "cuda":
        return (torch.cuda.max_memory_allocated(device) - baseline) / (1 << 20)
    # Linux reports kilobytes; the peak of the whole process, torch's own runtime included.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _free(device: torch.device) -> None:
    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def classify(exc: BaseException, stage: Stage, device: torch.device, task_path: Path) -> tuple[Status, str]:
    """The status and one-line reason of an exception raised at `stage`."""
    text = str(exc)
    where = _task_line(exc, task_path)
    message = _describe(exc) + where
    if isinstance(exc, MemoryError) or any(marker in text for marker in _HOST_OOM_MARKERS):
        return Status.HOST_OOM, message
    if isinstance(exc, torch.cuda.OutOfMemoryError) or any(marker in text for marker in _CUDA_OOM_MARKERS):
        return Status.CUDA_OOM, message
    if device.type == "cuda" and "out of memory" in text:
        return Status.CUDA_OOM, message
    if stage is Stage.IMPORT:
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            package = exc.name.split(".")[0]
            return Status.IMPORT_ERROR, f"missing package {package!r}{where}; install it, or leave the task out with --tasks"
        return Status.IMPORT_ERROR, f"the task's module-level code raised {message}"
    if stage is Stage.COMPILE:
        return Status.COMPILE_ERROR, message
    if stage is Stage.STARTUP:
        return Status.ERROR, f"before the task ran: {message}"
    return Status.ERROR, message


def _describe(exc: BaseException) -> str:
    """`Type: first line`, and the next line too where the first only introduces it (as
    torch.compile's "backend='inductor' raised:" does)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    head = lines[0] if lines else "(no message)"
    if head.endswith(":") and len(lines) > 1:
        head = f"{head} {lines[1]}"
    return f"{type(exc).__name__}: {head}"


def _task_line(exc: BaseException, task_path: Path) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == task_path]
    return f" (line {frames[-1].lineno} of the task, in {frames[-1].name})" if frames else ""


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Without the interpreter's teardown: a thread the task left running, or a CUDA context after
    # a fault, could hold the exit until the parent's timeout and hide the result written above.
    os._exit(code)
