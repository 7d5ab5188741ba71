"""The runner: the candidate's process. It loads one candidate, builds its models and runs the
calls the judge hands it; nothing a verdict depends on lives here.

Started by `kernel_refinery.tools.processes.worker.Worker` (forked from a warm template, see tools/processes/forkserver.py) in its own
process group and temporary directory, with a scrubbed environment and resource limits, for one
candidate only. Before any candidate code runs it confines its writes to its own folder and the
build caches (tools/processes/confine.py), gives up its capabilities, records the settings the evaluation
pins and arms an audit hook (tools/guards/audit.py). It answers the parent (load and compile) on one
socket and the judge (tools/processes/judge.py) on another; the judge writes each call's inputs into shared
memory and reads the outputs back. What the runner reports (its clock, kernel calls, aten ops,
output problems, settings changed) can only make a verdict stricter: the judge checks the outputs
and the clock itself.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing

from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.config import EvalConfig, default_pch_dir
from kernel_refinery.tools.faults import CUDA_FAULT_MARKERS, OOM_MARKERS
from kernel_refinery.tools.guards import audit
from kernel_refinery.tools.guards.output_guards import output_problem
from kernel_refinery.tools.processes import sandbox
from kernel_refinery.tools.processes.channel import (
    Batch,
    BatchDone,
    Build,
    Built,
    Call,
    Called,
    End,
    Failed,
    Inputs,
    LoadTask,
    OutputMeta,
    Outputs,
    Profile,
    Profiled,
    Share,
    Shared,
    SlotArg,
    Spec,
    map_arena,
)
from kernel_refinery.tools.processes.confine import confine_writes, drop_capabilities
from kernel_refinery.tools.processes.jobs import EvalJob, JobReply, Rejected, StageFailed
from kernel_refinery.tools.processes.programs import Program, import_source, source_hash, tensors_of
from kernel_refinery.tools.processes.startup import StartSteps
from kernel_refinery.tools.results import CompileReport
from kernel_refinery.tools.stages import steps_in
from kernel_refinery.tools.steps.aten_ops import OpRecorder, synchronize
from kernel_refinery.tools.steps.compile_cache import CompileCache, CompileFailed, CompileLedger
from kernel_refinery.tools.steps.kernel_share import measure_kernel_share
from kernel_refinery.tools.steps.profiling import profile_forward
from kernel_refinery.tools.steps.timing import Timer

(LOAD,) = steps_in("runner")
"""The runner's one step in the table (tools/stages.py), the load that compiles the candidate: the job
asks for nothing else here, and the runner decides nothing else."""

REFUSED = "refused by the evaluator"
"""How the audit hook's PermissionError starts (tools/guards/audit.py): the candidate reached for the harness."""


def refused(exc: BaseException) -> bool:
    return isinstance(exc, PermissionError) and str(exc).startswith(REFUSED)


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
    pinned: dict[str, object]
    """The settings the evaluation pins, as they were before candidate code ran."""
    isolation: str = ""
    config: EvalConfig | None = None
    loaded: Loaded | None = None
    loaded_key: str = ""
    timer: Timer | None = None
    models: dict[int, Any] = field(default_factory=dict)
    inputs: list[torch.Tensor] = field(default_factory=list)
    outputs: list[torch.Tensor] = field(default_factory=list)
    arenas: dict[str, list[list[torch.Tensor]]] = field(default_factory=dict)
    pending_changes: tuple[str, ...] = ()
    snapshot_due: bool = False
    """Timed hand-overs ran since the last state snapshot (taken before the next other request)."""
    reference_runner: bool = False
    """Started with --reference: serves the judge the task's reference, never a candidate."""

    def state_changes(self) -> tuple[str, ...]:
        # No candidate runs in the reference runner, and torch.compile of the reference sets
        # environment variables of its own (inductor's): no one's attempt on the pinned settings.
        # (Neither runner takes the snapshot between timed hand-overs, so skipping it here changes
        # no harness cost.)
        if self.reference_runner:
            return ()
        return tuple(audit.changed(self.pinned, audit.snapshot()))


def _load(state: WorkerState, job: EvalJob) -> Loaded:
    key = source_hash(job.task_source + "\0" + job.candidate_source + "\0" + job.config.precision)
    if state.loaded is not None:
        if key != state.loaded_key:
            raise StageFailed(EvalStatus.RUNTIME_ERROR, "a runner holds one candidate; this one was loaded for another", fatal=True)
        return state.loaded
    try:
        task = import_source(job.task_source, "task", state.workdir)
    except Exception as exc:  # a broken task program is reported, whatever it raised
        raise StageFailed(EvalStatus.RUNTIME_ERROR, f"the task program {job.task_name} failed to load:\n{describe(exc)}") from exc
    # The compiler comes with the job (EvalConfig.compiler), never from this process's environment.
    ledger = state.cache.begin(job.candidate_source, compiler=job.config.compiler)
    hits_before, misses_before = ledger.hits, ledger.misses
    started = time.perf_counter()
    try:
        candidate = import_source(job.candidate_source, "candidate", state.workdir)
        if not hasattr(candidate, "ModelNew"):
            raise StageFailed(EvalStatus.COMPILE_ERROR, "the candidate defines no ModelNew class")
        program = Program(task, candidate, state.device, dtype=getattr(torch, job.config.dtype_name), task_source=job.task_source)
        # Kernels built in __init__ compile here, not inside a timed call.
        program.new_model(job.config.seed)
    except CompileFailed as exc:
        raise StageFailed(EvalStatus.COMPILE_ERROR, exc.log) from None
    except StageFailed:
        raise
    except Exception as exc:  # candidate code may raise anything: it becomes the candidate's status
        status, fatal = classify(exc)
        if refused(exc):
            status = EvalStatus.REJECTED
        elif status is EvalStatus.RUNTIME_ERROR:
            status = EvalStatus.COMPILE_ERROR
        raise StageFailed(status, f"loading the candidate failed:\n{describe(exc)}", fatal) from exc
    report = CompileReport(
        ok=True,
        compiler=ledger.compiler,
        seconds=time.perf_counter() - started,
        cache_hits=ledger.hits - hits_before,
        cache_misses=ledger.misses - misses_before,
    )
    changes = state.state_changes()
    if changes:
        raise Rejected(
            f"loading the candidate changed settings the evaluation pins: {'; '.join(changes)}; leave global settings "
            "(threads, backend flags, precision, torch's functions, the environment) as they are"
        )
    loaded = Loaded(program=program, ledger=ledger, report=report)
    state.loaded, state.loaded_key, state.config = loaded, key, job.config
    return loaded


def apply_tf32_policy(allow: bool) -> None:
    """TF32 for fp32 matmul and convolution, for both models alike. torch leaves cuDNN's on by
    default, so an fp32 reference would otherwise be timed at reduced precision."""
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow
    torch.set_float32_matmul_precision("high" if allow else "highest")


def run_job(state: WorkerState, job: EvalJob) -> JobReply:
    """The parent's job: load (and so compile) the candidate. The device stages are the judge's."""
    seconds: dict[str, float] = {}
    apply_tf32_policy(job.config.allow_tf32)
    if state.loaded is None:
        state.pinned = audit.snapshot()  # the run's TF32 policy is the harness's setting, not a change
    started = time.perf_counter()
    try:
        loaded = _load(state, job)
        state.cache.ledger = loaded.ledger
    except StageFailed as exc:
        compile_report = None
        if exc.status is EvalStatus.COMPILE_ERROR:
            compile_report = CompileReport(
                ok=False, log=exc.message, seconds=time.perf_counter() - started, compiler=state.cache.ledger.compiler
            )
        seconds[LOAD.value] = time.perf_counter() - started
        return JobReply(failure=exc.status, message=exc.message, compile=compile_report, stage_seconds=seconds, fatal=exc.fatal)
    except Rejected as exc:
        return JobReply(failure=EvalStatus.REJECTED, message=str(exc), stage_seconds=seconds, isolation=state.isolation)
    seconds[LOAD.value] = time.perf_counter() - started
    return JobReply(compile=loaded.report, stage_seconds=seconds, isolation=state.isolation)


def _args(state: WorkerState, template: tuple[SlotArg, ...]) -> list[Any]:
    return [state.inputs[value] if kind == "slot" else value for kind, value in template]


def _metas(out: Any) -> tuple[OutputMeta, ...]:
    if isinstance(out, (torch.Tensor, list, tuple, dict)):
        tensors = tensors_of(out)
        if tensors or not isinstance(out, torch.Tensor):
            return tuple(OutputMeta("tensor", Spec.of(t)) for t in tensors)
    return (OutputMeta(type(out).__name__),)


def _call(state: WorkerState, request: Call) -> Called:
    """One untimed call (correctness, checks): its outputs into the output arena."""
    assert state.loaded is not None
    model = state.models[request.model]
    args = _args(state, request.args)
    ledger = state.loaded.ledger
    before = ledger.kernel_calls
    with torch.no_grad(), OpRecorder() if request.record_ops else contextlib.nullcontext() as recorder:
        out = model(*args)
    synchronize(state.device)
    ops = tuple(sorted(recorder.ops)) if recorder is not None else ()
    calls = ledger.kernel_calls - before
    problem = output_problem(out, args) if _plain_outputs(state) else ""
    copied = not problem and _copy_outputs(out, state.outputs)
    pending, state.pending_changes = state.pending_changes, ()
    return Called(_metas(out), copied, calls, ops, problem, pending)


def _plain_outputs(state: WorkerState) -> bool:
    return state.config.guards.plain_outputs if state.config is not None else True


def _copy_outputs(out: Any, slots: list[torch.Tensor]) -> bool:
    """The call's tensors into their arena slots, when they match the slots' specs."""
    outputs = tensors_of(out)
    if len(outputs) != len(slots) or any(o.shape != s.shape or o.dtype != s.dtype for o, s in zip(outputs, slots, strict=True)):
        return False
    with torch.no_grad():
        for o, slot in zip(outputs, slots, strict=True):
            slot.copy_(o)
    return True


def _batch(state: WorkerState, request: Batch) -> BatchDone:
    """The judge's timed hand-over: each call in turn, the device synchronized after it (work on any
    stream counts, as KernelBench's timing has it), its outputs into its own group of slots.

    The judge's clock runs from before it wrote these inputs until it has read the outputs back;
    what this process measures of each call (`runner_ms`, the host's clock) is only a diagnostic."""
    assert state.loaded is not None
    model = state.models[request.model]
    if request.graph and state.timer is None:
        state.timer = Timer(state.device, "graph", flush=False)
    per_call = len(state.outputs) // max(1, len(request.calls))
    ledger = state.loaded.ledger
    before = ledger.kernel_calls
    runner_ms: list[float] = []
    first: tuple[OutputMeta, ...] = ()
    with torch.no_grad():
        for k, template in enumerate(request.calls):
            args = _args(state, template)
            started = time.perf_counter_ns()
            if state.timer is not None:
                out, _ = state.timer.time_call(model, args)
            else:
                out = model(*args)
                synchronize(state.device)
            runner_ms.append((time.perf_counter_ns() - started) / 1e6)
            problem = output_problem(out, args) if _plain_outputs(state) else ""
            if problem:
                return BatchDone(_metas(out), False, ledger.kernel_calls - before, problem, tuple(runner_ms))
            if k == 0:
                first = _metas(out)
            if not _copy_outputs(out, state.outputs[k * per_call : (k + 1) * per_call]):
                return BatchDone(_metas(out), False, ledger.kernel_calls - before, "", tuple(runner_ms))
            del out, args
    synchronize(state.device)
    pending, state.pending_changes = state.pending_changes, ()
    return BatchDone(first, True, ledger.kernel_calls - before, "", tuple(runner_ms), pending)


def _serve_judge(state: WorkerState, conn: Connection) -> bool:
    """Answer the judge until it says End (True) or its end of the socket is closed (False)."""
    open_ = True
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            open_ = False
            break
        if isinstance(request, End):
            conn.send(Called((), False, 0, state_changes=state.pending_changes or state.state_changes()))
            break
        if isinstance(request, (Inputs, Outputs)):
            role = "inputs" if isinstance(request, Inputs) else "outputs"
            mapped = state.arenas.setdefault(role, [])
            if request.new:
                mapped.append(map_arena(conn.recv(), conn))
            setattr(state, role, mapped[request.arena])
            conn.send(True)
            continue
        if state.snapshot_due and not isinstance(request, Batch):
            state.snapshot_due = False
            state.pending_changes = state.pending_changes or state.state_changes()
        try:
            reply = _answer(state, request)
        except Exception as exc:  # noqa: BLE001 - candidate code may raise anything: it becomes the candidate's status
            status, fatal = classify(exc)
            if isinstance(exc, CompileFailed):
                status, fatal = EvalStatus.COMPILE_ERROR, False
            elif refused(exc):
                status = EvalStatus.REJECTED
            conn.send(Failed(status.value, f"{describe(exc)}", fatal, state.pending_changes))
            if fatal:
                os._exit(1)
            continue
        conn.send(reply)
        if isinstance(request, Call):
            # After the reply, outside the judge's clock: reported with the next one.
            state.pending_changes = state.state_changes()
        elif isinstance(request, Batch):
            # Not between timed hand-overs: the judge's next clock would meet it (a few tenths of a
            # millisecond, and as variable as the machine). The next request that is not a timed
            # hand-over takes it first, and End always does.
            state.snapshot_due = True
    state.models.clear()
    state.inputs, state.outputs = [], []
    state.arenas.clear()
    if state.device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return open_


def _answer(state: WorkerState, request: object) -> object:
    if isinstance(request, LoadTask):
        return _load_task(state, request)
    assert state.loaded is not None
    program = state.loaded.program
    if isinstance(request, Build):
        if request.overrides:
            program = program.variant(request.overrides)
        state.models[len(state.models)] = _build(state, program, request)
        return Built(len(state.models) - 1, state.state_changes())
    if isinstance(request, Call):
        return _call(state, request)
    if isinstance(request, Batch):
        return _batch(state, request)
    if isinstance(request, (Profile, Share)):
        PROFILER.wait()
    if isinstance(request, Profile):
        return Profiled(profile_forward(state.models[request.model], _args(state, request.args), state.device, rows=request.rows))
    if isinstance(request, Share):
        sets = [_args(state, group) for group in request.arg_sets]
        return Shared(
            measure_kernel_share(state.models[request.model], sets, state.device, request.non_compute, set(request.reference_ops))
        )
    raise ValueError(f"unknown request {type(request).__name__}")


class NullModel(torch.nn.Module):
    """The harness's own cost: returns outputs of the reference's specs without any work, so that a
    batch of it is everything a timed batch costs but the calls (tools/steps/timing_stage.py)."""

    def __init__(self, specs: tuple[Spec, ...], device: torch.device) -> None:
        super().__init__()
        self.outputs = [torch.zeros(s.shape, dtype=s.torch_dtype, device=device) for s in specs]

    def forward(self, *args: Any) -> Any:
        return self.outputs[0] if len(self.outputs) == 1 else tuple(self.outputs)


def _build(state: WorkerState, program: Program, request: Build) -> Any:
    """A candidate's runner builds only ModelNew; the reference runner only the others."""
    reference_runner = program.candidate is None
    if reference_runner == (request.role == "candidate"):
        raise PermissionError(f"{REFUSED}: a {'reference' if reference_runner else 'candidate'} runner builds no {request.role} model")
    if request.role == "candidate":
        return program.new_model(request.seed, reference=program.reference(request.seed))
    if request.role == "null":
        return NullModel(request.specs, state.device)
    model = program.reference(request.seed)
    return torch.compile(model) if request.role == "compiled" else model


@dataclass
class _NoLedger:
    """The reference runner's stand-in for a compile ledger: it builds nothing and calls no
    candidate's kernel (the judge asks for kernel calls only of a candidate's runner)."""

    kernel_calls: int = 0
    hits: int = 0
    misses: int = 0
    compiler: str | None = None


def _load_task(state: WorkerState, request: LoadTask) -> Built:
    """The reference runner's load: the task program alone, never a candidate."""
    if not state.reference_runner:
        raise PermissionError(f"{REFUSED}: a candidate's runner loads no task for the reference")
    key = source_hash(request.source + "\0" + request.dtype)
    if state.loaded_key != key:
        task = import_source(request.source, "task", state.workdir)
        program = Program(task, None, state.device, dtype=getattr(torch, request.dtype))
        apply_tf32_policy(request.allow_tf32)
        state.pinned = audit.snapshot()  # the run's TF32 policy is the harness's setting, not a change
        state.loaded = Loaded(program=program, ledger=_NoLedger(), report=CompileReport(ok=True))  # type: ignore[arg-type]  # builds nothing: no compile ledger
        state.loaded_key = key
    return Built(-1)


def serve(conn: Connection, judge: Connection, state: WorkerState, cpu_seconds_per_job: float, start_seconds: dict[str, float]) -> None:
    conn.send(("ready", start_seconds))
    sources = [conn, judge]
    while True:
        ready = wait(sources)
        if conn not in ready and judge in ready:
            if not _serve_judge(state, judge):
                sources = [conn]  # no judge can reach this runner any more; the parent still may
            continue
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone: so is any reason to live
        if job is None:
            return
        # What the candidate prints goes to this job's log only.
        for fd in (1, 2):
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
        sandbox.limit_cpu_seconds(cpu_seconds_per_job)
        reply = run_job(state, job)
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
    parent's *thread* that started the worker ends, so kernel_refinery.tools.processes.worker starts every worker from one
    long-lived thread.
    """
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)  # the parent died before the signal was armed


def warm_profiler(device: torch.device) -> None:
    """CUPTI starts in seconds the first time a process profiles CUDA: here, while the judge starts,
    rather than in the kernel-share step of the first correctness stage."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
        torch.zeros(16, device=device).add_(1)
        torch.cuda.synchronize(device)


@dataclass
class ProfilerWarmUp:
    """CUPTI's start (seconds) in a thread of its own, begun before any candidate code runs: the
    runner says it is ready at once, and the candidate compiles meanwhile. The first step that
    profiles (the kernel share, the profile) waits for it; a candidate that never gets there (a
    compile error, a wrong output before the share) never waits at all."""

    thread: Any = None
    error: BaseException | None = None

    def start(self, device: torch.device) -> None:
        import threading

        def run() -> None:
            try:
                warm_profiler(device)
            except BaseException as exc:  # noqa: BLE001 - reported when a step needs the profiler
                self.error = exc

        self.thread = threading.Thread(target=run, name="refinery-profiler-warm-up", daemon=True)
        self.thread.start()

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None


PROFILER = ProfilerWarmUp()


def isolate(workdir: Path, cache_dir: Path, reference_runner: bool = False) -> str:
    """Before any candidate code: writes confined, capabilities dropped, settings pinned, audit hook armed.
    The reference runner, which never loads a candidate, may start any program outside the writable
    folders: torch.compile of the reference runs a child interpreter (its CPU vector-ISA probe),
    openssl (its precompiled header's hash) and the like, beside the compilers."""
    writable = [workdir, cache_dir / "extensions", cache_dir / "triton", cache_dir / "inductor", default_pch_dir(), Path("/dev/shm")]
    for folder in writable[1:4]:
        folder.mkdir(parents=True, exist_ok=True)
    confined = confine_writes(writable)
    capabilities = drop_capabilities()
    allowed = None if reference_runner else audit.DEFAULT_COMPILERS
    audit.install_hook(allowed_executables=allowed, writable_dirs=tuple(str(p) for p in writable))
    audit.arm()
    return f"writes: {confined}; capabilities: {capabilities}; audit hook armed"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--judge-fd", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--memory-bytes", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--cpu-seconds-per-job", type=float, default=3600)
    parser.add_argument("--cores", default="", help="comma-separated CPU cores to run on")
    parser.add_argument("--parent-pid", type=int, default=0, help="end when this process ends")
    parser.add_argument("--reference", action="store_true", help="the judge's reference runner: loads tasks, never a candidate")
    args = parser.parse_args()
    steps = StartSteps()
    # torch.compile (the compiled reference, a Triton candidate's helpers) compiles in this process:
    # inductor's pool of Python workers would be a process start that the audit hook refuses. Read
    # when torch._inductor.config is first imported, which is after this.
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    if args.parent_pid:
        die_with_parent(args.parent_pid)
    if args.cores:
        # Before any thread exists: OpenMP and compiler processes inherit it.
        os.sched_setaffinity(0, {int(c) for c in args.cores.split(",")})
    conn = Connection(args.fd)
    judge = Connection(args.judge_fd)
    device = torch.device(args.device)
    sandbox.apply_limits(args.memory_bytes or None, file_bytes=4 << 30)
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        # Event timing of a candidate's kernels must not include cuBLAS/cuDNN autotuning noise.
        torch.backends.cudnn.benchmark = False
        torch.zeros(1, device=device)
        steps.mark("cuda_context")
        if not args.reference:
            PROFILER.start(device)
    cache = CompileCache(Path(args.cache_dir))
    cache.install()
    if device.type == "cuda":
        cache.install_triton_counter()
    workdir = Path.cwd()
    # torch._dynamo wraps nn.Module.__init__ and __setstate__ on its first use (the profiler's
    # warm-up thread may be that use, after the snapshot): the harness's setting, made before it.
    from torch._dynamo.mutation_guard import install_generation_tagging_init

    install_generation_tagging_init()
    pinned = audit.snapshot()
    isolation = isolate(workdir, Path(args.cache_dir), reference_runner=args.reference)
    steps.mark("isolate")
    state = WorkerState(device=device, workdir=workdir, cache=cache, pinned=pinned, isolation=isolation, reference_runner=args.reference)
    serve(conn, judge, state, args.cpu_seconds_per_job, steps.seconds)


if __name__ == "__main__":
    main()
