"""Every path a benchmark module names at import time exists in the repository.

The benchmarks read the tests' fixtures, the prompts' examples and KernelBench's tasks by path, and
they run only by hand (on the H200, or for minutes on CPU), so no other test imports most of them.
When issue 27 moved them from bench/perf/ to benchmarks/, five kept counting parents from their old
depth and pointed above the repository; nothing failed until someone ran one. This test imports
each module and follows every module-level value (through tuples, lists and dicts) to its paths.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from pathlib import Path

import pytest

import benchmarks
from benchmarks import REPO_ROOT


def benchmark_modules() -> list[str]:
    names = [
        info.name
        for info in pkgutil.walk_packages(benchmarks.__path__, prefix="benchmarks.")
        if ".kernelbench_vendor" not in info.name  # KernelBench's own files, vendored as they are
    ]
    return sorted(names)


def paths_in(value: object, depth: int = 0) -> Iterator[Path]:
    if isinstance(value, Path):
        yield value
    elif depth < 4 and isinstance(value, tuple | list | set | frozenset):
        for item in value:
            yield from paths_in(item, depth + 1)
    elif depth < 4 and isinstance(value, dict):
        for item in (*value.keys(), *value.values()):
            yield from paths_in(item, depth + 1)


def test_repo_root_is_the_repository() -> None:
    assert (REPO_ROOT / "pyproject.toml").is_file()
    assert (REPO_ROOT / "benchmarks" / "__init__.py").is_file()


@pytest.mark.parametrize("name", benchmark_modules())
def test_every_path_a_benchmark_names_exists(name: str) -> None:
    module = importlib.import_module(name)
    named = [
        (attr, path) for attr, value in vars(module).items() if not attr.startswith("__") for path in paths_in(value) if path.is_absolute()
    ]
    missing = [f"{name}.{attr} = {path}" for attr, path in named if not path.exists()]
    assert not missing, "benchmark paths that point nowhere:\n" + "\n".join(missing)
    outside = [f"{name}.{attr} = {path}" for attr, path in named if not path.resolve().is_relative_to(REPO_ROOT)]
    assert not outside, "benchmark paths outside the repository:\n" + "\n".join(outside)
