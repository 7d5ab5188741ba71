"""The trace schema: one versioned JSON record per turn, one JSONL file per trajectory.

Version history (readers accept every version listed in `read_record`):
- 1: the first schema.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from tools.results import EvalResult

SCHEMA_VERSION = 1


class TraceMessage(BaseModel):
    model_config = ConfigDict(frozen=True)
    role: str
    content: str


class TokenUsage(BaseModel):
    model_config = ConfigDict(frozen=True)
    prompt: int = 0
    completion: int = 0

    @property
    def total(self) -> int:
        return self.prompt + self.completion

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(prompt=self.prompt + other.prompt, completion=self.completion + other.completion)


class TrajectoryId(BaseModel):
    """Which trajectory a record belongs to; also its file name and checkpoint thread."""

    model_config = ConfigDict(frozen=True)
    task: str
    variant: str
    sample: int = 0
    strategy: str = "refine"

    @property
    def slug(self) -> str:
        safe = self.task.replace("/", "__")
        variant = self.variant.replace("+", "")
        suffix = "" if self.strategy == "refine" else f"__{self.strategy}"
        return f"{safe}__{variant}__s{self.sample}{suffix}"


class TurnRecord(BaseModel):
    """Everything about one turn: what the model saw, said, and what the evaluator found."""

    model_config = ConfigDict(frozen=True)

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
    def status(self) -> str:
        if self.result is None or self.result.status is None:
            return "no_code" if self.code is None else "unfinished"
        return self.result.status.value

    @property
    def speedup(self) -> float | None:
        return self.result.speedup if self.result is not None else None


class UnknownSchemaVersion(ValueError):
    pass


def read_record(line: str) -> TurnRecord:
    """Parse one JSONL line of any known schema version."""
    record = TurnRecord.model_validate_json(line)
    if record.schema_version > SCHEMA_VERSION:
        raise UnknownSchemaVersion(
            f"trace schema version {record.schema_version} is newer than this kernel-refinery "
            f"(reads up to {SCHEMA_VERSION}); upgrade kernel-refinery to read it"
        )
    return record
