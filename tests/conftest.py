from __future__ import annotations

import ast
import importlib
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import structlog

sys.path.insert(0, str(Path(__file__).parent))

import gpu_memory
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


# The GPU suite's memory (tests/gpu_memory.py). Each GPU test has a peak estimate; one too large for
# the card beside the other workers skips, saying so. Under `bash .ci/device/gpu-suite`, whose plan
# sets the variables below, a test starts only when it fits (the gate), the largest first, and what
# it really held is recorded.

GPU_STATE = os.environ.get("REFINERY_GPU_STATE", "")
"""The suite's own folder (the gate's ledger, the tests' records); unset outside the suite."""
GPU_PEAKS = os.environ.get("REFINERY_GPU_PEAKS", "")
"""Where the suite's gpu_peaks.json is written when the session ends."""
ESTIMATE = pytest.StashKey[float]()


def gpu_plan() -> tuple[gpu_memory.Plan, str] | None:
    """The suite's plan (from its variables), else one for this card and this run's workers; None
    without a GPU."""
    usable = os.environ.get("REFINERY_GPU_USABLE_GIB")
    if usable:
        workers = int(os.environ.get("REFINERY_GPU_WORKERS", "1"))
        return gpu_memory.Plan(workers=workers, usable_gib=float(usable)), os.environ.get("REFINERY_GPU_CARD", "this card")
    card = gpu_memory.read_card()
    if card is None:
        return None
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return gpu_memory.Plan(workers=workers, usable_gib=card.free_gib - gpu_memory.margin_gib(card.total_gib)), card.describe()


def gpu_gate() -> gpu_memory.MemoryGate | None:
    usable = os.environ.get("REFINERY_GPU_USABLE_GIB")
    if not GPU_STATE or not usable:
        return None
    return gpu_memory.MemoryGate(Path(GPU_STATE) / "ledger.json", budget_gib=float(usable))


@pytest.hookimpl(trylast=True)  # after `-m` and `-k` have deselected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    unsized = [item.nodeid for item in gpu if gpu_memory.estimate(item.nodeid) is None]
    if unsized:
        raise pytest.UsageError(f"GPU tests without a peak estimate in tests/gpu_memory.py (PEAKS): {', '.join(unsized)}")
    planned = gpu_plan()
    for item in gpu:
        found = gpu_memory.estimate(item.nodeid)
        assert found is not None
        item.stash[ESTIMATE] = found[0]
        why = gpu_memory.too_large(found[0], *planned) if planned else None
        if why:
            item.add_marker(pytest.mark.skip(reason=why))
    if gpu_gate() is not None:
        # The large ones first: they run one or two at a time, so the suite's length is theirs; the
        # small ones fill in beside them, in their modules' order (a stable sort, small ones alike).
        items.sort(key=_large_first)


def _large_first(item: pytest.Item) -> float:
    gib = item.stash.get(ESTIMATE, 0.0)
    return -gib if gib > 2 * gpu_memory.SMALL_GIB else 0.0


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[object]:
    """A GPU test under the suite: held at the gate until it fits, its real peak sampled meanwhile."""
    gate = gpu_gate()
    gib = item.stash.get(ESTIMATE, None)
    if gate is None or gib is None or item.get_closest_marker("skip"):
        return (yield)
    if item.get_closest_marker("alone"):
        # Its figures are timings that nothing else may share the machine with: it waits until
        # every other worker is idle, and holds all the room while it runs.
        planned = gpu_plan()
        gib = max(gib, planned[0].capacity_gib if planned else gib)
    waited = gate.acquire(gib, item.nodeid)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()
    sampler = gpu_memory.PeakSampler().start()
    started = time.monotonic()
    try:
        return (yield)
    finally:
        sampler.stop()
        gate.release()
        torch = sys.modules.get("torch")
        in_test = torch.cuda.max_memory_allocated() / gpu_memory.GIB if torch is not None and torch.cuda.is_initialized() else None
        record = {
            "test": item.nodeid,
            "estimate_gib": gib,
            "peak_gib": sampler.peak_gib if sampler.samples else None,
            "by_process_gib": sampler.by_role,
            "test_process_torch_max_allocated_gib": None if in_test is None else round(in_test, 2),
            "card_used_max_gib": sampler.card_used_gib if sampler.samples else None,
            "samples": sampler.samples,
            "sampler_error": sampler.error,
            "waited_s": round(waited, 1),
            "seconds": round(time.monotonic() - started, 1),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        }
        gpu_memory.append_line(Path(GPU_STATE) / "peaks.jsonl", record)


def pytest_sessionfinish(session: pytest.Session) -> None:
    gate = gpu_gate()
    if gate is not None:
        gate.leave()
    controller = not hasattr(session.config, "workerinput")
    if controller and GPU_STATE and GPU_PEAKS:
        planned = gpu_plan()
        header = {
            "card": os.environ.get("REFINERY_GPU_CARD"),
            "workers": planned[0].workers if planned else None,
            "usable_gib": planned[0].usable_gib if planned else None,
            "capacity_gib": round(planned[0].capacity_gib, 1) if planned else None,
            "resident_gib": gpu_memory.RESIDENT_GIB,
            "how": "peak_gib: the largest sum, over NVML's samples every 0.2 s, of the GPU memory of the test process and "
            "its descendants (judge, runners, ncu); by_process_gib: each kind's largest single process",
        }
        gpu_memory.write_peaks(Path(GPU_STATE) / "peaks.jsonl", Path(GPU_PEAKS), header)


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
