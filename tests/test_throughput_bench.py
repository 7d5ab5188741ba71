"""The throughput benchmark (benchmarks/throughput) on a CPU: its --check, its tables and JSON
on made-up numbers, the verdict mappings, and the KernelBench driver's bookkeeping with the
vendored batch functions faked (the real run needs a GPU)."""

from __future__ import annotations

import io
import json
import multiprocessing as mp
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from benchmarks.throughput import cli, kernelbench_driver, manifest, ours, report
from kernel_refinery.core.verdict import EvalStatus


def test_check_passes_on_the_shipped_manifest(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--check"]) == 0
    out = capsys.readouterr().out
    assert "ok: 12 tasks, 30 candidates" in out
    assert "the vendored KernelBench driver imports" in out


def test_manifest_lists_every_verdict_and_file() -> None:
    tasks, candidates = manifest.load()
    assert {c.expected for c in candidates} == set(manifest.EXPECTABLE)
    assert sum(c.expected == "runtime_error" for c in candidates) == 1
    assert sum(c.expected == "correct" for c in candidates) > len(candidates) / 2
    assert {t.level for t in tasks} == {1, 2}
    on_disk = {p.name for p in (manifest.ROOT / "candidates").glob("*.py")}
    assert on_disk == {Path(c.file).name for c in candidates}
    assert [c.name for c in manifest.select(candidates, "level2_76_*")] == [
        "level2_76_bias_relu_vec4",
        "level2_76_bias_relu_scalar",
        "level2_76_bias_relu_wrong_order",
    ]
    assert manifest.select(candidates, None) == candidates


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


CANDIDATE = """from torch.utils.cpp_extension import load_inline
ext = load_inline(name="{name}", cpp_sources="", functions=["f"])
class {cls}:
    pass
"""


def test_check_finds_what_is_wrong(tmp_path: Path) -> None:
    _write(tmp_path / "tasks" / "level1" / "1_a.py", "class Model: ...\ndef get_inputs(): ...\n")
    _write(tmp_path / "tasks" / "level1" / "2_b.py", "class Model: ...\ndef get_inputs(): ...\ndef get_init_inputs(): ...\n")
    _write(tmp_path / "candidates" / "a.py", CANDIDATE.format(name="same", cls="ModelNew"))
    _write(tmp_path / "candidates" / "b.py", CANDIDATE.format(name="same", cls="Other"))
    _write(tmp_path / "candidates" / "c.py", CANDIDATE.format(name="my_block_kernel", cls="ModelNew"))
    _write(
        tmp_path / "manifest.toml",
        '[[tasks]]\nkey = "level1/1_a"\n\n[[tasks]]\nkey = "level1/2_b"\n\n'
        + "".join(f'[[candidates]]\nfile = "candidates/{n}.py"\ntask = "level1/1_a"\nexpected = "correct"\n\n' for n in "abc"),
    )
    problems = "\n".join(manifest.check(tmp_path / "manifest.toml"))
    assert "task level1/1_a: does not define get_init_inputs" in problems
    assert "task level1/2_b: no candidate uses it" in problems
    assert "candidates/b.py: does not define ModelNew" in problems
    assert "extension name 'same' is also used by candidates/a.py" in problems
    assert "extension name 'my_block_kernel' contains 'lock'" in problems

    _write(
        tmp_path / "manifest.toml",
        '[[tasks]]\nkey = "level1/1_a"\n\n[[candidates]]\nfile = "x.py"\ntask = "level1/1_a"\nexpected = "fast"\n',
    )
    assert "expected verdict 'fast'" in manifest.check(tmp_path / "manifest.toml")[0]


def made_up_report() -> dict[str, Any]:
    candidates = [
        {"name": "good", "task": "level1/88_MinGPTNewGelu", "expected": "correct", "file": "candidates/good.py"},
        {"name": "wrong", "task": "level1/88_MinGPTNewGelu", "expected": "incorrect", "file": "candidates/wrong.py"},
        {"name": "fault", "task": "level1/40_LayerNorm", "expected": "runtime_error", "file": "candidates/fault.py"},
    ]
    ours_side = {
        "count": 3,
        "workers": 16,
        "wall_s": 120.0,
        "candidates_per_hour": report.per_hour(3, 120.0),
        "busy_s": 54.0,
        "busy_fraction": 0.45,
        "worker_starts": 17,
        "gpu": {"mean": 0.31, "mean_by_label": {"compiling": 0.22, "not_compiling": 0.6}},
        "results": {"good": {"verdict": "correct"}, "wrong": {"verdict": "incorrect"}, "fault": {"verdict": "runtime_error"}},
    }
    kb_side = {
        "count": 3,
        "cpu_workers": 16,
        "wall_s": 300.0,
        "compile_s": 100.0,
        "eval_s": 200.0,
        "candidates_per_hour": report.per_hour(3, 300.0),
        "gpu": {"mean": 0.12, "mean_by_label": {"compile": 0.0, "eval": 0.2}},
        "harness_errors": {},
        "results": {"good": {"verdict": "correct"}, "wrong": {"verdict": "correct"}, "fault": {"verdict": "runtime_error"}},
    }
    made = {
        "schema": report.SCHEMA,
        "host": {"gpu": "NVIDIA H200", "cpu_cores": 16},
        "candidates": candidates,
        "ours": ours_side,
        "kernelbench": kb_side,
    }
    made["ratio"] = report.ratio(made)
    return made


def rendered(made: dict[str, Any]) -> str:
    console = Console(file=io.StringIO(), width=220, color_system=None)
    report.render(made, console)
    out = console.file.getvalue()  # type: ignore[attr-defined]  # the StringIO given above
    assert isinstance(out, str)
    return out


def test_tables_on_made_up_numbers() -> None:
    made = made_up_report()
    assert made["ratio"] == pytest.approx(2.5)
    out = rendered(made)
    assert "NVIDIA H200" in out
    assert "ours: EvaluatorPool, 16 workers" in out
    assert "90" in out  # 3 candidates in 120 s
    assert "36" in out  # 3 candidates in 300 s
    assert "2.50x" in out
    assert "45%" in out  # lock held 54 of 120 s
    assert "22%" in out  # NVML while compiling
    assert "1 of 3 candidates flagged" in out
    rows = report.verdict_rows(made)
    assert [r[0] for r in rows if r[5]] == ["wrong"]


def test_one_side_and_combine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    made = made_up_report()
    only_ours = {**made, "kernelbench": None, "ratio": None}
    only_kb = {**made, "ours": None, "ratio": None}
    out = rendered(only_ours)
    assert "2.50x" not in out
    assert "–" in out  # KernelBench's column of the verdict table
    assert [r[5] for r in report.verdict_rows(only_ours)] == [False, False, False]

    (tmp_path / "ours.json").write_text(json.dumps(only_ours))
    (tmp_path / "kb.json").write_text(json.dumps(only_kb))
    assert cli.main(["--combine", str(tmp_path / "kb.json"), str(tmp_path / "ours.json"), "--out", str(tmp_path / "both.json")]) == 0
    both = json.loads((tmp_path / "both.json").read_text())
    assert both["ratio"] == pytest.approx(2.5)
    assert both["ours"]["workers"] == 16 and both["kernelbench"]["cpu_workers"] == 16
    assert "2.50x" in capsys.readouterr().out
    with pytest.raises(ValueError, match="schema"):
        report.combine([{**made, "schema": 99}])


def test_kernelbench_verdicts() -> None:
    v = kernelbench_driver.verdict
    assert v(None) == "missing"
    assert v({"compiled": True, "correctness": True, "metadata": {}}) == "correct"
    assert v({"compiled": True, "correctness": False, "metadata": {"correctness_issue": "Output mismatch"}}) == "incorrect"
    assert v({"compiled": False, "correctness": False, "metadata": {"compilation_error_name": "builtins.RuntimeError"}}) == "compile_error"
    assert v({"compiled": False, "correctness": False, "metadata": {"cuda_error": "CUDA Error: illegal memory access"}}) == "runtime_error"
    assert v({"compiled": True, "correctness": False, "metadata": {"runtime_error": "boom"}}) == "runtime_error"
    assert v({"compiled": False, "correctness": False, "metadata": {"error": "Evaluation timed out"}}) == "timeout"
    assert v({"compiled": False, "correctness": False, "metadata": {"error": "pickling"}}) == "harness_error"
    assert v({"compiled": False, "correctness": False, "metadata": {"other_error": "error: x"}}) == "runtime_error"


def test_our_verdicts_cover_every_status() -> None:
    for status in EvalStatus:
        assert ours.verdict(status) in manifest.VERDICTS
    assert ours.verdict(EvalStatus.CUDA_FAULT) == "runtime_error"
    assert ours.verdict(None) == "missing"
    config = ours.eval_config(Path("/tmp/x"))
    assert config.device == "cuda" and not config.time_compiled_reference
    assert (config.correctness_trials, config.trials) == (5, 100)  # KernelBench's num_correct_trials and num_perf_trials


def test_kernelbench_driver_lays_out_the_run_and_goes_on_after_a_raise(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's bookkeeping around the vendored calls, which are faked here (they need a GPU)."""
    import torch

    from benchmarks.kernelbench_vendor import compile as kb_compile
    from benchmarks.kernelbench_vendor import eval_from_generations as efg

    _, candidates = manifest.load()
    chosen = candidates[:3] + [c for c in candidates if c.task.key.startswith("level2/")][:2]
    work = [kernelbench_driver.Work(c.name, c.task.key, c.task.source, c.source) for c in chosen]
    calls: dict[str, Any] = {"compile": None, "eval": []}

    def fake_compile(total_work: list[tuple[int, int]], config: dict[str, Any]) -> list[bool]:
        calls["compile"] = (list(total_work), config)
        return [True] * len(total_work)

    def fake_batch_eval(total_work: list[tuple[int, int]], config: Any, dataset: Any, run_dir: str, eval_file: str) -> None:
        calls["eval"].append(list(total_work))
        for pid, sid in total_work:
            if (pid, sid) == (1, 1) and len(calls["eval"]) == 1:
                raise AttributeError("'NoneType' object has no attribute 'compiled'")  # what a None result does
            kernel = (Path(run_dir) / f"level_{config.level}_problem_{pid}_sample_{sid}_kernel.py").read_text()
            assert "class ModelNew" in kernel and "class Model(" in dataset.get_problem_by_id(pid).code
            result = efg.KernelExecResult(compiled=True, correctness=sid == 0, metadata={})
            efg.add_to_eval_results_file(pid, sid, result, eval_file)

    monkeypatch.setattr(kb_compile, "batch_compile", fake_compile)
    monkeypatch.setattr(efg, "batch_eval", fake_batch_eval)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(mp, "set_start_method", lambda *a, **k: None)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    phases: list[str] = []
    cwd = Path.cwd()

    run = kernelbench_driver.run_kernelbench(
        work, tmp_path / "kb", cpu_workers=7, gpu_arch=["Hopper"], on_phase=lambda p, _: phases.append(p)
    )

    assert Path.cwd() == cwd
    import os

    assert os.environ["TORCH_CUDA_ARCH_LIST"] == "8.0"  # set_gpu_arch's change is undone
    assert phases == ["compile", "eval"]
    total_work, config = calls["compile"]
    assert total_work == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1)]
    assert config["build_cache"] and config["num_cpu_workers"] == 7 and config["gpu_arch"] == ["Hopper"]
    assert (config["num_correct_trials"], config["num_perf_trials"], config["timeout"]) == (5, 100, 180)
    assert calls["eval"] == [total_work, total_work[2:]]
    assert run.harness_errors == {chosen[1].name: "batch_eval raised AttributeError: 'NoneType' object has no attribute 'compiled'"}
    assert set(run.results) == {c.name for c in chosen} - {chosen[1].name}
    assert kernelbench_driver.verdict(run.results[chosen[0].name]) == "correct"
    assert kernelbench_driver.verdict(run.results[chosen[2].name]) == "incorrect"
    assert run.compiled_in_cache == {c.name: True for c in chosen}


def test_a_side_run_in_parts_adds_up() -> None:
    made = made_up_report()
    kb = made["kernelbench"]
    first = {
        **kb,
        "count": 2,
        "wall_s": 200.0,
        "compile_s": 60.0,
        "eval_s": 140.0,
        "results": {k: kb["results"][k] for k in ("good", "wrong")},
    }
    second = {**kb, "count": 1, "wall_s": 100.0, "compile_s": 40.0, "eval_s": 60.0, "results": {"fault": kb["results"]["fault"]}}
    first["gpu"] = {"mean_by_label": {"eval": 0.5}, "series": [[0.0, 50, "eval"], [0.25, 0, "compile"]]}
    second["gpu"] = {"mean_by_label": {"eval": 1.0}, "series": [[0.0, 100, "eval"]]}
    parts = [{**made, "ours": None, "kernelbench": first}, {**made, "ours": None, "kernelbench": second}, {**made, "kernelbench": None}]
    both = report.combine(parts)
    side = both["kernelbench"]
    assert (side["count"], side["wall_s"], side["compile_s"], side["parts"]) == (3, 300.0, 100.0, 2)
    assert side["candidates_per_hour"] == pytest.approx(36.0)
    assert set(side["results"]) == {"good", "wrong", "fault"}
    assert side["gpu"]["mean"] == pytest.approx(0.5) and side["gpu"]["mean_by_label"]["eval"] == pytest.approx(0.75)
    assert both["ratio"] == pytest.approx(2.5)
    assert "(2 parts run apart)" in rendered(both)
    # The same candidates again: the later run replaces the earlier one.
    again = report.combine([{**made, "ours": None, "kernelbench": first}, {**made, "ours": None, "kernelbench": {**first, "wall_s": 50.0}}])
    assert again["kernelbench"]["wall_s"] == 50.0 and again["kernelbench"].get("parts", 1) == 1
