"""EvaluatorPool's scheduling: candidates queued for a device do not hold the workers that
compiles need, and a candidate's device stages go back to the worker (runner) that compiled it.
The evaluators are fakes that record what ran where; no worker process starts."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.tools.processes.pool import EvaluatorPool
from kernel_refinery.tools.results import EvalResult, Stage

COMPILE = (Stage.STATIC, Stage.COMPILE)
DEVICE = (Stage.CORRECTNESS, Stage.TIMING)
TASK = TaskProgram(name="t", source="class Model: pass")


class FakeEvaluator:
    """Sleeps for the stage's time and records (slot, stages, start, end)."""

    def __init__(self, slot: int, log: list[tuple[int, str, float, float]], seconds: dict[str, float]):
        self.slot, self.log, self.seconds = slot, log, seconds

    def run(self, task: TaskProgram, candidate: str, stages: Sequence[Stage]) -> EvalResult:
        kind = "device" if Stage.CORRECTNESS in stages else "compile"
        started = time.monotonic()
        time.sleep(self.seconds[kind])
        self.log.append((self.slot, kind, started, time.monotonic()))
        return EvalResult(device="cpu", precision="fp32", tolerance=None, allow_tf32=False, status=None)

    def close(self) -> None:
        pass


def fake_pool(tmp_path: Path, workers: int, seconds: dict[str, float]) -> tuple[EvaluatorPool, list[tuple[int, str, float, float]]]:
    pool = EvaluatorPool(EvalConfig(device="cpu", cache_dir=tmp_path), workers=workers, devices=1)
    log: list[tuple[int, str, float, float]] = []
    for i, slot in enumerate(pool.slots):
        slot.evaluator = FakeEvaluator(i, log, seconds)  # type: ignore[assignment]  # a fake with the same run()
    return pool, log


def candidate(pool: EvaluatorPool, n: int) -> None:
    pool.run(TASK, f"candidate {n}", COMPILE)
    pool.run(TASK, f"candidate {n}", DEVICE)


def test_device_stages_go_back_to_the_worker_that_compiled_the_candidate(tmp_path: Path) -> None:
    """A runner holds one candidate: another worker would have to load it again."""
    pool, log = fake_pool(tmp_path, workers=3, seconds={"compile": 0.01, "device": 0.01})
    for n in range(4):
        candidate(pool, n)
        (compiled, _, *_), (judged, _, *_) = log[-2:]
        assert judged == compiled
    assert len(log) == 8
    assert {judge.device for judge in (d.judge for d in pool.devices)} == {"cpu"}


def test_candidates_waiting_for_the_device_leave_the_workers_to_compiles(tmp_path: Path) -> None:
    """Device stages are slow here: 6 candidates queue for the device. Before the fix each held
    a worker while it waited, so the last compiles began only as the device freed them. Now the
    two compile workers go on compiling, and all compiles end long before the device work."""
    pool, log = fake_pool(tmp_path, workers=3, seconds={"compile": 0.05, "device": 0.2})
    with ThreadPoolExecutor(6) as threads:
        list(threads.map(lambda n: candidate(pool, n), range(6)))
    compiles_end = max(end for _, kind, _, end in log if kind == "compile")
    device_start = min(start for _, kind, start, _ in log if kind == "device")
    # 6 compiles on 2 workers: 3 rounds of 0.05 s. Holding workers while queued would push the
    # last compile behind several 0.2 s device runs.
    assert compiles_end - device_start < 0.3, f"compiles ended {compiles_end - device_start:.2f} s after the device began"


def test_a_single_worker_serves_every_stage(tmp_path: Path) -> None:
    pool, log = fake_pool(tmp_path, workers=1, seconds={"compile": 0.01, "device": 0.01})
    done = threading.Event()
    threading.Thread(target=lambda: (candidate(pool, 0), done.set()), daemon=True).start()
    assert done.wait(10), "one worker that is also the device's deadlocked"
    assert [(slot, kind) for slot, kind, *_ in log] == [(0, "compile"), (0, "device")]


def test_on_cpu_no_compile_runs_while_a_device_stage_does() -> None:
    """QuietCpu: compiles share it; a device stage waits for running compiles, holds new ones
    back while it runs, and goes before compiles that came after it."""
    import threading

    from kernel_refinery.tools.processes.pool import QuietCpu

    quiet = QuietCpu()
    events: list[str] = []
    compiling, release_compile, timing_waits = threading.Event(), threading.Event(), threading.Event()

    def compile_(name: str, hold: threading.Event | None = None) -> None:
        with quiet.shared():
            events.append(f"{name} start")
            if hold is not None:
                compiling.set()
                hold.wait(10)
            events.append(f"{name} end")

    def timing() -> None:
        timing_waits.set()
        with quiet.exclusive():
            events.append("timing start")
            events.append("timing end")

    first = threading.Thread(target=compile_, args=("compile 1", release_compile))
    first.start()
    assert compiling.wait(10)
    device = threading.Thread(target=timing)
    device.start()
    assert timing_waits.wait(10)
    time.sleep(0.2)  # the timing now waits for compile 1
    late = threading.Thread(target=compile_, args=("compile 2",))
    late.start()
    time.sleep(0.2)  # compile 2 waits behind the timing
    assert events == ["compile 1 start"]
    release_compile.set()
    for thread in (first, device, late):
        thread.join(10)
    assert events == ["compile 1 start", "compile 1 end", "timing start", "timing end", "compile 2 start", "compile 2 end"]
