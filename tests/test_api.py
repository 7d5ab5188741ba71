"""The public Python API (kernel_refinery/api.py, re-exported from `kernel_refinery`): every entry point on CPU, with
real C++ candidates that share one build (tests/candidates.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from candidates import FIXTURES, candidate
from result_compare import EVAL_SETS, comparable, eval_json
from typer.testing import CliRunner

import kernel_refinery
import kernel_refinery.api
from kernel_refinery import (
    Client,
    EvalConfig,
    Experiment,
    ExperimentConfig,
    evaluate,
    evaluate_many,
    load_suite,
    load_task,
    load_traces,
    refine,
    report_run,
)
from kernel_refinery.agent.chat.scripted import load_script
from kernel_refinery.agent.config import LoopSettings, RunConfig
from kernel_refinery.api import __all__ as api_names
from kernel_refinery.bench.cli import app
from kernel_refinery.bench.tasks import SuiteError
from kernel_refinery.core.errors import RunDirError

SMALL_RELU = FIXTURES / "small_relu_task.py"
CORRECT = candidate("return ext.scaled_relu(x, 1e-3)")  # small_relu's reference is relu(x) * 1e-3
WRONG = candidate("return ext.relu_fwd(x)")
CRASH = candidate("return ext.crash(x)")  # a null-pointer write: SIGSEGV in the worker


@pytest.fixture(scope="module")
def settings(cache_dir: Path) -> EvalConfig:
    return EvalConfig(device="cpu", trials=5, correctness_trials=2, time_compiled_reference=False, cache_dir=cache_dir)


def test_the_package_exports_the_api_and_nothing_else() -> None:
    assert sorted(kernel_refinery.__all__) == sorted(api_names)
    assert all(getattr(kernel_refinery, name) is getattr(kernel_refinery.api, name) for name in api_names)
    with pytest.raises(AttributeError, match="no attribute 'Evaluator'"):
        _ = kernel_refinery.Evaluator  # type: ignore[attr-defined]  # checking that the private names stay private


def test_the_service_client_is_public_and_loaded_when_first_asked_for() -> None:
    from kernel_refinery.bench.serve import client

    assert Client is client.Client and kernel_refinery.ServiceError is client.ServiceError
    with pytest.raises(AttributeError, match="no attribute 'Server'"):
        _ = kernel_refinery.api.Server  # type: ignore[attr-defined]  # only the client is public


def test_refine_runs_the_loop_on_one_task_with_a_model_by_name_or_object(settings: EvalConfig, tmp_path: Path) -> None:
    """The scripted model answers a wrong kernel, then a correct one: the loop feeds the first
    verdict back and stops at the second; a chat model object is used as given."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps([f"```python\n{WRONG}```", f"```python\n{CORRECT}```"]))
    config = RunConfig(loop=LoopSettings(variant="G+E", turns=3, target_speedup=0.0, hardware_prompt=False), eval=settings)
    result = refine(SMALL_RELU, f"scripted:{script}", config, run_dir=tmp_path / "by-name")
    assert [a.result.status.value for a in result.attempts if a.result and a.result.status] == ["incorrect", "correct"]
    assert result.best is not None and result.best.turn == 2 and result.tokens.completion > 0
    assert result.trajectory.task == "level1/small_relu_task" and result.trace.exists()
    assert (tmp_path / "by-name" / "manifest.json").exists() and (tmp_path / "by-name" / "config.json").exists()
    turns = load_traces(tmp_path / "by-name")[result.trajectory]
    assert "gave wrong results" in turns[1].messages[-1].content, "turn 2 saw turn 1's verdict"

    given = load_script(script)
    again = refine(SMALL_RELU, given, config, run_dir=tmp_path / "by-object")
    assert [a.turn for a in again.attempts] == [1, 2]
    with pytest.raises(FileExistsError, match="--resume"):
        refine(SMALL_RELU, load_script(script), config, run_dir=tmp_path / "by-object")
    assert refine(SMALL_RELU, load_script(script), config, run_dir=tmp_path / "by-object", resume=True).attempts == again.attempts


def test_tasks_by_name_by_path_and_from_suites() -> None:
    assert load_task("1_relu").key == load_task("level1/1_relu").key == "level1/1_relu"
    assert load_task(SMALL_RELU).name == "small_relu_task"
    assert load_task(str(SMALL_RELU)).source == SMALL_RELU.read_text()
    with pytest.raises(SuiteError, match="neither a task file nor a built-in task"):
        load_task("no_such_task")
    found = load_suite("builtin", levels=[1, 2], tasks="*relu*")
    assert [t.key for t in found] == ["level1/1_relu", "level2/1_matmul_bias_relu", "level2/5_conv_relu_maxpool"]
    with pytest.raises(SuiteError, match="does not exist"):
        load_suite("/no/such/suite")
    with pytest.raises(SuiteError, match="not a KernelBench task"):
        kernel_refinery.task_from_source("x = 1\n", name="x")


def test_evaluate_gives_what_refinery_eval_gives(settings: EvalConfig, tmp_path: Path) -> None:
    result = evaluate(SMALL_RELU, CORRECT, settings)
    assert result.correct and result.speedup is not None, result.headline()
    assert result.timing is not None and result.timing.candidate.trials == 5

    candidate_file = tmp_path / "candidate.py"
    candidate_file.write_text(CORRECT)
    cli = CliRunner().invoke(
        app,
        ["eval", str(SMALL_RELU), str(candidate_file), "--json", *EVAL_SETS],
        env={"REFINERY_CACHE_DIR": str(settings.cache_dir)},
    )
    assert cli.exit_code == 0, eval_json(cli.stdout).headline() if cli.stdout.startswith("{") else cli.output
    assert comparable(eval_json(cli.stdout)) == comparable(result)


def test_evaluate_many_over_the_pool_keeps_the_order_and_a_crash_costs_only_its_own(settings: EvalConfig) -> None:
    relu = load_task("1_relu")
    pairs = [(SMALL_RELU, CRASH), (SMALL_RELU, CORRECT), (relu, WRONG.replace("ext.relu_fwd", "ext.leaky_wrong")), (SMALL_RELU, WRONG)]
    results = evaluate_many(pairs, settings, workers=2)
    assert [r.status.value if r.status else None for r in results] == ["runtime_error", "correct", "incorrect", "incorrect"]
    assert "leak" not in results[2].message and results[2].correctness is not None and not results[2].correctness.passed
    assert comparable(results[1]) == comparable(evaluate(SMALL_RELU, CORRECT, settings))
    assert evaluate_many([], settings) == []
    with pytest.raises(ValueError, match="workers must be at least 1"):
        evaluate_many(pairs, settings, workers=0)


def test_an_experiment_runs_reports_and_leaves_traces(tmp_path: Path, cache_dir: Path) -> None:
    """One task, one turn, a scripted reply the static check rejects: no compile, a full run."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps(["```python\nimport torch\n\nclass ModelNew(torch.nn.Module):\n    pass\n```"]))
    config = ExperimentConfig.model_validate(
        {
            "tasks": "1_relu",
            "variants": ["G"],
            "llm": {"model": f"scripted:{script}"},
            "loop": {"turns": 1, "hardware_prompt": False},
            "eval": {"trials": 5, "time_compiled_reference": False, "cache_dir": str(cache_dir)},
            "workers": 1,
        }
    )
    run_dir = tmp_path / "run"
    experiment = Experiment(config, run_dir)
    records = experiment.run()
    assert [(r.task, r.variant, r.best_status.value) for r in records] == [("level1/1_relu", "G", "rejected")]
    assert experiment.run() == records, "a second run resumes: nothing left to do"

    scores = report_run(run_dir)
    assert [(s.level, s.variant, s.tasks, s.correct) for s in scores] == [(1, "G", 1, 0.0)]
    assert (run_dir / "report.json").exists() and not (run_dir / "plots").exists()
    assert experiment.report() == scores

    traces = load_traces(run_dir)
    ((trajectory, turns),) = traces.items()
    assert trajectory.task == "level1/1_relu" and [t.turn for t in turns] == [1]
    assert turns[0].result is not None and turns[0].result.status is not None and turns[0].result.status.value == "rejected"
    with pytest.raises(RunDirError, match="no traces/ folder"):
        load_traces(tmp_path)


def test_an_experiment_from_a_toml_file_keeps_its_run_dir_unless_given(tmp_path: Path) -> None:
    demo = Path(__file__).parent.parent / "bench" / "configs" / "demo.toml"
    from_file = Experiment.from_toml(demo)
    assert from_file.run_dir == Path("runs/demo") and from_file.config.loop.turns == 3
    assert Experiment.from_toml(demo, run_dir=tmp_path).run_dir == tmp_path
