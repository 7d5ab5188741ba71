"""`refinery suite check`: run every task's reference, eager and compiled, each in its own process.

A suite's tasks are other people's programs at their own sizes: one may need a package that is
not installed, raise, segfault, hang or run out of memory. Each task runs in a fresh interpreter
(kernel_refinery.bench.suite_check.child) under a wall-clock limit, so whatever it does becomes that task's row
and the other tasks go on. Up to `jobs` tasks run at once, scheduled from this one thread.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import psutil
import structlog

from kernel_refinery.bench.suite_check.types import (
    JOB_FILE,
    LOG_FILE,
    RESULT_FILE,
    TASK_FILE,
    CheckOptions,
    Stage,
    Status,
    TaskCheck,
    Timing,
)
from kernel_refinery.bench.tasks import SuiteError, chosen_levels, load_task_file, matches, resolve_suite
from kernel_refinery.core.errors import ConfigError, InputFileError
from kernel_refinery.tools.faults import cuda_fault_in
from kernel_refinery.tools.processes import sandbox

log = structlog.get_logger()

_POLL_S = 0.2
_STARTUP_TIMEOUT_S = 300.0
"""Importing torch, before the task's clock starts: minutes on a loaded 2-core machine."""
_LOG_TAIL_CHARS = 2000
_MESSAGE_CHARS = 300


@dataclass(frozen=True)
class TaskFile:
    level: int
    path: Path

    @property
    def key(self) -> str:
        return f"level{self.level}/{self.path.stem}"


def default_jobs(device: str) -> int:
    """cuda: half the cores, since torch.compile of each task is CPU-bound; cpu: one, so tasks
    do not share the cores they are timed on."""
    return max(1, len(os.sched_getaffinity(0)) // 2) if device == "cuda" else 1


def find_tasks(suite: str, levels: Iterable[int] | None = None, name_filter: str | None = None) -> list[TaskFile]:
    """The task files of a suite in its order, without reading them: a file that is not a task
    becomes that task's row, not the end of the check (kernel_refinery.bench.tasks.load_suite would stop there)."""
    root = resolve_suite(suite)
    chosen = chosen_levels(root, levels)
    found: list[TaskFile] = []
    for level in chosen:
        files = [p for p in (root / f"level{level}").glob("*.py") if p.is_file() and not p.name.startswith("_")]
        found += [TaskFile(level, p) for p in sorted(files, key=_file_order) if name_filter is None or matches(p.stem, name_filter)]
    if not found:
        raise SuiteError(f"no task of suite {root} matches --levels/--tasks; run without them to check every task")
    return found


def _file_order(path: Path) -> tuple[int, int, str]:
    # As kernel_refinery.bench.tasks orders a level: numbered files by number (2_ before 10_), then the others.
    number = re.match(r"\d+", path.stem)
    return (0, int(number.group()), path.stem) if number else (1, 0, path.stem)


_OUT_OF_MEMORY = (Status.CUDA_OOM, Status.HOST_OOM)


def check_suite(tasks: list[TaskFile], options: CheckOptions, on_done: Callable[[TaskCheck], None] | None = None) -> list[TaskCheck]:
    """Every task's row, in the order given; `on_done` sees each row as its task ends.

    A task that ran out of memory while others shared the machine runs once more at the end,
    alone: its row is what it does with the device to itself."""
    pending = deque(tasks)
    alone: deque[TaskFile] = deque()
    retried: set[str] = set()
    running: list[_Running] = []
    rows: dict[str, TaskCheck] = {}

    def done(row: TaskCheck) -> None:
        rows[row.key] = row
        if on_done is not None:
            on_done(row)

    env = _child_env(options)
    try:
        while pending or running or alone:
            while (pending and len(running) < options.jobs) or (alone and not pending and not running):
                if pending:
                    task = pending.popleft()
                else:
                    task = alone.popleft()
                    retried.add(task.key)
                started = _start(task, options, env)
                if isinstance(started, TaskCheck):
                    done(started)
                else:
                    running.append(started)
            time.sleep(_POLL_S)
            _relieve_memory(running)
            for run in list(running):
                row = run.poll()
                if row is None:
                    continue
                running.remove(run)
                if row.status in _OUT_OF_MEMORY and options.jobs > 1 and len(tasks) > 1 and row.key not in retried:
                    log.info("suite_check_retry_alone", task=row.key, status=row.status.value, reason=row.message)
                    alone.append(run.task)
                else:
                    done(row)
    finally:
        # Ctrl-C, or a bug here: no task's process outlives the check.
        for run in running:
            run.kill()
            run.cleanup()
    return [rows[task.key] for task in tasks]


def _child_env(options: CheckOptions) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = sandbox.project_pythonpath()
    # The cores split between the tasks running at once, unless the user chose otherwise.
    threads = str(max(1, len(os.sched_getaffinity(0)) // options.jobs))
    env.setdefault("OMP_NUM_THREADS", threads)
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", threads)
    env.update(PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    # A segfault or abort prints the Python stack, so the row can name the task's line.
    env["PYTHONFAULTHANDLER"] = "1"
    return env


def _start(task: TaskFile, options: CheckOptions, env: dict[str, str]) -> TaskCheck | _Running:
    started = time.monotonic()
    try:
        source = load_task_file(task.path, task.level).source_for(options.device)
    except SuiteError as exc:
        return _row(task, Status.INVALID, Stage.LOAD, str(exc), {}, time.monotonic() - started)
    workdir = Path(tempfile.mkdtemp(prefix="refinery-suite-check-"))
    (workdir / TASK_FILE).write_text(source, encoding="utf-8")
    job = {
        "device": options.device,
        "compile": options.compile,
        "budget_s": options.budget_s,
        "seed": options.seed,
        "time": options.time,
        "probe": options.probe,
        "tolerance": options.tolerance,
        "threads": int(env["OMP_NUM_THREADS"]) if env["OMP_NUM_THREADS"].isdigit() else 1,
        "parent_pid": os.getpid(),
    }
    (workdir / JOB_FILE).write_text(json.dumps(job), encoding="utf-8")
    log_file = (workdir / LOG_FILE).open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernel_refinery.bench.suite_check.child", str(workdir)],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        # Its own process group, so that a kill ends the compiler workers it started too.
        start_new_session=True,
    )
    return _Running(task, options, proc, workdir, log_file, started)


class _Running:
    """One task's process while it runs: its clock, its stage, and how it ended."""

    def __init__(
        self,
        task: TaskFile,
        options: CheckOptions,
        proc: subprocess.Popen[bytes],
        workdir: Path,
        log: IO[bytes],
        started: float,
    ):
        self.task = task
        self.options = options
        self.proc = proc
        self.workdir = workdir
        self.log = log
        self.started = started
        self.clock_started: float | None = None
        """When the task's own code began (torch imported): the timeout counts from here."""
        self.killed: tuple[Status, str] | None = None

    def result(self) -> dict[str, Any]:
        # Written with os.replace by the child: never half a file.
        with contextlib.suppress(OSError, ValueError):
            found = json.loads((self.workdir / RESULT_FILE).read_text(encoding="utf-8"))
            return found if isinstance(found, dict) else {}
        return {}

    def rss_bytes(self) -> int:
        return sandbox.tree_rss_bytes(self.proc.pid)

    def poll(self) -> TaskCheck | None:
        """The row once the process has ended (or was ended here for its time), else None."""
        now = time.monotonic()
        if self.killed is None and self.proc.poll() is None:
            stage = self.result().get("stage", Stage.STARTUP.value)
            if self.clock_started is None and stage != Stage.STARTUP.value:
                self.clock_started = now
            if self.clock_started is None and now - self.started > _STARTUP_TIMEOUT_S:
                self.end(Status.TIMEOUT, f"the interpreter did not start (import torch) within {_STARTUP_TIMEOUT_S:.0f} s")
            elif self.clock_started is not None and now - self.clock_started > self.options.timeout_s:
                self.end(Status.TIMEOUT, f"no result within {self.options.timeout_s:g} s (--timeout-s); killed during {stage}")
            else:
                return None
        row = self.row(time.monotonic() - self.started)
        self.cleanup()
        return row

    def end(self, status: Status, message: str) -> None:
        self.killed = (status, message)
        log.info("suite_check_killed", task=self.task.key, status=status.value, reason=message)
        self.kill()

    def kill(self) -> None:
        sandbox.kill_tree(self.proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def row(self, wall_s: float) -> TaskCheck:
        result = self.result()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        # Compiler workers of a finished task may linger in its process group.
        sandbox.kill_tree(self.proc.pid)
        self.log.close()
        printed = sandbox.tail(self.workdir / LOG_FILE, _LOG_TAIL_CHARS)
        stage = Stage(result.get("stage", Stage.STARTUP.value))
        failure = result.get("failure")
        # What the child wrote first: a task killed after it had finished keeps its result.
        if isinstance(failure, dict):
            status, message = Status(failure["status"]), str(failure["message"])
        elif stage is Stage.DONE:
            status, message = Status.OK, ""
        elif self.killed is not None:
            status, message = self.killed
        else:
            status, message = describe_exit(self.proc.returncode, stage, printed)
        return _row(self.task, status, stage, message, result, wall_s, "" if status is Status.OK else printed)

    def cleanup(self) -> None:
        self.log.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _row(task: TaskFile, status: Status, stage: Stage, message: str, result: dict[str, Any], wall_s: float, printed: str = "") -> TaskCheck:
    def timing(name: str) -> Timing | None:
        found = result.get(name)
        return Timing(**found) if isinstance(found, dict) else None

    degenerate = result.get("degenerate")
    kind, detail = (str(degenerate["kind"]), str(degenerate["detail"])) if isinstance(degenerate, dict) else ("", "")

    return TaskCheck(
        key=task.key,
        level=task.level,
        name=task.path.stem,
        path=str(task.path),
        status=status,
        stage=stage,
        message=_one_line(message),
        eager=timing("eager"),
        compiled=timing("compiled"),
        compile_s=result.get("compile_s"),
        wall_s=round(wall_s, 2),
        device_name=str(result.get("device_name", "")),
        torch_version=str(result.get("torch", "")),
        log_tail=printed,
        degenerate=kind,
        degenerate_detail=detail,
    )


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _MESSAGE_CHARS else line[: _MESSAGE_CHARS - 1] + "…"


_FAULTHANDLER_TASK_FRAME = re.compile(rf'File "[^"]*{re.escape(TASK_FILE)}", line (\d+) in (\S+)')


def describe_exit(returncode: int | None, stage: Stage, printed: str) -> tuple[Status, str]:
    """Why a task's process ended without a result: a signal, or an exit of its own."""
    fault = cuda_fault_in(printed)
    if returncode is not None and returncode < 0:
        number = -returncode
        if number == signal.SIGKILL:
            # Nobody here sent it (the check's own kills are recorded before they are sent).
            return Status.HOST_OOM, f"killed by SIGKILL during {stage.value}, most likely by the kernel's OOM killer"
        name = signal.Signals(number).name if number in signal.valid_signals() else f"signal {number}"
        where = _task_line(printed)
        detail = f": {fault}" if fault else ""
        return Status.CRASH, f"{signal.strsignal(number) or name} ({name}) during {stage.value}{where}{detail}"
    if fault:
        return Status.CRASH, f"exited with code {returncode} during {stage.value} after a CUDA fault: {fault}"
    last = next((line.strip() for line in reversed(printed.splitlines()) if line.strip()), "")
    return Status.CRASH, f"exited with code {returncode} during {stage.value}" + (f": {last}" if last else " and printed nothing")


def _task_line(printed: str) -> str:
    # faulthandler lists the innermost frame first.
    found = _FAULTHANDLER_TASK_FRAME.search(printed)
    return f" at line {found.group(1)} of the task ({found.group(2)})" if found else ""


def _relieve_memory(running: list[_Running]) -> None:
    """Kill the largest task before the machine runs out of memory: the kernel's OOM killer could
    pick any process (this check, or someone else's), and on a shared machine often does."""
    if not running:
        return
    memory = psutil.virtual_memory()
    floor = max(1 << 30, memory.total // 20)
    if memory.available >= floor:
        return
    sizes = [(run.rss_bytes(), run) for run in running if run.killed is None]
    if not sizes:
        return
    rss, largest = max(sizes, key=lambda pair: pair[0])
    hint = "run it alone (--jobs 1 --tasks NAME)" if len(running) > 1 else "it needs more memory than this machine has free"
    largest.end(
        Status.HOST_OOM,
        f"killed at {rss / (1 << 30):.1f} GB resident, when the machine had under {floor / (1 << 30):.1f} GB free; {hint}",
    )


def check_device(device: str) -> None:
    """A device the children can use, before any task starts: else every row would say so."""
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"--device must be cpu or cuda, not {device!r}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise ConfigError(f"--device cuda: torch {torch.__version__} ({build}) sees no CUDA device here; use --device cpu")


class JsonReport:
    """The --json file: every row so far, rewritten as each task ends, so that a check cut short
    (Ctrl-C, a session's time limit) keeps what it measured; `complete` says whether it was."""

    def __init__(self, path: Path, suite: str, options: CheckOptions, total: int):
        self.path = path
        self.head = {"suite": suite, "options": asdict(options), "tasks": total}
        self.rows: list[TaskCheck] = []
        self.write()

    def add(self, row: TaskCheck) -> None:
        self.rows.append(row)
        self.write()

    def finish(self, rows: list[TaskCheck]) -> None:
        """All rows, in the suite's order rather than the order the tasks ended in."""
        self.rows = list(rows)
        self.write()

    def write(self) -> None:
        counts: dict[str, int] = {}
        for row in self.rows:
            counts[row.status.value] = counts.get(row.status.value, 0) + 1
        degenerate = {row.key: row.degenerate for row in self.rows if row.degenerate}
        report = {
            **self.head,
            "complete": len(self.rows) == self.head["tasks"],
            "counts": counts,
            "degenerate": degenerate,
            "rows": [asdict(r) for r in self.rows],
        }
        partial = self.path.with_name(self.path.name + ".partial")
        try:
            partial.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
            os.replace(partial, self.path)
        except OSError as exc:
            raise InputFileError(
                f"cannot write the --json file {self.path}: {exc.strerror or exc}; give a path in a writable folder"
            ) from exc
