"""`refinery suite check`: every task gets its row, whatever it does, and the command still exits 0.

Each task runs in a fresh interpreter that imports torch (seconds here), so the tests run few
tasks, two at a time, without torch.compile.
"""

from __future__ import annotations

import json
import signal
from functools import partial
from pathlib import Path

import pytest
from candidates import task_source
from cli_runner import run_cli

from kernel_refinery.bench.suite_check.run import describe_exit
from kernel_refinery.bench.suite_check.types import Stage, Status

TASK = """import torch
import torch.nn as nn
{imports}

class Model(nn.Module):
    def forward(self, x):
        {body}
        return torch.relu(x)


def get_inputs():
    return [torch.rand(8, 8)]


def get_init_inputs():
    return []
"""

SYNTHETIC = {
    "1_missing_package": TASK.format(imports="import refinery_no_such_package", body="pass"),
    "2_raises": TASK.format(imports="", body="raise ValueError('the forward refuses')"),
    "3_segfault": TASK.format(imports="import ctypes", body="ctypes.string_at(0)"),
    "4_hangs": TASK.format(imports="import time", body="time.sleep(600)"),
    "5_not_python": "class Model(:\n",
    "6_out_of_memory": TASK.format(imports="", body="raise MemoryError()"),
}


refinery = partial(run_cli, columns=80)


def rows_of(path: Path) -> dict[str, dict[str, object]]:
    report = json.loads(path.read_text())
    assert report["complete"] is True
    return {row["name"]: row for row in report["rows"]}


def test_two_builtin_tasks_are_ok(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    result = refinery(
        "suite", "check", "--suite", "builtin", "--levels", "1", "--tasks", "[12]_*", "--no-compile", "--jobs", "2", "--json", out
    )
    assert result.exit_code == 0, result.output
    rows = rows_of(out)
    assert sorted(rows) == ["1_relu", "2_gelu"]
    for row in rows.values():
        assert row["status"] == "ok" and row["stage"] == "done", row
        eager = row["eager"]
        assert isinstance(eager, dict) and eager["median_ms"] > 0 and eager["calls"] >= 3
        assert row["compiled"] is None
    assert "2 of 2 tasks ok" in result.output
    assert "share the CPU cores" in result.output


def test_each_failure_is_its_tasks_row(tmp_path: Path) -> None:
    level = tmp_path / "suite" / "level1"
    level.mkdir(parents=True)
    for name, source in SYNTHETIC.items():
        (level / f"{name}.py").write_text(source)
    out = tmp_path / "check.json"
    result = refinery("suite", "check", "--suite", level.parent, "--no-compile", "--jobs", "2", "--timeout-s", "4", "--json", out)
    assert result.exit_code == 0, result.output
    rows = rows_of(out)

    def check(name: str, status: Status, stage: Stage, *phrases: str) -> None:
        row = rows[name]
        assert (row["status"], row["stage"]) == (status.value, stage.value), row
        for phrase in phrases:
            assert phrase in str(row["message"]), row

    check("1_missing_package", Status.IMPORT_ERROR, Stage.IMPORT, "missing package 'refinery_no_such_package'")
    check("2_raises", Status.ERROR, Stage.EAGER, "ValueError: the forward refuses", "line 7 of the task")
    check("3_segfault", Status.CRASH, Stage.EAGER, "SIGSEGV", "line 7 of the task")
    check("4_hangs", Status.TIMEOUT, Stage.EAGER, "no result within 4 s")
    check("5_not_python", Status.INVALID, Stage.LOAD, "not valid Python")
    # Out of memory with another task running: once more, alone, and that is its row.
    check("6_out_of_memory", Status.HOST_OOM, Stage.EAGER, "MemoryError")
    assert "suite_check_retry_alone" in result.stderr and "6_out_of_memory" in result.stderr
    assert "0 of 6 tasks ok" in result.output
    assert "Traceback" not in result.output


def test_a_folder_that_is_not_a_suite_is_a_one_line_error(tmp_path: Path) -> None:
    result = refinery("suite", "check", "--suite", tmp_path / "absent")
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("error: suite path") and "does not exist" in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("code", "printed", "status", "phrase"),
    [
        (-signal.SIGKILL, "", Status.HOST_OOM, "OOM killer"),
        (-signal.SIGABRT, "terminate called", Status.CRASH, "SIGABRT"),
        (1, "RuntimeError: CUDA error: an illegal memory access was encountered", Status.CRASH, "illegal memory access"),
        (3, "bye\n", Status.CRASH, "exited with code 3 during eager: bye"),
    ],
)
def test_an_exit_without_a_result_is_described(code: int, printed: str, status: Status, phrase: str) -> None:
    found, message = describe_exit(code, Stage.EAGER, printed)
    assert found is status and phrase in message, message


def test_a_constant_reference_is_flagged_and_a_normal_one_is_not(tmp_path: Path) -> None:
    level = tmp_path / "suite" / "level1"
    level.mkdir(parents=True)
    (level / "1_max_minus_its_mean.py").write_text(task_source("constant_task"))
    (level / "2_relu.py").write_text(task_source("small_relu_task"))
    out = tmp_path / "check.json"
    result = refinery("suite", "check", "--suite", level.parent, "--no-compile", "--no-time", "--jobs", "2", "--json", out)
    assert result.exit_code == 0, result.output
    rows = rows_of(out)
    constant, normal = rows["1_max_minus_its_mean"], rows["2_relu"]
    assert constant["status"] == "ok" and constant["degenerate"] == "zeros", constant
    assert "every output value is 0 on 4 random inputs" in str(constant["degenerate_detail"])
    assert normal["status"] == "ok" and normal["degenerate"] == "" and normal["eager"] is None, normal
    assert json.loads(out.read_text())["degenerate"] == {"level1/1_max_minus_its_mean": "zeros"}
    assert "level1/1_max_minus_its_mean: all zeros" in result.output and "1 degenerate" in result.output
