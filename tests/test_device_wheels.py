"""The wheels a GPU run carries to the H200 (.ci/device/wheels.txt) are the versions this
environment installs, so the GPU suite there tests what CI tests here."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

WHEELS = Path(__file__).resolve().parents[1] / ".ci" / "device" / "wheels.txt"


def pins() -> dict[str, str]:
    lines = [line.strip() for line in WHEELS.read_text().splitlines()]
    return dict(line.split("==", 1) for line in lines if line and not line.startswith("#"))


def test_every_carried_wheel_is_the_version_installed_here() -> None:
    carried = pins()
    assert {"langgraph", "pydantic", "structlog", "fastapi"} <= carried.keys()
    differ = {}
    for name, version in carried.items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed = "not installed"
        if installed != version:
            differ[name] = f"carried {version}, here {installed}"
    assert not differ, f"update {WHEELS.name} (then run .ci/device/fetch-wheels): {differ}"
