"""Seconds each step of a process's start took, for the log line that says it is ready: where a
cold evaluation's seconds go (the judge's, the template's and a runner's starts overlap)."""

from __future__ import annotations

import os
import time

STARTED_AT = "REFINERY_STARTED_AT"
"""The wall-clock time at which the parent asked for the process, in its environment: a fork's
creation time in /proc counts from a boot time rounded to the second."""


def started_at() -> dict[str, str]:
    return {STARTED_AT: repr(time.time())}


class StartSteps:
    """`mark(name)` records the seconds since the previous mark (the first: since the parent asked
    for the process, when it said so in the environment)."""

    def __init__(self) -> None:
        self._last = time.perf_counter()
        self.seconds: dict[str, float] = {}
        with_start = os.environ.get(STARTED_AT)
        if with_start:
            self.seconds["interpreter_and_imports"] = round(max(0.0, time.time() - float(with_start)), 3)

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(now - self._last, 3)
        self._last = now
