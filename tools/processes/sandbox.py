"""The environment and limits an untrusted candidate runs under."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import signal
import subprocess
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

import kernel_refinery

# Variables a worker needs to build and run kernels; everything else is dropped.
_KEEP = re.compile(
    r"^(PATH|LANG|LC_[A-Z]+|TZ|TMPDIR|TERM|USER|LOGNAME|SHELL|PYTHONPATH|PYTHONHASHSEED|VIRTUAL_ENV"
    r"|CC|CXX|CUDA_[A-Z_]+|CUDACXX|NVCC_[A-Z_]+|LD_LIBRARY_PATH|LIBRARY_PATH|CPATH|C_INCLUDE_PATH"
    r"|CPLUS_INCLUDE_PATH|TORCH_CUDA_ARCH_LIST|TORCH_[A-Z_]+|MAX_JOBS|NVIDIA_[A-Z_]+|TRITON_[A-Z_]+"
    r"|OPENBLAS_[A-Z_]+|MKL_[A-Z_]+|OMP_[A-Z_]+|KMP_[A-Z_]+|PYTORCH_[A-Z_]+|NCCL_[A-Z_]+)$"
)
# Even an allowed name is dropped when it looks like a credential.
_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.IGNORECASE)


PROJECT_ROOT = str(Path(kernel_refinery.__file__).parent.parent)
"""The folder that holds the kernel_refinery package: the repository in a checkout, site-packages in a wheel."""


def project_pythonpath() -> str:
    """The project's root first, then whatever PYTHONPATH the parent had: where its packages come
    from a PYTHONPATH (a carried site folder on the GPU machine), a child that dropped it could
    not import them."""
    return os.pathsep.join(p for p in (PROJECT_ROOT, os.environ.get("PYTHONPATH", "")) if p)


def scrubbed_env(base: dict[str, str] | None = None, /, **extra: str) -> dict[str, str]:
    """The parent's environment, less anything a candidate must not read."""
    source = dict(os.environ if base is None else base)
    env = {k: v for k, v in source.items() if _KEEP.match(k) and not _SECRET.search(k)}
    env.update(extra)
    return env


def apply_limits(memory_bytes: int | None, file_bytes: int) -> None:
    """Called in the worker before it runs anything of the candidate's.

    The memory limit is only set for CPU workers, and on the data segment (private writable
    memory: the heap, anonymous maps, thread stacks), not the address space: a CUDA build of torch
    maps gigabytes of libraries and reservations it never writes, and failed every allocation
    under a 16 GiB address-space limit on a GPU host. CUDA workers rely on the parent's RSS watchdog.
    """
    if memory_bytes is not None:
        resource.setrlimit(resource.RLIMIT_DATA, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def limit_cpu_seconds(seconds: float) -> None:
    """Let the worker use `seconds` more CPU time from now; SIGXCPU ends it past that."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    spent = used.ru_utime + used.ru_stime
    soft = int(spent + seconds) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def kill_tree(pid: int) -> None:
    """SIGKILL the worker's whole process group and any child that left it."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += proc.memory_info().rss
    return total


def tail(path: Path, limit: int = 4000) -> str:
    """The last `limit` characters of a log file, for error messages."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            text = fh.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""
    return ("…" + text) if size > limit else text


_SPAWNER: ThreadPoolExecutor | None = None
_SPAWNER_LOCK = threading.Lock()


def _spawner() -> ThreadPoolExecutor:
    """One thread that starts every child of this process and lives as long as it does."""
    global _SPAWNER
    with _SPAWNER_LOCK:
        if _SPAWNER is None:
            _SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="refinery-spawner")
        return _SPAWNER


def popen_logged(cmd: Sequence[str], cwd: Path, env: dict[str, str], log_path: Path, pass_fds: Sequence[int]) -> subprocess.Popen[bytes]:
    """A child in its own session (so kill_tree ends it and its compilers), reading nothing, its
    output in `log_path`. Started from one long-lived thread: a child that arms PR_SET_PDEATHSIG
    dies with this process, not with whichever thread happened to start it (the kernel sends the
    signal when the starting *thread* ends)."""
    with open(log_path, "wb") as out:
        return (
            _spawner()
            .submit(
                subprocess.Popen,
                list(cmd),
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=tuple(pass_fds),
                start_new_session=True,
            )
            .result()
        )
