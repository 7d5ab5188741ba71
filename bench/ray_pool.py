"""`--executor ray`: the same evaluation workers as Ray actors, one GPU each, over many machines.

Each actor hosts an ordinary `Evaluator` (and so its isolated worker process); Ray places the
actors on the cluster's GPUs and sets CUDA_VISIBLE_DEVICES for them, which the worker inherits
(it then sees its one GPU as cuda:0). An actor runs one call at a time, so two candidates never
share its device. Install with `pip install 'kernel-refinery[ray]'` on every machine of the cluster.
"""

from __future__ import annotations

import queue
from collections.abc import Sequence
from typing import Any

import structlog

from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.tools.results import EvalResult, Stage

log = structlog.get_logger()

PLACEMENT_TIMEOUT_S = 300.0
"""How long the pool waits for Ray to place its actors (an autoscaling cluster may add a node)."""


class _EvaluatorActor:
    def __init__(self, config: EvalConfig):
        from kernel_refinery.tools.evaluator import Evaluator

        self.evaluator = Evaluator(config)

    def ready(self) -> bool:
        return True

    def run(self, task: TaskProgram, candidate: str, stages: Sequence[Stage]) -> EvalResult:
        return self.evaluator.run(task, candidate, stages)

    def nsight(self, task: TaskProgram, candidate: str) -> EvalResult:
        return self.evaluator.nsight(task, candidate)

    def close(self) -> None:
        self.evaluator.close()


class RayEvaluatorPool:
    """Thread-safe `run` over Ray actors; connects to RAY_ADDRESS or starts a local Ray.

    `workers` 0: one actor per GPU of the cluster (per CPU for device "cpu"), counted by Ray, not
    on this machine, which may have none. Actors that Ray cannot place within
    `placement_timeout_s` (more workers than the cluster has GPUs) are dropped with a warning: a
    call handed to one of them would wait forever.
    """

    def __init__(self, config: EvalConfig, workers: int = 0, address: str | None = None, placement_timeout_s: float = PLACEMENT_TIMEOUT_S):
        try:
            import ray
        except ImportError as exc:
            raise RuntimeError("--executor ray needs Ray: pip install 'kernel-refinery[ray]'") from exc
        self._ray = ray
        if not ray.is_initialized():
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        gpus = 1 if config.device == "cuda" else 0
        resource = "GPU" if gpus else "CPU"
        if workers <= 0:
            workers = int(ray.cluster_resources().get(resource, 0))
            if workers < 1:
                raise RuntimeError(f"--executor ray: the Ray cluster has no {resource} for an evaluation actor")
        actor: Any = ray.remote(num_gpus=gpus, num_cpus=1)(_EvaluatorActor)
        actors: list[Any] = [actor.remote(config) for _ in range(workers)]
        pings = {a.ready.remote(): a for a in actors}
        placed, unplaced = ray.wait(list(pings), num_returns=len(pings), timeout=placement_timeout_s)
        for ref in unplaced:
            ray.kill(pings[ref])
        try:
            ray.get(placed)  # an actor whose Evaluator failed to start raises here, not at its first call
        except Exception:
            for a in actors:
                ray.kill(a)
            raise
        self.actors: list[Any] = [pings[ref] for ref in placed]
        if not self.actors:
            raise RuntimeError(
                f"--executor ray: Ray placed none of {workers} evaluation actors (1 {resource} each) within "
                f"{placement_timeout_s:g} s; the cluster has {ray.cluster_resources().get(resource, 0):g} {resource}"
            )
        if unplaced:
            log.warning("ray_actors_unplaced", asked=workers, placed=len(self.actors), resource=resource, timeout_s=placement_timeout_s)
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
        try:
            self._ray.get([a.close.remote() for a in self.actors])
        finally:
            for a in self.actors:
                self._ray.kill(a)
