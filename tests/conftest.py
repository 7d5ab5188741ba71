from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

sys.path.insert(0, str(Path(__file__).parent))

from candidates import task_source

from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.processes.jobs import TaskProgram

# test_serve.py imports the serve extra's server stack (FastAPI, Starlette) at its top. Where the
# extra is absent (the H200 image, which carries only the agent stack) the module is left out of
# collection instead of an import error that stops the whole run; `make setup` installs the extra.
collect_ignore = [] if importlib.util.find_spec("fastapi") else ["test_serve.py"]


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
