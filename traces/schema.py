"""The trace schema: one versioned JSON record per turn, one JSONL file per trajectory.

Version history (readers migrate every older version through `_MIGRATIONS`):
- 0: before the version field: `task`/`variant`/`sample` at top level, `tokens_prompt`/`tokens_completion`.
- 1: the trajectory object and the `tokens` object.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import total_ordering
from typing import Any

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field

from kernel_refinery.core.numerics import Precision
from kernel_refinery.core.strategy import Strategy
from kernel_refinery.core.verdict import Verdict
from kernel_refinery.tools.results import NONFINITE_AS_STRINGS, EvalResult

SCHEMA_VERSION = 1


class TraceMessage(BaseModel):
    model_config = ConfigDict(frozen=True)
    role: str
    content: str


class TokenUsage(BaseModel):
    model_config = ConfigDict(frozen=True)
    prompt: int = 0
    completion: int = 0
    prompt_cached: int = 0
    """Prompt tokens the server read from its cache of an earlier prompt's prefix rather than
    evaluating them (OpenAI's `cached_tokens`; 0 where the endpoint does not say)."""

    @property
    def total(self) -> int:
        return self.prompt + self.completion

    @property
    def prompt_processed(self) -> int:
        """Prompt tokens the model evaluated: the prefill this call paid for."""
        return self.prompt - self.prompt_cached

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            prompt=self.prompt + other.prompt,
            completion=self.completion + other.completion,
            prompt_cached=self.prompt_cached + other.prompt_cached,
        )


TrajectoryKey = tuple[str, str, int, str, str]
"""A trajectory's identity as a tuple: task, variant, sample, strategy, precision."""


@total_ordering
class TrajectoryId(BaseModel):
    """Which trajectory a record belongs to; also its file name and checkpoint thread.

    The one key of a trajectory everywhere (results, traces, reports): hashable, and ordered by
    task, variant, sample, strategy, precision.
    """

    model_config = ConfigDict(frozen=True)
    task: str
    variant: str
    sample: int = 0
    strategy: Strategy = Strategy.REFINE
    precision: Precision = Precision.FP32
    """fp32, fp16 or bf16 (records written before precisions were fp32): one run directory can hold
    the same task, variant and sample at two precisions, each with its own trace and checkpoint."""

    @property
    def key(self) -> TrajectoryKey:
        return (self.task, self.variant, self.sample, self.strategy, self.precision)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, TrajectoryId):
            return NotImplemented
        return self.key < other.key

    def without(self, *fields: str) -> tuple[str | int, ...]:
        """The key less some of its fields, in order: what pairs trajectories that differ only in those."""
        unknown = set(fields) - set(TrajectoryId.model_fields)
        if unknown:
            raise ValueError(f"a trajectory has no field {', '.join(sorted(unknown))}")
        return tuple(getattr(self, name) for name in TrajectoryId.model_fields if name not in fields)

    @property
    def qualifier(self) -> str:
        """What sets it apart beyond task, variant and sample: " (beam, bf16)"; "" for refine at fp32."""
        parts = [p for p in (self.strategy != Strategy.REFINE and self.strategy, self.precision != Precision.FP32 and self.precision) if p]
        return f" ({', '.join(parts)})" if parts else ""

    @property
    def label(self) -> str:
        """For people: "level1/relu · G+E · sample 0 (beam, bf16)"."""
        return f"{self.task} · {self.variant} · sample {self.sample}{self.qualifier}"

    @property
    def flags(self) -> str:
        """The `refinery traces show` options that pick exactly this trajectory of its task."""
        return f"--variant {self.variant} --sample {self.sample} --strategy {self.strategy} --precision {self.precision}"

    @property
    def slug(self) -> str:
        safe = self.task.replace("/", "__")
        variant = self.variant.replace("+", "")
        suffix = "" if self.strategy == Strategy.REFINE else f"__{self.strategy}"
        # fp32 keeps the name traces had before precisions, so older runs resume into the same files.
        precision = f"__{self.precision}" if self.precision != Precision.FP32 else ""
        return f"{safe}__{variant}__s{self.sample}{suffix}{precision}"


class TurnRecord(BaseModel):
    """Everything about one turn: what the model saw, said, and what the evaluator found."""

    model_config = ConfigDict(frozen=True, **NONFINITE_AS_STRINGS)

    schema_version: int = SCHEMA_VERSION
    run_id: str
    trajectory: TrajectoryId
    level: int | None = None
    turn: int
    model: str
    messages: tuple[TraceMessage, ...]
    reply: str
    code: str | None = None
    extract_error: str | None = None
    result: EvalResult | None = None
    phase_seconds: dict[str, float] = Field(default_factory=dict)
    tokens: TokenUsage = TokenUsage()
    started_at: str
    node_id: str | None = None
    """Search strategies (beam) name each evaluated kernel; refine leaves this empty."""
    parent_id: str | None = None
    idea: str | None = None

    @property
    def status(self) -> Verdict:
        return Verdict.of(self.code, self.result)

    @property
    def speedup(self) -> float | None:
        return self.result.speedup if self.result is not None else None


class UnknownSchemaVersion(ValueError):
    pass


Migrations = dict[int, Callable[[dict[str, Any]], dict[str, Any]]]
"""Version N -> a function turning a raw version-N record into a version N+1 record."""


def _v0_to_v1(raw: dict[str, Any]) -> dict[str, Any]:
    """Version 0 kept the trajectory's fields and the token counts flat on the record."""
    missing = [k for k in ("task", "variant") if k not in raw]
    if missing:
        raise ValueError(f"a version-0 trace record needs {' and '.join(missing)} at top level")
    out = {k: v for k, v in raw.items() if k not in ("task", "variant", "sample", "tokens_prompt", "tokens_completion")}
    out["trajectory"] = {"task": raw["task"], "variant": raw["variant"], "sample": raw.get("sample", 0)}
    out["tokens"] = {"prompt": raw.get("tokens_prompt", 0), "completion": raw.get("tokens_completion", 0)}
    out["schema_version"] = 1
    return out


_MIGRATIONS: Migrations = {0: _v0_to_v1}


def migrate(line: str, version_now: int, migrations: Migrations, what: str) -> dict[str, Any]:
    """One JSONL line of a versioned record, as a raw record of the current version.

    A line without `schema_version` is version 0; `migrations[N]` turns a version-N record into a
    version N+1 record. Versions newer than this kernel-refinery, or unknown, raise UnknownSchemaVersion.
    """
    # pydantic's parser, not json's: a torn line reads as a ValueError mentioning EOF, which
    # readers skip when it is the last line.
    raw = pydantic_core.from_json(line)
    if not isinstance(raw, dict):
        raise ValueError(f"a {what} line must be a JSON object, not {type(raw).__name__}")
    version = raw.get("schema_version", 0)
    if isinstance(version, int) and version > version_now:
        raise UnknownSchemaVersion(
            f"{what} schema version {version} is newer than this kernel-refinery "
            f"(reads versions 0 to {version_now}); upgrade kernel-refinery to read it"
        )
    if not isinstance(version, int) or (version != version_now and version not in migrations):
        raise UnknownSchemaVersion(f"{what} schema version {version!r} is unknown (this kernel-refinery reads versions 0 to {version_now})")
    while version < version_now:
        raw = migrations[version](raw)
        version = raw["schema_version"]
    return raw


def read_record(line: str) -> TurnRecord:
    """Parse one JSONL line of any known schema version, migrating older ones on the way."""
    return TurnRecord.model_validate(migrate(line, SCHEMA_VERSION, _MIGRATIONS, "trace"))
