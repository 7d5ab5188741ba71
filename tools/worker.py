"""The parent's handle on one worker process: start, send a job, watch it, replace it.

A segfault, a hang, a CUDA fault or a blown memory limit ends the worker, never the caller:
the job gets that status, and the next job starts a fresh worker. Healthy workers are reused,
so the cost of importing torch is paid once.
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
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path

import structlog

from tools import sandbox
from tools.config import default_pch_dir
from tools.faults import cuda_fault_in
from tools.jobs import EvalJob, JobReply
from tools.results import EvalStatus

log = structlog.get_logger()

_STARTUP_TIMEOUT_S = 300.0
"""Importing torch took over 2 minutes on a 2-core machine running two llama.cpp servers and a compile."""
_KILLED = "the worker was killed (SIGKILL)"
_WATCH_INTERVAL_S = 0.25


_SPAWNER: ThreadPoolExecutor | None = None
_SPAWNER_LOCK = threading.Lock()


def _spawner() -> ThreadPoolExecutor:
    """One thread that starts every worker of this process and lives as long as it does."""
    global _SPAWNER
    with _SPAWNER_LOCK:
        if _SPAWNER is None:
            _SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="worker-spawner")
        return _SPAWNER


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
    ):
        from tools.config import default_cache_dir

        self.device = device
        self.cache_dir = Path(cache_dir or default_cache_dir())
        self.memory_limit_bytes = int(memory_limit_gb * (1 << 30))
        self.threads = threads or max(1, len(os.sched_getaffinity(0)))
        self.gpu_index = gpu_index
        self.extra_env = env or {}
        self.cores = cores
        self.proc: subprocess.Popen[bytes] | None = None
        self.conn: Connection | None = None
        self.workdir: Path | None = None
        self.log_path: Path | None = None
        self.starts = 0
        self.retries = 0
        self.last_start_s = 0.0
        self.pid: int | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _env(self) -> dict[str, str]:
        extra = {
            "PYTHONPATH": sandbox.project_pythonpath(),
            "HOME": str(self.workdir),
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
        self.close()
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.workdir = Path(tempfile.mkdtemp(prefix="refinery-worker-"))
        self.log_path = self.workdir / "worker.log"
        parent_sock, child_sock = socket.socketpair()
        # The command line as flag and value pairs, one a line.
        # fmt: off
        cmd = [
            sys.executable, "-m", "tools.worker_main",
            "--fd", str(child_sock.fileno()),
            "--device", "cuda:0" if self.device == "cuda" else "cpu",
            "--cache-dir", str(self.cache_dir),
            "--threads", str(self.threads),
            "--cores", ",".join(map(str, self.cores or [])),
            # The address-space limit only suits CPU workers (see sandbox.apply_limits).
            "--memory-bytes", str(self.memory_limit_bytes + (4 << 30) if self.device == "cpu" else 0),
            "--parent-pid", str(os.getpid()),
        ]
        # fmt: on
        with open(self.log_path, "wb") as out:
            # From the long-lived spawner thread: the worker dies with this process (see
            # worker_main.die_with_parent), not with whichever thread happened to start it.
            self.proc = (
                _spawner()
                .submit(
                    subprocess.Popen,
                    cmd,
                    cwd=self.workdir,
                    env=self._env(),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    pass_fds=(child_sock.fileno(),),
                    start_new_session=True,
                )
                .result()
            )
        child_sock.close()
        self.conn = Connection(os.dup(parent_sock.fileno()))
        parent_sock.close()
        self.pid = self.proc.pid
        self.starts += 1
        started = time.monotonic()
        if not self.conn.poll(_STARTUP_TIMEOUT_S) or self._recv_or_none() != "ready":
            detail = sandbox.tail(self.log_path)
            killed = self.proc.poll() == -signal.SIGKILL
            self.close()
            if killed and not _retry:
                # Killed from outside while starting (the OOM killer, an operator, the soak): not a
                # broken installation, so one more start before saying so.
                log.warning("worker_killed_while_starting", pid=self.pid)
                return self.start(_retry=True)
            raise WorkerStartError(f"the evaluation worker did not start; its output:\n{detail}")
        self.last_start_s = time.monotonic() - started
        log.info("worker_started", pid=self.pid, device=self.device, starts=self.starts, seconds=round(self.last_start_s, 2))

    def _recv_or_none(self) -> object:
        assert self.conn is not None
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            return None

    def run(self, job: EvalJob, timeout_s: float) -> tuple[JobReply, str]:
        """Run a job; returns the reply and the tail of what the candidate printed.

        A worker killed by a SIGKILL nobody here sent (the OOM killer, or an operator) gets one
        more try in a fresh worker: a candidate that really exhausts memory dies again and is
        reported as OOM, while an outside kill does not change the candidate's verdict.
        """
        reply, printed = self._run_once(job, timeout_s)
        if reply.failure is EvalStatus.OOM and reply.message.startswith(_KILLED):
            log.warning("worker_killed_retrying", pid=self.pid)
            self.retries += 1
            reply, printed = self._run_once(job, timeout_s)
        return reply, printed

    def _run_once(self, job: EvalJob, timeout_s: float) -> tuple[JobReply, str]:
        if not self.alive:
            self.start()
        assert self.conn is not None and self.proc is not None and self.log_path is not None
        try:
            self.conn.send(job)
        except (BrokenPipeError, OSError):
            self.start()
            self.conn.send(job)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.conn.poll(_WATCH_INTERVAL_S):
                reply = self._recv_or_none()
                if isinstance(reply, JobReply):
                    printed = sandbox.tail(self.log_path) if reply.failure else ""
                    if reply.fatal:
                        self.kill(reason="fatal")
                    return reply, printed
                printed = sandbox.tail(self.log_path)
                return self._died(printed), printed
            if not self.alive:
                printed = sandbox.tail(self.log_path)
                return self._died(printed), printed
            if sandbox.tree_rss_bytes(self.proc.pid) > self.memory_limit_bytes:
                printed = sandbox.tail(self.log_path)
                self.kill(reason="memory")
                gb = self.memory_limit_bytes / (1 << 30)
                return JobReply(failure=EvalStatus.OOM, message=f"the candidate used more than {gb:.1f} GB of host memory"), printed
            if time.monotonic() > deadline:
                printed = sandbox.tail(self.log_path)
                self.kill(reason="timeout")
                return JobReply(failure=EvalStatus.TIMEOUT, message=f"no result within {timeout_s:.0f} s; the worker was killed"), printed

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
        if self.conn is not None:
            self.conn.close()
        self.conn = None
        self.proc = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir = None

    def close(self) -> None:
        # A worker holds nothing worth a graceful exit, and tearing down a CUDA context that
        # cached many GB takes seconds: end it at once.
        if self.proc is not None:
            sandbox.kill_tree(self.proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        self._cleanup()
