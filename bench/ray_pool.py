"""`--executor ray`: the same evaluation workers as Ray actors, one GPU each, over many machines.

Each actor hosts an ordinary `Evaluator` (and so its isolated worker process); Ray places the
actors on the cluster's GPUs and sets CUDA_VISIBLE_DEVICES for them. An actor runs one call at a
time, so two candidates never share its device. Install with `pip install 'kernel-refinery[ray]'`.
"""

from __future__ import annotations

import queue
from collections.abc import Sequence
from typing import Any

from tools.config import EvalConfig
from tools.jobs import TaskProgram
from tools.results import EvalResult, Stage


class _EvaluatorActor:
    def __init__(self, config: EvalConfig):
        from tools.evaluator import Evaluator

        self.evaluator = Evaluator(config)

    def run(self, task: TaskProgram, candidate: str, stages: Sequence[Stage]) -> EvalResult:
        return self.evaluator.run(task, candidate, stages)

    def nsight(self, task: TaskProgram, candidate: str) -> EvalResult:
        return self.evaluator.nsight(task, candidate)

    def close(self) -> None:
        self.evaluator.close()


class RayEvaluatorPool:
    """Thread-safe `run` over Ray actors; connects to RAY_ADDRESS or starts a local Ray."""

    def __init__(self, config: EvalConfig, workers: int = 1, address: str | None = None):
        try:
            import ray
        except ImportError as exc:
            raise RuntimeError("--executor ray needs Ray: pip install 'kernel-refinery[ray]'") from exc
        self._ray = ray
        if not ray.is_initialized():
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        gpus = 1 if config.device == "cuda" else 0
        actor = ray.remote(num_gpus=gpus, num_cpus=1)(_EvaluatorActor)
        self.actors: list[Any] = [actor.remote(config) for _ in range(max(1, workers))]
        self._free: queue.Queue[int] = queue.Queue()
        for i in range(len(self.actors)):
            self._free.put(i)

    def run(self, task: TaskProgram, candidate: str, stages: Sequence[Stage]) -> EvalResult:
        index = self._free.get()
        try:
            return self._ray.get(self.actors[index].run.remote(task, candidate, tuple(stages)))
        finally:
            self._free.put(index)

    def nsight(self, task: TaskProgram, candidate: str) -> EvalResult:
        index = self._free.get()
        try:
            return self._ray.get(self.actors[index].nsight.remote(task, candidate))
        finally:
            self._free.put(index)

    def close(self) -> None:
        self._ray.get([a.close.remote() for a in self.actors])
        for a in self.actors:
            self._ray.kill(a)
