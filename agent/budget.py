"""A shared cost budget: candidate evaluations and tokens, checked before each step that spends them.

An evaluation is one candidate entering the evaluator (its compile step), whatever stage stops it;
a reply without code costs tokens but no evaluation. Limits hold exactly: nothing starts a model
call once the tokens are spent, or a kernel call once the evaluations are, so a run never
evaluates more than `max_evals` candidates (the last call may end past `max_tokens`: a reply's
length is not known before it is written).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class Budget:
    max_evals: int | None = None
    max_tokens: int | None = None
    evals: int = 0
    tokens: int = 0
    parent: Budget | None = None
    """A share of a larger budget: spending here also spends there, and either limit stops."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def can_call(self) -> bool:
        """Whether a model call may start (an idea call: it leads to no evaluation itself)."""
        own = self.max_tokens is None or self.tokens < self.max_tokens
        return own and (self.parent is None or self.parent.can_call())

    def can_generate(self) -> bool:
        """Whether a kernel call may start: its reply may need one evaluation."""
        own = self.max_evals is None or self.evals < self.max_evals
        return own and self.can_call() and (self.parent is None or self.parent.can_generate())

    @property
    def exhausted(self) -> bool:
        return not self.can_generate()

    def spend_tokens(self, tokens: int) -> None:
        with self._lock:
            self.tokens += tokens
        if self.parent is not None:
            self.parent.spend_tokens(tokens)

    def spend_eval(self) -> None:
        with self._lock:
            if self.max_evals is not None and self.evals >= self.max_evals:
                # A caller skipped can_generate(): a bug, not a bad kernel.
                raise RuntimeError(f"evaluation budget of {self.max_evals} already spent")
            self.evals += 1
        if self.parent is not None:
            self.parent.spend_eval()

    def share(self, parts: int) -> Budget:
        """An equal share of what is left, for one of `parts` independent runs (best-of-n)."""
        parts = max(1, parts)

        def portion(limit: int | None, spent: int) -> int | None:
            return None if limit is None else max(1, (limit - spent) // parts) if limit > spent else 0

        return Budget(max_evals=portion(self.max_evals, self.evals), max_tokens=portion(self.max_tokens, self.tokens), parent=self)
