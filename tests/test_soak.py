"""The soak's short mode: every fault once, nothing lost, nothing duplicated, the same table."""

from __future__ import annotations

import json
import time
from pathlib import Path

from benchmarks.soak.fake_server import FAULTS
from benchmarks.soak.run import main


def test_short_soak_survives_every_fault(tmp_path: Path, cache_dir: Path) -> None:
    figures_path = tmp_path / "figures.json"
    rc = main(["--short", "--work-dir", str(tmp_path / "soak"), "--figures", str(figures_path), "--cache-dir", str(cache_dir)])
    figures = json.loads(figures_path.read_text())
    assert rc == 0, figures
    assert figures["rounds"] == 1 and figures["rounds_failed"] == 0 and figures["failures"] == {}
    assert figures["trajectories"] == 6 and figures["turns"] >= 15
    assert set(figures["faults"]) == set(FAULTS), "every transport fault was injected"
    assert figures["faults_not_survived"] == 0 and figures["faults_survived"] == figures["faults"]
    assert figures["llm_retries"] >= sum(figures["faults"].values()) - 3, "each fault was retried"
    assert figures["experiment_kills"] == 1 and figures["worker_kills"] >= 1
    assert figures["experiment_kills_survived"] == 1 and figures["worker_kills_survived"] == figures["worker_kills"]
    assert set(figures["candidates"]) == {"correct", "no_code", "garbage", "crash", "spin", "hog", "oob_write", "chatty", "forker"}
    assert figures["candidates_survived"] == figures["candidates"], "every candidate got its expected verdict"
    assert figures["worker_restarts"] >= 3, "crash, oob_write and hog each end a worker"
    assert figures["lost"] == 0
    assert figures["duplicated"] == 0
    assert figures["tables_equal"] == 1 and figures["tables_differ"] == 0
    assert figures["outcomes_differ"] == 0, "every trajectory's turn verdicts match the fault-free run"
    assert figures["stray_processes"] == 0, "no worker or candidate child outlives its run"


def test_a_stale_torch_build_lock_does_not_block_the_next_build(tmp_path: Path) -> None:
    """A worker SIGKILLed mid-compile leaves torch's `lock` file; the next builder removes it."""
    from kernel_refinery.tools.steps.compile_cache import _build_lock

    (tmp_path / "lock").touch()
    with _build_lock(tmp_path):
        assert not (tmp_path / "lock").exists()


def test_workers_die_with_a_sigkilled_parent(tmp_path: Path) -> None:
    """A SIGKILLed experiment leaves no worker behind (one with a hung kernel would spin for an hour)."""
    import os
    import signal
    import subprocess
    import sys

    import psutil

    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time\n"
                "from kernel_refinery.tools.processes.worker import Worker\n"
                f"w = Worker(cache_dir={str(tmp_path)!r}, memory_limit_gb=2)\n"
                "w.start()\n"
                "print('WORKER', w.pid, flush=True)\n"
                "time.sleep(600)\n"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        line = ""
        while not line.startswith("WORKER"):
            line = parent.stdout.readline()
            assert line, "the parent ended before its worker started"
        worker_pid = int(line.split()[1])
        assert psutil.pid_exists(worker_pid)
    finally:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if psutil.Process(worker_pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.1)
    else:
        os.killpg(worker_pid, signal.SIGKILL)
        raise AssertionError("the worker outlived its SIGKILLed parent")


def test_a_reply_with_unicode_line_separators_keeps_its_trace_line(tmp_path: Path) -> None:
    """The soak's garbage replies hold U+0085 and U+2028, which JSON leaves unescaped; the trace
    reader split lines on them and the trajectory died at its next turn."""
    from kernel_refinery.traces.schema import TrajectoryId, TurnRecord
    from kernel_refinery.traces.store import append_turn, read_trace, trace_path

    trajectory = TrajectoryId(task="level1/1_relu", variant="G")
    for turn in (1, 2, 3):
        record = TurnRecord(
            run_id="r",
            trajectory=trajectory,
            turn=turn,
            model="m",
            messages=(),
            reply=f"garbage\x85more\u2028and\x1cmore {turn}",
            started_at="2026-01-01T00:00:00+00:00",
        )
        assert append_turn(tmp_path, record)
    turns = read_trace(trace_path(tmp_path, trajectory))
    assert [t.turn for t in turns] == [1, 2, 3] and turns[1].reply == "garbage\x85more\u2028and\x1cmore 2"


def test_a_failed_round_is_charged_to_the_error_its_log_ends_with(tmp_path: Path) -> None:
    from benchmarks.soak.run import Totals, _cause

    log = tmp_path / "faulty.log"
    log.write_text(
        'node=generate turn=1\nTraceback (most recent call last):\n  File "agent/runner.py", line 85\n'
        "sqlite3.OperationalError: database is locked\n"
    )
    failure = _cause("experiment under faults exited 1", log)
    assert failure.cause == "experiment under faults exited 1: OperationalError: database is locked"
    (tmp_path / "quiet.log").write_text("node=generate turn=1\n")
    assert _cause("fault-free run exited -9", tmp_path / "quiet.log").cause == "fault-free run exited -9: no exception in its log"

    totals = Totals()
    totals.faults.update({"http_429": 3, "reset": 2})
    totals.faults_survived.update({"http_429": 3})
    totals.failures[failure.cause] += 1
    figures = totals.figures(1.0)
    assert figures["faults_not_survived"] == 2
    assert figures["failures"] == {failure.cause: 1}
