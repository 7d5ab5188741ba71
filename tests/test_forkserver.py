"""kernel_refinery.tools.processes.forkserver: children forked from a template that has imported torch.

One template with torch serves the module (started once); tests that kill or break a template
start their own without preloads, which starts in a fraction of a second.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from kernel_refinery.tools.processes import sandbox
from kernel_refinery.tools.processes.forkserver import ForkedChild, ForkServer, ForkServerError

PROBE = r"""
import json, os, random, signal, socket, sys, time

def report(**extra):
    fds = []
    for fd in range(3, 1024):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            pass
    out = {
        "name": __name__, "argv": sys.argv, "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
        "ppid": os.getppid(), "cwd": os.getcwd(), "path0": sys.path[0], "env": dict(os.environ), "fds": fds,
        "stdin": sys.stdin.read(), "random": random.random(), **extra,
    }
    print(json.dumps(out), flush=True)

mode = sys.argv[1]
if mode == "report":
    print("to stderr", file=sys.stderr, flush=True)
    report()
elif mode == "exit":
    print("exiting", flush=True)
    sys.exit(int(sys.argv[2]))
elif mode == "raise":
    raise ValueError("from the candidate")
elif mode == "segv":
    import ctypes
    ctypes.string_at(0)
elif mode == "sleep":
    time.sleep(float(sys.argv[2]))
elif mode == "send":
    for fd in map(int, sys.argv[2:]):
        os.write(fd, str(fd).encode())
    report()
elif mode == "torch":
    import numpy, torch
    import threading
    info = {"cuda_initialized": torch.cuda.is_initialized(), "threads_at_start": len(os.listdir("/proc/self/task")),
            "torch_rand": torch.rand(1).item(), "numpy_rand": float(numpy.random.rand()),
            "num_threads": torch.get_num_threads()}
    torch.set_num_threads(2)
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    parallel = a @ b
    torch.set_num_threads(1)
    serial = a @ b
    x = torch.randn(1 << 22)
    torch.set_num_threads(2)
    info.update(matmul_ok=bool(torch.allclose(parallel, serial, atol=1e-3)), sum_ok=abs(x.sum().item() - x.double().sum().item()) < 1,
                threads_after=len(os.listdir("/proc/self/task")), cuda_after=torch.cuda.is_initialized(),
                openmp="OpenMP" in torch.__config__.parallel_info(), pgid=os.getpgid(0))
    print(json.dumps(info), flush=True)
"""


def _env(home: Path, **extra: str) -> dict[str, str]:
    return sandbox.scrubbed_env(PYTHONPATH=sandbox.project_pythonpath(), HOME=str(home), PYTHONUNBUFFERED="1", **extra)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _until(done: Callable[[], bool], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(0.05)
    return done()


def _wait_gone(pid: int, seconds: float = 5.0) -> bool:
    return _until(lambda: _gone(pid), seconds)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("forkserver")
    (path / "fsprobe.py").write_text(PROBE)
    return path


@pytest.fixture(scope="module")
def server(work: Path) -> Iterator[ForkServer]:
    """The module's one template that imports torch."""
    with ForkServer(_env(work), work, log_path=work / "template.log") as fs:
        yield fs


class Spawner:
    def __init__(self, server: ForkServer, work: Path) -> None:
        self.server, self.work, self.count = server, work, 0

    def __call__(self, *argv: str, env: dict[str, str] | None = None, pass_fds: tuple[int, ...] = ()) -> tuple[ForkedChild, Path]:
        self.count += 1
        log = self.work / f"child-{self.count}.log"
        child = self.server.spawn("fsprobe", argv, cwd=self.work, log_path=log, env=env or _env(self.work), pass_fds=pass_fds)
        return child, log


@pytest.fixture
def spawn(server: ForkServer, work: Path) -> Spawner:
    return Spawner(server, work)


def _report(log: Path) -> dict:
    lines = [line for line in log.read_text().splitlines() if line.startswith("{")]
    return json.loads(lines[-1])


def test_child_runs_the_module_as_python_m_would(spawn: Spawner, server: ForkServer, work: Path) -> None:
    env = _env(work, REFINERY_PROBE="1")
    child, log = spawn("report", "x y", env=env)
    assert child.wait(30) == 0
    out = _report(log)
    assert out["name"] == "__main__"
    assert out["argv"] == [str(work / "fsprobe.py"), "report", "x y"]
    assert out["pid"] == child.pid == out["pgid"] == out["sid"]  # its own session and process group
    assert out["ppid"] == server.pid
    assert out["cwd"] == str(work) == out["path0"]
    assert out["env"] == env  # exactly: nothing of the test's own environment
    assert out["stdin"] == ""
    assert out["fds"] == []  # nothing inherited beyond 0, 1, 2
    assert "to stderr" in log.read_text()  # stderr goes to the same log


def test_exit_statuses_as_popen_gives_them(spawn: Spawner) -> None:
    exits, _ = spawn("exit", "3")
    raises, raised_log = spawn("raise")
    segv, _ = spawn("segv")
    killed, _ = spawn("sleep", "60")
    hung, _ = spawn("sleep", "60")
    assert exits.wait(30) == 3
    assert raises.wait(30) == 1
    assert "ValueError: from the candidate" in raised_log.read_text()
    assert segv.wait(30) == -signal.SIGSEGV
    assert killed.poll() is None
    sandbox.kill_tree(killed.pid)
    assert killed.wait(10) == -signal.SIGKILL
    with pytest.raises(subprocess.TimeoutExpired):
        hung.wait(timeout=0.2)
    assert hung.poll() is None
    sandbox.kill_tree(hung.pid)
    assert hung.wait(10) == -signal.SIGKILL
    assert hung.poll() == -signal.SIGKILL


def test_passed_fds_keep_their_numbers(spawn: Spawner) -> None:
    pipes = [os.pipe() for _ in range(3)]
    # A high number, and low numbers that the template's own descriptors may well hold.
    high = os.dup2(pipes[0][1], 250)
    targets = (high, pipes[1][1], pipes[2][1])
    try:
        child, log = spawn("send", *map(str, targets), pass_fds=targets)
        assert child.wait(30) == 0
        for (r, _), fd in zip(pipes, targets, strict=True):
            assert os.read(r, 100) == str(fd).encode()
        assert _report(log)["fds"] == sorted(targets)
    finally:
        os.close(high)
        for r, w in pipes:
            os.close(r)
            os.close(w)


REMAP = """
import json, os
from kernel_refinery.tools.processes.forkserver import _remap_fds
pipes = [os.pipe() for _ in range(3)]
fds = [w for _, w in pipes]                # as the template received them
targets = [fds[1], fds[2], fds[0]]         # each one's number in the caller: another's number here
inodes = [os.fstat(fd).st_ino for fd in fds]
keep_ino = os.fstat(pipes[0][0]).st_ino
(kept,) = _remap_fds(fds, targets, [pipes[0][0]])
open_fds = []
for fd in range(3, 1024):
    try:
        os.fstat(fd)
        open_fds.append(fd)
    except OSError:
        pass
print(json.dumps({"placed": [os.fstat(t).st_ino for t in targets], "inodes": inodes, "open": open_fds,
                  "targets": targets, "kept": kept, "kept_same": os.fstat(kept).st_ino == keep_ino}))
"""


def test_passed_fds_of_crossing_numbers() -> None:
    """A received descriptor may sit at another one's target number: none is lost on the way."""
    out = subprocess.run(
        [sys.executable, "-c", REMAP],
        env={**os.environ, "PYTHONPATH": sandbox.project_pythonpath()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["placed"] == result["inodes"]
    assert result["open"] == sorted([*result["targets"], result["kept"]])
    assert result["kept"] not in result["targets"] and result["kept_same"]


def test_pass_fds_must_not_be_standard_streams(spawn: Spawner) -> None:
    with pytest.raises(ValueError, match="pass_fds"):
        spawn("report", pass_fds=(1,))


def test_torch_in_the_child_threads_and_no_cuda(spawn: Spawner, server: ForkServer) -> None:
    assert server.pid is not None
    assert len(os.listdir(f"/proc/{server.pid}/task")) == 1  # the template runs no thread
    first, log1 = spawn("torch")
    second, log2 = spawn("torch")
    assert first.wait(120) == 0, log1.read_text()
    assert second.wait(120) == 0, log2.read_text()
    a, b = _report(log1), _report(log2)
    assert a["cuda_initialized"] is False and a["cuda_after"] is False
    assert a["threads_at_start"] == 1
    assert a["num_threads"] > 0
    assert a["openmp"] and a["matmul_ok"] and a["sum_ok"]
    assert a["threads_after"] >= 2  # OpenMP's pool started in the child
    # Random state of each child's own.
    assert a["torch_rand"] != b["torch_rand"]
    assert a["numpy_rand"] != b["numpy_rand"]
    assert len(os.listdir(f"/proc/{server.pid}/task")) == 1


def test_children_draw_different_random_numbers(spawn: Spawner) -> None:
    logs = []
    for _ in range(3):
        child, log = spawn("report")
        assert child.wait(30) == 0
        logs.append(log)
    assert len({_report(log)["random"] for log in logs}) == 3


def test_omp_num_threads_of_the_child_env(spawn: Spawner, work: Path) -> None:
    child, log = spawn("torch", env=_env(work, OMP_NUM_THREADS="1"))
    assert child.wait(120) == 0, log.read_text()
    assert _report(log)["num_threads"] == 1


def test_spawn_from_several_threads(spawn: Spawner) -> None:
    results: dict[int, int] = {}

    def one(code: int) -> None:
        child, _ = spawn("exit", str(code))
        results[code] = child.wait(60)

    threads = [threading.Thread(target=one, args=(code,)) for code in range(10, 16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert results == {code: code for code in range(10, 16)}


def test_bad_cwd_raises_at_spawn(server: ForkServer, work: Path) -> None:
    with pytest.raises(FileNotFoundError):
        server.spawn("fsprobe", ["report"], cwd=work / "missing", log_path=work / "x.log", env=_env(work))
    assert server.alive


def test_spawn_is_fast(spawn: Spawner) -> None:
    """spawn and the child's first message; `python -m kernel_refinery.tools.processes.forkserver` compares with Popen."""
    a, b = socket.socketpair()
    try:
        spawn("send", str(b.fileno()), pass_fds=(b.fileno(),))  # warm
        a.recv(100)
        started = time.perf_counter()
        child, _ = spawn("send", str(b.fileno()), pass_fds=(b.fileno(),))
        assert a.recv(100) == str(b.fileno()).encode()
        elapsed = time.perf_counter() - started
        assert child.wait(30) == 0
    finally:
        a.close()
        b.close()
    assert elapsed < 1.0  # ~10 ms here; importing torch afresh takes seconds


def test_no_secret_in_template_or_child_environ(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_API_KEY", "x")
    env = _env(work)
    assert "MY_API_KEY" not in env
    with ForkServer(env, work, preload=(), log_path=work / "secret-template.log") as fs:
        log = work / "secret-child.log"
        child = fs.spawn("fsprobe", ["sleep", "30"], cwd=work, log_path=log, env=env)
        try:
            assert fs.pid is not None
            for pid in (fs.pid, child.pid):
                environ = Path(f"/proc/{pid}/environ").read_bytes()
                assert b"MY_API_KEY" not in environ
                assert b"PYTHONPATH=" in environ
        finally:
            sandbox.kill_tree(child.pid)
        assert child.wait(10) == -signal.SIGKILL
        checked = fs.spawn("fsprobe", ["report"], cwd=work, log_path=log, env=env)
        assert checked.wait(30) == 0
        assert "MY_API_KEY" not in _report(log)["env"]


def test_template_death(work: Path) -> None:
    env = _env(work)
    fs = ForkServer(env, work, preload=(), log_path=work / "dying-template.log")
    fs.start()
    try:
        sleeper = fs.spawn("fsprobe", ["sleep", "60"], cwd=work, log_path=work / "orphan.log", env=env)
        assert fs.alive and fs.pid is not None
        os.kill(fs.pid, signal.SIGKILL)
        assert sleeper.wait(10) == -signal.SIGKILL
        assert _wait_gone(sleeper.pid)  # PR_SET_PDEATHSIG
        assert _until(lambda: not fs.alive)
        with pytest.raises(ForkServerError, match=r"template .* ended with status -9; start\(\) it again"):
            fs.spawn("fsprobe", ["report"], cwd=work, log_path=work / "never.log", env=env)
        fs.start()
        assert fs.alive
        child = fs.spawn("fsprobe", ["exit", "5"], cwd=work, log_path=work / "again.log", env=env)
        assert child.wait(30) == 5
    finally:
        fs.close()
    assert not fs.alive


def test_close_kills_children(work: Path) -> None:
    env = _env(work)
    fs = ForkServer(env, work, preload=())
    fs.start()
    child = fs.spawn("fsprobe", ["sleep", "60"], cwd=work, log_path=work / "closed.log", env=env)
    template = fs.pid
    assert template is not None
    fs.close()
    assert child.poll() == -signal.SIGKILL
    assert _wait_gone(child.pid) and _wait_gone(template)
    assert not fs.alive


def test_a_failing_preload_is_reported(work: Path) -> None:
    fs = ForkServer(_env(work), work, preload=("no_such_module_here",), log_path=work / "bad-template.log")
    with pytest.raises(ForkServerError, match="No module named 'no_such_module_here'"):
        fs.start()
    assert not fs.alive


DRIVER = """
import sys, time
from pathlib import Path
from kernel_refinery.tools.processes import sandbox
from kernel_refinery.tools.processes.forkserver import ForkServer
work = Path(sys.argv[1])
env = sandbox.scrubbed_env(PYTHONPATH=sandbox.project_pythonpath(), HOME=str(work))
fs = ForkServer(env, work, preload=())
fs.start()
child = fs.spawn("fsprobe", ["sleep", "120"], cwd=work, log_path=work / "driver-child.log", env=env)
print(fs.pid, child.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("stopped", [False, True], ids=["template-running", "template-stopped"])
def test_template_and_children_die_with_the_parent(work: Path, stopped: bool) -> None:
    """A stopped template cannot notice its socket close: PR_SET_PDEATHSIG alone ends it."""
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(work)],
        env=_env(work),
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert driver.stdout is not None
        template, child = map(int, driver.stdout.readline().split())
        assert not _gone(template) and not _gone(child)
        if stopped:
            os.kill(template, signal.SIGSTOP)
        driver.kill()
        driver.wait(10)
        assert _wait_gone(template), "the template outlived its parent"
        assert _wait_gone(child), "the child outlived the template"
    finally:
        driver.kill()
        driver.wait(10)
