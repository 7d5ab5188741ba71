"""The run manifest: collected on this machine, written and read back, kept by every experiment and
`refinery eval --json`, shown by the reports, and what `report --compare` warns about."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Self

import pytest
from cli_runner import run_cli

from kernel_refinery.bench.experiment import ExperimentConfig, TrajectoryRecord, TurnOutcome, prepare_run_dir
from kernel_refinery.bench.provenance import collect_manifest, sha256_of
from kernel_refinery.core.errors import RunDirError
from kernel_refinery.core.numerics import Precision
from kernel_refinery.core.verdict import EvalStatus, Verdict
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.results import EvalResult
from kernel_refinery.traces.manifest import RunManifest, differences, manifest_path, read_manifest, write_manifest
from kernel_refinery.traces.schema import TrajectoryId, TurnRecord
from kernel_refinery.traces.store import append_turn

ROOT = Path(__file__).parent.parent
RELU = ROOT / "bench" / "suites" / "builtin" / "level1" / "1_relu.py"
SOLUTION = Path(__file__).parent / "fixtures" / "cpu_solutions" / "1_relu.py"


refinery = partial(run_cli, columns=400)  # the "measured:" line is one line however long: 203 characters on a CI VM


@pytest.fixture(scope="module")
def manifest() -> RunManifest:
    return collect_manifest(EvalConfig(trials=7, cpu_threads=1), [("level1/1_relu", RELU)])


def test_this_machines_manifest_is_written_and_read_back(manifest: RunManifest, tmp_path: Path) -> None:
    assert manifest.source.commit is not None and len(manifest.source.commit) == 40, "the tests run in a git checkout"
    assert manifest.software.torch and manifest.software.python.count(".") == 2
    assert "c++ (run)" in manifest.software.compilers
    assert manifest.device.kind == "cpu" and manifest.device.cores_used == 1 and manifest.device.name
    assert (manifest.eval.trials, manifest.eval.precision, manifest.eval.tolerance, manifest.eval.timing) == (7, "fp32", 1e-4, "judge")
    assert manifest.tasks[0].sha256 == sha256_of(RELU)
    assert read_manifest(tmp_path) is None, "a run from before manifests has none"
    write_manifest(tmp_path, manifest)
    assert read_manifest(tmp_path) == manifest
    line = manifest.summary()
    assert line.startswith(f"commit {manifest.source.commit[:10]}") and f"torch {manifest.software.torch}" in line and "fp32" in line
    # A damaged manifest is a user error naming the file and what to do.
    manifest_path(tmp_path).write_text('{"schema_version": 1, "host": 3}')
    with pytest.raises(RunDirError, match=r"manifest.json is not a run manifest .*delete it"):
        read_manifest(tmp_path)
    manifest_path(tmp_path).write_text('{"schema_version": 99}')
    with pytest.raises(RunDirError, match="newer than this kernel-refinery"):
        read_manifest(tmp_path)


def test_differences_name_what_differs_and_leave_out_seeds_and_hosts(manifest: RunManifest) -> None:
    other = manifest.model_copy(
        update={
            "host": "elsewhere",
            "created_at": "2020-01-01T00:00:00+00:00",
            "device": manifest.device.model_copy(update={"name": "Other CPU", "cores_used": 64}),
            "eval": manifest.eval.model_copy(update={"seed": 7, "trials": 100}),
            "tasks": (manifest.tasks[0].model_copy(update={"sha256": "0" * 64}),),
        }
    )
    found = {d.field: (d.a, d.b) for d in differences(manifest, other)}
    assert found == {
        "device.cores_used": ("1", "64"),
        "device.name": (manifest.device.name, "Other CPU"),
        "eval.trials": ("7", "100"),
        "tasks.level1/1_relu": (f"sha256 {manifest.tasks[0].sha256[:12]}", "sha256 000000000000"),
    }
    assert differences(manifest, manifest.model_copy(update={"host": "x", "eval": manifest.eval.model_copy(update={"seed": 1})})) == []


def test_an_experiment_keeps_its_manifest_and_the_one_before_a_change(tmp_path: Path) -> None:
    config = ExperimentConfig(tasks="1_relu", variants=["G"], llm={"model": "scripted:x.json"}, eval={"trials": 9})
    assert prepare_run_dir(tmp_path, config) == []
    first = read_manifest(tmp_path)
    assert first is not None and first.eval.trials == 9 and [t.key for t in first.tasks] == ["level1/1_relu"]
    assert prepare_run_dir(tmp_path, config) == [], "resumed on the same machine: nothing differs"
    bf16 = config.model_copy(update={"eval": config.eval.model_copy(update={"precision": Precision.BF16})})
    changed = prepare_run_dir(tmp_path, bf16)
    assert {d.field for d in changed} == {"eval.precision", "eval.tolerance"}
    (kept,) = tmp_path.glob("manifest-before-*.json")
    assert RunManifest.model_validate_json(kept.read_text()).eval.precision == "fp32"
    now = read_manifest(tmp_path)
    assert now is not None and now.eval.precision == "bf16"


class FixedEvaluator:
    """Stands in for the evaluator: `refinery eval --json` is checked without compiling anything."""

    def __init__(self, config: EvalConfig, *args: object, **kwargs: object) -> None:
        self.config = config

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def evaluate(self, task: object, candidate: str) -> EvalResult:
        return EvalResult(status=EvalStatus.INCORRECT, message="wrong at [0]")


def test_eval_json_carries_the_manifest(monkeypatch: pytest.MonkeyPatch) -> None:
    import kernel_refinery.tools.evaluator

    monkeypatch.setattr(kernel_refinery.tools.evaluator, "Evaluator", FixedEvaluator)
    result = refinery("eval", RELU, SOLUTION, "--json", "--precision", "fp16")
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["status"] == "incorrect", "the result's fields stay where they were"
    manifest = RunManifest.model_validate(data["manifest"])
    assert (manifest.eval.trials, manifest.eval.precision, manifest.eval.tolerance) == (EvalConfig().trials, "fp16", 1e-2)
    assert manifest.tasks[0].key == "level1/1_relu" and manifest.tasks[0].sha256 == sha256_of(RELU)


def record(task: str, speedup: float) -> TrajectoryRecord:
    return TrajectoryRecord(
        task=task,
        level=1,
        variant="G",
        sample=0,
        best_status=Verdict.CORRECT,
        best_speedup=speedup,
        best_turn=1,
        turns=1,
        compiled=True,
        tokens=10,
        per_turn=(TurnOutcome(status=Verdict.CORRECT, speedup=speedup),),
    )


def a_run(directory: Path, manifest: RunManifest | None, speedup: float) -> Path:
    directory.mkdir()
    lines = [record(f"level1/t{i}", speedup).model_dump_json() for i in range(3)]
    (directory / "results.jsonl").write_text("\n".join(lines) + "\n")
    if manifest is not None:
        write_manifest(directory, manifest)
    return directory


def test_reports_show_the_manifest_and_compare_warns_across_machines(manifest: RunManifest, tmp_path: Path) -> None:
    a = a_run(tmp_path / "a", manifest, 1.5)
    elsewhere = manifest.model_copy(update={"device": manifest.device.model_copy(update={"name": "Other CPU"})})
    b = a_run(tmp_path / "b", elsewhere, 2.0)
    shown = refinery("report", a, "--no-plots")
    assert shown.exit_code == 0, shown.output
    assert f"measured: {manifest.summary()}" in shown.output
    saved = json.loads((a / "report.json").read_text())
    assert RunManifest.model_validate(saved["manifest"]) == manifest and saved["groups"][0]["tasks"] == 3

    compared = refinery("report", "--compare", a, b)
    assert compared.exit_code == 0, compared.output
    assert "warning: A and B were measured differently" in compared.output
    assert f"device.name: {manifest.device.name} vs Other CPU" in compared.output
    same = refinery("report", "--compare", a, a)
    assert "measured differently" not in same.output
    old = a_run(tmp_path / "old", None, 1.0)
    unknown = refinery("report", "--compare", a, old)
    assert f"{old} has no manifest.json" in unknown.output and "measured differently" not in unknown.output
    assert "measured: no manifest.json" in refinery("report", old, "--no-plots").output


def test_the_html_report_heads_with_the_manifest(manifest: RunManifest, tmp_path: Path) -> None:
    turn = TurnRecord(
        run_id="r",
        trajectory=TrajectoryId(task="level1/1_relu", variant="G"),
        turn=1,
        model="scripted",
        messages=(),
        reply="no code",
        started_at="2026-01-01T00:00:00",
    )
    append_turn(tmp_path, turn)
    result = refinery("traces", "html", tmp_path)
    assert result.exit_code == 0, result.output
    assert "measured: no manifest.json" in (tmp_path / "report.html").read_text()
    write_manifest(tmp_path, manifest)
    assert refinery("traces", "html", tmp_path).exit_code == 0
    page = (tmp_path / "report.html").read_text()
    assert manifest.source.commit is not None
    assert f"commit {manifest.source.commit[:10]}" in page and f"torch {manifest.software.torch}" in page


def test_run_and_experiment_write_the_manifest_and_a_resume_elsewhere_says_so(tmp_path: Path) -> None:
    """Replies without code: nothing is compiled, the commands still keep their manifest."""
    script = tmp_path / "script.json"
    script.write_text('["no code here"]')
    run = refinery("run", "--task", RELU, "--model", f"scripted:{script}", "--turns", "1", "--run-dir", tmp_path / "one")
    assert run.exit_code == 0, run.output
    written = read_manifest(tmp_path / "one")
    assert written is not None and [t.key for t in written.tasks] == ["level1/1_relu"]

    experiment = ["experiment", "--tasks", "1_relu", "--variants", "G", "--turns", "1", "--model", f"scripted:{script}"]
    first = refinery(*experiment, "--run-dir", tmp_path / "many")
    assert first.exit_code == 0, first.output
    assert "measured: commit" in first.output and "was run before" not in first.output
    second = refinery(*experiment, "--run-dir", tmp_path / "many", "--precision", "bf16")
    assert second.exit_code == 0, second.output
    assert "was run before with other facts (eval.precision: fp32 vs bf16; eval.tolerance: 0.0001 vs 0.01" in second.output
    assert len(list((tmp_path / "many").glob("manifest-before-*.json"))) == 1
