"""Fresh candidate processes in milliseconds, forked from a warm template.

`ForkServer.start()` starts a template process with exactly the environment it is given, which
imports torch (the `preload` modules) and then waits. `ForkServer.spawn()` asks it over a control
socket for a child that runs a module as `python -m module *argv` would, in its own process group,
directory, log and environment, with the caller's file descriptors at the caller's numbers. The
template reaps its children and reports their exit statuses, so `ForkedChild.poll()` and
`ForkedChild.wait()` answer as `subprocess.Popen`'s do (exit code, or -signal).

Measured on this 2-core machine (`python -m kernel_refinery.tools.processes.forkserver`: median of 10, load about 1.5 from
other work): `spawn` until the child's first message on a passed socket, the child importing
torch (already imported in the template), ~13 ms (min 12 ms); `subprocess.Popen([sys.executable,
"-c", "import torch; <send>"])` to the same message ~0.83-1.07 s (min 0.80 s), torch's files
in the page cache: 60-80 times longer, and seconds on a loaded or cold machine. kernel_refinery.tools.processes.worker_main
in a forked child said "ready" 0.14 s after `spawn` (its own imports beyond torch).

What the template must never do, and does not:
- run candidate code: only the children do, and they cannot reach its control socket (closed in
  every child) nor its memory (it is not dumpable: same-user processes cannot ptrace it or read
  /proc/<pid>/mem, so a child cannot poison later children);
- start a thread or initialise CUDA before forking: a forked copy of a running thread pool
  (OpenMP's, CUDA's) hangs or crashes the child. Importing torch initialises no CUDA, but it
  imports numpy, whose OpenBLAS starts its thread pool at load. OpenBLAS stops that pool before
  any fork (pthread_atfork), so the template forks once, throwaway, right after the preloads,
  then checks it runs one thread and refuses to start otherwise.

What a child shares with the template rather than getting fresh: whatever was decided at the
interpreter's start or at a preloaded library's load, from the template's environment and not
the child's: sys.path from PYTHONPATH, the hash seed (PYTHONHASHSEED), OpenMP's and MKL's
settings. So a child's `env` should be the template's, differing only in what is read later
(OMP_NUM_THREADS is applied to torch in the child; PYTHONUNBUFFERED to its stdout and stderr).
/proc/<child>/environ shows the template's environment: a process's starting environment, which
a fork inherits; os.environ in the child is exactly `env`.

Parent death: the template dies with the process that started it (PR_SET_PDEATHSIG, armed from
a long-lived thread, as kernel_refinery.tools.processes.worker starts its workers), and every child dies with the template.
A child's own subprocesses (compilers) are in its process group: `kernel_refinery.tools.processes.sandbox.kill_tree(pid)`.
A child's parent is the template, not the caller: a `--parent-pid` for kernel_refinery.tools.processes.worker_main must be
`ForkServer.pid`. Children still running when the template dies are reported as -9 (SIGKILL).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, Self

from kernel_refinery.tools.processes.sandbox import PROJECT_ROOT, popen_logged

_STARTUP_TIMEOUT_S = 300.0
"""Importing torch took over 2 minutes on a 2-core machine under load (see kernel_refinery.tools.processes.worker)."""
_SPAWN_TIMEOUT_S = 120.0
_CHILD_SETUP_TIMEOUT_S = 60.0
_MAX_MESSAGE = 1 << 18
_MAX_FDS = 64
_SETUP_FAILED = 127
"""A child's exit code when it could not be set up (bad cwd, unwritable log); spawn raises then."""

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_SET_NAME = 15

_BOOT = "import sys; sys.path.append(sys.argv[1]); from kernel_refinery.tools.processes.forkserver import _boot; _boot()"


class ForkServerError(RuntimeError):
    """The template could not start, died, or could not fork a child."""


def _prctl(option: int, value: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}, {value}): {os.strerror(err)}")


def _set_name(name: str) -> None:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, ctypes.c_char_p(name[:15].encode()), 0, 0, 0)


def _die_with(parent_pid: int) -> None:
    """SIGKILL this process when `parent_pid` (its parent) ends; as kernel_refinery.tools.processes.worker_main.die_with_parent."""
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != parent_pid:
        os._exit(1)  # the parent died before the signal was armed


def _tail(path: Path, limit: int = 4000) -> str:
    from kernel_refinery.tools.processes.sandbox import tail

    return tail(path, limit)


class ForkedChild:
    """A process forked by the template; duck-types the parts of subprocess.Popen that kernel_refinery.tools.processes.worker uses."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._done = threading.Event()

    def _exited(self, returncode: int) -> None:
        if self.returncode is None:
            self.returncode = returncode
        self._done.set()

    def poll(self) -> int | None:
        """None while it runs; else its exit code, or -signal (-11 for SIGSEGV, -9 for SIGKILL)."""
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def __repr__(self) -> str:
        return f"ForkedChild(pid={self.pid}, returncode={self.returncode})"


class ForkServer:
    """A template process that has imported `preload` modules (torch) but initialised no CUDA and
    started no threads; forks a child per request."""

    def __init__(self, env: dict[str, str], cwd: Path, preload: Sequence[str] = ("torch",), log_path: Path | None = None) -> None:
        self.env = dict(env)
        self.cwd = Path(cwd)
        self.preload = tuple(preload)
        self.log_path = log_path
        self._own_log: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._reader: threading.Thread | None = None
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._replies: dict[int, tuple[Any, ...]] = {}
        self._children: dict[int, ForkedChild] = {}
        self._ids = itertools.count(1)
        self._ready: dict[str, Any] | None = None
        self.start_seconds: float | None = None
        """How long the last start took, and of that the preloads' imports (for the caller's log)."""
        self.preload_seconds: float | None = None
        self._dead = True
        self._death = ""

    # -- the parent's side ---------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return not self._dead and self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The template's pid (the children's parent), or None before start()."""
        return self._proc.pid if self._proc is not None else None

    def _template_log(self) -> Path:
        if self.log_path is not None:
            return Path(self.log_path)
        if self._own_log is None:
            fd, name = tempfile.mkstemp(prefix="refinery-forkserver-", suffix=".log")
            os.close(fd)
            self._own_log = Path(name)
        return self._own_log

    def start(self) -> None:
        """Start the template and wait until its preloads are imported (restarts a dead one)."""
        self.close()
        began = time.monotonic()
        log_path = self._template_log()
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cmd = [sys.executable, "-c", _BOOT, PROJECT_ROOT, str(child_sock.fileno()), str(os.getpid()), *self.preload]
        try:
            self._proc = popen_logged(cmd, self.cwd, self.env, log_path, (child_sock.fileno(),))
        except BaseException:
            parent_sock.close()
            raise
        finally:
            child_sock.close()
        self._sock = parent_sock
        self._dead = False
        self._death = ""
        self._reader = threading.Thread(target=self._read, args=(parent_sock, self._proc), name="forkserver-reader", daemon=True)
        self._reader.start()
        with self._cond:
            self._cond.wait_for(lambda: self._ready is not None or self._dead, _STARTUP_TIMEOUT_S)
            ready = self._ready
        if ready is None or "error" in ready:
            why = ready["error"] if ready else ("it died" if self._dead else f"no answer within {_STARTUP_TIMEOUT_S:.0f} s")
            output = _tail(log_path)
            self.close()
            raise ForkServerError(f"the fork server's template did not start ({why}); its output:\n{output}")
        self.start_seconds = round(time.monotonic() - began, 2)
        self.preload_seconds = ready.get("preload_s")

    def _read(self, sock: socket.socket, proc: subprocess.Popen[bytes]) -> None:
        """The reader thread: exit statuses and spawn replies, until the template's socket closes."""
        while True:
            try:
                data = sock.recv(_MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                break
            msg = pickle.loads(data)
            with self._cond:
                if msg[0] == "exit":
                    child = self._children.pop(msg[1], None)
                    if child is not None:
                        child._exited(msg[2])
                elif msg[0] == "ready":
                    self._ready = msg[1]
                elif msg[0] == "spawned":
                    # Registered here, in the order the template sent them: its report of this
                    # child's exit comes later on the same socket.
                    _, request, pid, args = msg
                    self._children[pid] = child = ForkedChild(pid, args)
                    self._replies[request] = ("spawned", request, child)
                else:
                    self._replies[msg[1]] = msg
                self._cond.notify_all()
        if sock is not self._sock:
            return  # a closed template's reader
        code: int | None
        try:
            code = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        with self._cond:
            if sock is not self._sock:
                return  # closed meanwhile, and perhaps started again
            self._dead = True
            self._death = f"the fork server's template (pid {proc.pid}) ended with status {code}"
            self._orphan_children()
            self._cond.notify_all()

    def _orphan_children(self) -> None:
        """Children whose exit the template can no longer report: they got SIGKILL with it (PR_SET_PDEATHSIG)."""
        for child in self._children.values():
            child._exited(-signal.SIGKILL)
        self._children.clear()

    def spawn(
        self, module: str, argv: Sequence[str], *, cwd: Path, log_path: Path, env: dict[str, str], pass_fds: Sequence[int] = ()
    ) -> ForkedChild:
        """Fork a child that runs `python -m module *argv`; see the module docstring."""
        fds = [int(fd) for fd in pass_fds]
        if any(fd <= 2 for fd in fds) or len(set(fds)) != len(fds) or len(fds) > _MAX_FDS:
            raise ValueError(f"pass_fds must be distinct descriptors above 2, at most {_MAX_FDS}: {fds}")
        args = [module, *map(str, argv)]
        request = next(self._ids)
        message = {
            "id": request,
            "module": module,
            "argv": args[1:],
            "cwd": str(Path(cwd).absolute()),
            "log_path": str(Path(log_path).absolute()),
            "env": {str(k): str(v) for k, v in env.items()},
            "fds": fds,
        }
        data = pickle.dumps(message)
        if len(data) >= _MAX_MESSAGE:
            raise ValueError(f"the spawn request is too large ({len(data)} bytes)")
        if not self.alive or self._sock is None:
            raise ForkServerError(self._dead_message())
        try:
            with self._send_lock:
                socket.send_fds(self._sock, [data], fds)
        except OSError as exc:
            if exc.errno == errno.EMSGSIZE:
                raise ValueError(f"the spawn request is too large ({len(data)} bytes)") from exc
            raise ForkServerError(self._dead_message()) from exc
        with self._cond:
            self._cond.wait_for(lambda: request in self._replies or self._dead, _SPAWN_TIMEOUT_S)
            reply = self._replies.pop(request, None)
        if reply is None:
            if not self._dead:
                self.close()  # a template that answers nothing is of no more use
                raise ForkServerError(f"the fork server's template answered no spawn request within {_SPAWN_TIMEOUT_S:.0f} s")
            raise ForkServerError(self._dead_message())
        if reply[0] == "spawned":
            child = reply[2]
            assert isinstance(child, ForkedChild)
            return child
        _, _, kind, err, text = reply
        if kind == "oserror":
            raise OSError(err, text)
        raise ForkServerError(f"could not start {module} in a forked child: {text}")

    def _dead_message(self) -> str:
        what = self._death
        if not what and self._proc is not None and self._proc.poll() is not None:
            what = f"the fork server's template (pid {self._proc.pid}) ended with status {self._proc.returncode}"
        what = what or "the fork server is not running"
        log = self.log_path or self._own_log
        tail = _tail(Path(log)) if log is not None else ""
        return f"{what}; start() it again" + (f"; its output:\n{tail}" if tail else "")

    def close(self) -> None:
        """Kill every child still running, then the template."""
        from kernel_refinery.tools.processes.sandbox import kill_tree

        proc, sock = self._proc, self._sock
        if proc is None:
            self._remove_own_log()
            return
        with self._cond:
            children = list(self._children.values())
        for child in children:
            kill_tree(child.pid)
        deadline = time.monotonic() + 2.0
        for child in children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=max(0.0, deadline - time.monotonic()))
        with self._cond:
            self._sock = None
            self._dead = True
            self._death = self._death or "the fork server was closed"
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(timeout=5)
        with self._cond:
            self._orphan_children()
            self._replies.clear()
        self._proc = None
        self._reader = None
        self._ready = None
        self._remove_own_log()

    def _remove_own_log(self) -> None:
        if self._own_log is not None:
            with contextlib.suppress(OSError):
                self._own_log.unlink()
            self._own_log = None

    def __enter__(self) -> Self:
        if not self.alive:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the template's side ---------------------------------------------------------------------------


def _boot() -> None:
    """The template's entry point: `python -c _BOOT ROOT FD PARENT_PID PRELOAD...`."""
    # As `python -m` builds it for a child: less "" (-c's entry, the child's cwd then) and the
    # project root that _BOOT appended to import this module.
    sys_path = sys.path[1:-1]
    _, fd, parent_pid, *preload = sys.argv[1:]
    _die_with(int(parent_pid))
    _prctl(_PR_SET_DUMPABLE, 0)
    ctrl = socket.socket(fileno=int(fd))
    code = 0
    try:
        _Template(ctrl, sys_path, preload).serve()
    except BaseException:  # noqa: BLE001 - the template's last words go to its log
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class _Template:
    def __init__(self, ctrl: socket.socket, sys_path: list[str], preload: list[str]) -> None:
        import importlib

        self.ctrl = ctrl
        self.pid = os.getpid()
        self.sys_path = sys_path
        started = time.perf_counter()
        restore = None
        try:
            for name in preload:
                importlib.import_module(name)
                restore = restore or _is_available_without_the_driver()
        except BaseException as exc:
            self._send(("ready", {"error": f"importing the preloads failed: {type(exc).__name__}: {exc}"}))
            raise
        finally:
            if restore is not None:
                restore()
        # Libraries that started a pool at load stop it before any fork (OpenBLAS does): fork once.
        self._settle()
        threads = _thread_names()
        import gc

        gc.collect()
        gc.freeze()  # the children then leave the template's objects' pages shared
        cuda = sys.modules.get("torch.cuda")
        refused = ""
        if len(threads) > 1:
            refused = f"the template runs {len(threads)} threads after the preloads ({', '.join(threads)})"
        elif cuda is not None and cuda.is_initialized():
            refused = "a preload initialised CUDA in the template"
        if refused:
            self._send(("ready", {"error": refused}))
            raise SystemExit(1)
        self._send(("ready", {"threads": len(threads), "preload_s": round(time.perf_counter() - started, 3)}))
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)
        self.children: set[int] = set()

    def _send(self, msg: tuple[Any, ...]) -> None:
        self.ctrl.send(pickle.dumps(msg))

    def _settle(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)

    def serve(self) -> None:
        poller = select.poll()
        poller.register(self.ctrl.fileno(), select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        while True:
            events = dict(poller.poll())
            if self.wake_r in events:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.wake_r, 4096)
            self._reap()
            if self.ctrl.fileno() in events:
                msg, fds, flags, _ = socket.recv_fds(self.ctrl, _MAX_MESSAGE, _MAX_FDS)
                if not msg:
                    self._kill_children()
                    return  # the parent closed its end
                try:
                    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                        raise ValueError("a truncated request")
                    self._spawn(pickle.loads(msg), fds)
                finally:
                    for fd in fds:
                        with contextlib.suppress(OSError):
                            os.close(fd)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.children:
                self.children.discard(pid)
                self._send(("exit", pid, os.waitstatus_to_exitcode(status)))

    def _kill_children(self) -> None:
        for pid in self.children:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)  # its compilers too
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def _spawn(self, req: dict[str, Any], fds: list[int]) -> None:
        request = req["id"]
        if len(fds) != len(req["fds"]):
            self._send(("error", request, "error", 0, f"{len(fds)} descriptors arrived for {len(req['fds'])}"))
            return
        sys.stdout.flush()
        sys.stderr.flush()
        err_r, err_w = os.pipe()
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(err_r)
            os.close(err_w)
            self._send(("error", request, "oserror", exc.errno or 0, f"fork: {exc}"))
            return
        if pid == 0:
            try:
                os.close(err_r)
                _child(self, req, fds, err_w)
            finally:
                os._exit(_SETUP_FAILED)
        os.close(err_w)
        self.children.add(pid)
        report = _read_until_eof(err_r, _CHILD_SETUP_TIMEOUT_S)
        os.close(err_r)
        if report is None:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            self._send(("error", request, "error", 0, f"the child did not finish its setup within {_CHILD_SETUP_TIMEOUT_S:.0f} s"))
        elif report:
            kind, err, text = pickle.loads(report)
            self._send(("error", request, kind, err, text))
        else:
            self._send(("spawned", request, pid, [req["module"], *req["argv"]]))


def _read_until_eof(fd: int, timeout: float) -> bytes | None:
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _is_available_without_the_driver() -> Callable[[], None] | None:
    """Once torch.cuda is imported: `torch.cuda.is_available()` answers True without asking the
    driver, until the returned function puts it back (None: torch.cuda not imported yet).

    Importing torch.utils.cpp_extension (the compile cache's) asks it, only to warn when CUDA_HOME
    exists without a GPU; on a GPU host that first question initialises the CUDA driver, which
    starts a thread (named cuda000...) in the template, and a forked copy of a driver thread breaks
    every child. The children ask the driver themselves, after the fork."""
    cuda: Any = sys.modules.get("torch.cuda")
    if cuda is None:
        return None
    original = cuda.is_available
    cuda.is_available = lambda: True

    def restore() -> None:
        cuda.is_available = original

    return restore


def _thread_names() -> list[str]:
    names = []
    for tid in sorted(os.listdir("/proc/self/task")):
        try:
            names.append(f"{tid}:" + Path(f"/proc/self/task/{tid}/comm").read_text().strip())
        except OSError:
            continue  # a thread that has just ended
    return names


def _child(template: _Template, req: dict[str, Any], fds: list[int], err_w: int) -> NoReturn:
    """The forked child: set up as the request says, then run the module. Never returns."""
    err = [err_w]  # where the error pipe is: _setup_child moves it out of the way of the passed fds
    try:
        _setup_child(template, req, fds, err)
    except BaseException as exc:  # noqa: BLE001 - any failure to set up goes back to spawn()
        report = ("oserror", exc.errno or 0, str(exc)) if isinstance(exc, OSError) else ("error", 0, f"{type(exc).__name__}: {exc}")
        with contextlib.suppress(OSError):
            os.write(err[0], pickle.dumps(report))
        os._exit(_SETUP_FAILED)
    os.close(err[0])  # EOF on the pipe: the template's spawn() reply is "set up"
    _run_module(req["module"])


def _setup_child(template: _Template, req: dict[str, Any], fds: list[int], err: list[int]) -> None:
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != template.pid:
        os._exit(1)  # the template died before the signal was armed
    _prctl(_PR_SET_DUMPABLE, 1)  # as a fresh process: its parent may read /proc/<pid>/* of it
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])

    template.ctrl.detach()  # closed by _remap_fds with the rest, never through this object
    (err[0],) = _remap_fds(fds, req["fds"], [err[0]])
    # Opened once the passed descriptors are in place: at a number none of them needs.
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    out = os.open(req["log_path"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    _reopen_stdio(bool(req["env"].get("PYTHONUNBUFFERED")))

    sys.argv = [req["module"], *req["argv"]]
    # The command line stays the template's (a fork keeps it): the name says which module it runs,
    # for ps and psutil (`refinery:worker_main`; the kernel keeps 15 characters).
    _set_name(f"refinery:{req['module'].rsplit('.', 1)[-1]}")
    sys.path[:] = [os.getcwd(), *template.sys_path]
    _reseed(req["env"])


def _remap_fds(fds: Sequence[int], targets: Sequence[int], keep: Sequence[int]) -> list[int]:
    """Put each of `fds` at its number in `targets`, close every other descriptor above 2 except
    `keep`, and return where `keep` went. Every descriptor to keep first goes above all the
    target numbers, so that no dup2 lands on one still to be moved (a received descriptor may sit
    at another's target number)."""
    floor = max([*targets, 2]) + 1
    moved = [_dup_above(fd, floor) for fd in fds]
    kept = [_dup_above(fd, floor) for fd in keep]
    low = 3
    for fd in sorted([*moved, *kept]):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, _max_fd())
    for high, target in zip(moved, targets, strict=True):
        os.dup2(high, target)  # inheritable, as subprocess's pass_fds leaves them
        os.close(high)
    return kept


def _dup_above(fd: int, floor: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD, floor)


def _max_fd() -> int:
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY and soft > 0 else 1 << 20


def _reopen_stdio(unbuffered: bool) -> None:
    """New sys.stdin/stdout/stderr on fds 0-2, buffered as a fresh interpreter's would be."""
    import io

    def stream(fd: int, mode: str) -> io.TextIOWrapper:
        raw = io.FileIO(fd, mode, closefd=False)
        if fd == 0:
            return io.TextIOWrapper(io.BufferedReader(raw), encoding=sys.stdin.encoding, errors=sys.stdin.errors)
        binary: io.RawIOBase | io.BufferedWriter = raw if unbuffered else io.BufferedWriter(raw)
        errors = "backslashreplace" if fd == 2 else (sys.stdout.errors or "strict")
        return io.TextIOWrapper(
            binary,  # type: ignore[arg-type]  # a raw FileIO is a valid binary stream when unbuffered
            encoding=sys.stdout.encoding,
            errors=errors,
            line_buffering=fd == 2,
            write_through=unbuffered,
        )

    sys.stdin = sys.__stdin__ = stream(0, "rb")  # type: ignore[misc]  # replaced as a fresh interpreter sets them
    sys.stdout = sys.__stdout__ = stream(1, "wb")  # type: ignore[misc]  # as above
    sys.stderr = sys.__stderr__ = stream(2, "wb")  # type: ignore[misc]  # as above


def _reseed(env: dict[str, str]) -> None:
    """Random state of this child's own: every child would otherwise draw the template's numbers."""
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()
        threads = env.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:
            torch.set_num_threads(int(threads))  # libgomp read the template's value at load


def _run_module(module: str) -> NoReturn:
    """`python -m module`, then the interpreter's own exit: threads joined, atexit handlers run."""
    import atexit
    import runpy
    import threading as _threading
    import traceback

    code, killed_by = 0, 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        killed_by = signal.SIGINT  # as the interpreter ends on an uncaught one
    except BaseException:  # noqa: BLE001 - as the interpreter: print it, exit 1
        traceback.print_exc()
        code = 1
    with contextlib.suppress(BaseException):
        _threading._shutdown()  # type: ignore[attr-defined]  # what the interpreter calls at exit: joins non-daemon threads
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    if killed_by:
        signal.signal(killed_by, signal.SIG_DFL)
        os.kill(os.getpid(), killed_by)
    os._exit(code & 0xFF)


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    with contextlib.suppress(BaseException):
        print(value, file=sys.stderr)
    return 1


# -- measurement -----------------------------------------------------------------------------------


_PROBE = "import socket, sys, torch\nsocket.socket(fileno=int(sys.argv[1])).send(b'up')\n"


def _bench(rounds: int = 10) -> None:
    """`python -m kernel_refinery.tools.processes.forkserver`: spawn-to-first-message against Popen-to-first-message."""
    import statistics

    from kernel_refinery.tools.processes.sandbox import project_pythonpath, scrubbed_env

    with tempfile.TemporaryDirectory(prefix="refinery-forkbench-") as tmp:
        work = Path(tmp)
        (work / "forkprobe.py").write_text(_PROBE)
        env = scrubbed_env(PYTHONPATH=project_pythonpath(), HOME=str(work))
        forked, popened = [], []
        with ForkServer(env, work, log_path=work / "template.log") as server:
            for i in range(rounds):
                a, b = socket.socketpair()
                started = time.perf_counter()
                child = server.spawn("forkprobe", [str(b.fileno())], cwd=work, log_path=work / f"f{i}.log", env=env, pass_fds=[b.fileno()])
                a.recv(2)
                forked.append(time.perf_counter() - started)
                child.wait(30)
                a.close()
                b.close()
        for _ in range(rounds):
            a, b = socket.socketpair()
            started = time.perf_counter()
            proc = subprocess.Popen(
                [sys.executable, "-c", _PROBE, str(b.fileno())], cwd=work, env=env, pass_fds=[b.fileno()], start_new_session=True
            )
            a.recv(2)
            popened.append(time.perf_counter() - started)
            proc.wait(30)
            a.close()
            b.close()
    print(f"spawn + first message: median {statistics.median(forked) * 1e3:.1f} ms (min {min(forked) * 1e3:.1f})")
    print(f"Popen + import torch + first message: median {statistics.median(popened) * 1e3:.0f} ms (min {min(popened) * 1e3:.0f})")


if __name__ == "__main__":
    _bench(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
