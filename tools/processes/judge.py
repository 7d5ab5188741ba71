"""The judge: the trusted process that decides a verdict. It never loads candidate code.

Started by `kernel_refinery.tools.processes.worker.Judge` as `python -m kernel_refinery.tools.processes.judge`, one per
device, long-lived (its CUDA
context and the baselines it measured stay warm). For each job it gets a socket to the
candidate's process (the runner, tools/processes/worker_main.py) and does every step that a verdict
depends on, here:
- it loads the task, builds the reference, draws every input from the OS's entropy (seeds the
  runner never sees) and writes them into shared memory only when a call starts;
- it times both sides with its own clock, the reference through its reference runner (a runner
  that never loads candidate code, started with the judge) and the candidate through the
  candidate's runner, by the same path, in quiet windows (tools/steps/timing_stage.py,
  tools/processes/quiet.py); only it reads and writes the baseline cache;
- it compares the candidate's outputs, read back from shared memory, with the reference's;
- it chooses, after a timing, which timed calls to check, and samples their outputs the moment
  each batch ended; it computes the statistics.
The runner only builds models, runs calls and reports what it saw, which can only make a
verdict stricter; its own clock is recorded as a diagnostic.
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
from typing import Any, Literal, TypeVar

import structlog
import torch

from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.processes.channel import Spec
from kernel_refinery.tools.processes.confine import not_dumpable
from kernel_refinery.tools.processes.jobs import (
    EvalJob,
    JobReply,
    QuietGranted,
    QuietRelease,
    QuietRequest,
    Rejected,
    StageFailed,
)
from kernel_refinery.tools.processes.programs import Program, import_source, source_hash, tensors_of
from kernel_refinery.tools.processes.quiet import QUIET_ATTEMPTS, QUIET_PATIENCE_S, GpuSamples, Window
from kernel_refinery.tools.processes.remote import RunnerGone, RunnerLink
from kernel_refinery.tools.processes.startup import StartSteps
from kernel_refinery.tools.processes.worker_main import apply_tf32_policy, describe, die_with_parent
from kernel_refinery.tools.results import CorrectnessReport, Frozen, ProfileReport, Stage, TimingReport, WindowReport
from kernel_refinery.tools.stages import STEP, steps_in
from kernel_refinery.tools.steps.aten_ops import OpRecorder
from kernel_refinery.tools.steps.baseline_cache import store_for
from kernel_refinery.tools.steps.correctness import check_correctness, compare, verify_after_timing
from kernel_refinery.tools.steps.shape_variants import warm_meta
from kernel_refinery.tools.steps.timing_stage import (
    Baseline,
    JudgedTiming,
    ReferenceRunner,
    TimedPath,
    args_for_calls,
    time_candidate,
)

log = structlog.get_logger()

RUNNER_GONE = "the candidate's process ended while the judge was waiting for it"
QUIET_PAUSE_S = (0.25, 0.5, 1.0, 2.0, 4.0)
"""The pauses between windows, the last repeated."""
RECORD_ATTEMPTS = 3
"""Windows under eval.quiet "record" before the last one is kept with its note."""

T = TypeVar("T")


class ReferenceRunnerGone(RunnerGone):
    """The judge's own reference runner ended: the judge is replaced, the candidate not blamed."""


@dataclass
class JudgeState:
    device: torch.device
    workdir: Path
    tasks: dict[str, ModuleType] = field(default_factory=dict)
    baselines: dict[tuple[Any, ...], Baseline] = field(default_factory=dict)
    reference: RunnerLink | None = None
    """The reference runner: a runner that never loads candidate code, through which the judge times the reference."""
    reference_pid: int | None = None
    gpu: GpuSamples | None = None
    """NVML's view of the GPU, to check a window idle (CUDA only)."""
    flush: torch.Tensor | None = None
    """The judge's L2 flush buffer (CUDA)."""

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


@dataclass
class JudgeQuiet:
    """Quiet windows through the parent, which stops the other runners (tools/processes/quiet.py),
    checked here against what the kernel and NVML say ran beside them."""

    state: JudgeState
    cfg: EvalConfig
    parent: Connection | None
    """None when the judge runs without a parent (a test): nothing is stopped, the window is still checked."""
    runner_pid: int | None

    def _ask(self, message: object) -> object:
        assert self.parent is not None
        self.parent.send(message)
        return self.parent.recv()

    def run(
        self, what: Literal["reference", "harness", "candidate", "spot check"], hold_runner: bool, measure: Callable[[], T]
    ) -> tuple[T, WindowReport]:
        cores = sorted(os.sched_getaffinity(0))
        every_core = len(cores) == os.cpu_count()
        # The evaluator process that answers these asks (pid 1 once it is gone: never allowed).
        harness = (os.getppid(),) if self.parent is not None and os.getppid() != 1 else ()
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            held: tuple[int, ...] = ()
            if self.parent is not None:
                granted = self._ask(QuietRequest(hold_runner=hold_runner))
                if not isinstance(granted, QuietGranted):
                    raise StageFailed(EvalStatus.RUNTIME_ERROR, f"the evaluator did not grant a quiet window ({granted!r})")
                held = granted.held
            allowed = {os.getpid(), *([self.state.reference_pid] if self.state.reference_pid else [])}
            if not hold_runner and self.runner_pid:
                allowed.add(self.runner_pid)
            quiet = True  # a window that failed counts as the candidate's time
            try:
                window = Window(allowed, None if every_core else cores, self.state.gpu, harness=harness)
                value = measure()
                activity = window.close()
                quiet = activity.quiet
            finally:
                if self.parent is not None:
                    self._ask(QuietRelease(quiet=quiet))
            report = WindowReport(
                what=what,
                seconds=round(activity.seconds, 4),
                others_cpu_ms=round(activity.others_cpu_s * 1e3, 1),
                steal_ms=round(activity.steal_s * 1e3, 1),
                held=len(held),
                attempts=attempt,
                quiet=activity.quiet,
                gpu_checked=activity.gpu_checked,
                note="" if activity.quiet else activity.describe(),
            )
            if activity.quiet:
                return value, report
            log.info("window_not_quiet", what=what, attempt=attempt, why=activity.describe())
            if self.cfg.quiet == "record" and attempt >= RECORD_ATTEMPTS:
                return value, report
            waited = time.monotonic() - started
            if attempt >= QUIET_ATTEMPTS and waited >= QUIET_PATIENCE_S:
                raise StageFailed(
                    EvalStatus.RUNTIME_ERROR,
                    f"the machine was never quiet while the judge timed the {what} ({attempt} windows in {waited:.0f} s): "
                    f"{activity.describe()}. A time taken so is not honest; stop other work on this machine, or set "
                    "eval.quiet=record to keep such timings with a note",
                )
            time.sleep(QUIET_PAUSE_S[min(attempt, len(QUIET_PAUSE_S)) - 1])


@dataclass(frozen=True)
class Judged:
    """What the judge's steps of one job share."""

    state: JudgeState
    job: EvalJob
    program: Program
    first_seed: int
    quiet: JudgeQuiet


def _correctness(run: Judged) -> CorrectnessReport:
    return check_correctness(run.program, run.job.config, first_seed=run.first_seed)


def _timing(run: Judged) -> TimingReport:
    state, job, program, first_seed = run.state, run.job, run.program, run.first_seed
    cfg = job.config
    if state.reference is None:
        raise StageFailed(EvalStatus.RUNTIME_ERROR, "the judge has no reference runner to time the reference through")
    ref_model = program.reference(cfg.seed)
    new_model = program.new_model(cfg.seed)
    calls = args_for_calls(program, cfg, ref_model)
    with torch.no_grad():
        specs = tuple(Spec.of(t) for t in tensors_of(ref_model(*calls.make(0))))
    if program.device.type == "cuda" and state.flush is None:
        state.flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device=program.device)
    path = TimedPath(program, cfg, calls.make, specs, calls.source, flush=state.flush)
    reference = ReferenceRunner(state.reference, program, cfg, specs, job.task_source)
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
    try:
        report = time_candidate(
            JudgedTiming(path, reference, run.quiet), ref_model, new_model, state.baselines, baseline_key, store_for(cfg)
        )
    finally:
        with contextlib.suppress(RunnerGone):
            state.reference.end()
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


def run_job(state: JudgeState, job: EvalJob, link: RunnerLink, parent: Connection | None = None, runner_pid: int | None = None) -> JobReply:
    """The device stages of one candidate that the job asks for, in the table's order (tools/stages.py).

    `parent`: the connection to the evaluator, which stops other runners for a quiet window;
    `runner_pid`: the candidate's runner, whose CPU a candidate's window allows."""
    cfg: EvalConfig = job.config
    seconds: dict[str, float] = {}
    parts: dict[str, Any] = {}
    apply_tf32_policy(cfg.allow_tf32)
    stage = steps_in("judge")[0]  # a failure before the first step is reported as the first step's
    first_seed = cfg.seed + _salt()
    try:
        task, dtype = state.task(job), getattr(torch, cfg.dtype_name)
        program = Program(
            task, None, state.device, dtype=dtype, build=link.build_candidate, input_salt=_salt(), task_source=job.task_source
        )
        run = Judged(state, job, program, first_seed, JudgeQuiet(state, cfg, parent, runner_pid))
        for stage in [s for s in steps_in("judge") if s in job.stages]:
            started = time.perf_counter()
            parts[STEP[stage].fills] = report = HANDLERS[stage](run)
            if isinstance(report, CorrectnessReport) and not report.passed:
                raise StageFailed(EvalStatus.INCORRECT, report.summary())
            seconds[stage.value] = time.perf_counter() - started
        changes = link.end()
        if changes:
            raise Rejected(f"after the calls, the candidate had changed settings the evaluation pins: {'; '.join(changes)}")
    except ReferenceRunnerGone as exc:
        return JobReply(failure=EvalStatus.RUNTIME_ERROR, message=str(exc), stage_seconds=seconds, judge_broken=True, **parts)
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
    """The first use of each kernel the judge itself always runs costs time on a GPU, and scipy's
    statistics and torch's flop counter take seconds to import; pay them while the runner starts and
    compiles, not inside the first candidate's stages. Not cuBLAS: only a task that multiplies
    matrices needs it, and its reference's first call pays for it then."""
    import scipy.stats  # noqa: F401 - the speedup's interval
    from torch.utils.flop_counter import flop_registry  # noqa: F401 - the roofline and the input source

    with torch.no_grad(), OpRecorder():  # its first use imports torch._dynamo: most of a second
        torch.zeros(1)
    warm_meta()  # the shape variants' probes of the reference (tools/steps/shape_variants.py)
    with torch.no_grad():
        a = torch.rand(256, 256, device=device)
        b = torch.randn(256, 256, device=device)
        compare(a, a.add(1e-3), EvalConfig(device=device.type))
        compare(a, a.clone(), EvalConfig(device=device.type))
        torch.lerp(a, b, 0.5)
        flat = a.reshape(-1)
        flat[torch.randint(flat.numel(), (64,), device=device)].sum().item()
        torch.equal(a, b)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def serve(conn: Connection, state: JudgeState, start_seconds: dict[str, float]) -> None:
    """Jobs from the parent: ("reference", pid) then the reference runner's socket, once; ("job",
    job, runner pid) then the candidate's runner's socket, each answered with a JobReply."""
    conn.send(("ready", start_seconds))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        fd = recv_handle(conn)
        if message[0] == "reference":
            state.reference, state.reference_pid = _ReferenceLink(Connection(fd), state.device), message[1]
            continue
        _, job, runner_pid = message
        link = RunnerLink(Connection(fd), state.device)
        conn.send(run_job(state, job, link, conn, runner_pid))


class _ReferenceLink(RunnerLink):
    """The reference runner's end: its death is the judge's problem, never the candidate's."""

    def _gone(self, exc: BaseException) -> Exception:
        return ReferenceRunnerGone(f"the judge's reference runner ended while timing the reference ({exc}); the judge is restarted")

    def end(self) -> tuple[str, ...]:
        """Its models and arenas released after each job; the runner serves the next."""
        changes = super().end()
        self.closed = False
        return changes


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
    state = JudgeState(device=device, workdir=Path.cwd())
    if device.type == "cuda":
        state.gpu = GpuSamples(device.index or 0)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    serve(Connection(args.fd), state, steps.seconds)


if __name__ == "__main__":
    main()
