"""The worker process: loads candidates, runs the evaluation stages, answers over a pipe.

Started by `tools.worker.Worker` as `python -m tools.worker_main`, in its own process group, in a
temporary directory, with a scrubbed environment and resource limits. Candidate code runs here
and only here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

from tools import sandbox
from tools.baseline_cache import store_for
from tools.compile_cache import CompileCache, CompileFailed, CompileLedger
from tools.correctness import (
    Rejected,
    TrialContext,
    check_correctness,
    verify_after_timing,
)
from tools.faults import CUDA_FAULT_MARKERS, OOM_MARKERS
from tools.jobs import EvalJob, JobReply, StageFailed
from tools.profiling import profile_forward
from tools.programs import Program, import_source, source_hash
from tools.results import CompileReport, EvalStatus, Stage, TimingReport
from tools.timing import Timer
from tools.timing_stage import Baseline, time_candidate


def classify(exc: BaseException) -> tuple[EvalStatus, bool]:
    """Status for an exception raised by candidate code, and whether the worker is now unusable."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)) or any(m in text for m in OOM_MARKERS):
        return EvalStatus.OOM, False
    accel_error = getattr(torch, "AcceleratorError", None)
    if (accel_error is not None and isinstance(exc, accel_error)) or any(m in text for m in CUDA_FAULT_MARKERS):
        return EvalStatus.CUDA_FAULT, True
    return EvalStatus.RUNTIME_ERROR, False


def describe(exc: BaseException, limit: int = 3000) -> str:
    """The traceback, with the worker's own frames dropped and candidate files named plainly."""
    frames = traceback.extract_tb(exc.__traceback__)
    kept = [f for f in frames if "refinery_" in f.filename or "/tools/" not in f.filename]
    error = "".join(traceback.format_exception_only(type(exc), exc))
    # The error first: a long traceback would push it out of a trimmed message.
    text = error + "Traceback (most recent call last):\n" + "".join(traceback.format_list(kept[-8:]))
    for kind in ("candidate", "task"):
        text = _rename(text, kind)
    return text[-limit:]


def _rename(text: str, kind: str) -> str:
    import re

    return re.sub(rf'File "[^"]*refinery_{kind}_[0-9a-f]+\.py"', f'File "{kind}.py"', text)


_WATCHED = {
    "time.perf_counter": ("time", "perf_counter"),
    "time.perf_counter_ns": ("time", "perf_counter_ns"),
    "time.time": ("time", "time"),
    "time.monotonic": ("time", "monotonic"),
    "torch.cuda.synchronize": ("torch.cuda", "synchronize"),
    "torch.cuda.Event": ("torch.cuda", "Event"),
    "torch.cuda.Event.record": ("torch.cuda.Event", "record"),
    "torch.cuda.Event.elapsed_time": ("torch.cuda.Event", "elapsed_time"),
    "torch.cuda.Event.synchronize": ("torch.cuda.Event", "synchronize"),
    "torch.cuda.current_stream": ("torch.cuda", "current_stream"),
    "torch.Tensor.clone": ("torch.Tensor", "clone"),
    "torch.equal": ("torch", "equal"),
}


def _resolve(path: str) -> Any:
    import importlib

    head, *rest = path.split(".")
    obj: Any = importlib.import_module(head)
    for part in rest:
        obj = getattr(obj, part)
    return obj


class Integrity:
    """Checks that candidate code left the timers and synchronisation alone, and puts them back."""

    def __init__(self) -> None:
        self.originals = {name: getattr(_resolve(owner), attr) for name, (owner, attr) in _WATCHED.items()}

    def check(self) -> str:
        changed = []
        for name, (owner, attr) in _WATCHED.items():
            holder = _resolve(owner) if "Event." not in name else self.originals["torch.cuda.Event"]
            if getattr(holder, attr) is not self.originals[name]:
                changed.append(name)
                setattr(holder, attr, self.originals[name])
        if changed:
            return f"the candidate replaced {', '.join(changed)}; timers and synchronisation must not be patched"
        return ""


@dataclass
class Loaded:
    program: Program
    ledger: CompileLedger
    report: CompileReport


@dataclass
class WorkerState:
    device: torch.device
    workdir: Path
    cache: CompileCache
    integrity: Integrity
    loaded: dict[str, Loaded] = field(default_factory=dict)
    baselines: dict[tuple[Any, ...], Baseline] = field(default_factory=dict)
    timer: Timer | None = None


def _load(state: WorkerState, job: EvalJob) -> Loaded:
    key = source_hash(job.task_source + "\0" + job.candidate_source + "\0" + job.config.precision)
    if key in state.loaded:
        return state.loaded[key]
    try:
        task = import_source(job.task_source, "task", state.workdir)
    except Exception as exc:  # a broken task program is reported, whatever it raised
        raise StageFailed(EvalStatus.RUNTIME_ERROR, f"the task program {job.task_name} failed to load:\n{describe(exc)}") from exc
    ledger = state.cache.begin(job.candidate_source)
    hits_before, misses_before = ledger.hits, ledger.misses
    started = time.perf_counter()
    try:
        candidate = import_source(job.candidate_source, "candidate", state.workdir)
        if not hasattr(candidate, "ModelNew"):
            raise StageFailed(EvalStatus.COMPILE_ERROR, "the candidate defines no ModelNew class")
        program = Program(task, candidate, state.device, dtype=getattr(torch, job.config.dtype_name))
        # Kernels built in __init__ compile here, not inside a timed call.
        program.new_model(job.config.seed)
    except CompileFailed as exc:
        raise StageFailed(EvalStatus.COMPILE_ERROR, exc.log) from None
    except StageFailed:
        raise
    except Exception as exc:  # candidate code may raise anything: it becomes the candidate's status
        status, fatal = classify(exc)
        if status is EvalStatus.RUNTIME_ERROR:
            status = EvalStatus.COMPILE_ERROR
        raise StageFailed(status, f"loading the candidate failed:\n{describe(exc)}", fatal) from exc
    report = CompileReport(
        ok=True,
        seconds=time.perf_counter() - started,
        cache_hits=ledger.hits - hits_before,
        cache_misses=ledger.misses - misses_before,
    )
    loaded = Loaded(program=program, ledger=ledger, report=report)
    state.loaded[key] = loaded
    return loaded


def _context(state: WorkerState, loaded: Loaded) -> TrialContext:
    return TrialContext(kernel_calls=lambda: loaded.ledger.kernel_calls, integrity=state.integrity.check)


def _correctness(state: WorkerState, job: EvalJob, loaded: Loaded) -> Any:
    return check_correctness(loaded.program, job.config, _context(state, loaded))


def _timing(state: WorkerState, job: EvalJob, loaded: Loaded) -> TimingReport:
    cfg = job.config
    program = loaded.program
    if state.timer is None:
        state.timer = Timer(state.device)
    ref_model = program.reference(cfg.seed)
    new_model = program.new_model(cfg.seed, reference=ref_model)
    baseline_key = (
        source_hash(job.task_source),
        cfg.warmup,
        cfg.trials,
        cfg.time_compiled_reference,
        cfg.seed,
        cfg.precision,
        cfg.allow_tf32,
    )
    report = time_candidate(state.timer, program, cfg, ref_model, new_model, state.baselines, baseline_key, store_for(cfg))
    tampered = state.integrity.check()
    if tampered:
        raise StageFailed(EvalStatus.REJECTED, tampered)
    after = verify_after_timing(program, cfg, _context(state, loaded), ref_model, new_model, cfg.seed + 3_000_003)
    if not after.passed:
        raise StageFailed(EvalStatus.INCORRECT, f"after timing, on new inputs: {after.reason} (is an output cached across calls?)")
    if report.speedup > cfg.reverify_speedup:
        # An implausible speedup is checked again on new seeds before it is believed.
        again = check_correctness(
            program, cfg, _context(state, loaded), trials=cfg.reverify_trials, first_seed=cfg.seed + 10_000, full=False
        )
        if not again.passed:
            raise StageFailed(EvalStatus.INCORRECT, f"speedup {report.speedup:.1f}x failed re-verification: {again.summary()}")
        report = report.model_copy(update={"suspicious": True, "reverified_trials": cfg.reverify_trials})
    return report


def apply_tf32_policy(allow: bool) -> None:
    """TF32 for fp32 matmul and convolution, for both models alike. torch leaves cuDNN's on by
    default, so an fp32 reference would otherwise be timed at reduced precision."""
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow
    torch.set_float32_matmul_precision("high" if allow else "highest")


def run_job(state: WorkerState, job: EvalJob) -> JobReply:
    seconds: dict[str, float] = {}
    parts: dict[str, Any] = {}
    apply_tf32_policy(job.config.allow_tf32)
    stage = Stage.COMPILE
    try:
        started = time.perf_counter()
        loaded = _load(state, job)
        state.cache.ledger = loaded.ledger
        if Stage.COMPILE in job.stages:
            seconds[Stage.COMPILE.value] = time.perf_counter() - started
            parts["compile"] = loaded.report
        for stage in job.stages:
            started = time.perf_counter()
            if stage is Stage.CORRECTNESS:
                parts["correctness"] = report = _correctness(state, job, loaded)
                if not report.passed:
                    raise StageFailed(EvalStatus.INCORRECT, report.summary())
            elif stage is Stage.TIMING:
                parts["timing"] = _timing(state, job, loaded)
            elif stage is Stage.PROFILE:
                inputs = loaded.program.inputs(job.config.seed + 1_000_003)
                model = loaded.program.new_model(job.config.seed)
                parts["profile"] = profile_forward(model, inputs, state.device, rows=job.config.profile_rows)
            else:
                continue
            seconds[stage.value] = time.perf_counter() - started
    except StageFailed as exc:
        if exc.status is EvalStatus.COMPILE_ERROR:
            parts["compile"] = CompileReport(ok=False, log=exc.message, seconds=time.perf_counter() - started)
            seconds.setdefault(Stage.COMPILE.value, time.perf_counter() - started)
        return JobReply(failure=exc.status, message=exc.message, stage_seconds=seconds, fatal=exc.fatal, **parts)
    except Rejected as exc:
        return JobReply(failure=EvalStatus.REJECTED, message=str(exc), stage_seconds=seconds, **parts)
    except Exception as exc:  # noqa: BLE001 - candidate code may raise anything: it becomes the candidate's status
        status, fatal = classify(exc)
        return JobReply(failure=status, message=f"{stage.value}: {describe(exc)}", stage_seconds=seconds, fatal=fatal, **parts)
    return JobReply(stage_seconds=seconds, **parts)


def _release_device_memory(reply: JobReply) -> JobReply:
    """Give cached blocks back (other workers on the same GPU need the memory). A fault the
    candidate left behind surfaces here at the latest: it is the job's status, not a dead worker."""
    try:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    except Exception as exc:  # noqa: BLE001 - whatever the runtime raises after a fault is the candidate's doing
        status, _ = classify(exc)
        if status is EvalStatus.CUDA_FAULT and not reply.fatal:
            return reply.model_copy(update={"failure": status, "message": f"after the job: {describe(exc)}", "fatal": True})
        if not reply.fatal:
            return reply.model_copy(update={"fatal": True})
    return reply


def serve(conn: Connection, state: WorkerState, cpu_seconds_per_job: float) -> None:
    conn.send("ready")
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        # What the candidate prints goes to this job's log only.
        for fd in (1, 2):
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
        sandbox.limit_cpu_seconds(cpu_seconds_per_job)
        reply = run_job(state, job)
        if state.device.type == "cuda":
            reply = _release_device_memory(reply)
        sys.stdout.flush()
        sys.stderr.flush()
        conn.send(reply)
        if reply.fatal:
            return


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this worker when the process that started it dies, even a SIGKILLed one.

    Without it a killed experiment leaves its workers behind, and one running a hung kernel spins
    on until its CPU-time limit (an hour), holding its cores or its GPU's memory. A Python-level
    watch could not help: a spinning kernel holds the GIL. The kernel sends the signal when the
    parent's *thread* that started the worker ends, so tools.worker starts every worker from one
    long-lived thread.
    """
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)  # the parent died before the signal was armed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--memory-bytes", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--cpu-seconds-per-job", type=float, default=3600)
    parser.add_argument("--cores", default="", help="comma-separated CPU cores to run on")
    parser.add_argument("--parent-pid", type=int, default=0, help="end when this process ends")
    args = parser.parse_args()
    if args.parent_pid:
        die_with_parent(args.parent_pid)
    if args.cores:
        # Before any thread exists: OpenMP and compiler processes inherit it.
        os.sched_setaffinity(0, {int(c) for c in args.cores.split(",")})
    conn = Connection(args.fd)
    device = torch.device(args.device)
    sandbox.apply_limits(args.memory_bytes or None, file_bytes=4 << 30)
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        # Event timing of a candidate's kernels must not include cuBLAS/cuDNN autotuning noise.
        torch.backends.cudnn.benchmark = False
    cache = CompileCache(Path(args.cache_dir))
    cache.install()
    if device.type == "cuda":
        cache.install_triton_counter()
    state = WorkerState(device=device, workdir=Path.cwd(), cache=cache, integrity=Integrity())
    serve(conn, state, args.cpu_seconds_per_job)


if __name__ == "__main__":
    main()
