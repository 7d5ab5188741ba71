"""Temporary stand-in for tools/audit.py while it is written (same API)."""

from __future__ import annotations

import torch


def snapshot() -> dict[str, object]:
    return {"torch.get_num_threads()": torch.get_num_threads(), "mkldnn": torch.backends.mkldnn.enabled}


def changed(before: dict[str, object], after: dict[str, object]) -> list[str]:
    return [f"{k}: {before.get(k)} -> {after.get(k)}" for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)]


def install_hook(**kwargs: object) -> None:
    pass


def arm() -> None:
    pass
