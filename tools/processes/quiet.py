"""Nothing else runs while the judge takes a time.

A time is only honest when the machine does nothing else: a candidate's runner that starts, warms
up, compiles or streams memory from a native thread while the judge times the reference makes the
reference slower and the candidate look faster. Three parts:

- `RunnerRegistry`, in the parent (one per evaluator process): every candidate's runner is
  registered with its device group. When the judge asks for quiet (`QuietRequest`, through the
  parent's watch of the job), the registry stops every runner of the group (SIGSTOP to its process
  group and to every descendant that left it), the job's own runner too when the reference is
  timed, and holds new runners back until the judge releases it. On CPU the group is every runner
  (cores, caches and memory bandwidth are shared); on CUDA, the runners of the same GPU.
- `BuildGate`, machine-wide: every evaluator process's builds wait while a window is open, and a
  window opens once the builds under way have ended.
- `Activity`, in the judge: what else ran during a window, from the kernel's own accounts (/proc)
  and, on CUDA, from NVML's per-process samples. A stopped process cannot run, but a process that
  escaped the tree (double fork, setsid) or work already queued on a GPU still can: this check is
  the wall, the stop is the means. A window in which other processes took more than
  `QUIET_SHARE` of a core (plus two clock ticks, the accounts' resolution), or in which another
  process used the GPU, is not quiet, and the judge times again.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil
import structlog

log = structlog.get_logger()

STOP_WAIT_S = 2.0
"""How long a stop may take to reach every thread of a runner before the freeze is reported incomplete."""

QUIET_ATTEMPTS = 6
"""Windows a timing gets at least before the machine is called busy."""
QUIET_PATIENCE_S = 180.0
"""And the time they may take together (eval.quiet "require"): another evaluator process on the
machine (a pool's, a Ray worker's) builds its candidate outside the device turn, and a cold build
takes a minute or more on a 2-core machine (Ray actors' timings failed at 60 s): outlasted, rather
than charged to this candidate as a turn lost."""
WINDOW_REFUND_S = 2 * QUIET_PATIENCE_S
"""What a stage's limit (eval.timeout_s) gives back at most for time that was not the candidate's:
windows with its runner stopped, and windows found unquiet with the pauses after them
(tools/processes/worker.py: StageClock). Bounded, so a hang inside a window still ends."""
QUIET_SHARE = 0.10
"""Other processes may use this share of one core during a window (the OS, a logger) and it is still quiet.
A Ray node's own processes and idle actors, with the kernel's threads, took 8% of a core on a 2-core
VM in CI, and every window of a three-minute timing failed at 5%; a candidate's loader that streams
memory takes a whole core, and one paced below a tenth of one moves a memory-bound reference by a
few percent at most, inside the A/A band."""
QUIET_TICKS = 2
"""And this many clock ticks (10 ms each at the usual USER_HZ): the accounts' own resolution."""

GPU_QUIET_PERCENT = 5
"""Another process's NVML sample must show at least this SM utilisation to count: a runner starting up
(its first kernels, CUPTI's) shows a percent or two, a process that loads the GPU far more."""

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def group_of(device: str, gpu_index: int | None) -> str:
    """The runners that share what a timing on this device measures: every CPU runner, or one GPU's."""
    return "cpu" if device == "cpu" else f"cuda:{gpu_index or 0}"


def _tree(pid: int) -> list[int]:
    try:
        return [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def _signal_tree(pid: int, sig: signal.Signals) -> list[int]:
    """The signal to the runner's process group (it leads its own) and to every descendant."""
    pids = _tree(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)
    return pids


def _stopped(pid: int) -> bool:
    """Every thread of the process stopped (or gone)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("T", "t", "Z", "X"):
            return False
    return True


@dataclass
class RunnerRegistry:
    """The parent's candidate runners by device group, and which groups are held still."""

    _cond: threading.Condition = field(default_factory=threading.Condition)
    _runners: dict[int, str] = field(default_factory=dict)
    _frozen: dict[str, set[int]] = field(default_factory=dict)

    def wait_until_free(self, group: str) -> None:
        """Before a new runner of `group` starts: not while its group is held still."""
        with self._cond:
            self._cond.wait_for(lambda: group not in self._frozen)

    def add(self, pid: int, group: str) -> None:
        with self._cond:
            self._runners[pid] = group
            if group in self._frozen:  # started in the moment between the gate and the freeze
                _signal_tree(pid, signal.SIGSTOP)
                self._frozen[group].add(pid)

    def remove(self, pid: int) -> None:
        with self._cond:
            self._runners.pop(pid, None)
            for held in self._frozen.values():
                held.discard(pid)

    def freeze(self, group: str, keep: int | None) -> tuple[int, ...]:
        """Stop every runner of the group but `keep` (and its tree); returns the processes held."""
        with self._cond:
            self._cond.wait_for(lambda: group not in self._frozen)  # one window of a group at a time
            targets = [pid for pid, g in self._runners.items() if (g == group or group == "cpu") and pid != keep]
            held = self._frozen.setdefault(group, set())
            stopped: list[int] = []
            for pid in targets:
                stopped.extend(_signal_tree(pid, signal.SIGSTOP))
                held.add(pid)
        deadline = time.monotonic() + STOP_WAIT_S
        while not all(_stopped(p) for p in stopped) and time.monotonic() < deadline:
            time.sleep(0.001)
        return tuple(stopped)

    def thaw(self, group: str) -> None:
        with self._cond:
            for pid in self._frozen.pop(group, set()):
                _signal_tree(pid, signal.SIGCONT)
            self._cond.notify_all()


RUNNERS = RunnerRegistry()
"""This process's candidate runners (tools/processes/worker.py registers them)."""


def lock_dir() -> Path:
    """Where evaluator processes of this machine take turns on a device (REFINERY_LOCK_DIR moves it)."""
    return Path(os.environ.get("REFINERY_LOCK_DIR") or Path(tempfile.gettempdir()) / "kernel-refinery-locks")


def lock_file(folder: Path, name: str) -> IO[str]:
    """A lock file of the machine's, opened afresh (flock is per open file; closing it drops the lock)."""
    folder.mkdir(parents=True, exist_ok=True)
    return open(folder / name, "a+")  # closed by the caller


@contextlib.contextmanager
def machine_turn(group: str) -> Iterator[None]:
    """This device to this process alone for a candidate's device steps: another evaluator process
    on the machine (another run, a test worker) waits, as this process's own evaluations wait on
    the pool's device lock. The kernel drops the lock with a process that dies."""
    with lock_file(lock_dir(), f"{group.replace(':', '-')}.lock") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class BuildGate:
    """Builds and quiet windows of every evaluator process on the machine take turns.

    A build (a candidate's compile: a compiler on every core for a minute, cold) holds `builds.lock`
    shared, so builds run side by side; a quiet window holds it exclusive, so it opens only once the
    builds under way have ended, and none starts while it lasts. Whoever waits for a window holds
    `gate.lock` meanwhile, and a build takes the gate before its share: a stream of builds cannot
    starve the windows, which are short. Each side opens the files afresh (flock is per open file),
    so two threads of one process wait on each other as two processes do; a window never waits on
    a build of its own thread, as a thread builds and times in turn. The kernel drops the locks
    with a process that dies. Without this, the judge could only wait another process's build out
    (up to three minutes), and a machine busy with builds failed timings as "never quiet"."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder

    def _open(self, name: str) -> IO[str]:
        return lock_file(self.folder or lock_dir(), name)

    @contextlib.contextmanager
    def building(self) -> Iterator[None]:
        """Around a build: waits while a window is open or waited for."""
        with self._open("builds.lock") as builds:  # closing it drops the share
            with self._open("gate.lock") as gate:
                fcntl.flock(gate, fcntl.LOCK_EX)
                fcntl.flock(builds, fcntl.LOCK_SH)
            yield

    def hold(self) -> contextlib.ExitStack:
        """Builds stopped for a window: returns once none runs; closing the stack lets them go on."""
        stack = contextlib.ExitStack()
        try:
            gate = stack.enter_context(self._open("gate.lock"))
            builds = stack.enter_context(self._open("builds.lock"))
            started = time.monotonic()
            fcntl.flock(gate, fcntl.LOCK_EX)
            fcntl.flock(builds, fcntl.LOCK_EX)
        except BaseException:
            stack.close()
            raise
        waited = time.monotonic() - started
        if waited > 1:
            log.info("quiet_window_waited_for_builds", seconds=round(waited, 1))
        return stack  # closing the files drops both locks


BUILDS = BuildGate()
"""The machine's builds and quiet windows (REFINERY_LOCK_DIR moves the lock files)."""


# The judge's side: what else ran during a window.


def _cpu_busy_ticks(cores: Iterable[int] | None) -> tuple[int, int]:
    """Busy ticks (user, nice, system) and steal ticks summed over the given cores (all when None)."""
    wanted = None if cores is None else {f"cpu{c}" for c in cores}
    busy = steal = 0
    with open("/proc/stat") as fh:
        for line in fh:
            if not line.startswith("cpu") or line.startswith("cpu "):
                continue
            parts = line.split()
            if wanted is not None and parts[0] not in wanted:
                continue
            values = [int(v) for v in parts[1:]]
            busy += values[0] + values[1] + values[2]
            steal += values[7] if len(values) > 7 else 0
    return busy, steal


def _process_ticks() -> dict[int, tuple[int, int, str]]:
    """Every process's user + system ticks so far, those of its children it has waited for, and its name."""
    ticks: dict[int, tuple[int, int, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                text = fh.read()
        except OSError:
            continue
        name = text[text.find("(") + 1 : text.rfind(")")]
        fields = text.rsplit(")", 1)[1].split()
        ticks[int(entry)] = (int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14]), name)
    return ticks


@dataclass(frozen=True)
class WindowActivity:
    """What ran beside the allowed processes during one window."""

    seconds: float
    others_cpu_s: float
    """CPU time of processes other than the allowed ones (the larger of the per-process and the per-core accounts)."""
    steal_s: float
    """Time the hypervisor gave the cores to other machines (recorded, not judged: nothing here can stop it)."""
    busiest: tuple[tuple[int, str, float], ...]
    """The other processes that ran most: pid, name, CPU seconds."""
    unattributed_s: float = 0.0
    """Of `others_cpu_s`, what the per-core account saw and no process's account holds: processes
    that ended within the window (a compiler), or that this PID namespace cannot see (another container)."""
    gpu_others: tuple[tuple[int, int], ...] = ()
    """Other processes NVML saw using the GPU during the window: pid, SM utilisation (%)."""
    gpu_checked: str = ""
    """How the GPU was checked ("nvml" or why it was not); "" on CPU."""

    @property
    def allowance_s(self) -> float:
        return QUIET_SHARE * self.seconds + QUIET_TICKS * _TICK_S

    @property
    def quiet(self) -> bool:
        return self.others_cpu_s <= self.allowance_s and not self.gpu_others

    def describe(self) -> str:
        parts = []
        if self.others_cpu_s > self.allowance_s:
            named = [f"{name} (pid {pid}) {s * 1e3:.0f} ms" for pid, name, s in self.busiest[:3]]
            if self.unattributed_s * 1e3 >= 1:
                named.append(f"{self.unattributed_s * 1e3:.0f} ms by processes that ended or are not visible here")
            parts.append(
                f"other processes used {self.others_cpu_s * 1e3:.0f} ms of CPU in a {self.seconds * 1e3:.0f} ms window"
                f" (allowed: {self.allowance_s * 1e3:.0f} ms)" + (f": {', '.join(named)}" if named else "")
            )
        if self.gpu_others:
            parts.append("other processes used the GPU: " + ", ".join(f"pid {pid} at {sm}% SM" for pid, sm in self.gpu_others))
        return "; ".join(parts) or "quiet"


class GpuSamples:
    """NVML's per-process utilisation of the judge's GPU; `unavailable` says why when it cannot tell."""

    def __init__(self, device_index: int) -> None:
        self.unavailable = ""
        self._handle: object | None = None
        try:
            import pynvml
            import torch

            pynvml.nvmlInit()
            uuid = str(torch.cuda.get_device_properties(device_index).uuid)
            self._handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
            self._nvml = pynvml
        except Exception as exc:  # noqa: BLE001 - without NVML the GPU is not checked, and the result says so
            self.unavailable = f"NVML unavailable ({type(exc).__name__}: {str(exc)[:120]})"

    def others_since(self, since_us: int, allowed: set[int]) -> tuple[tuple[int, int], ...] | None:
        """Processes outside `allowed` with SM samples above zero since `since_us`; None where NVML cannot say."""
        if self._handle is None:
            return None
        try:
            samples = self._nvml.nvmlDeviceGetProcessUtilization(self._handle, since_us)
        except self._nvml.NVMLError_NotFound:
            return ()  # no process used the GPU since then
        except Exception as exc:  # noqa: BLE001 - a driver without per-process samples: not checked
            self.unavailable = f"NVML per-process samples unavailable ({type(exc).__name__})"
            self._handle = None
            return None
        worst: dict[int, int] = {}
        for s in samples:
            if s.pid not in allowed and s.smUtil >= GPU_QUIET_PERCENT and s.timeStamp >= since_us:
                worst[s.pid] = max(worst.get(s.pid, 0), int(s.smUtil))
        return tuple(sorted(worst.items()))


class Window:
    """One timing window: the accounts read when it opens and when it closes."""

    def __init__(self, allowed: Iterable[int], cores: Iterable[int] | None, gpu: GpuSamples | None, harness: Iterable[int] = ()) -> None:
        self.allowed = set(allowed)
        self.harness = set(harness)
        """Processes allowed without their descendants: the judge's parent, which answers the judge's
        asks and watches the runner during the window, and whose children are the candidates' runners."""
        self.cores = None if cores is None else list(cores)
        self.gpu = gpu
        self.started = time.monotonic()
        self.started_us = int(time.time() * 1e6)
        self.busy, self.steal = _cpu_busy_ticks(self.cores)
        self.ticks = _process_ticks()

    def close(self) -> WindowActivity:
        seconds = time.monotonic() - self.started
        busy, steal = _cpu_busy_ticks(self.cores)
        ticks = _process_ticks()
        # Threads and children of the allowed processes count as theirs.
        allowed = set(self.allowed)
        for pid in list(self.allowed):
            allowed.update(_tree(pid))
        # An allowed process's children that ended within the window (the reference's compilers)
        # are its own work: their ticks are in its children's account once it has waited for them.
        # The harness's own time counts as allowed, not its reaped children's: they were runners.
        reaped = sum(ticks[pid][1] - self.ticks.get(pid, (0, ticks[pid][1], ""))[1] for pid in allowed if pid in ticks)
        on_cpu = allowed | self.harness
        used = {pid: ticks[pid][0] - self.ticks.get(pid, (0, 0, ""))[0] for pid in ticks}
        others = {pid: t for pid, t in used.items() if pid not in on_cpu and t > 0}
        allowed_ticks = sum(t for pid, t in used.items() if pid in on_cpu) + reaped
        per_core = max(0, busy - self.busy - allowed_ticks)
        per_process = sum(others.values())
        busiest = tuple((pid, ticks[pid][2], t * _TICK_S) for pid, t in sorted(others.items(), key=lambda item: item[1], reverse=True)[:5])
        gpu_others: tuple[tuple[int, int], ...] = ()
        checked = ""
        if self.gpu is not None:
            found = self.gpu.others_since(self.started_us, allowed)
            gpu_others, checked = (found, "nvml") if found is not None else ((), self.gpu.unavailable)
        return WindowActivity(
            seconds=seconds,
            others_cpu_s=max(per_core, per_process) * _TICK_S,
            steal_s=max(0, steal - self.steal) * _TICK_S,
            busiest=busiest,
            unattributed_s=max(0, per_core - per_process) * _TICK_S,
            gpu_others=gpu_others,
            gpu_checked=checked,
        )
