"""A pool of evaluation workers spread over devices, with the same `run` as one Evaluator.

- One lock per device: correctness, timing and profile hold it, so two candidates never run on
  one device at the same moment; loading and compiling do not, so on a GPU a compile overlaps a
  timing (on CPU see below).
- A candidate waits for its device's lock before it takes a worker, so candidates queued for
  the device never hold workers that the next compiles need.
- Each device has one judge (tools/processes/judge.py), the trusted process that runs the reference and
  drives the device stages; it never loads candidate code, so it is shared by the device's
  workers and keeps its CUDA context warm. Each worker is a runner, fresh for every candidate.
- GPUs: each device is one GPU, its workers and judge pinned with CUDA_VISIBLE_DEVICES.
- CPU: the cores are split into devices, each worker pinned to its device's cores. The cores are
  also what a CPU timing measures, and pinning does not keep a compile's load off them (virtual
  cores share physical ones, caches and memory bandwidth): on CPU, device stages wait until no
  compile runs anywhere in the pool and hold new compiles back (`QuietCpu`), while compiles still
  run beside each other.
- A candidate's later stages go back to the worker that loaded (compiled) it when that worker is
  free; another worker loads it again from the build cache.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Self

from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.evaluator import Evaluator
from kernel_refinery.tools.processes.jobs import TaskProgram, source_hash
from kernel_refinery.tools.processes.worker import Judge, Worker
from kernel_refinery.tools.results import EvalResult, Stage
from kernel_refinery.tools.stages import steps_in

_LOAD_STAGES = steps_in("parent") + steps_in("runner")
"""Static check and compile (tools/stages.py): no device lock."""
_DEVICE_STAGES = steps_in("judge")
"""The judge's steps (tools/stages.py): they hold their device's lock."""


class QuietCpu:
    """A shared/exclusive lock: compiles share it, device stages hold it alone. A waiting device
    stage goes before compiles that come after it, so a stream of compiles cannot starve timing."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._sharing = 0
        self._held = False
        self._waiting = 0

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            self._cond.wait_for(lambda: not self._held and self._sharing == 0)
            self._waiting -= 1
            self._held = True
        try:
            yield
        finally:
            with self._cond:
                self._held = False
                self._cond.notify_all()

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._held and self._waiting == 0)
            self._sharing += 1
        try:
            yield
        finally:
            with self._cond:
                self._sharing -= 1
                self._cond.notify_all()


@dataclass
class Device:
    name: str
    judge: Judge
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
            self.devices = [
                Device(name=f"cuda:{i}", judge=Judge(device="cuda", gpu_index=i, cache_dir=config.cache_dir)) for i in range(n_devices)
            ]
            groups: list[list[int] | None] = [None] * n_devices
        else:
            core_groups = cpu_groups(devices or workers)
            self.devices = [
                Device(
                    name=f"cpu[{','.join(map(str, g))}]",
                    judge=Judge(device="cpu", threads=config.cpu_threads or len(g), cores=g, cache_dir=config.cache_dir),
                )
                for g in core_groups
            ]
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
            self.slots.append(Slot(evaluator=Evaluator(config, worker=worker, judge=self.devices[d].judge), device=self.devices[d]))
        self._quiet = QuietCpu() if config.device == "cpu" else None
        self._free: set[int] = set(range(len(self.slots)))
        self._affinity: dict[str, int] = {}
        self._changed = threading.Condition()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for slot in self.slots:
            slot.evaluator.close()
        for device in self.devices:
            device.judge.close()

    def _acquire(self, key: str, device: Device | None) -> int:
        """A free worker, the one that loaded the candidate first: for device stages (`device`
        given, its lock held) one of that device's, for the rest any."""

        def rank(i: int) -> tuple[int, int] | None:
            """Lower is preferred; None: this worker may not take the stages."""
            slot, loaded = self.slots[i], self._affinity.get(key) == i
            if device is not None and slot.device is not device:
                return None
            return (0 if loaded else 1, i)

        with self._changed:
            while True:
                ranked = sorted(r for r in map(rank, self._free) if r is not None)
                if ranked:
                    chosen = ranked[0][1]
                    self._free.discard(chosen)
                    return chosen
                self._changed.wait()

    def _release(self, index: int, key: str) -> None:
        with self._changed:
            self._free.add(index)
            self._affinity[key] = index
            self._changed.notify_all()

    def _device_for(self, key: str) -> Device:
        """The device of the worker that loaded the candidate, else the one that has been busy least."""
        loaded = self._affinity.get(key)
        return self.slots[loaded].device if loaded is not None else min(self.devices, key=lambda d: d.busy_s)

    def _evaluator(self, index: int, config: EvalConfig | None) -> Evaluator:
        evaluator = self.slots[index].evaluator
        return evaluator if config is None else evaluator.with_config(config)

    def run(self, task: TaskProgram, candidate: str, stages: Sequence[Stage], config: EvalConfig | None = None) -> EvalResult:
        """`config`: other settings for this candidate than the pool's (see Evaluator.with_config)."""
        key = source_hash(task.source + "\0" + candidate)
        if not any(s in _DEVICE_STAGES for s in stages):
            with self._quiet.shared() if self._quiet else contextlib.nullcontext():
                index = self._acquire(key, None)
                try:
                    return self._evaluator(index, config).run(task, candidate, stages)
                finally:
                    self._release(index, key)
        device = self._device_for(key)
        with self._quiet.exclusive() if self._quiet else contextlib.nullcontext(), device.lock:
            index = self._acquire(key, device)
            try:
                started = time.monotonic()
                result = self._evaluator(index, config).run(task, candidate, stages)
                device.busy_s += time.monotonic() - started
                device.timing_s += result.stage_seconds.get(Stage.TIMING.value, 0.0)
            finally:
                self._release(index, key)
        return result

    def nsight(self, task: TaskProgram, candidate: str) -> EvalResult:
        """Nsight Compute runs the candidate on the GPU: it holds a device like a timing does."""
        device = self.devices[0]
        with device.lock:
            started = time.monotonic()
            result = self.slots[0].evaluator.nsight(task, candidate)
            device.busy_s += time.monotonic() - started
        return result

    def evaluate(self, task: TaskProgram, candidate: str, config: EvalConfig | None = None) -> EvalResult:
        result = self.run(task, candidate, _LOAD_STAGES, config)
        if result.status is not None:
            return result
        return result.merge(self.run(task, candidate, _DEVICE_STAGES, config))

    def busy_fraction(self) -> float:
        """Share of wall time since the pool started that its devices spent running candidates."""
        wall = max(1e-9, time.monotonic() - self.started)
        return sum(d.busy_s for d in self.devices) / (wall * len(self.devices))

    @property
    def worker_starts(self) -> int:
        return sum(slot.evaluator.worker.starts for slot in self.slots)
