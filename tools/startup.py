"""Seconds each step of a process's start took, for the log line that says it is ready: where a
cold evaluation's seconds go (the judge's, the template's and a runner's starts overlap)."""

from __future__ import annotations

import time

import psutil


class StartSteps:
    """`mark(name)` records the seconds since the previous mark (the first: since the process began)."""

    def __init__(self) -> None:
        self._last = time.perf_counter()
        began = psutil.Process().create_time()
        self.seconds: dict[str, float] = {"interpreter_and_imports": round(max(0.0, time.time() - began), 3)}

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(now - self._last, 3)
        self._last = now
