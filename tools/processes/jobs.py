"""What the parent asks a worker to do, and what comes back over the pipe."""

from __future__ import annotations

import hashlib

from pydantic import Field

from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.results import CompileReport, CorrectnessReport, Frozen, ProfileReport, Stage, TimingReport


def source_hash(source: str) -> str:
    """A short key for a program's text (here rather than in tools/processes/programs.py: the parent, which
    never runs task or candidate code, need not import torch for it)."""
    return hashlib.sha256(source.encode()).hexdigest()[:16]


class TaskProgram(Frozen):
    """A KernelBench-format reference program, with the sizes for the device already chosen."""

    name: str
    source: str


class EvalJob(Frozen):
    task_name: str
    task_source: str
    candidate_source: str
    stages: tuple[Stage, ...]
    config: EvalConfig


class JobReply(Frozen):
    failure: EvalStatus | None = None
    """None when every requested stage passed."""
    message: str = ""
    compile: CompileReport | None = None
    correctness: CorrectnessReport | None = None
    timing: TimingReport | None = None
    profile: ProfileReport | None = None
    stage_seconds: dict[str, float] = Field(default_factory=dict)
    fatal: bool = False
    """The worker's state is unusable (a CUDA fault): the parent replaces it."""
    runner_gone: bool = False
    """From the judge: the candidate's process closed its end mid-job; the parent, which watched
    it, says why (a crash, a timeout, memory)."""
    isolation: str = ""
    """From the runner's load: how the candidate's process is confined (filesystem, capabilities, audit hook)."""
    judge_broken: bool = False
    """From the judge: its own reference runner died; the parent starts a fresh judge for the next job."""


# The judge asks the parent for quiet during a job (tools/processes/quiet.py); each gets one answer.


class QuietRequest(Frozen):
    """Stop every other candidate runner of the device, and the job's own when `hold_runner`."""

    hold_runner: bool


class QuietGranted(Frozen):
    held: tuple[int, ...]
    """The processes stopped."""
    runner: int
    """The job's runner (its process group leader)."""


class QuietRelease(Frozen):
    """Let them run again."""

    quiet: bool = True
    """Whether the window was quiet: one that was not is timed again, and neither it nor the pause
    before the next is the candidate's time."""


class QuietReleased(Frozen):
    pass


class StageFailed(Exception):
    """A stage ended the evaluation with this status; becomes the job's reply."""

    def __init__(self, status: EvalStatus, message: str, fatal: bool = False):
        super().__init__(message)
        self.status = status
        self.message = message
        self.fatal = fatal


class Rejected(Exception):
    """A check found a hack rather than a wrong answer; becomes the job's `rejected` reply."""
