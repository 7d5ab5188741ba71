"""A pool of evaluation workers spread over devices, with the same `run` as one Evaluator.

- One lock per device: correctness, timing and profile hold it, so two candidates never run on
  one device at the same moment; loading and compiling do not, so a compile overlaps a timing.
- GPUs: each device is one GPU, its workers pinned with CUDA_VISIBLE_DEVICES.
- CPU: the cores are split into devices, each worker pinned to its device's cores.
- A candidate's later stages go back to the worker that loaded it when that worker is free.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Self

from tools.config import EvalConfig
from tools.evaluator import Evaluator
from tools.jobs import TaskProgram
from tools.programs import source_hash
from tools.results import EvalResult, Stage
from tools.worker import Worker

_DEVICE_STAGES = (Stage.CORRECTNESS, Stage.TIMING, Stage.PROFILE)


@dataclass
class Device:
    name: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    busy_s: float = 0.0
    timing_s: float = 0.0


@dataclass
class Slot:
    evaluator: Evaluator
    device: Device


def cpu_groups(devices: int) -> list[list[int]]:
    cores = sorted(os.sched_getaffinity(0))
    devices = max(1, min(devices, len(cores)))
    size = len(cores) // devices
    return [cores[i * size : (i + 1) * size] for i in range(devices)]


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


class EvaluatorPool:
    """`workers` evaluators over `devices` devices; thread-safe `run`."""

    def __init__(self, config: EvalConfig, workers: int = 1, devices: int | None = None):
        self.config = config
        self.started = time.monotonic()
        if config.device == "cuda":
            n_devices = devices or max(1, gpu_count())
            self.devices = [Device(name=f"cuda:{i}") for i in range(n_devices)]
            groups: list[list[int] | None] = [None] * n_devices
        else:
            core_groups = cpu_groups(devices or workers)
            self.devices = [Device(name=f"cpu[{','.join(map(str, g))}]") for g in core_groups]
            groups = list(core_groups)
        self.slots: list[Slot] = []
        for i in range(max(1, workers)):
            d = i % len(self.devices)
            cores = groups[d]
            worker = Worker(
                device=config.device,
                cache_dir=config.cache_dir,
                memory_limit_gb=config.memory_limit_gb,
                threads=len(cores) if cores else config.cpu_threads,
                gpu_index=d if config.device == "cuda" else None,
                cores=cores,
            )
            self.slots.append(Slot(evaluator=Evaluator(config, worker=worker), device=self.devices[d]))
        self._free: queue.Queue[int] = queue.Queue()
        for i in range(len(self.slots)):
            self._free.put(i)
        self._affinity: dict[str, int] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for slot in self.slots:
            slot.evaluator.close()

    def _acquire(self, key: str) -> int:
        """The worker that loaded this candidate if it is free, else any free worker."""
        with self._lock:
            preferred = self._affinity.get(key)
            held = []
            chosen = None
            while True:
                try:
                    i = self._free.get_nowait()
                except queue.Empty:
                    break
                if i == preferred:
                    chosen = i
                    break
                held.append(i)
            if chosen is None and held:
                chosen = held.pop(0)
            for i in held:
                self._free.put(i)
        return chosen if chosen is not None else self._free.get()

    def run(self, task: TaskProgram, candidate: str, stages: Sequence[Stage]) -> EvalResult:
        key = source_hash(task.source + "\0" + candidate)
        index = self._acquire(key)
        slot = self.slots[index]
        try:
            if any(s in _DEVICE_STAGES for s in stages):
                with slot.device.lock:
                    started = time.monotonic()
                    result = slot.evaluator.run(task, candidate, stages)
                    spent = time.monotonic() - started
                    slot.device.busy_s += spent
                    slot.device.timing_s += sum(result.stage_seconds.get(s.value, 0.0) for s in (Stage.TIMING,))
            else:
                result = slot.evaluator.run(task, candidate, stages)
            with self._lock:
                self._affinity[key] = index
            return result
        finally:
            self._free.put(index)

    def nsight(self, task: TaskProgram, candidate: str) -> EvalResult:
        """Nsight Compute runs the candidate on the GPU: it holds a device like a timing does."""
        device = self.devices[0]
        with device.lock:
            started = time.monotonic()
            result = self.slots[0].evaluator.nsight(task, candidate)
            device.busy_s += time.monotonic() - started
        return result

    def evaluate(self, task: TaskProgram, candidate: str) -> EvalResult:
        result = self.run(task, candidate, (Stage.STATIC, Stage.COMPILE))
        if result.status is not None:
            return result
        return result.merge(self.run(task, candidate, _DEVICE_STAGES))

    def busy_fraction(self) -> float:
        """Share of wall time since the pool started that its devices spent running candidates."""
        wall = max(1e-9, time.monotonic() - self.started)
        return sum(d.busy_s for d in self.devices) / (wall * len(self.devices))

    @property
    def worker_starts(self) -> int:
        return sum(slot.evaluator.worker.starts for slot in self.slots)
