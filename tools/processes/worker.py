"""The parent's handles on the two processes of an evaluation: the runner (the candidate's
process, one per candidate) and the judge (trusted, one per device, long-lived).

A segfault, a hang, a CUDA fault or a blown memory limit ends the runner, never the caller nor
the judge: the job gets that status, and the next candidate gets a fresh runner. A runner is
never reused for another candidate, so nothing one candidate changed in its process reaches the
next; the judge never loads candidate code, so it is reused, and its CUDA context stays warm.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from multiprocessing.reduction import send_handle
from pathlib import Path

import structlog

from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.config import default_pch_dir
from kernel_refinery.tools.faults import cuda_fault_in
from kernel_refinery.tools.processes import sandbox
from kernel_refinery.tools.processes.forkserver import ForkedChild, ForkServer, ForkServerError
from kernel_refinery.tools.processes.jobs import EvalJob, JobReply, QuietGranted, QuietRelease, QuietReleased, QuietRequest
from kernel_refinery.tools.processes.quiet import BUILDS, RUNNERS, WINDOW_REFUND_S, group_of
from kernel_refinery.tools.processes.startup import started_at

log = structlog.get_logger()

_STARTUP_TIMEOUT_S = 300.0
"""Importing torch took over 2 minutes on a 2-core machine running two llama.cpp servers and a compile."""
_KILLED = "the worker was killed (SIGKILL)"
_WATCH_INTERVAL_S = 0.25


_JUDGE_START_LOCK = threading.Lock()
"""Guards a judge's start-in-progress (Judge.warm, Judge._ready)."""
_STARTERS: dict[str, ThreadPoolExecutor] = {}
_STARTERS_LOCK = threading.Lock()
"""Guards the pools alone: Judge.warm asks for its pool while it holds _JUDGE_START_LOCK (one lock for both deadlocked)."""


def _starter(kind: str) -> ThreadPoolExecutor:
    """Threads that wait for judges ("judge") or spare runners ("spare") to start, beside the
    evaluations (the processes themselves come from the spawner thread or the template)."""
    with _STARTERS_LOCK:
        if kind not in _STARTERS:
            _STARTERS[kind] = ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"{kind}-starter")
        return _STARTERS[kind]


@dataclass(frozen=True)
class _Spawned:
    """A runner process started and not yet adopted: its pipes, folder and log."""

    proc: subprocess.Popen[bytes] | ForkedChild
    conn: Connection
    judge_end: socket.socket
    workdir: Path
    log_path: Path
    spare: bool = False
    waited_s: float = 0.0
    """How long the evaluation waited for the spare to be forked (its start beyond that ran beside the last candidate)."""

    def discard(self) -> None:
        sandbox.kill_tree(self.proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        RUNNERS.remove(self.proc.pid)
        self.conn.close()
        self.judge_end.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


@dataclass
class StageClock:
    """A judged stage's limit, less what is not the candidate's time: the wait for other processes'
    builds before a window, windows with its runner stopped (the reference's, the harness's), and
    windows the judge found unquiet with the pauses after them (other processes' work made it time
    them again). At most WINDOW_REFUND_S is given back in all, so a hang inside a window still ends."""

    deadline: float
    refunded: float = 0.0
    opened: float = 0.0
    """When the open window opened; 0 while none is."""
    holds_runner: bool = False
    unquiet_since: float = 0.0
    """When the last window the judge found unquiet closed, until it asks for the next."""

    def _give_back(self, seconds: float) -> None:
        given = max(0.0, min(seconds, WINDOW_REFUND_S - self.refunded))
        self.deadline += given
        self.refunded += given

    def granted(self, request: QuietRequest, asked: float, now: float) -> None:
        if self.unquiet_since:  # the judge's pause after an unquiet window
            self._give_back(asked - self.unquiet_since)
            self.unquiet_since = 0.0
        self.deadline += now - asked
        self.opened, self.holds_runner = now, request.hold_runner

    def released(self, release: QuietRelease, now: float) -> None:
        if not self.opened:
            return
        if self.holds_runner or not release.quiet:
            self._give_back(now - self.opened)
        self.unquiet_since = 0.0 if release.quiet else now
        self.opened = 0.0

    def passed(self, now: float) -> bool:
        """Past the limit. While a window with the runner stopped is open, its time is not yet spent
        (its close gives it back); a window where the candidate runs is its time until the judge
        finds it unquiet, so a slow or hung candidate ends at the limit as before."""
        pending = min(now - self.opened, WINDOW_REFUND_S - self.refunded) if self.opened and self.holds_runner else 0.0
        return now > self.deadline + pending


class WorkerStartError(RuntimeError):
    """The worker process could not start; this is a broken installation, not a bad kernel."""


class Worker:
    """One evaluation process, pinned to one device."""

    def __init__(
        self,
        device: str = "cpu",
        cache_dir: Path | None = None,
        memory_limit_gb: float = 12.0,
        threads: int | None = None,
        gpu_index: int | None = None,
        env: dict[str, str] | None = None,
        cores: list[int] | None = None,
        reference: bool = False,
    ):
        from kernel_refinery.tools.config import default_cache_dir

        self.device = device
        self.cache_dir = Path(cache_dir or default_cache_dir())
        self.memory_limit_bytes = int(memory_limit_gb * (1 << 30))
        self.threads = threads or max(1, len(os.sched_getaffinity(0)))
        self.gpu_index = gpu_index
        self.extra_env = env or {}
        self.cores = cores
        self.reference = reference
        """The judge's reference runner: never loads a candidate, never stopped for quiet (tools/processes/quiet.py)."""
        self.group = group_of(device, gpu_index)
        self.proc: subprocess.Popen[bytes] | ForkedChild | None = None
        self.conn: Connection | None = None
        self._builds_held: contextlib.ExitStack | None = None
        """While the judge's window is open: the machine's builds held back (quiet.BuildGate)."""
        self.judge_end: socket.socket | None = None
        """The parent's end of the runner's socket to the judge, handed to the judge for each device job."""
        self.candidate_key = ""
        """The candidate this runner was started for ("" before its first job)."""
        self.workdir: Path | None = None
        self.log_path: Path | None = None
        self.starts = 0
        self.retries = 0
        self.last_start_s = 0.0
        self.pid: int | None = None
        self.use_template = os.environ.get("REFINERY_FORK_TEMPLATE", "1") != "0" and not reference
        self.spares = os.environ.get("REFINERY_SPARE_RUNNER", "1") != "0"
        """Start the next candidate's runner while this one's is used (REFINERY_SPARE_RUNNER=0: on demand)."""
        self._spare: Future[_Spawned] | None = None
        """Fork runners from a warm template (tools/processes/forkserver.py); REFINERY_FORK_TEMPLATE=0 starts each one plainly."""
        self._forkserver: ForkServer | None = None
        self._template_error = ""
        self.forked = False
        """Whether the last runner started was a fork of the warm template (else a plain process)."""

    @property
    def template_status(self) -> str:
        """ "started" (runners are forks of the warm template), "off" (REFINERY_FORK_TEMPLATE=0, or
        the judge's reference runner), "not started yet", or "failed: why" (plain processes instead)."""
        if self._template_error:
            return f"failed: {self._template_error}"
        if self._forkserver is not None and self._forkserver.alive:
            return "started"
        return "not started yet" if self.use_template else "off"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _env(self, workdir: Path | None = None) -> dict[str, str]:
        extra = {
            "PYTHONPATH": sandbox.project_pythonpath(),
            "HOME": str(workdir),
            # Compilers' temporary files: the runner may write only under its own folder and the caches.
            "TMPDIR": str(workdir),
            # Found under the real HOME, which the worker does not see: without it no build takes the header.
            "REFINERY_PCH_DIR": str(default_pch_dir()),
            "OMP_NUM_THREADS": str(self.threads),
            # Spinning OpenMP threads of torch's runtime and a candidate's own libgomp starve each
            # other on a small machine; sleeping waits keep both timings honest.
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
            "MAX_JOBS": str(len(self.cores) if self.cores else max(1, len(os.sched_getaffinity(0)))),
            "TORCH_EXTENSIONS_DIR": str(self.cache_dir / "extensions"),
            "TORCHINDUCTOR_CACHE_DIR": str(self.cache_dir / "inductor"),
            "TRITON_CACHE_DIR": str(self.cache_dir / "triton"),
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            **self.extra_env,
        }
        if self.gpu_index is not None:
            extra["CUDA_VISIBLE_DEVICES"] = str(self.gpu_index)
        return sandbox.scrubbed_env(**extra)

    def start(self, _retry: bool = False) -> None:
        """A runner for the next candidate: the spare started while the last one ran, when it is
        alive, else a new one; then the next spare begins in the background."""
        self.close()
        spawned = self._take_spare() or self._spawn()
        self.proc, self.conn, self.judge_end = spawned.proc, spawned.conn, spawned.judge_end
        self.workdir, self.log_path, self.pid = spawned.workdir, spawned.log_path, spawned.proc.pid
        self.forked = isinstance(spawned.proc, ForkedChild)
        self.starts += 1
        started = time.monotonic()
        steps = _ready_steps(self.conn)
        if steps is None:
            detail = sandbox.tail(self.log_path)
            killed = self.proc.poll() == -signal.SIGKILL
            self.close()
            if killed and not _retry:
                # Killed from outside while starting (the OOM killer, an operator, the soak): not a
                # broken installation, so one more start before saying so.
                log.warning("worker_killed_while_starting", pid=self.pid)
                return self.start(_retry=True)
            raise WorkerStartError(f"the evaluation worker did not start; its output:\n{detail}")
        self.last_start_s = time.monotonic() - started + spawned.waited_s
        # `steps`: the runner's own account of its start (its word only: for the log, never for a verdict).
        seconds = round(self.last_start_s, 2)
        log.info(
            "worker_started", pid=self.pid, device=self.device, starts=self.starts, seconds=seconds, runner_steps=steps, spare=spawned.spare
        )
        if self.spares and not self.reference:
            self._spare = _starter("spare").submit(self._spawn, True)

    def _take_spare(self) -> _Spawned | None:
        """The spare runner, once it is up; None when there is none or it died waiting."""
        future, self._spare = self._spare, None
        if future is None:
            return None
        waited = time.monotonic()
        try:
            spawned = future.result()
        except Exception as exc:  # noqa: BLE001 - a spare that could not start is replaced by a plain start, which reports
            log.warning("spare_runner_failed", error=str(exc)[:300])
            return None
        if spawned.proc.poll() is not None:
            spawned.discard()
            return None
        return replace(spawned, waited_s=time.monotonic() - waited)

    def _spawn(self, spare: bool = False) -> _Spawned:
        """A runner process, forked from the warm template where it runs; not yet waited for."""
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix="refinery-worker-"))
        log_path = workdir / "worker.log"
        parent_sock, child_sock = socket.socketpair()
        judge_end, judge_sock = socket.socketpair()
        # The command line as flag and value pairs, one a line.
        # fmt: off
        cmd = [
            sys.executable, "-m", "kernel_refinery.tools.processes.worker_main",
            "--fd", str(child_sock.fileno()),
            "--judge-fd", str(judge_sock.fileno()),
            "--device", "cuda:0" if self.device == "cuda" else "cpu",
            "--cache-dir", str(self.cache_dir),
            "--threads", str(self.threads),
            "--cores", ",".join(map(str, self.cores or [])),
            # The address-space limit only suits CPU workers (see sandbox.apply_limits).
            "--memory-bytes", str(self.memory_limit_bytes + (4 << 30) if self.device == "cpu" else 0),
            "--parent-pid", str(os.getpid()),
            *(["--reference"] if self.reference else []),
        ]
        # fmt: on
        fds = (child_sock.fileno(), judge_sock.fileno())
        env = {**self._env(workdir), **started_at()}
        template = self._template()
        if not self.reference:
            RUNNERS.wait_until_free(self.group)  # no runner starts while the judge times in quiet
        proc: subprocess.Popen[bytes] | ForkedChild
        if template is not None:
            # A fork of the warm template (torch imported, no CUDA, no threads): milliseconds, not seconds.
            cmd[cmd.index("--parent-pid") + 1] = str(template.pid)
            proc = template.spawn(
                "kernel_refinery.tools.processes.worker_main", cmd[3:], cwd=workdir, log_path=log_path, env=env, pass_fds=fds
            )
        else:
            proc = sandbox.popen_logged(cmd, workdir, env, log_path, fds)
        child_sock.close()
        judge_sock.close()
        conn = Connection(os.dup(parent_sock.fileno()))
        parent_sock.close()
        if not self.reference:
            RUNNERS.add(proc.pid, self.group)
        return _Spawned(proc, conn, judge_end, workdir, log_path, spare)

    def _template(self) -> ForkServer | None:
        """The warm template this worker forks its runners from; None (plain processes) where it cannot start."""
        if self.use_template and (self._forkserver is None or not self._forkserver.alive):
            home = Path(tempfile.mkdtemp(prefix="refinery-template-"))
            env = {**self._env(), "HOME": str(home), "TMPDIR": str(home)}
            # torch._dynamo: the first TorchDispatchMode (the op recorder of the first correctness
            # call) imports it, most of a second; imported here, every runner has it already.
            preload = ("torch", "torch._dynamo", "kernel_refinery.tools.processes.worker_main")
            self._forkserver = ForkServer(env=env, cwd=home, preload=preload, log_path=home / "template.log")
            try:
                self._forkserver.start()
                server = self._forkserver
                log.info("template_started", seconds=server.start_seconds, preload_seconds=server.preload_seconds)
            except ForkServerError as exc:
                log.warning("template_failed_plain_processes_instead", error=str(exc)[-500:])
                self._template_error = str(exc)[-500:]
                self._forkserver = None
                self.use_template = False
        return self._forkserver

    def run(self, job: EvalJob, timeout_s: float) -> tuple[JobReply, str]:
        """Run a job; returns the reply and the tail of what the candidate printed.

        A worker killed by a SIGKILL nobody here sent (the OOM killer, or an operator) gets one
        more try in a fresh worker: a candidate that really exhausts memory dies again and is
        reported as OOM, while an outside kill does not change the candidate's verdict.
        """
        reply, printed = self._run_once(job, timeout_s)
        if self.killed_from_outside(reply):
            log.warning("worker_killed_retrying", pid=self.pid)
            self.retries += 1
            reply, printed = self._run_once(job, timeout_s)
        return reply, printed

    def run_judged_with_retry(
        self, judge: Judge, load: EvalJob, judged: EvalJob, timeout_s: float, load_timeout_s: float
    ) -> tuple[JobReply, str]:
        """The device stages; a runner killed from outside during them (not by its candidate), or a
        judge or reference runner that died, gets a fresh runner (and judge), which loads the
        candidate again, up to twice: a candidate that really exhausts memory dies each time and is
        reported as OOM."""
        reply, printed = self.run_judged(judge, judged, timeout_s)
        for _ in range(2):
            if not self.killed_from_outside(reply) and not self.harness_fault(reply):
                break
            log.warning("worker_killed_retrying", pid=self.pid, harness=self.harness_fault(reply))
            self.retries += 1
            if self.harness_fault(reply):
                self.close()  # its link to the judge ended with that judge
            reply, printed = self.run(load, load_timeout_s)
            if reply.failure is None:
                reply, printed = self.run_judged(judge, judged, timeout_s)
        return reply, printed

    @staticmethod
    def harness_fault(reply: JobReply) -> bool:
        """The judge or its reference runner died (a kill from outside, never the candidate's doing:
        it cannot reach them): the evaluation is the harness's to repeat, not a turn lost."""
        return reply.judge_broken or reply.message.startswith("the judge process died")

    @staticmethod
    def killed_from_outside(reply: JobReply) -> bool:
        """Ended by a SIGKILL nobody here sent (the OOM killer, an operator): worth one more try."""
        return reply.failure is EvalStatus.OOM and reply.message.startswith(_KILLED)

    def for_candidate(self, key: str) -> None:
        """A fresh runner when this one was started for another candidate (or has died)."""
        if self.candidate_key != key:
            self.close()
            self.candidate_key = key

    def _run_once(self, job: EvalJob, timeout_s: float) -> tuple[JobReply, str]:
        if not self.alive:
            self.start()
        assert self.conn is not None and self.proc is not None and self.log_path is not None
        try:
            self.conn.send(job)
        except (BrokenPipeError, OSError):
            self.start()
            self.conn.send(job)
        return self._watch(self.conn, time.monotonic() + timeout_s, timeout_s)

    def run_judged(self, judge: Judge, job: EvalJob, timeout_s: float) -> tuple[JobReply, str]:
        """The device stages: the judge drives this runner; this process watches the runner's
        time, memory and life, and the judge's life."""
        if not self.alive or self.judge_end is None:
            return JobReply(failure=EvalStatus.RUNTIME_ERROR, message="the candidate is not loaded: run its compile stage first"), ""
        conn = judge.submit(job, self.judge_end, self.pid)
        return self._watch(conn, time.monotonic() + timeout_s, timeout_s, judge=judge)

    def _watch(self, conn: Connection, deadline: float, timeout_s: float, judge: Judge | None = None) -> tuple[JobReply, str]:
        """Until the reply: the runner's life, memory and time watched here, and the judge's asks
        for quiet answered (every other runner stopped while it times; tools/processes/quiet.py)."""
        assert self.proc is not None and self.log_path is not None
        holding = False
        clock = StageClock(deadline)
        try:
            while True:
                if conn.poll(_WATCH_INTERVAL_S):
                    reply = _recv_or_none(conn)
                    if isinstance(reply, (QuietRequest, QuietRelease)):
                        asked = time.monotonic()
                        holding = self._quiet(conn, reply)
                        if isinstance(reply, QuietRequest):
                            clock.granted(reply, asked, time.monotonic())
                        else:
                            clock.released(reply, time.monotonic())
                        continue
                    if judge is not None and not isinstance(reply, JobReply):
                        judge.kill(reason="died")
                        return JobReply(failure=EvalStatus.RUNTIME_ERROR, message=f"the judge process died: {judge.log_tail()}"), ""
                    if isinstance(reply, JobReply) and reply.judge_broken and judge is not None:
                        judge.kill(reason="its reference runner ended")
                    if isinstance(reply, JobReply) and not reply.runner_gone:
                        printed = sandbox.tail(self.log_path) if reply.failure else ""
                        if reply.fatal:
                            self.kill(reason="fatal")
                        return reply, printed
                    printed = sandbox.tail(self.log_path)
                    return self._died(printed), printed
                if not self.alive:
                    printed = sandbox.tail(self.log_path)
                    if judge is not None:
                        judge.drain(conn)
                    return self._died(printed), printed
                if sandbox.tree_rss_bytes(self.proc.pid) > self.memory_limit_bytes:
                    printed = sandbox.tail(self.log_path)
                    self.kill(reason="memory")
                    if judge is not None:
                        judge.drain(conn)
                    gb = self.memory_limit_bytes / (1 << 30)
                    return JobReply(failure=EvalStatus.OOM, message=f"the candidate used more than {gb:.1f} GB of host memory"), printed
                if clock.passed(time.monotonic()):
                    printed = sandbox.tail(self.log_path)
                    self.kill(reason="timeout")
                    if judge is not None:
                        judge.drain(conn)
                    return JobReply(
                        failure=EvalStatus.TIMEOUT, message=f"no result within {timeout_s:.0f} s; the worker was killed"
                    ), printed
        finally:
            if holding:
                self._end_quiet()

    def _quiet(self, conn: Connection, request: object) -> bool:
        """Answer the judge's ask on its connection; True while other runners are held. A window
        opens once no build runs on the machine, and none starts until it ends (quiet.BuildGate)."""
        if isinstance(request, QuietRequest):
            assert self.pid is not None
            self._builds_held = BUILDS.hold()
            held = RUNNERS.freeze(self.group, keep=None if request.hold_runner else self.pid)
            conn.send(QuietGranted(held=held, runner=self.pid))
            return True
        self._end_quiet()
        conn.send(QuietReleased())
        return False

    def _end_quiet(self) -> None:
        RUNNERS.thaw(self.group)
        if self._builds_held is not None:
            self._builds_held.close()
            self._builds_held = None

    def _died(self, printed: str = "") -> JobReply:
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        self.kill(reason="died")
        if code is not None and code < 0:
            sig = signal.Signals(-code)
            if sig is signal.SIGXCPU:
                return JobReply(failure=EvalStatus.TIMEOUT, message="the candidate exceeded its CPU-time limit")
            if sig is signal.SIGKILL:
                # Nobody here sent it: the kernel's OOM killer is the usual sender.
                return JobReply(failure=EvalStatus.OOM, message=f"{_KILLED}, most likely out of memory")
            if sig is signal.SIGXFSZ:
                return JobReply(failure=EvalStatus.RUNTIME_ERROR, message="the candidate wrote more output than allowed")
            return JobReply(
                failure=EvalStatus.RUNTIME_ERROR, message=f"the worker crashed with {sig.name} (e.g. a segmentation fault in the kernel)"
            )
        fault = cuda_fault_in(printed)
        if fault:
            # The CUDA runtime can end the process itself after a fault (exit code 1, no exception
            # reaching the worker's handler); its last words name the fault.
            return JobReply(failure=EvalStatus.CUDA_FAULT, message=f"the worker died after a CUDA fault (exit code {code}): {fault}")
        return JobReply(failure=EvalStatus.RUNTIME_ERROR, message=f"the worker exited unexpectedly with code {code}")

    def kill(self, reason: str) -> None:
        if self.proc is not None:
            sandbox.kill_tree(self.proc.pid)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.warning("worker_unreaped", pid=self.proc.pid)
            log.info("worker_replaced", pid=self.proc.pid, reason=reason)
        self._cleanup()

    def _cleanup(self) -> None:
        if self.pid is not None and not self.reference:
            RUNNERS.remove(self.pid)
        if self.conn is not None:
            self.conn.close()
        self.conn = None
        if self.judge_end is not None:
            self.judge_end.close()
        self.judge_end = None
        self.proc = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir = None

    def close(self) -> None:
        """End the runner (the template stays, for the next candidate's)."""
        # A worker holds nothing worth a graceful exit, and tearing down a CUDA context that
        # cached many GB takes seconds: end it at once.
        if self.proc is not None:
            sandbox.kill_tree(self.proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        self._cleanup()

    def shutdown(self) -> None:
        """End the runner, the spare and the template."""
        self.close()
        spare = self._take_spare()
        if spare is not None:
            spare.discard()
        if self._forkserver is not None:
            self._forkserver.close()
            self._forkserver = None


def _ready_steps(conn: Connection) -> dict[str, float] | None:
    """The start-up steps a child's `("ready", steps)` message reports, or None when none came in time."""
    ready = _recv_or_none(conn) if conn.poll(_STARTUP_TIMEOUT_S) else None
    if not (isinstance(ready, tuple) and len(ready) == 2 and ready[0] == "ready"):
        return None
    return ready[1] if isinstance(ready[1], dict) else {}


def _recv_or_none(conn: Connection) -> object:
    try:
        return conn.recv()
    except (EOFError, OSError):
        return None


class Judge:
    """The trusted process of one device (tools/processes/judge.py): started once, reused for every candidate."""

    def __init__(
        self,
        device: str = "cpu",
        threads: int | None = None,
        gpu_index: int | None = None,
        cores: list[int] | None = None,
        cache_dir: Path | None = None,
    ):
        self.device = device
        self.reference = Worker(device=device, cache_dir=cache_dir, threads=threads, gpu_index=gpu_index, cores=cores, reference=True)
        """The judge's reference runner: the same runner program, which never loads a candidate;
        the judge times the reference through it, by the same path as the candidate."""
        self.threads = threads or max(1, len(os.sched_getaffinity(0)))
        self.gpu_index = gpu_index
        self.cores = cores
        self.proc: subprocess.Popen[bytes] | None = None
        self.conn: Connection | None = None
        self.workdir: Path | None = None
        self.log_path: Path | None = None
        self.starts = 0
        self.lock = threading.Lock()
        self._starting: Future[None] | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def warm(self) -> None:
        """Start the process in the background (importing torch takes seconds), so that it is
        ready when the candidate's runner has loaded and compiled the candidate."""
        with _JUDGE_START_LOCK:
            if self._starting is None and not self.alive:
                self._starting = _starter("judge").submit(self.start)

    def _ready(self) -> None:
        with _JUDGE_START_LOCK:
            starting, self._starting = self._starting, None
        if starting is not None:
            starting.result()

    def start(self) -> None:
        self._stop()
        self.workdir = Path(tempfile.mkdtemp(prefix="refinery-judge-"))
        self.log_path = self.workdir / "judge.log"
        parent_sock, child_sock = socket.socketpair()
        cmd = [
            sys.executable,
            "-m",
            "kernel_refinery.tools.processes.judge",
            "--fd",
            str(child_sock.fileno()),
            "--device",
            "cuda:0" if self.device == "cuda" else "cpu",
            "--threads",
            str(self.threads),
            "--cores",
            ",".join(map(str, self.cores or [])),
            "--parent-pid",
            str(os.getpid()),
        ]
        env = {
            "PYTHONPATH": sandbox.project_pythonpath(),
            "HOME": str(self.workdir),
            "OMP_NUM_THREADS": str(self.threads),
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        if self.gpu_index is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(self.gpu_index)
        env.update(started_at())
        self.proc = sandbox.popen_logged(cmd, self.workdir, sandbox.scrubbed_env(**env), self.log_path, (child_sock.fileno(),))
        child_sock.close()
        self.conn = Connection(os.dup(parent_sock.fileno()))
        parent_sock.close()
        self.starts += 1
        self.reference.start()  # while the judge imports and warms up
        steps = _ready_steps(self.conn)
        if steps is None:
            detail = self.log_tail()
            self._stop()
            raise WorkerStartError(f"the judge process did not start; its output:\n{detail}")
        assert self.reference.judge_end is not None and self.reference.pid is not None
        self.conn.send(("reference", self.reference.pid))
        send_handle(self.conn, self.reference.judge_end.fileno(), self.proc.pid)
        log.info("judge_started", pid=self.proc.pid, device=self.device, seconds=steps, reference_runner=self.reference.pid)

    def submit(self, job: EvalJob, runner_end: socket.socket, runner_pid: int | None = None) -> Connection:
        """Send a job, the runner's pid and its socket; the reply comes on the returned connection."""
        self._ready()
        if not self.alive:
            self.start()
        assert self.conn is not None and self.proc is not None
        self.conn.send(("job", job, runner_pid))
        send_handle(self.conn, runner_end.fileno(), self.proc.pid)
        return self.conn

    def drain(self, conn: Connection, timeout_s: float = 30.0) -> None:
        """After the runner was killed: the judge notices and replies; read that reply away (or restart it).
        An ask for quiet on the way is granted with nothing held, so that the judge gets to its reply."""
        deadline = time.monotonic() + timeout_s
        while conn.poll(max(0.0, deadline - time.monotonic())):
            message = _recv_or_none(conn)
            if isinstance(message, QuietRequest):
                conn.send(QuietGranted(held=(), runner=0))
            elif isinstance(message, QuietRelease):
                conn.send(QuietReleased())
            elif isinstance(message, JobReply):
                return
            else:
                break
        self.kill(reason="no reply after the runner ended")

    def log_tail(self) -> str:
        return sandbox.tail(self.log_path) if self.log_path is not None else ""

    def kill(self, reason: str) -> None:
        log.warning("judge_replaced", reason=reason, pid=self.proc.pid if self.proc else None)
        self._stop()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._ready()
        self._stop()

    def _stop(self) -> None:
        if self.proc is not None:
            sandbox.kill_tree(self.proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        self.reference.shutdown()
        if self.conn is not None:
            self.conn.close()
        self.proc = None
        self.conn = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir = None
