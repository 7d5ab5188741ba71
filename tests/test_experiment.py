"""Experiments on the built-in CPU suite with a scripted model: parallel, killed, resumed, scored."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from kernel_refinery.bench.experiment import (
    RESULTS_SCHEMA_VERSION,
    ExperimentConfig,
    TrajectoryRecord,
    TurnOutcome,
    read_results,
    run_experiment,
)
from kernel_refinery.bench.report import render_by_turn, score
from kernel_refinery.core.errors import RunDirError
from kernel_refinery.core.verdict import Verdict
from kernel_refinery.tools.processes.pool import EvaluatorPool
from kernel_refinery.traces.schema import TrajectoryId

SOLUTIONS = Path(__file__).parent / "fixtures" / "cpu_solutions"
TASKS = "1_relu,2_gelu,9_bias_tanh_clamp_chain"


def fence(code: str) -> str:
    return f"My kernel:\n```python\n{code}```\n"


def script() -> dict[str, list[str]]:
    slow = (SOLUTIONS / "1_relu_slow.py").read_text()
    broken = slow.replace("auto y = torch::empty_like(xc);", "auto y = torch::empty_like(xc)", 1)
    return {
        "level1/1_relu": [fence(broken), fence(slow)],
        "level1/2_gelu": [fence((SOLUTIONS / "2_gelu_wrong.py").read_text())],
        "level2/9_bias_tanh_clamp_chain": [fence((SOLUTIONS / "9_bias_tanh_clamp_chain.py").read_text())],
    }


def write_config(tmp_path: Path, cache_dir: Path) -> Path:
    script_path = tmp_path / "script.json"
    script_path.write_text(json.dumps(script()))
    config = tmp_path / "experiment.toml"
    config.write_text(
        f"""
suite = "builtin"
levels = [1, 2]
tasks = "[129]_[rgb]*"  # 1_relu, 2_gelu, 9_bias_tanh_clamp_chain
variants = ["G", "G+E"]
turns = 2
target_speedup = 1.0
workers = 2
concurrency = 3
hardware_prompt = false

[llm]
model = "scripted:{script_path}"

[eval]
trials = 5
warmup = 1
correctness_trials = 3
time_compiled_reference = false
cache_dir = "{cache_dir}"
"""
    )
    return config


def refinery(*args: str) -> list[str]:
    return [sys.executable, "-c", "from kernel_refinery.bench.cli import app; app()", *args]


def table(records: list[TrajectoryRecord]) -> list[tuple]:
    """The parts of the report that the scripted outcomes fix. fast_1 is left out: it hangs on a
    timing, and the fused level-2 kernel's speedup here ranged from 1.24x to 2.27x and fell to 1 or
    below in 3 of 9 runs of this test on a 2-core machine; `fast_1_follows_the_speedups` checks it."""
    return [(s.level, s.variant, s.tasks, s.fast_p["0"], s.correct, s.compiled) for s in score(records)]


def fast_1_follows_the_speedups(records: list[TrajectoryRecord]) -> None:
    """Each row's fast_1 is the share of its trajectories correct and faster than eager, whatever the timings were."""
    for row in score(records):
        mine = [r for r in records if r.level == row.level and r.variant == row.variant]
        faster = sum(r.best_status == "correct" and (r.best_speedup or 0) > 1 for r in mine)
        assert row.fast_p["1"] == pytest.approx(faster / len(mine)), (row.level, row.variant)


EXPECTED = [
    (1, "G", 2, 0.5, 0.5, 1.0),
    (1, "G+E", 2, 0.5, 0.5, 1.0),
    (2, "G", 1, 1.0, 1.0, 1.0),
    (2, "G+E", 1, 1.0, 1.0, 1.0),
]


def test_report_numbers_from_known_outcomes() -> None:
    def rec(task: str, level: int, status: str, speedup: float | None, per_turn: list) -> TrajectoryRecord:
        return TrajectoryRecord(
            task=task,
            level=level,
            variant="G+E",
            sample=0,
            best_status=status,
            best_speedup=speedup,
            best_turn=1,
            turns=len(per_turn),
            compiled=status != "compile_error",
            tokens=100,
            per_turn=tuple(TurnOutcome(status=s, speedup=x) for s, x in per_turn),
        )

    records = [
        rec("a", 1, "correct", 2.0, [("incorrect", None), ("correct", 2.0)]),
        rec("b", 1, "correct", 0.5, [("correct", 0.5)]),
        rec("c", 1, "incorrect", None, [("incorrect", None), ("incorrect", None)]),
        rec("d", 1, "compile_error", None, [("compile_error", None)]),
    ]
    (s,) = score(records)
    assert s.fast_p == {"0": 0.5, "0.5": 0.25, "0.8": 0.25, "1": 0.25, "1.5": 0.25, "2": 0.0}
    assert s.correct == 0.5 and s.compiled == 0.75 and s.tokens == 400
    assert s.geomean_speedup == pytest.approx(1.0)
    assert s.fast1_by_turn == [0.0, 0.25]
    # Within k turns: b is correct from turn 1, a from turn 2 (b's one turn still counts at turn 2).
    assert [e.value for e in s.correct_by_turn] == [0.25, 0.5]
    table = render_by_turn([s])
    assert table is not None
    text = Console(width=80, record=True, color_system=None)
    text.print(table)
    rows = [line.split() for line in text.export_text().splitlines()]
    assert ["1", "G+E", "fast_1", "0%", "25%"] in rows and ["correct", "25%", "50%"] in rows


def test_results_written_before_schema_versions_load_and_migrate(tmp_path: Path) -> None:
    # A line as results.jsonl held it before schema_version: per_turn as [status, speedup] pairs.
    old = {
        "task": "level1/1_relu",
        "level": 1,
        "variant": "G+E",
        "sample": 0,
        "best_status": "correct",
        "best_speedup": 1.5,
        "best_turn": 3,
        "turns": 3,
        "compiled": True,
        "tokens": 10,
        "per_turn": [["no_code", None], ["compile_error", None], ["correct", 1.5]],
        "strategy": "refine",
        "evals": 2,
    }
    (tmp_path / "results.jsonl").write_text(json.dumps(old) + "\n")
    (record,) = read_results(tmp_path)
    assert record.schema_version == RESULTS_SCHEMA_VERSION
    assert record.per_turn == (
        TurnOutcome(status=Verdict.NO_CODE),
        TurnOutcome(status=Verdict.COMPILE_ERROR),
        TurnOutcome(status=Verdict.CORRECT, speedup=1.5),
    )
    assert record.best_status is Verdict.CORRECT and record.evaluations == 2
    # Written again, it is a current line, and reads back the same.
    (tmp_path / "results.jsonl").write_text(record.model_dump_json() + "\n")
    written = json.loads((tmp_path / "results.jsonl").read_text())
    assert written["schema_version"] == RESULTS_SCHEMA_VERSION and written["per_turn"][2] == {"status": "correct", "speedup": 1.5}
    assert read_results(tmp_path) == [record]
    # A line from a newer kernel-refinery is refused with what to do, not misread.
    (tmp_path / "results.jsonl").write_text(json.dumps({**written, "schema_version": RESULTS_SCHEMA_VERSION + 1}) + "\n")
    with pytest.raises(RunDirError, match="newer than this kernel-refinery"):
        read_results(tmp_path)


def test_config_checks() -> None:
    with pytest.raises(ValueError, match="temperature above 0"):
        ExperimentConfig(samples=3, llm={"model": "gpt-x", "temperature": 0.0})
    with pytest.raises(ValueError, match="must start with G"):
        ExperimentConfig(variants=["E"])


def test_experiment_killed_midway_finishes_with_the_same_table(tmp_path: Path, cache_dir: Path) -> None:
    config_path = write_config(tmp_path, cache_dir)
    killed_dir = tmp_path / "killed"
    cmd = refinery("experiment", "--config", str(config_path), "--run-dir", str(killed_dir))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if len(read_results(killed_dir)) >= 2 or proc.poll() is not None:
            break
        time.sleep(0.5)
    assert proc.poll() is None, f"the run ended before it could be killed:\n{proc.stdout.read().decode()[-3000:]}"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = read_results(killed_dir)
    assert 2 <= len(partial) < 6

    finished = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    records = read_results(killed_dir)
    assert len(records) == 6, "every trajectory once: nothing lost, nothing duplicated"
    lines = (killed_dir / "results.jsonl").read_text().splitlines()
    assert len(lines) == 6, "finished trajectories were not recomputed"
    assert "fast_1" in finished.stdout and (killed_dir / "report.json").exists()
    assert {p.name for p in (killed_dir / "plots").iterdir()} == {"fast_p.png", "fast1_by_turn.png", "correct_by_turn.png", "speedups.png"}

    # The same experiment, uninterrupted, in this process: the same table.
    config = ExperimentConfig.from_toml(config_path)
    from kernel_refinery.agent.chat.scripted import load_script

    model = load_script(tmp_path / "script.json")
    with EvaluatorPool(config.eval_config(), workers=2) as pool:
        clean = run_experiment(config, tmp_path / "clean", model, pool)
    assert table(records) == table(clean) == EXPECTED
    fast_1_follows_the_speedups(records)
    fast_1_follows_the_speedups(clean)
    slow_relu = [r for r in records + clean if r.task == "level1/1_relu" and r.best_status == "correct"]
    assert slow_relu and all((r.best_speedup or 0) < 1 for r in slow_relu), "the slow ReLU is never fast_1"
    by_id = {r.id: r for r in clean}
    assert by_id[TrajectoryId(task="level1/1_relu", variant="G+E")].per_turn[0].status == "compile_error"
    chain = by_id[TrajectoryId(task="level2/9_bias_tanh_clamp_chain", variant="G")]
    assert chain.turns == 1, f"stopped at the target; its turns: {chain.per_turn}"


# config.json as an experiment wrote it before the loop and evaluator settings were nested (no
# schema_version; turns, target_speedup, hardware_prompt, device and backend at the top level).
V0_CONFIG = {
    "suite": "builtin",
    "levels": [1],
    "tasks": "1_relu",
    "variants": ["G", "G+E"],
    "turns": 2,
    "samples": 1,
    "strategies": ["refine"],
    "search": {"n": 4, "rounds": 3, "ideas": 3, "beam_width": 2, "budget_evals": None, "budget_tokens": None},
    "target_speedup": 1.5,
    "hardware_prompt": False,
    "device": "cpu",
    "backend": None,
    "workers": 0,
    "concurrency": 4,
    "executor": "local",
    "llm": {
        "model": "scripted:x.json",
        "base_url": None,
        "api_key_env": "OPENAI_API_KEY",
        "temperature": 0.0,
        "max_tokens": 4096,
        "timeout_s": 600.0,
        "retries": 6,
    },
    "eval": None,
}


def test_config_json_of_older_runs_still_loads_and_resumes(tmp_path: Path) -> None:
    from kernel_refinery.bench.experiment import CONFIG_SCHEMA_VERSION, prepare_run_dir, read_precisions, read_saved_config

    (tmp_path / "config.json").write_text(json.dumps(V0_CONFIG))
    old = read_saved_config(tmp_path / "config.json")
    assert (old.loop.turns, old.loop.target_speedup, old.loop.hardware_prompt, old.eval.device) == (2, 1.5, False, "cpu")
    assert {p: n.tolerance for p, n in read_precisions(tmp_path).items()} == {"fp32": 1e-4}
    # The same experiment in today's layout resumes the old directory; the file is then today's.
    same = ExperimentConfig(
        tasks="1_relu",
        variants=["G", "G+E"],
        loop={"turns": 2, "target_speedup": 1.5, "hardware_prompt": False},
        llm={"model": "scripted:x.json"},
        concurrency=2,
    )
    assert same == old.model_copy(update={"concurrency": 2})
    prepare_run_dir(tmp_path, same)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["schema_version"] == CONFIG_SCHEMA_VERSION and saved["loop"] == {
        "turns": 2,
        "target_speedup": 1.5,
        "hardware_prompt": False,
    }
    assert read_saved_config(tmp_path / "config.json") == same
    # Other settings are still refused, by their key.
    (tmp_path / "config.json").write_text(json.dumps({**V0_CONFIG, "turns": 3}))
    with pytest.raises(RunDirError, match=r"differing: loop.turns"):
        prepare_run_dir(tmp_path, same)
    # An old [eval] table kept the evaluator's default device; the top-level device was the one in force.
    (tmp_path / "config.json").write_text(json.dumps({**V0_CONFIG, "device": "cuda", "eval": {"device": "cpu", "trials": 7}}))
    assert (read_saved_config(tmp_path / "config.json").eval.device, read_saved_config(tmp_path / "config.json").eval.trials) == ("cuda", 7)
    (tmp_path / "config.json").write_text(json.dumps({**saved, "schema_version": CONFIG_SCHEMA_VERSION + 1}))
    with pytest.raises(RunDirError, match="newer than this kernel-refinery"):
        prepare_run_dir(tmp_path, same)


def test_toml_flat_or_nested_with_flags_on_top(tmp_path: Path) -> None:
    from kernel_refinery.bench.settings import load_settings

    flat = tmp_path / "flat.toml"
    flat.write_text('variants = ["G"]\nturns = 2\ntarget_speedup = 3.0\ndevice = "cpu"\nrun_dir = "runs/x"\n[eval]\ntrials = 7\n')
    nested = tmp_path / "nested.toml"
    nested.write_text('variants = ["G"]\nrun_dir = "runs/x"\n[loop]\nturns = 2\ntarget_speedup = 3.0\n[eval]\ndevice = "cpu"\ntrials = 7\n')
    a, a_dir = load_settings(ExperimentConfig, flat, {})
    b, b_dir = load_settings(ExperimentConfig, nested, {})
    assert a == b and a_dir == b_dir == Path("runs/x") and (a.loop.turns, a.eval.trials) == (2, 7)
    # A flag wins over the file, a flat key of it included, and leaves the rest of its section alone.
    for path in (flat, nested):
        c, _ = load_settings(ExperimentConfig, path, {"loop.turns": ("--turns", 5), "eval.precision": ("--precision", "bf16")})
        assert (c.loop.turns, c.loop.target_speedup, c.eval.trials, c.eval.precision) == (5, 3.0, 7, "bf16")
    # The checked-in configs load: the embedded model on CPU, but for the endpoint's GPU ablation.
    for toml in sorted((Path(__file__).parent.parent / "bench" / "configs").glob("*.toml")):
        config, run_dir = load_settings(ExperimentConfig, toml, {})
        assert run_dir is not None, toml
        on_endpoint = toml.name == "ablation_kernelbench_l1.toml"
        assert (config.llm.model == "local", config.eval.device) == ((False, "cuda") if on_endpoint else (True, "cpu")), toml
    # An experiment's variants are its own list: a loop.variant would be ignored, so it is refused.
    with pytest.raises(ValueError, match="variants"):
        ExperimentConfig(loop={"variant": "G"})


def test_run_and_experiment_take_the_same_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`refinery run --config` and `refinery experiment --config` read one file, flags on top."""
    from typer.testing import CliRunner

    import kernel_refinery.bench.launch
    from kernel_refinery.agent.config import RunConfig
    from kernel_refinery.bench.cli import app

    seen: dict[str, object] = {}
    monkeypatch.setattr(
        kernel_refinery.bench.launch, "launch_run", lambda config, task, run_dir, *a, **k: seen.update(run=config, run_dir=run_dir)
    )
    monkeypatch.setattr(
        kernel_refinery.bench.launch, "launch", lambda config, run_dir, *a, **k: seen.update(experiment=config, run_dir=run_dir)
    )
    script = tmp_path / "script.json"
    script.write_text('["no code"]')
    toml = tmp_path / "settings.toml"
    toml.write_text(
        f'run_dir = "{tmp_path / "from-file"}"\n[loop]\nturns = 2\n[llm]\nmodel = "scripted:{script}"\n'
        "[search]\nrounds = 5\n[eval]\ntrials = 9\n"
    )
    relu = Path(__file__).parent.parent / "bench" / "suites" / "builtin" / "level1" / "1_relu.py"
    result = CliRunner().invoke(
        app,
        ["run", "--task", str(relu), "--config", str(toml), "--turns", "4", "--strategy", "beam", "--set", "loop.hardware_prompt=false"],
    )
    assert result.exit_code == 0, result.output
    run = seen["run"]
    assert isinstance(run, RunConfig)
    assert (run.loop.turns, run.loop.hardware_prompt, run.strategy, run.search.rounds, run.eval.trials) == (4, False, "beam", 5, 9)
    assert seen["run_dir"] == tmp_path / "from-file"
    result = CliRunner().invoke(app, ["experiment", "--config", str(toml), "--set", "eval.trials=3", "--run-dir", str(tmp_path / "flag")])
    assert result.exit_code == 0, result.output
    experiment = seen["experiment"]
    assert isinstance(experiment, ExperimentConfig)
    assert (experiment.loop.turns, experiment.search.rounds, experiment.eval.trials) == (2, 5, 3)
    assert seen["run_dir"] == tmp_path / "flag"


def test_gpu_experiments_compile_on_every_core_and_cpu_ones_time_on_every_core(monkeypatch: pytest.MonkeyPatch) -> None:
    import kernel_refinery.tools.processes.pool

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(kernel_refinery.tools.processes.pool, "gpu_count", lambda: 1)
    gpu = ExperimentConfig.model_validate({"eval": {"device": "cuda"}})
    assert gpu.worker_count() == 16, "16 workers compile while the GPU's lock lets one run"
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(128)))
    assert gpu.worker_count() == 16, "at most 16 per GPU"
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)))
    monkeypatch.setattr(kernel_refinery.tools.processes.pool, "gpu_count", lambda: 8)
    assert gpu.worker_count() == 8, "at least one worker per GPU"
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert ExperimentConfig.model_validate({"eval": {"device": "cpu"}}).worker_count() == 16
    assert ExperimentConfig.model_validate({"workers": 3, "eval": {"device": "cuda"}}).worker_count() == 3
