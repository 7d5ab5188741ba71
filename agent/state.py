"""The graph's state: raw data only, with finished attempts appended through a reducer.

Prompt text is built inside the generate node from these fields, never stored ahead.
"""

from __future__ import annotations

import operator
from enum import Enum
from typing import Annotated, TypedDict

from pydantic import BaseModel, ConfigDict

from kernel_refinery.core.verdict import Verdict, best
from kernel_refinery.tools.results import EvalResult
from kernel_refinery.traces.schema import TokenUsage, TraceMessage


class Outcome(str, Enum):
    """What a node found; the graph's routing table maps each to the next node."""

    CODE = "code"
    NO_CODE = "no_code"
    COMPILED = "compiled"
    COMPILE_FAIL = "compile_fail"
    CORRECT = "correct"
    WRONG = "wrong"
    CONTINUE = "continue"
    DONE = "done"


class TaskSpec(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str
    source: str
    """The reference program at the device's size."""
    level: int | None = None


class Attempt(BaseModel):
    """One turn: the prompt, the reply, the extracted code and the verdict."""

    model_config = ConfigDict(frozen=True)
    turn: int
    messages: tuple[TraceMessage, ...] = ()
    reply: str = ""
    code: str | None = None
    extract_error: str | None = None
    result: EvalResult | None = None
    tokens: TokenUsage = TokenUsage()
    phase_seconds: dict[str, float] = {}
    started_at: str = ""

    @property
    def correct(self) -> bool:
        return self.result is not None and self.result.correct and self.result.timing is not None

    @property
    def speedup(self) -> float | None:
        return self.result.speedup if self.correct and self.result is not None else None

    @property
    def verdict(self) -> Verdict:
        return Verdict.of(self.code, self.result)

    @property
    def status(self) -> Verdict:
        """The verdict, under the name kernel_refinery.core.verdict.best reads."""
        return self.verdict

    def reaches(self, target_speedup: float) -> bool:
        """The target check of every strategy: correct, and at least this fast."""
        return self.correct and (self.speedup or 0.0) >= target_speedup


def best_attempt(attempts: list[Attempt]) -> Attempt | None:
    """The fastest correct attempt (kernel_refinery.core.verdict.best); ties go to the earliest turn."""
    # A stable sort by turn: best-of-n's samples each start again at turn 1.
    found = best(sorted(attempts, key=lambda a: a.turn))
    return found if found is not None and found.correct else None


class TreePlace(BaseModel):
    """Where a turn's kernel sits in a search tree (beam search); the loop's turns have none."""

    model_config = ConfigDict(frozen=True)
    node_id: str
    parent_id: str | None = None


class TurnInput(TypedDict, total=False):
    """What one turn starts from; the loop passes its own state, a strategy builds it."""

    task: TaskSpec
    turn: int
    """The turns so far; this turn is number turn + 1."""
    attempts: list[Attempt]
    """The attempts before it (the prompt shows the last)."""
    idea: str | None
    """An optimisation idea the kernel should apply (beam search)."""
    place: TreePlace | None
    carried: TokenUsage
    """Tokens spent for this turn before it began (a beam's idea call): its record carries them."""


class TurnOutput(TypedDict, total=False):
    turn: int
    draft: Attempt | None
    """The finished, recorded attempt."""
    tokens: Annotated[TokenUsage, operator.add]
    """The turn's own model tokens."""


class TurnState(TurnInput, TurnOutput, total=False):
    """One turn: generate → extract → compile → execute → profile → record."""

    outcome: Outcome


class RefineInput(TypedDict):
    task: TaskSpec


class RefineState(TypedDict, total=False):
    """The loop: one turn after another until decide says done."""

    task: TaskSpec
    turn: int
    draft: Attempt | None
    """The attempt of the turn just ended; decide appends it to `attempts`."""
    attempts: Annotated[list[Attempt], operator.add]
    outcome: Outcome
    tokens: Annotated[TokenUsage, operator.add]
