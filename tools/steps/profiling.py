"""Profile: the candidate's top operators and kernels by device time, as a compact table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from kernel_refinery.tools.processes.programs import clone_args
from kernel_refinery.tools.results import ProfileReport, ProfileRow

_NAME_WIDTH = 40


def _self_device_us(event: Any, cuda: bool) -> float:
    if cuda:
        for attr in ("self_device_time_total", "self_cuda_time_total"):
            if hasattr(event, attr):
                return float(getattr(event, attr))
    return float(event.self_cpu_time_total)


def _total_device_us(event: Any, cuda: bool) -> float:
    if cuda:
        for attr in ("device_time_total", "cuda_time_total"):
            if hasattr(event, attr):
                return float(getattr(event, attr))
    return float(event.cpu_time_total)


def render(rows: list[ProfileRow], device: str) -> str:
    head = f"{'operator / kernel':<{_NAME_WIDTH}} {'calls':>6} {'self ms':>9} {'total ms':>9} {'self %':>7}"
    lines = [f"top operators by self {device} time, per forward", head, "-" * len(head)]
    for row in rows:
        name = row.name if len(row.name) <= _NAME_WIDTH else row.name[: _NAME_WIDTH - 1] + "…"
        lines.append(f"{name:<{_NAME_WIDTH}} {row.calls:>6} {row.self_ms:>9.3f} {row.total_ms:>9.3f} {row.percent:>6.1f}%")
    return "\n".join(lines)


def profiled_calls(fn: Callable[..., Any], warm: list[Any], arg_sets: list[list[Any]], device: torch.device) -> profile:
    """One unprofiled call, then one profiled call per argument set (all made beforehand, so the
    harness's copies are not the candidate's), the device idle at both ends."""
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.no_grad():
        fn(*warm)
        if cuda:
            torch.cuda.synchronize(device)
        with profile(activities=activities) as prof:
            for args in arg_sets:
                fn(*args)
            if cuda:
                torch.cuda.synchronize(device)
    return prof


def profile_forward(fn: Callable[..., Any], inputs: list[Any], device: torch.device, iterations: int = 3, rows: int = 12) -> ProfileReport:
    cuda = device.type == "cuda"
    prof = profiled_calls(fn, clone_args(inputs), [clone_args(inputs) for _ in range(iterations)], device)
    events = [e for e in prof.key_averages() if not e.key.startswith(("ProfilerStep", "Activity Buffer Request"))]
    if cuda:
        # On CUDA the kernels themselves are listed; the host-side range around them would count twice.
        events = [e for e in events if not e.key.startswith("kernel::")]
    timed = [(e, _self_device_us(e, cuda)) for e in events]
    total = sum(t for _, t in timed) or 1.0
    timed.sort(key=lambda pair: pair[1], reverse=True)
    picked = [
        ProfileRow(
            name=e.key,
            calls=max(1, e.count // iterations),
            self_ms=t / 1000 / iterations,
            total_ms=_total_device_us(e, cuda) / 1000 / iterations,
            percent=100 * t / total,
        )
        for e, t in timed[:rows]
        if t > 0
    ]
    label = "CUDA" if cuda else "CPU"
    return ProfileReport(device=label, rows=tuple(picked), table=render(picked, label))
