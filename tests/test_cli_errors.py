"""User errors: one line on stderr (`error: ...`), exit code 2, no traceback; --debug (or
REFINERY_DEBUG=1) shows the traceback; a bug in the project still shows its traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
from cli_runner import run_cli
from typer.testing import Result

from kernel_refinery.bench.experiment import TrajectoryRecord, TurnOutcome
from kernel_refinery.bench.tasks import SuiteError

ROOT = Path(__file__).parent.parent
RELU = ROOT / "bench" / "suites" / "builtin" / "level1" / "1_relu.py"
SOLUTION = Path(__file__).parent / "fixtures" / "cpu_solutions" / "1_relu.py"
V0_RUN = Path(__file__).parent / "fixtures" / "traces_v0"


refinery = partial(run_cli, columns=80)


def assert_user_error(result: Result, *phrases: str) -> str:
    """Exit 2, one `error:` line (the last on stderr) naming what failed, no traceback anywhere.

    Log lines may come before it (a retry warning per retry, as they happen)."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], result.stderr
    assert all("llm_retry" in line for line in lines[:-1]), f"only retry logs before the error: {result.stderr}"
    assert "Traceback" not in result.output
    for phrase in phrases:
        assert phrase in errors[0], f"{phrase!r} not in {errors[0]!r}"
    return errors[0]


@pytest.fixture()
def not_a_task(tmp_path: Path) -> Path:
    path = tmp_path / "notatask.py"
    path.write_text("x = 1\n")
    return path


def test_a_file_that_is_not_a_task(not_a_task: Path) -> None:
    assert_user_error(refinery("run", "--task", not_a_task), str(not_a_task), "is not a KernelBench task", "class Model")
    assert_user_error(refinery("eval", not_a_task, SOLUTION), "is not a KernelBench task")


def test_a_task_file_that_is_not_python(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("def Model(:\n")
    assert_user_error(refinery("run", "--task", broken), str(broken), "not valid Python", "line 1")


def test_a_candidate_file_that_is_not_text(tmp_path: Path) -> None:
    binary = tmp_path / "candidate.py"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    assert_user_error(refinery("eval", RELU, binary), str(binary), "not UTF-8")


def test_bad_flags_and_values() -> None:
    assert_user_error(refinery("run", "--task", RELU, "--variant", "E+G"), "--variant", "must start with G")
    assert_user_error(refinery("run", "--task", RELU, "--strategy", "greedy"), "--strategy", "'greedy'", "refine")
    assert_user_error(refinery("run", "--task", RELU, "--device", "gpu"), "--device must be cpu or cuda")
    assert_user_error(refinery("experiment", "--levels", "one"), "--levels", "'one'")
    assert_user_error(refinery("experiment", "--variants", "G,X"), "variant 'X' must start with G")
    # Click's own parsing errors keep click's usage message; they too exit 2 without a traceback.
    unknown = refinery("run", "--task", RELU, "--tunrs", "3")
    assert unknown.exit_code == 2 and "No such option" in unknown.output and "Traceback" not in unknown.output


def test_a_compiler_that_is_not_a_choice_or_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """eval.compiler: a value that is no choice names the choices, whether given by --set or by
    REFINERY_COMPILER; clang asked for where it is missing says what to install, before any runner starts."""
    from kernel_refinery.tools.steps import compilers

    assert_user_error(refinery("eval", RELU, SOLUTION, "--set", "eval.compiler=icc"), "--set eval.compiler must be auto, gcc or clang")
    env = {"REFINERY_COMPILER": "icc"}
    assert_user_error(refinery("eval", RELU, SOLUTION, env=env), "REFINERY_COMPILER='icc'", "gcc, clang or auto", "eval.compiler")
    monkeypatch.setattr(compilers, "CLANG_NAMES", ("/nonexistent/clang++-19",))
    monkeypatch.delenv("CXX", raising=False)
    missing = refinery("eval", RELU, SOLUTION, "--set", "eval.compiler=clang")
    assert_user_error(missing, "eval.compiler=clang, but no clang++", "libomp-19-dev", "--set eval.compiler=gcc")


def test_bad_config_file(tmp_path: Path) -> None:
    config = tmp_path / "experiment.toml"
    config.write_text('turns = 0\nvariants = ["G"]\n[llm]\nmodel = "scripted:x.json"\n')
    assert_user_error(refinery("experiment", "--config", config), str(config), "turns", "greater than or equal to 1")
    config.write_text("turns = [\n")
    assert_user_error(refinery("experiment", "--config", config), str(config), "not valid TOML")
    config.write_text('colour = "blue"\n')
    assert_user_error(refinery("experiment", "--config", config), "colour: unknown setting")


def test_missing_scripted_model_file(tmp_path: Path) -> None:
    assert_user_error(refinery("run", "--task", RELU, "--model", f"scripted:{tmp_path / 'nope.json'}"), "nope.json", "no file")


def test_missing_api_key() -> None:
    env = dict.fromkeys(("OPENAI_API_KEY",), "")
    result = refinery("run", "--task", RELU, "--model", "gpt-4o", "--set", "llm.api_key_env=REFINERY_TEST_NO_SUCH_KEY", env=env)
    assert_user_error(result, "no API key", "REFINERY_TEST_NO_SUCH_KEY", "--set llm.base_url=URL")


def test_unreachable_endpoint_names_the_url_and_the_retries(tmp_path: Path) -> None:
    url = "http://127.0.0.1:9/v1"  # the discard port: nothing listens there
    result = refinery(
        "run",
        "--task",
        RELU,
        "--model",
        "gpt-4o",
        "--set",
        f"llm.base_url={url}",
        "--set",
        "llm.retries=2",
        "--turns",
        "1",
        "--run-dir",
        tmp_path / "run",
        "--set",
        "loop.hardware_prompt=false",
    )
    assert_user_error(result, url, "could not be reached", "after 2 attempts (1 retry with back-off)", "--set llm.base_url=URL")


def test_refusing_endpoint_names_the_url_and_status(tmp_path: Path) -> None:
    from benchmarks.soak.fake_server import FaultPlan, ServerLog, serve

    log = ServerLog()
    with serve(["unused"], log, FaultPlan(first=("http_401",))) as url:
        result = refinery(
            "run",
            "--task",
            RELU,
            "--model",
            "gpt-test",
            "--set",
            f"llm.base_url={url}",
            "--turns",
            "1",
            "--run-dir",
            tmp_path / "run",
            "--set",
            "loop.hardware_prompt=false",
            env={"OPENAI_API_KEY": "sk-test"},
        )
    assert_user_error(result, url, "refused the request (HTTP 401", "retrying will not help")
    assert log.requests == 1, "an authentication error is not retried"


def test_run_directory_from_another_version(tmp_path: Path) -> None:
    # results.jsonl with a record this version does not know (a torn last line is fine, this is not).
    good = TrajectoryRecord(
        task="level1/1_relu",
        level=1,
        variant="G",
        sample=0,
        best_status="correct",
        best_speedup=1.5,
        best_turn=1,
        turns=1,
        compiled=True,
        tokens=10,
        per_turn=(TurnOutcome(status="correct", speedup=1.5),),
    )
    run = tmp_path / "old"
    run.mkdir()
    (run / "results.jsonl").write_text(json.dumps({"task_name": "relu", "score": 1}) + "\n" + good.model_dump_json() + "\n")
    assert_user_error(refinery("report", run), "results.jsonl:1", "another version", "new --run-dir")
    # An experiment's config.json written by another version.
    (run / "config.json").write_text(json.dumps({"suite": "builtin", "model_name": "gpt-3"}))
    script = tmp_path / "script.json"
    script.write_text('["no kernel here"]')
    experiment = refinery("experiment", "--tasks", "1_relu", "--variants", "G", "--model", f"scripted:{script}", "--run-dir", run)
    assert_user_error(experiment, "config.json", "another version", "another --run-dir")
    # Traces of a newer schema.
    traces = tmp_path / "future" / "traces"
    traces.mkdir(parents=True)
    line = json.loads((V0_RUN / "traces" / "level1__relu__GE__s0.jsonl").read_text().splitlines()[0])
    (traces / "t.jsonl").write_text(json.dumps({**line, "schema_version": 99}) + "\n")
    assert_user_error(refinery("traces", "list", tmp_path / "future"), "t.jsonl:1", "version 99")


def test_a_directory_with_no_results() -> None:
    assert_user_error(refinery("report", V0_RUN), "no finished trajectories", "refinery experiment")


def test_debug_shows_the_traceback(not_a_task: Path) -> None:
    flagged = refinery("--debug", "run", "--task", not_a_task)
    assert isinstance(flagged.exception, SuiteError), "re-raised, so its traceback is printed"
    by_env = refinery("run", "--task", not_a_task, env={"REFINERY_DEBUG": "1"})
    assert isinstance(by_env.exception, SuiteError)


def test_a_bug_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import kernel_refinery.bench.report

    def broken(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("a bug in the report")

    monkeypatch.setattr(kernel_refinery.bench.report, "report", broken)
    run = tmp_path / "run"
    run.mkdir()
    result = refinery("report", run)
    assert result.exit_code == 1 and isinstance(result.exception, ZeroDivisionError)


def test_the_installed_command_prints_one_line_without_traceback(not_a_task: Path) -> None:
    """The same through a real process: what a user sees in a terminal or CI log."""
    env = {k: v for k, v in os.environ.items() if k != "REFINERY_DEBUG"}
    done = subprocess.run(
        [sys.executable, "-c", "from kernel_refinery.bench.cli import app; app()", "run", "--task", str(not_a_task)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    bug = subprocess.run(
        [
            sys.executable,
            "-c",
            "from kernel_refinery.bench.cli import app; import kernel_refinery.bench.report as r; r.report = lambda *a, **k: 1 / 0; app()",
            "report",
            str(V0_RUN),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert bug.returncode == 1 and "ZeroDivisionError" in bug.stderr and "Traceback" in bug.stderr
