"""A compact, live description of the device, for the prompt (switchable per experiment)."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from kernel_refinery.tools.results import Frozen


class HardwareInfo(Frozen):
    device: str
    name: str
    facts: tuple[tuple[str, str], ...] = ()

    def block(self) -> str:
        lines = [f"- device: {self.name}"] + [f"- {k}: {v}" for k, v in self.facts]
        return "\n".join(lines)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _cache_sizes() -> list[tuple[str, str]]:
    found = []
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(base.glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        if kind in ("Data", "Unified"):
            found.append((f"L{level} cache", size))
    return found


def describe_cpu() -> HardwareInfo:
    cores = len(os.sched_getaffinity(0))
    flags = _cpu_flags()
    simd = [f for f in ("avx512f", "avx512_bf16", "avx2", "fma", "neon", "sve") if f in flags]
    facts = [("cores available", str(cores)), ("architecture", platform.machine())]
    if simd:
        facts.append(("SIMD", ", ".join(simd)))
    facts += _cache_sizes()
    return HardwareInfo(device="cpu", name=_cpu_model(), facts=tuple(facts))


def describe_gpu(index: int = 0) -> HardwareInfo:
    import torch

    props = torch.cuda.get_device_properties(index)
    facts = [
        ("compute capability", f"{props.major}.{props.minor}"),
        ("SMs", str(props.multi_processor_count)),
        ("memory", f"{props.total_memory / (1 << 30):.0f} GiB"),
    ]
    l2 = getattr(props, "L2_cache_size", None)
    if l2:
        facts.append(("L2 cache", f"{l2 / (1 << 20):.0f} MiB"))
    smem = getattr(props, "shared_memory_per_block_optin", None)
    if smem:
        facts.append(("shared memory per block (opt-in)", f"{smem // 1024} KiB"))
    facts.append(("warp size", str(getattr(props, "warp_size", 32))))
    pynvml = nvml()
    if pynvml is not None:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            bus_width = pynvml.nvmlDeviceGetMemoryBusWidth(handle)
            mem_clock = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)
            sm_clock = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)
            # DDR: two transfers per clock.
            bandwidth = 2 * mem_clock * 1e6 * bus_width / 8 / 1e12
            facts.append(("memory bandwidth (peak)", f"about {bandwidth:.1f} TB/s"))
            facts.append(("max SM clock", f"{sm_clock} MHz"))
        except pynvml.NVMLError as exc:  # bandwidth is detail; the rest of the block stands without it
            facts.append(("memory bandwidth", f"unknown ({exc})"))
    return HardwareInfo(device="cuda", name=props.name, facts=tuple(facts))


def nvml() -> Any:
    """pynvml, initialised; None where it is not installed or finds no driver."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    return pynvml


def describe(device: str) -> HardwareInfo:
    return describe_gpu() if device == "cuda" else describe_cpu()
