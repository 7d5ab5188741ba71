"""The evaluator's Python API: static check here, compile in the candidate's own process (the
runner), then correctness, timing and profile driven by the judge, which never loads candidate code;
the one table of these steps and their processes is tools/stages.py.

    with Evaluator(EvalConfig(device="cpu")) as ev:
        result = ev.evaluate(TaskProgram(name="relu", source=ref), candidate_source)
        print(result.headline())

The agent calls the same stages one at a time (`run(..., stages=...)`); a failed stage ends the
evaluation with its status, and later stages are not run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Self

import structlog

from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.guards.static_check import check_candidate
from kernel_refinery.tools.processes.jobs import EvalJob, JobReply, TaskProgram, source_hash
from kernel_refinery.tools.processes.quiet import BUILDS, machine_turn
from kernel_refinery.tools.processes.worker import Judge, Worker
from kernel_refinery.tools.results import EvalResult, Stage, StaticReport
from kernel_refinery.tools.stages import STEPS, order, steps_in
from kernel_refinery.tools.steps.compilers import identify

log = structlog.get_logger()

ALL_STAGES: tuple[Stage, ...] = tuple(step.stage for step in STEPS)
# Who runs what, from the one table (tools/stages.py).
_PARENT = steps_in("parent")
"""Here: the static check, `Evaluator.static` (tests/test_stages.py holds the table to it)."""
_RUNNER = steps_in("runner")
"""In the candidate's runner: load and compile."""
_JUDGE = steps_in("judge")
"""Driven by the judge: correctness, timing, profile."""


class Evaluator:
    """Judges candidates for one device through one reusable worker."""

    def __init__(self, config: EvalConfig, worker: Worker | None = None, judge: Judge | None = None):
        if config.compiler != "auto":
            # The compiler asked for is on this machine (CompilerMissing, a user error, where it is
            # not): checked here, before a runner starts, rather than failing every candidate's build.
            identify(choice=config.compiler)
        self.config = config
        self.worker = worker or Worker(
            device=config.device,
            cache_dir=config.cache_dir,
            memory_limit_gb=config.memory_limit_gb,
            threads=config.cpu_threads,
        )
        self.owns_judge = judge is None
        self.judge = judge or Judge(
            device=config.device,
            threads=self.worker.threads,
            gpu_index=self.worker.gpu_index,
            cores=self.worker.cores,
            cache_dir=config.cache_dir,
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.worker.shutdown()
        if self.owns_judge:
            self.judge.close()

    def with_config(self, config: EvalConfig) -> Evaluator:
        """This evaluator's worker and judge judging with other settings (trials, precision,
        tolerance, ...), e.g. one request's to `refinery serve`. What the worker was started with
        stays its own: the device, cache, memory limit and threads must match. Close only the original."""
        fixed = ("device", "cache_dir", "memory_limit_gb", "cpu_threads")
        differing = [name for name in fixed if getattr(config, name) != getattr(self.config, name)]
        if differing:
            raise ValueError(f"with_config: {', '.join(differing)} are fixed when the worker starts; use another Evaluator")
        return Evaluator(config, worker=self.worker, judge=self.judge)  # a judge given is not owned: closing the view leaves it

    @property
    def _setting(self) -> dict[str, object]:
        """What every result records of how it was judged."""
        cfg = self.config
        return {"device": cfg.device, "precision": cfg.precision, "tolerance": cfg.numerics.tolerance, "allow_tf32": cfg.allow_tf32}

    def _run_worker_stages(self, task: TaskProgram, candidate: str, stages: tuple[Stage, ...]) -> tuple[JobReply, str]:
        """Load (compile) in the candidate's runner when asked or not yet done there, then the device
        stages through the judge; the first failure is the reply."""
        self.worker.for_candidate(source_hash(task.source + "\0" + candidate + "\0" + self.config.precision))
        job = EvalJob(task_name=task.name, task_source=task.source, candidate_source=candidate, stages=_RUNNER, config=self.config)
        self.judge.warm()  # its start overlaps the runner's and the compile
        load: JobReply | None = None
        asked_load = any(s in _RUNNER for s in stages)
        if asked_load or not self.worker.alive:
            with BUILDS.building():  # not while a judge times anywhere on the machine
                load, printed = self.worker.run(job, self.config.compile_timeout_s)
            if load.failure is not None:
                return load, printed
            if not asked_load:
                load = load.model_copy(update={"compile": None, "stage_seconds": {}})
        device_stages = tuple(s for s in stages if s in _JUDGE)
        if not device_stages:
            assert load is not None
            return load, ""
        judged = job.model_copy(update={"stages": device_stages})
        with self.judge.lock, machine_turn(self.worker.group):
            reply, printed = self.worker.run_judged_with_retry(
                self.judge, job, judged, self.config.timeout_s, self.config.compile_timeout_s
            )
        if load is not None:
            reply = reply.model_copy(
                update={
                    "compile": load.compile,
                    "isolation": load.isolation,
                    "stage_seconds": {**load.stage_seconds, **reply.stage_seconds},
                }
            )
        return reply, printed

    def static(self, candidate: str) -> StaticReport:
        report = check_candidate(candidate, backend=self.config.kernel_backend)
        if not self.config.guards.kernelguard:
            return report
        from kernel_refinery.tools.guards.kernelguard_layer import kernelguard_findings

        findings = kernelguard_findings(candidate)
        if findings is None:
            findings = ("kernelguard was asked for (guards.kernelguard) but is not installed: pip install 'kernel-refinery[kernelguard]'",)
        return report.model_copy(update={"kernelguard": findings, "rejections": (*report.rejections, *findings)})

    def nsight(self, task: TaskProgram, candidate: str) -> EvalResult:
        """Hardware counters of the candidate's kernels under Nsight Compute (variant N)."""
        from kernel_refinery.tools.steps.nsight import profile_with_ncu

        started = time.perf_counter()
        report = profile_with_ncu(task, candidate, self.config)
        return EvalResult(**self._setting, status=None, nsight=report, stage_seconds={"nsight": time.perf_counter() - started})

    def evaluate(self, task: TaskProgram, candidate: str) -> EvalResult:
        """Every stage, in order; the first failure decides the status."""
        result = self.run(task, candidate, _PARENT + _RUNNER)
        if result.status is not None:
            return result
        return result.merge(self.run(task, candidate, _JUDGE))

    def run(self, task: TaskProgram, candidate: str, stages: Sequence[Stage]) -> EvalResult:
        """The given stages only. Status None means they all passed and the verdict is open;
        after the correctness stage a pass is `correct`."""
        stage_set = order(stages)
        static = None
        seconds: dict[str, float] = {}
        if Stage.STATIC in stage_set:
            started = time.perf_counter()
            static = self.static(candidate)
            seconds[Stage.STATIC.value] = time.perf_counter() - started
            if not static.ok:
                return EvalResult(
                    **self._setting, status=EvalStatus.REJECTED, message="\n".join(static.rejections), static=static, stage_seconds=seconds
                )
        worker_stages = tuple(s for s in stage_set if s not in _PARENT)
        if not worker_stages:
            return EvalResult(**self._setting, status=None, static=static, stage_seconds=seconds)
        reply, printed = self._run_worker_stages(task, candidate, worker_stages)
        seconds.update(reply.stage_seconds)
        status = reply.failure
        if status is None and Stage.CORRECTNESS in worker_stages:
            status = EvalStatus.CORRECT
        result = EvalResult(
            **self._setting,
            status=status,
            message=reply.message,
            static=static,
            compile=reply.compile,
            correctness=reply.correctness,
            timing=reply.timing,
            profile=reply.profile,
            stage_seconds=seconds,
            worker_log=printed[-2000:] if reply.failure else "",
            isolation=reply.isolation or None,
        )
        log.info(
            "evaluated", task=task.name, stages=[s.value for s in worker_stages], status=result.status.value if result.status else "passed"
        )
        return result
