"""A stand-in for `tqdm.tqdm`, used by the vendored modules only where tqdm is not installed.

Not part of KernelBench: it prints a line per tenth of the work instead of a progress bar, and
supports what the vendored code calls (a context manager with `update`, or an iterable).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sized
from typing import Any, Self


class tqdm:
    def __init__(self, iterable: Any = None, total: int | None = None, desc: str | None = None, **_: Any):
        self.iterable = iterable
        self.total = len(iterable) if total is None and isinstance(iterable, Sized) else total
        self.desc = desc or "progress"
        self.n = 0
        self._shown = -1

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Any]:
        assert self.iterable is not None
        for item in self.iterable:
            yield item
            self.update(1)

    def update(self, n: int = 1) -> None:
        self.n += n
        if not self.total:
            return
        tenth = 10 * self.n // self.total
        if tenth != self._shown:
            self._shown = tenth
            print(f"{self.desc}: {self.n}/{self.total}", file=sys.stderr, flush=True)

    def close(self) -> None:
        pass
