"""What `refinery serve` and its client send each other: typed request and response bodies.

Shared by bench/serve/server.py (the server) and bench/serve/client.py (the client), so that both read
and write the same JSON. Results travel as kernel_refinery.tools.results.EvalResult, unchanged.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kernel_refinery.core.numerics import Precision
from kernel_refinery.tools.config import EvalConfig, Guards
from kernel_refinery.tools.results import NONFINITE_AS_STRINGS, EvalResult

SERVER_FIELDS = frozenset(
    {
        "device",
        "cache_dir",
        "memory_limit_gb",
        "cpu_threads",
        "tolerances",
        "baseline_cache",
        "baseline_dir",
        "remeasure_baselines",
        "compiler",
        "quiet",
    }
)
"""EvalConfig fields a request may not set: what the workers were started with, the server's disk caches
its C++ compiler, and whether its timings require a quiet machine (a property of the server's
machine, not of one request)."""


class RequestSettings(BaseModel):
    """The evaluator settings one request may choose (a subset of EvalConfig); those left out are
    the server's. What its workers were started with (device, cache, memory limit, threads) is the
    server's alone."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    precision: Precision | None = None
    tolerance: float | None = Field(None, gt=0)
    allow_tf32: bool | None = None
    backend: Literal["cpp", "cuda", "triton"] | None = None
    correctness_trials: int | None = Field(None, ge=1)
    seed: int | None = None
    warmup: int | None = Field(None, ge=0)
    trials: int | None = Field(None, ge=1)
    time_compiled_reference: bool | None = None
    timing: Literal["events", "host", "graph"] | None = None
    baseline: Literal["eager", "compile", "best"] | None = None
    noise_band: bool | None = None
    reverify_speedup: float | None = Field(None, gt=0)
    reverify_trials: int | None = Field(None, ge=0)
    profile_rows: int | None = Field(None, ge=0)
    timeout_s: float | None = Field(None, gt=0)
    compile_timeout_s: float | None = Field(None, gt=0)
    shapes: Literal["off", "report", "require"] | None = None
    guards: Guards | None = None

    def applied_to(self, base: EvalConfig, time_limit_s: float | None = None) -> EvalConfig:
        """`base` with the settings given; with `time_limit_s`, no stage limit above it (the worker
        then ends an evaluation the request no longer waits for)."""
        config = EvalConfig.model_validate({**base.model_dump(), **self.model_dump(exclude_none=True)})
        if time_limit_s is None:
            return config
        limits = {"timeout_s": min(config.timeout_s, time_limit_s), "compile_timeout_s": min(config.compile_timeout_s, time_limit_s)}
        return EvalConfig.model_validate({**config.model_dump(), **limits})


class EvaluateRequest(BaseModel):
    """One candidate against one task: the task's program text, or the name of a built-in task."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task_source: str | None = Field(None, description="a KernelBench program: class Model, get_inputs(), get_init_inputs()")
    task_name: str | None = Field(None, description="with task_source: its name (default 'task'); alone: a built-in task, e.g. 1_relu")
    code: str = Field(description="the candidate module, defining ModelNew")
    settings: RequestSettings = RequestSettings()

    @model_validator(mode="after")
    def _one_task(self) -> EvaluateRequest:
        if self.task_source is None and self.task_name is None:
            raise ValueError("give task_source (a program's text) or task_name (a built-in task, e.g. 1_relu)")
        return self


class BatchRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    items: list[EvaluateRequest] = Field(min_length=1)


class BatchResponse(BaseModel):
    model_config = ConfigDict(frozen=True, **NONFINITE_AS_STRINGS)

    results: list[EvalResult]
    """In the order of the request's items."""


class Health(BaseModel):
    model_config = ConfigDict(frozen=True)

    status: Literal["ok"] = "ok"
    device: str
    workers: int
    capacity: int
    """Evaluations admitted at once: running plus queued; more answer 429."""


class ServerMetrics(BaseModel):
    model_config = ConfigDict(frozen=True)

    workers: int
    capacity: int
    running: int
    queue_depth: int
    """Admitted evaluations waiting for a worker."""
    evaluations_total: int
    evaluations_per_minute: float
    """Evaluations finished in the last 60 s."""
    verdicts: dict[str, int]
    """Finished evaluations by status (EvalStatus values)."""
    refused_full: int
    """Requests answered 429: the queue was full."""
    timed_out: int
    """Requests answered 504: past the per-request time limit."""
    failed: int
    """Evaluations that raised instead of giving a verdict (answered 500)."""
    busy_fraction: float
    """Share of wall time the pool's devices spent running candidates."""
    uptime_s: float


class ErrorBody(BaseModel):
    """Every 4xx and 5xx answer of the service: what went wrong and what to do."""

    model_config = ConfigDict(frozen=True)

    error: str
