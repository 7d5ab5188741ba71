"""The wheels a GPU run carries to the H200 (.ci/device/wheels.txt) bring every direct requirement
that the device image lacks, each at a version pyproject.toml allows."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".ci" / "device" / "wheels.txt"

# Direct requirements (the core, and the serve and kernelguard extras that the GPU tests and the serve
# benchmark use) missing from the H200 image's package list (the device library's KINDS.md, read
# 2026-11-17). The image has the rest: torch, numpy, typer, rich, psutil, jinja2, httpx and so on.
NOT_IN_THE_IMAGE = (
    "langgraph",
    "langgraph-checkpoint-sqlite",
    "langchain-openai",
    "langchain-core",
    "tenacity",
    "structlog",
    "pydantic",
    "fastapi",
    "uvicorn",
    "kernelguard",
)


def carried() -> dict[str, Version]:
    lines = [line.strip() for line in WHEELS.read_text().splitlines()]
    pins = (line.split("==", 1) for line in lines if line and not line.startswith("#"))
    return {canonicalize_name(name): Version(version) for name, version in pins}


def requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    specs = [*project["dependencies"], *extras["serve"], *extras["kernelguard"]]
    return {canonicalize_name(req.name): req for req in map(Requirement, specs)}


def test_every_direct_requirement_the_image_lacks_is_carried() -> None:
    required = requirements()
    assert set(NOT_IN_THE_IMAGE) <= required.keys(), "a name here is no longer a requirement"
    missing = sorted(set(NOT_IN_THE_IMAGE) - carried().keys())
    assert not missing, f"add to {WHEELS.name}, then run .ci/device/fetch-wheels: {missing}"


def test_every_carried_wheel_satisfies_the_projects_requirement() -> None:
    required = requirements()
    outside = {
        name: f"carried {version}, pyproject wants {required[name].specifier}"
        for name, version in carried().items()
        if name in required and not required[name].specifier.contains(version, prereleases=True)
    }
    assert not outside, f"update {WHEELS.name}, then run .ci/device/fetch-wheels: {outside}"
