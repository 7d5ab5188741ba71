from __future__ import annotations

import ast
import importlib
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import structlog

sys.path.insert(0, str(Path(__file__).parent))

from candidates import task_source

from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.processes.jobs import TaskProgram

TESTS = Path(__file__).parent

OPTIONAL_STACKS: dict[str, tuple[str, tuple[str, ...]]] = {
    "test_serve.py": ("the serve extra: pip install 'kernel-refinery[serve]'", ("bench/serve",)),
}
"""Test modules that exercise an optional extra: what installs it, and the project's folders whose
imports the module needs besides its own (test_serve.py starts `refinery serve`, bench/serve/).
Where one of those imports fails here (the extra, or a module it needs, is missing: the GPU image
once lacked fastapi's opentelemetry), the module is skipped, naming the module that is missing,
instead of an import error that stops the whole run."""


def third_party_imports(paths: Iterable[Path]) -> list[str]:
    """Every module the Python files at `paths` (files, or folders of them) import, anywhere in them,
    that is neither the standard library's, the project's, nor one of the tests' own helpers."""
    own = {"kernel_refinery", "benchmarks", "__future__", *(p.stem for p in TESTS.glob("*.py"))}
    names: set[str] = set()
    for path in paths:
        for file in sorted(path.glob("*.py")) if path.is_dir() else [path]:
            for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names.update(alias.name for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module)
    return sorted(n for n in names if n.split(".")[0] not in own and n.split(".")[0] not in sys.stdlib_module_names)


class NeedsOptionalStack(pytest.Module):
    """A test module of OPTIONAL_STACKS: skipped, with the missing module named, where an import it or
    the code it exercises makes fails."""

    def collect(self) -> Iterable[pytest.Item | pytest.Collector]:
        extra, folders = OPTIONAL_STACKS[self.path.name]
        for name in third_party_imports([self.path, *(TESTS.parent / f for f in folders)]):
            try:
                importlib.import_module(name)
            except ImportError as exc:
                missing = exc.name or name
                via = "" if missing == name else f" (needed by {name})"
                pytest.skip(f"{self.path.name}: no module {missing!r} here{via}; {extra} ({exc})")
        return super().collect()


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    if module_path.parent == TESTS and module_path.name in OPTIONAL_STACKS:
        return NeedsOptionalStack.from_parent(parent, path=module_path)
    return None


@pytest.fixture(autouse=True)
def restore_structlog() -> Iterator[None]:
    """The CLI commands point structlog at the CliRunner's stderr, closed after each invoke: no
    later test may log there."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build cache for the session: the shared test kernels compile once.

    REFINERY_CACHE_DIR shares it with other runs (the GPU check reuses the tests' builds)."""
    override = os.environ.get("REFINERY_CACHE_DIR")
    return Path(override) if override else tmp_path_factory.mktemp("refinery-cache")


@pytest.fixture(scope="session")
def cpu_config(cache_dir: Path) -> EvalConfig:
    return EvalConfig(device="cpu", trials=10, warmup=1, time_compiled_reference=False, cache_dir=cache_dir, cpu_threads=1)


@pytest.fixture(scope="session")
def relu_task() -> TaskProgram:
    return TaskProgram(name="relu", source=task_source("relu_task"))


@pytest.fixture(scope="session")
def small_relu_task() -> TaskProgram:
    return TaskProgram(name="small_relu", source=task_source("small_relu_task"))
