"""Reference baselines on disk: a new judge reuses one only after re-timing the reference agrees with it.

Each test runs real workers and names the path that fired in the report's `reference_source`.
The task's reference sleeps 10 ms per call, so its time barely moves with the load of this machine
and the spot check's verdict is decided by the test, not by the scheduler; every test has a task
of its own (a nonce in its source), and the module a baseline folder of its own (the builds stay in
the shared cache), so no file is shared between tests, with earlier runs or with other tests'
judges (other pytest workers, a shared REFINERY_CACHE_DIR).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from candidates import candidate

from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.evaluator import Evaluator
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.tools.processes.programs import source_hash
from kernel_refinery.tools.processes.worker import Judge
from kernel_refinery.tools.results import Stage, TimingReport
from kernel_refinery.tools.steps.baseline_cache import StoredBaseline

SLEEPY_TASK = """# {nonce}
import time

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        time.sleep(0.01)
        return torch.relu(x)


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return []
"""

# Any precision: the shared kernel reads float32.
CANDIDATE = candidate("return ext.relu_fwd(x.float()).to(x.dtype)")
TAGS = ("cached", "trials", "precision", "source", "doctored", "remeasure", "corrupt")


@pytest.fixture(scope="module")
def config(cpu_config: EvalConfig, tmp_path_factory: pytest.TempPathFactory) -> EvalConfig:
    # 5 trials keep every file small and quick; the 10 ms reference is far from any speed-up worth re-verifying.
    baselines = tmp_path_factory.mktemp("baselines")
    return cpu_config.model_copy(
        update={"trials": 5, "warmup": 1, "reverify_speedup": 1e9, "baseline_cache": True, "baseline_dir": baselines}
    )


@pytest.fixture(scope="module")
def tasks() -> dict[str, TaskProgram]:
    return {tag: TaskProgram(name=f"sleepy_{tag}", source=SLEEPY_TASK.format(nonce=uuid.uuid4())) for tag in TAGS}


@pytest.fixture(scope="module")
def first(config: EvalConfig, tasks: dict[str, TaskProgram]) -> Iterator[Judge]:
    """The judge that measures every test's task once, and so stores its baseline."""
    with Evaluator(config) as ev:
        for task in tasks.values():
            assert timed(ev, task).reference_source == "measured", "a task never seen is measured"
        yield ev.judge


@pytest.fixture(scope="module")
def second(config: EvalConfig, first: Judge) -> Iterator[Judge]:
    """A new judge process: its memory holds no baseline, so any it reuses came from disk.

    Every test gives it a task of its own, so one process serves them all (fewer starts on a slow machine)."""
    judge = Judge(device="cpu", threads=config.cpu_threads)
    yield judge
    judge.close()
    assert judge.starts == 1, "the judge was never restarted: no test lost its memory"


def timed(ev: Evaluator, task: TaskProgram) -> TimingReport:
    result = ev.run(task, CANDIDATE, (Stage.TIMING,))
    assert result.status is None and result.timing is not None, result.message
    return result.timing


def timed_once(config: EvalConfig, judge: Judge, task: TaskProgram) -> TimingReport:
    """One timing through a new runner and the given judge, the runner and its template closed after."""
    with Evaluator(config, judge=judge) as ev:
        return timed(ev, task)


def stored_file(config: EvalConfig, task: TaskProgram) -> Path:
    """The one file of this task at this trials and precision."""
    found = []
    for path in config.baseline_root.glob("*.json"):
        try:
            setting = StoredBaseline.model_validate_json(path.read_text()).setting
        except ValueError:  # another test's corrupt file
            continue
        if setting["worker_key"][0] == source_hash(task.source) and (setting["trials"], setting["precision"]) == (
            config.trials,
            config.precision,
        ):
            found.append(path)
    assert len(found) == 1, found
    return found[0]


def test_a_new_worker_uses_the_stored_baseline_after_a_spot_check(config: EvalConfig, tasks: dict[str, TaskProgram], second: Judge) -> None:
    stored = StoredBaseline.model_validate_json(stored_file(config, tasks["cached"]).read_text())
    report = timed_once(config, second, tasks["cached"])
    assert report.reference_source == "cached", (
        f"path: disk hit, spot check agreed (stored {stored.reference.median}, spot {report.reference_spot_ms})"
    )
    assert report.reference.median == stored.reference.median
    assert report.reference_spot_ms is not None and report.reference_spot_ms == pytest.approx(stored.reference.median, rel=0.1)
    assert report.speedup == pytest.approx(stored.reference.median / report.candidate.median)


def test_the_files_are_in_the_folder_baseline_dir_names(config: EvalConfig, tasks: dict[str, TaskProgram], first: Judge) -> None:
    """The judge keeps the baselines where the config says; by default beside the builds."""
    assert config.baseline_dir is not None and config.baseline_root == config.baseline_dir
    assert stored_file(config, tasks["cached"]).parent == config.baseline_dir
    shared = config.cache_dir / "baselines"
    assert not any(shared.glob(f"{stored_file(config, tasks['cached']).name}")), "none of this module's files in the shared folder"
    assert EvalConfig(cache_dir=config.cache_dir).baseline_root == shared


@pytest.mark.parametrize("change", ["trials", "precision", "source"])
def test_a_changed_setting_or_task_is_a_miss(config: EvalConfig, tasks: dict[str, TaskProgram], first: Judge, change: str) -> None:
    task = tasks[change]
    if change == "trials":
        config = config.model_copy(update={"trials": config.trials + 1})
    elif change == "precision":
        config = config.model_copy(update={"precision": "bf16"})
    else:
        task = TaskProgram(name=task.name, source=task.source + "\n# the same Model, another source\n")
    # The first worker's memory misses as well (its key holds the same), so the disk decides; and the
    # sleeping reference would pass the spot check: only the key keeps the stored file out.
    report = timed_once(config, first, task)
    assert report.reference_source == "measured", f"path: miss, {change} is part of the key"
    assert report.reference_spot_ms is None
    stored_file(config, task)  # stored under its own key


def test_a_stored_median_far_off_fails_the_spot_check_and_is_replaced(
    config: EvalConfig, tasks: dict[str, TaskProgram], second: Judge
) -> None:
    path = stored_file(config, tasks["doctored"])
    data = json.loads(path.read_text())
    for field in ("median", "mean", "std", "min", "max"):
        data["reference"][field] *= 10
    data["reference_samples_ms"] = [10 * s for s in data["reference_samples_ms"]]
    path.write_text(json.dumps(data))
    doctored = data["reference"]["median"]
    report = timed_once(config, second, tasks["doctored"])
    assert report.reference_source == "remeasured", "path: disk hit, two spot checks in quiet disagreed, measured again"
    assert "disagreed with two spot checks in quiet" in report.note, report.note
    assert report.reference_spot_ms is not None and report.reference_spot_ms < doctored / 5, "the spot checks ran, and saw the truth"
    assert report.reference.median < doctored / 5
    rewritten = StoredBaseline.model_validate_json(path.read_text())
    assert rewritten.reference.median == report.reference.median, "the file holds the new measurement"


def test_remeasure_baselines_measures_and_overwrites(config: EvalConfig, tasks: dict[str, TaskProgram], second: Judge) -> None:
    path = stored_file(config, tasks["remeasure"])
    before = StoredBaseline.model_validate_json(path.read_text())
    report = timed_once(config.model_copy(update={"remeasure_baselines": True}), second, tasks["remeasure"])
    assert report.reference_source == "measured" and report.reference_spot_ms is None, "path: remeasure_baselines, the file is not read"
    after = StoredBaseline.model_validate_json(path.read_text())
    assert after.measured_at > before.measured_at and after.reference.median == report.reference.median


def test_a_corrupt_file_is_a_miss(config: EvalConfig, tasks: dict[str, TaskProgram], second: Judge) -> None:
    path = stored_file(config, tasks["corrupt"])
    path.write_text('{"format": 1, "key": "trunc')
    report = timed_once(config, second, tasks["corrupt"])
    assert report.reference_source == "measured" and report.reference_spot_ms is None, "path: corrupt file, a miss"
    assert StoredBaseline.model_validate_json(path.read_text()).reference.median == report.reference.median, "and rewritten whole"
