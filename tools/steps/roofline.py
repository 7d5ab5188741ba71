"""Speed of light: the least time a kernel can take, from bytes and FLOPs at the device's peaks.

A candidate must at least write its outputs. Their bytes at the device's peak memory bandwidth,
plus one launch, is a time no honest candidate beats; one measured below it did its work outside
the timer (deferred, on another thread, or not at all). The reference's own roofline (all bytes
its operators move and the FLOPs they do) is recorded as information only: a reference may do
redundant work that a clever kernel rightly skips.
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from kernel_refinery.tools.processes.programs import tensors_of

# Peak DRAM bandwidth (bytes/s) and dense fp32 (non-tensor-core) FLOP/s, by device-name substring.
# Read live from NVML where it answers; this table covers a driver that does not.
_GPU_PEAKS = (
    ("H200", 4.8e12, 67e12),
    ("H100", 3.35e12, 67e12),
    ("GH200", 4.0e12, 67e12),
    ("B200", 8.0e12, 80e12),
    ("A100", 2.0e12, 19.5e12),
    ("L40", 0.86e12, 90e12),
    ("A10", 0.6e12, 31e12),
    ("L4", 0.3e12, 30e12),
    ("T4", 0.32e12, 8.1e12),
    ("V100", 0.9e12, 15.7e12),
)
_UNKNOWN_GPU = (10e12, 100e12)
"""Above every current GPU: a floor must never be set too high."""
GPU_LAUNCH_S = 2e-6
"""A kernel launch measured between events never takes less."""
CPU_BYTES_PER_S_PER_THREAD = 256e9
"""Above one core's L1 write bandwidth (64 B/cycle at 4 GHz): generous, as a floor must be."""
CPU_FLOPS_PER_S_PER_THREAD = 256e9
CPU_CALL_S = 1e-6


@cache
def _nvml_bandwidth(index: int) -> float | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        bus_bits = pynvml.nvmlDeviceGetMemoryBusWidth(handle)
        mem_mhz = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)
    except Exception:  # noqa: BLE001 - NVML is optional here: the table and the generous default stand in
        return None
    value = 2 * mem_mhz * 1e6 * bus_bits / 8  # DDR: two transfers per clock
    return value if value > 0 else None


def peaks(device: torch.device) -> tuple[float, float, float]:
    """(bytes/s, FLOP/s, fixed seconds per call) for the device, each on the generous side."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        bandwidth, flops = next(((bw, fl) for key, bw, fl in _GPU_PEAKS if key in name), _UNKNOWN_GPU)
        live = _nvml_bandwidth(device.index or 0)
        if live is not None:
            # HBM's reported clock can understate its data rate; never go below the table.
            bandwidth = max(bandwidth, live)
        return bandwidth, flops, GPU_LAUNCH_S
    threads = max(torch.get_num_threads(), len(os.sched_getaffinity(0)))
    return CPU_BYTES_PER_S_PER_THREAD * threads, CPU_FLOPS_PER_S_PER_THREAD * threads, CPU_CALL_S


def nbytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_of(value))


FLOOR_SLACK = 3.0
"""Outputs that fit in a cache (a GPU's L2, a core's L1/L2) are written faster than DRAM's peak;
the floor divides by this much more bandwidth, so that no honest kernel ever falls below it."""


def output_floor_ms(output_bytes: int, device: torch.device) -> float:
    """Writing the outputs once at (slack times) peak bandwidth, plus one launch."""
    bandwidth, _, fixed = peaks(device)
    return (output_bytes / (FLOOR_SLACK * bandwidth) + fixed) * 1e3


class OpCost(TorchDispatchMode):
    """Adds up the bytes each non-view aten op reads and writes, and the FLOPs torch's flop counter
    assigns it. Works on real tensors and on the meta device."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0
        self.flops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        from torch.utils.flop_counter import flop_registry

        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.is_view:
            return out
        leaves = tree_leaves((args, kwargs, out))
        self.bytes += sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))
        packet = func.overloadpacket
        if packet in flop_registry:
            self.flops += int(flop_registry[packet](*args, **kwargs, out_val=out))
        return out


def roofline_ms(moved_bytes: int, flops: int, device: torch.device) -> float:
    bandwidth, flop_rate, fixed = peaks(device)
    return (max(moved_bytes / bandwidth, flops / flop_rate) + fixed) * 1e3


def reference_roofline_ms(model: Any, inputs: list[Any], device: torch.device) -> float:
    """One call of the reference under the op counter."""
    counter = OpCost()
    with torch.no_grad(), counter:
        model(*inputs)
    return roofline_ms(counter.bytes, counter.flops, device)
