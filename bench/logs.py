"""structlog set-up for the command line: key=value events on stderr, with secrets masked."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

_SECRET_VALUE = re.compile(r"(sk-[A-Za-z0-9_\-]{8,}|Bearer\s+\S+|(?i:api[_-]?key)[=:]\s*\S+)")


def redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Mask anything shaped like a key or an authorization header, wherever it appears."""
    for key, value in list(event.items()):
        if isinstance(value, str) and _SECRET_VALUE.search(value):
            event[key] = _SECRET_VALUE.sub("[redacted]", value)
    return event


class _CurrentStderr:
    """Whatever sys.stderr is when a line is written: a caller that swaps it for a while (a test
    runner, a CLI test's CliRunner, which then closes it) must not leave the logs writing there."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(quiet: bool = False, level: int = logging.INFO) -> None:
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="%H:%M:%S"),
            redact,
            structlog.processors.KeyValueRenderer(key_order=["timestamp", "level", "event"], drop_missing=True),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING if quiet else level),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]  # a file-like proxy
        cache_logger_on_first_use=False,
    )
    # httpx logs every request line at INFO; keep them out of what a person watches.
    logging.getLogger("httpx").setLevel(logging.WARNING)
