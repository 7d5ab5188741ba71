"""What `refinery suite check` and each task's process agree on: the files they exchange, and the
typed row a task ends as. Kept free of heavy imports: every task's fresh interpreter imports it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

JOB_FILE = "job.json"
TASK_FILE = "task.py"
RESULT_FILE = "result.json"
LOG_FILE = "task.log"


class Status(str, Enum):
    """What became of one task; anything but OK names a reason in the row's message."""

    OK = "ok"
    COMPILE_ERROR = "compile_error"
    """Eager ran; torch.compile of the model failed (its eager time stands)."""
    IMPORT_ERROR = "import_error"
    """The module's own top-level code failed: a missing package, a download, a bad constant."""
    ERROR = "error"
    """An exception in get_init_inputs, Model(...), get_inputs or the eager forward."""
    CUDA_OOM = "cuda_oom"
    HOST_OOM = "host_oom"
    CRASH = "crash"
    """The process died without a Python exception: a signal (segfault, abort) or an exit."""
    TIMEOUT = "timeout"
    INVALID = "invalid"
    """The file is not a task program (not Python, no Model, a bad REFINERY_SIZES)."""


class Stage(str, Enum):
    """Steps of one task, in the order they run; a row names the last one reached."""

    LOAD = "load"
    """Reading the file, in this process."""
    STARTUP = "startup"
    """The child's interpreter starting and importing torch."""
    IMPORT = "import"
    INIT = "init"
    """get_init_inputs, Model(...), get_inputs, and moving all of it to the device."""
    EAGER = "eager"
    PROBE = "probe"
    """The reference on a few more random inputs: do its outputs vary (tools/steps/degenerate.py)?"""
    COMPILE = "compile"
    DONE = "done"


@dataclass(frozen=True)
class Timing:
    median_ms: float
    min_ms: float
    calls: int
    peak_mb: float
    """At its peak: the GPU memory the task had allocated (cuda), or the process's resident memory (cpu)."""


@dataclass(frozen=True)
class TaskCheck:
    """One task's row."""

    key: str
    level: int
    name: str
    path: str
    status: Status
    stage: Stage
    """The last stage reached: where a failure happened, DONE for a task that ran through."""
    message: str
    """One line: why, for anything but OK; empty for OK."""
    eager: Timing | None
    compiled: Timing | None
    compile_s: float | None
    """The first compiled call, which compiles; includes that call's run."""
    wall_s: float
    device_name: str = ""
    """Where it ran, e.g. `NVIDIA H200`, as its process saw it (empty if it never got that far)."""
    torch_version: str = ""
    log_tail: str = ""
    """The end of what the task's process printed, for a failure."""
    degenerate: str = ""
    """zeros, constant or input_independent where the reference's outputs on a few random inputs
    measure nothing (tools/steps/degenerate.py); "" where they vary, or where it was not probed."""
    degenerate_detail: str = ""
    """One line: what the outputs were."""


@dataclass(frozen=True)
class CheckOptions:
    device: str = "cpu"
    compile: bool = True
    timeout_s: float = 300.0
    """Wall-clock limit of one task once its interpreter has imported torch."""
    jobs: int = 1
    budget_s: float = 1.0
    """About this long of timed calls per side, within the child's bounds on the number of calls."""
    seed: int = 0
    time: bool = True
    """Time the eager reference (off: only build it and probe its outputs)."""
    probe: bool = True
    """Run the reference on a few more random inputs and flag outputs that do not vary."""
    tolerance: float = 1e-4
    """atol = rtol for the probe: what a candidate's output is held to (the evaluator's fp32 default)."""
