"""A quiet host: LLM calls and evaluations take turns where both run on this machine's cores.

With the embedded model (llama.cpp on this same machine) and a CPU evaluation, a kernel timed
while the model decodes is timed against the model's server for the cores, and a reply is slowed
by a compile. Where that is so (agent/config.py: needs_quiet_host), one QuietHost is shared by
every trajectory of the run: calls of one kind may run together, never beside the other kind,
and the kinds take turns in arrival order, so neither waits forever. Elsewhere it lets all through.

Across runs on one machine (two `refinery run`s, an experiment beside a service) the turns are the
machine's build gate (tools/processes/quiet.py: BuildGate): an LLM call holds its shared side as a
build does, so no other run's quiet window opens while the model decodes, and no call starts while
a window is open or waited for.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Literal

import structlog

from kernel_refinery.agent.config import ModelSettings, needs_quiet_host
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.processes.quiet import BUILDS, BuildGate

log = structlog.get_logger()

Kind = Literal["llm", "evaluation"]


class QuietHost:
    def __init__(self, enabled: bool = True, gate: BuildGate = BUILDS) -> None:
        self.enabled = enabled
        self.gate = gate
        """The machine's: other runs' quiet windows wait for an LLM call as for a build."""
        self._cond = threading.Condition()
        self._waiting: list[tuple[int, Kind]] = []
        """Tickets waiting, in arrival order."""
        self._tickets = 0
        self._active = 0
        self._active_kind: Kind | None = None

    @classmethod
    def for_settings(cls, llm: ModelSettings, eval: EvalConfig) -> QuietHost:
        """The host for one run or experiment: in force (and said so, once) where its settings need it."""
        if not needs_quiet_host(llm, eval):
            return cls(enabled=False)
        log.info(
            "quiet_host",
            model=llm.model,
            device=eval.device,
            detail="the embedded model shares this CPU with the evaluator: LLM calls and evaluations take turns, never overlap",
        )
        return cls()

    def llm_call(self) -> AbstractContextManager[None]:
        return self._hold("llm")

    def evaluation(self) -> AbstractContextManager[None]:
        return self._hold("evaluation")

    @contextmanager
    def _hold(self, kind: Kind) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        with self._cond:
            ticket = (self._tickets, kind)
            self._tickets += 1
            self._waiting.append(ticket)
            while not self._may_enter(ticket):
                self._cond.wait()
            self._waiting.remove(ticket)
            self._active_kind = kind
            self._active += 1
        try:
            if kind == "llm":
                with self.gate.building():
                    yield
            else:
                yield
        finally:
            with self._cond:
                self._active -= 1
                if self._active == 0:
                    self._active_kind = None
                self._cond.notify_all()

    def _may_enter(self, ticket: tuple[int, Kind]) -> bool:
        """Its kind is running or nothing is, and nobody of the other kind came before it."""
        kind = ticket[1]
        ahead = self._waiting[: self._waiting.index(ticket)]
        return self._active_kind in (None, kind) and all(k == kind for _, k in ahead)
