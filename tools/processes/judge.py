"""The judge: the trusted process that decides a verdict. It never loads candidate code.

Started by `kernel_refinery.tools.processes.worker.Judge` as `python -m kernel_refinery.tools.processes.judge`, one per
device, long-lived (its CUDA
context and the baselines it measured stay warm). For each job it gets a socket to the
candidate's process (the runner, tools/processes/worker_main.py) and does every step that a verdict
depends on, here:
- it loads the task, builds the reference, draws every input from the OS's entropy (seeds the
  runner never sees) and writes them into shared memory only when a call starts;
- it times the reference, and only it reads and writes the baseline cache;
- it compares the candidate's outputs, read back from shared memory, with the reference's;
- it chooses, after a timing, which timed calls to check, and samples their outputs the moment
  each call ended;
- it checks the runner's reported times against its own clock and computes the statistics.
The runner only builds models, runs calls and reports what it saw, which can only make a
verdict stricter.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle
from pathlib import Path
from types import ModuleType
from typing import Any

import structlog
import torch

from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.processes.confine import not_dumpable
from kernel_refinery.tools.processes.jobs import EvalJob, JobReply, Rejected, StageFailed
from kernel_refinery.tools.processes.programs import Program, import_source, source_hash
from kernel_refinery.tools.processes.remote import RunnerGone, RunnerLink
from kernel_refinery.tools.processes.startup import StartSteps
from kernel_refinery.tools.processes.worker_main import apply_tf32_policy, describe, die_with_parent
from kernel_refinery.tools.results import CorrectnessReport, Frozen, ProfileReport, Stage, TimingReport
from kernel_refinery.tools.stages import STEP, steps_in
from kernel_refinery.tools.steps.aten_ops import OpRecorder
from kernel_refinery.tools.steps.baseline_cache import store_for
from kernel_refinery.tools.steps.correctness import check_correctness, compare, verify_after_timing
from kernel_refinery.tools.steps.shape_variants import warm_meta
from kernel_refinery.tools.steps.timing import Timer
from kernel_refinery.tools.steps.timing_stage import Baseline, Calibration, calibrate, time_candidate

log = structlog.get_logger()

RUNNER_GONE = "the candidate's process ended while the judge was waiting for it"


@dataclass
class JudgeState:
    device: torch.device
    workdir: Path
    tasks: dict[str, ModuleType] = field(default_factory=dict)
    baselines: dict[tuple[Any, ...], Baseline] = field(default_factory=dict)
    timer: Timer | None = None
    calibrations: dict[str, Calibration] = field(default_factory=dict)
    """The harness's own cost per timing method, measured at its first use."""

    def task(self, job: EvalJob) -> ModuleType:
        key = source_hash(job.task_source)
        if key not in self.tasks:
            try:
                self.tasks[key] = import_source(job.task_source, "task", self.workdir)
            except Exception as exc:  # a broken task program is reported, whatever it raised
                raise StageFailed(EvalStatus.RUNTIME_ERROR, f"the task program {job.task_name} failed to load:\n{describe(exc)}") from exc
        return self.tasks[key]


def _salt() -> int:
    return random.SystemRandom().getrandbits(40)


@dataclass(frozen=True)
class Judged:
    """What the judge's steps of one job share."""

    state: JudgeState
    job: EvalJob
    program: Program
    first_seed: int


def _correctness(run: Judged) -> CorrectnessReport:
    return check_correctness(run.program, run.job.config, first_seed=run.first_seed)


def _timing(run: Judged) -> TimingReport:
    state, job, program, first_seed = run.state, run.job, run.program, run.first_seed
    cfg = job.config
    if state.timer is None:
        state.timer = Timer(state.device)
    state.timer.use(cfg.timing)
    if cfg.timing not in state.calibrations:
        state.calibrations[cfg.timing] = calibrate(state.timer)
    ref_model = program.reference(cfg.seed)
    new_model = program.new_model(cfg.seed)
    baseline_key = (
        source_hash(job.task_source),
        cfg.warmup,
        cfg.trials,
        cfg.times_compiled_reference,
        cfg.noise_band,
        cfg.timing,
        cfg.seed,
        cfg.precision,
        cfg.allow_tf32,
    )
    report = time_candidate(
        state.timer, program, cfg, ref_model, new_model, state.baselines, baseline_key, state.calibrations[cfg.timing], store_for(cfg)
    )
    after = verify_after_timing(program, cfg, ref_model, new_model, cfg.seed + 3_000_003)
    if not after.passed:
        raise StageFailed(EvalStatus.INCORRECT, f"after timing, on new inputs: {after.reason} (is an output cached across calls?)")
    if report.speedup > cfg.reverify_speedup:
        # An implausible speedup is checked again on new seeds before it is believed.
        again = check_correctness(program, cfg, trials=cfg.reverify_trials, first_seed=first_seed + 10_000, full=False)
        if not again.passed:
            raise StageFailed(EvalStatus.INCORRECT, f"speedup {report.speedup:.1f}x failed re-verification: {again.summary()}")
        report = report.model_copy(update={"suspicious": True, "reverified_trials": cfg.reverify_trials})
    return report


def _profile(run: Judged) -> ProfileReport:
    cfg = run.job.config
    model = run.program.new_model(cfg.seed)
    return model.profile(run.program.inputs(cfg.seed + 1_000_003), cfg.profile_rows)


HANDLERS: dict[Stage, Callable[[Judged], Frozen]] = {Stage.CORRECTNESS: _correctness, Stage.TIMING: _timing, Stage.PROFILE: _profile}
"""The judge's handler of each of its steps, in the table's order (tools/stages.py); each returns the
report for the step's field of the reply."""
if tuple(HANDLERS) != steps_in("judge"):
    raise RuntimeError(f"judge: handlers for {list(HANDLERS)}, but tools/stages.py gives the judge {list(steps_in('judge'))}")


def run_job(state: JudgeState, job: EvalJob, link: RunnerLink) -> JobReply:
    """The device stages of one candidate that the job asks for, in the table's order (tools/stages.py)."""
    cfg: EvalConfig = job.config
    seconds: dict[str, float] = {}
    parts: dict[str, Any] = {}
    apply_tf32_policy(cfg.allow_tf32)
    stage = steps_in("judge")[0]  # a failure before the first step is reported as the first step's
    first_seed = cfg.seed + _salt()
    try:
        task, dtype = state.task(job), getattr(torch, cfg.dtype_name)
        program = Program(task, None, state.device, dtype=dtype, build=link.build, input_salt=_salt(), task_source=job.task_source)
        run = Judged(state, job, program, first_seed)
        for stage in [s for s in steps_in("judge") if s in job.stages]:
            started = time.perf_counter()
            parts[STEP[stage].fills] = report = HANDLERS[stage](run)
            if isinstance(report, CorrectnessReport) and not report.passed:
                raise StageFailed(EvalStatus.INCORRECT, report.summary())
            seconds[stage.value] = time.perf_counter() - started
        changes = link.end()
        if changes:
            raise Rejected(f"after the calls, the candidate had changed settings the evaluation pins: {'; '.join(changes)}")
    except RunnerGone:
        return JobReply(failure=EvalStatus.RUNTIME_ERROR, message=RUNNER_GONE, stage_seconds=seconds, runner_gone=True, **parts)
    except StageFailed as exc:
        return JobReply(failure=exc.status, message=exc.message, stage_seconds=seconds, fatal=exc.fatal, **parts)
    except Rejected as exc:
        return JobReply(failure=EvalStatus.REJECTED, message=str(exc), stage_seconds=seconds, **parts)
    except Exception as exc:  # noqa: BLE001 - the task's reference code may raise anything
        return JobReply(failure=EvalStatus.RUNTIME_ERROR, message=f"{stage.value}: {describe(exc)}", stage_seconds=seconds, **parts)
    finally:
        with contextlib.suppress(Exception):
            link.end()
        link.conn.close()
        log.info("judged", task=job.task_name, stages=seconds, runner={k: round(v, 3) for k, v in link.seconds.items()})
        if state.device.type == "cuda":
            torch.cuda.empty_cache()
    return JobReply(stage_seconds=seconds, **parts)


def warm_up(device: torch.device) -> None:
    """The first use of cuBLAS and of each kernel costs seconds on a GPU, and scipy's statistics and
    torch's flop counter take seconds to import; pay them while the runner starts and compiles, not
    inside the first candidate's stages."""
    import scipy.stats  # noqa: F401 - the speedup's interval
    from torch.utils.flop_counter import flop_registry  # noqa: F401 - the roofline and the input source

    with torch.no_grad(), OpRecorder():  # its first use imports torch._dynamo: most of a second
        torch.zeros(1)
    warm_meta()  # the shape variants' probes of the reference (tools/steps/shape_variants.py)
    with torch.no_grad():
        a = torch.rand(256, 256, device=device)
        b = torch.randn(256, 256, device=device)
        compare(a @ b, (a @ b).add_(1e-3), EvalConfig(device=device.type))
        compare(a, a.clone(), EvalConfig(device=device.type))
        torch.lerp(a, b, 0.5)
        flat = a.reshape(-1)
        flat[torch.randint(flat.numel(), (64,), device=device)].sum().item()
        torch.equal(a, b)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def serve(conn: Connection, state: JudgeState, start_seconds: dict[str, float]) -> None:
    conn.send(("ready", start_seconds))
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        fd = recv_handle(conn)
        link = RunnerLink(Connection(fd), state.device)
        conn.send(run_job(state, job, link))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--cores", default="", help="comma-separated CPU cores to run on")
    parser.add_argument("--parent-pid", type=int, default=0, help="end when this process ends")
    args = parser.parse_args()
    steps = StartSteps()
    # No process of the same user (a candidate's) may attach to this one or read its memory.
    not_dumpable()
    if args.parent_pid:
        die_with_parent(args.parent_pid)
    if args.cores:
        os.sched_setaffinity(0, {int(c) for c in args.cores.split(",")})
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = False
        torch.zeros(1, device=device)
        steps.mark("cuda_context")
    warm_up(device)
    steps.mark("warm_up")
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    serve(Connection(args.fd), JudgeState(device=device, workdir=Path.cwd()), steps.seconds)


if __name__ == "__main__":
    main()
