"""The one vocabulary of verdicts: every label an attempt or a trajectory can get, ranked, with its style.

The evaluator's `EvalStatus` names what it found about code it ran; a verdict adds what the loop
knows besides: the reply had no code (`no_code`), or the code has no final verdict (`unfinished`).
Reports, traces, strategies and the CLI label and rank attempts through this enum only.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum, StrEnum
from typing import Protocol, TypeVar


class EvalStatus(str, Enum):
    """What the evaluator found about code it ran (tools/results.py's EvalResult carries it)."""

    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    CUDA_FAULT = "cuda_fault"
    TIMEOUT = "timeout"
    OOM = "oom"
    INCORRECT = "incorrect"
    REJECTED = "rejected"
    CORRECT = "correct"

    @property
    def compiled(self) -> bool:
        return self not in (EvalStatus.COMPILE_ERROR, EvalStatus.REJECTED)


class Evaluated(Protocol):
    """What a verdict reads of an evaluator's result (tools/results.py's EvalResult)."""

    @property
    def status(self) -> EvalStatus | None: ...

    @property
    def timing(self) -> object | None: ...


class Verdict(StrEnum):
    """What became of one attempt; members are listed best to worst (see `rank`).

    The order says how far an attempt got towards a correct, timed kernel, so how much a next
    attempt can build on it (beam seeds, a trajectory's best attempt when none was correct).
    Every verdict of code that compiled ranks above every verdict of code that did not, so a
    trajectory's best attempt compiled exactly when any of its attempts did.
    """

    CORRECT = EvalStatus.CORRECT.value
    """Right on every check and timed."""
    INCORRECT = EvalStatus.INCORRECT.value
    """Ran to the end; only the numbers are wrong, and the mismatches say where."""
    RUNTIME_ERROR = EvalStatus.RUNTIME_ERROR.value
    """Ran and raised: the traceback names the fault."""
    CUDA_FAULT = EvalStatus.CUDA_FAULT.value
    """Launched and died on the device (an illegal address): the message is coarse and the process lost."""
    OOM = EvalStatus.OOM.value
    """Ran out of memory: no output to compare, only a size to go on."""
    TIMEOUT = EvalStatus.TIMEOUT.value
    """Never returned: no output and no message at all."""
    COMPILE_ERROR = EvalStatus.COMPILE_ERROR.value
    """Did not build; the compiler log says why."""
    REJECTED = EvalStatus.REJECTED.value
    """Refused by the static check or a timing guard: against the task's rules, so not a base to refine."""
    UNFINISHED = "unfinished"
    """Code, but no final verdict: its evaluation stopped before one (or before timing a correct kernel)."""
    NO_CODE = "no_code"
    """The reply had no code to evaluate."""

    @classmethod
    def of(cls, code: str | None, result: Evaluated | None) -> Verdict:
        """The verdict on an attempt: its code (None when the reply had none) and the evaluator's result."""
        return cls.NO_CODE if code is None else cls.of_result(result)

    @classmethod
    def of_result(cls, result: Evaluated | None) -> Verdict:
        """The verdict on code given to the evaluator (None: no result came back)."""
        if result is None or result.status is None:
            return cls.UNFINISHED
        if result.status is EvalStatus.CORRECT and result.timing is None:
            return cls.UNFINISHED  # correct but never timed does not count as correct
        return cls(result.status.value)

    @property
    def rank(self) -> int:
        """Higher is better: `max(verdicts, key=lambda v: v.rank)` is the one that got furthest."""
        return _RANK[self]

    @property
    def compiled(self) -> bool:
        return self.rank > Verdict.COMPILE_ERROR.rank

    @property
    def style(self) -> str:
        """How the terminal shows it (a rich style)."""
        return _STYLE[self]

    @property
    def words(self) -> str:
        """For people: "compile error"."""
        return self.value.replace("_", " ")


_RANK: dict[Verdict, int] = {v: len(Verdict) - i for i, v in enumerate(Verdict)}
_STYLE: dict[Verdict, str] = {
    Verdict.CORRECT: "green",
    Verdict.INCORRECT: "yellow",
    Verdict.RUNTIME_ERROR: "red",
    Verdict.CUDA_FAULT: "red",
    Verdict.OOM: "magenta",
    Verdict.TIMEOUT: "magenta",
    Verdict.COMPILE_ERROR: "red",
    Verdict.REJECTED: "bright_red",
    Verdict.UNFINISHED: "dim",
    Verdict.NO_CODE: "dim",
}


def best_verdict(verdicts: Iterable[Verdict]) -> Verdict:
    """The verdict that got furthest (the first among equals); no_code when there is none."""
    return max(verdicts, key=lambda v: v.rank, default=Verdict.NO_CODE)


class Judged(Protocol):
    """Anything with a verdict and a speedup: an attempt, a trace record, a turn's outcome, a trajectory."""

    @property
    def status(self) -> Verdict: ...

    @property
    def speedup(self) -> float | None: ...


J = TypeVar("J", bound=Judged)


def merit(judged: Judged) -> tuple[bool, float, int]:
    """How good an attempt is, larger better: correct before not, then faster, then the failure
    that got furthest (a speedup counts only for a correct attempt)."""
    correct = judged.status is Verdict.CORRECT
    return (correct, (judged.speedup or 0.0) if correct else 0.0, judged.status.rank)


def best(items: Iterable[J]) -> J | None:
    """The best of `items` by `merit`, the first among equals (so give them in the order they
    happened: the earliest wins a tie); None when there are none.

    The one place "best" is decided: a trajectory's best attempt, its best trace record, the beam's
    seeds, the best of a task's samples in the HTML grid all come from here."""
    chosen: J | None = None
    for item in items:
        if chosen is None or merit(item) > merit(chosen):
            chosen = item
    return chosen
