"""The test suite's own machinery, on CPU: a module that needs an optional extra skips naming what is
missing (tests/conftest.py), and the GPU suite's memory plan, gate, peaks and summary
(tests/gpu_memory.py, .ci/device/gpu-suite) do what the GPU run relies on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import gpu_memory
import psutil
import pytest
from conftest import OPTIONAL_STACKS, third_party_imports
from gpu_memory import RESIDENT_GIB, Card, MemoryGate, admits, plan, too_large

TESTS = Path(__file__).parent
ROOT = TESTS.parent
H100 = Card("NVIDIA H100 80GB HBM3", 81559 / 1024, 81005 / 1024)
H200 = Card("NVIDIA H200", 143771 / 1024, 143190 / 1024)


def pytest_in(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        timeout=600,
    )


# The serve tests skip by what they import.


def test_the_serve_tests_need_what_they_and_the_server_import() -> None:
    needed = third_party_imports([TESTS / "test_serve.py", ROOT / "bench" / "serve"])
    assert {"fastapi", "uvicorn", "httpx", "starlette.testclient", "psutil"} <= set(needed)
    assert not {"os", "json", "candidates", "result_compare"} & set(needed), "neither the standard library's nor the tests' own"
    assert not [n for n in needed if n.startswith("kernel_refinery")]
    assert set(OPTIONAL_STACKS) == {"test_serve.py"}


def test_a_module_missing_under_the_serve_stack_skips_the_serve_tests_naming_it(tmp_path: Path) -> None:
    """fastapi present but its opentelemetry missing (the GPU image once): test_serve.py is skipped, not
    an import error that stops the run, and the reason names the missing module."""
    (tmp_path / "no_otel.py").write_text('import sys\n\nsys.modules["opentelemetry"] = None  # import of it fails\n')
    done = pytest_in("--co", "-q", "-rs", "-p", "no_otel", "tests/test_serve.py", env={"PYTHONPATH": str(tmp_path)})
    assert done.returncode in (0, 5), done.stdout[-3000:] + done.stderr[-3000:]
    skipped = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == 1 and "test_serve.py" in skipped[0], done.stdout[-3000:]
    assert "no module 'opentelemetry' here (needed by fastapi)" in skipped[0] and "kernel-refinery[serve]" in skipped[0]
    assert "error" not in done.stdout.lower().split("short test summary")[-1]
    collected = pytest_in("--co", "-q", "tests/test_serve.py")
    assert collected.returncode == 0 and "test_serve.py::" in collected.stdout, "with the stack here, the tests are collected"


# The GPU suite's plan.


def test_every_gpu_test_has_a_peak_estimate() -> None:
    """Collected as the GPU suite collects them (-m gpu): each has an estimate, or collection stops."""
    done = pytest_in("--co", "-q", "-m", "gpu", "tests")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    estimates = [gpu_memory.estimate(i) for i in ids]
    assert len(ids) >= 40 and all(e is not None for e in estimates)
    gibs = [e[0] for e in estimates if e is not None]
    assert min(gibs) <= 2.0 and max(gibs) > 50, "from an extension in the test process to a 4 GiB task's evaluation"


def test_a_gpu_test_without_an_estimate_stops_collection(tmp_path: Path) -> None:
    (tmp_path / "forget_pch.py").write_text(
        textwrap.dedent(
            """
            import gpu_memory

            del gpu_memory.PEAKS["tests/test_pch.py::test_a_cuda_builds_main_cpp_takes_its_header"]
            """
        )
    )
    done = pytest_in("--co", "-q", "-m", "gpu", "-p", "forget_pch", "tests/test_pch.py", env={"PYTHONPATH": f"{tmp_path}:{TESTS}"})
    assert done.returncode == 4, done.stdout[-2000:] + done.stderr[-2000:]
    assert "GPU tests without a peak estimate" in done.stderr and "test_a_cuda_builds_main_cpp_takes_its_header" in done.stderr


def test_the_plan_runs_8_workers_on_either_card_and_skips_what_an_h100_cannot_hold() -> None:
    h100, h200 = plan(H100), plan(H200)
    assert h100.workers == h200.workers == 8
    assert h100.usable_gib < H100.free_gib and h100.capacity_gib == pytest.approx(h100.usable_gib - 8 * RESIDENT_GIB)
    skipped = {key for key, (gib, _) in gpu_memory.PEAKS.items() if too_large(gib, h100, H100.describe())}
    # The built-in tasks at their CUDA sizes (4 GiB a set) in fp32: judge, runner and the judge's
    # reference runner together need more than an H100 leaves one test beside 8 workers.
    assert {
        "tests/test_gpu.py::test_each_timing_method_times_both_sides_and_records_itself[graph-judge/cuda-graph]",
        "tests/test_gpu.py::test_a_forward_that_cannot_be_captured_is_told_to_use_events",
        "tests/test_gpu.py::test_correct_cuda_candidate_for_builtin_task[1_relu]",
    } <= skipped
    assert all(key.startswith("tests/test_gpu.py::") and "4_softmax" not in key and "bf16" not in key for key in skipped), skipped
    assert not [key for key, (gib, _) in gpu_memory.PEAKS.items() if too_large(gib, h200)]
    why = too_large(71.8, h100, H100.describe())
    assert why is not None and "71.8 GiB" in why and "NVIDIA H100 80GB HBM3" in why and "larger card" in why
    small = plan(Card("NVIDIA L4", 22.5, 22.0))  # 20 GiB usable: 5 workers, 10 GiB for one test
    assert small.workers == 5 and too_large(27.8, small) and not too_large(2.0, small)


def test_the_plan_line_reads_into_the_suites_variables(tmp_path: Path) -> None:
    """gpu-suite reads `gpu_memory.py plan` with `read` (tab-separated); nvidia-smi faked as an H100's."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3, 81559, 81005'\n")
    fake.chmod(0o755)
    script = f"IFS=$'\\t' read -r card workers usable capacity too_large <<< \"$({sys.executable} tests/gpu_memory.py plan)\"\n"
    script += 'printf "%s|%s|%s|%s|%s" "$card" "$workers" "$usable" "$capacity" "$too_large"'
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    )
    card, workers, usable, capacity, large = done.stdout.split("|")
    assert card == H100.describe() and workers == "8" and float(usable) == plan(H100).usable_gib
    assert float(capacity) == pytest.approx(plan(H100).capacity_gib, abs=0.05)
    assert "graph-judge/cuda-graph" in large and "bf16_run_of_a_builtin_task[1_relu]" not in large


# The gate.

R = RESIDENT_GIB


def entry(held: float, want: float | None = None, since: float | None = None) -> dict[str, float | None]:
    return {"held": R + held, "want": want, "since": since, "test": None}


def test_a_test_starts_only_when_it_fits() -> None:
    budget = 3 * R + 60
    entries = {"1": entry(50), "2": entry(0, want=20, since=1.0)}
    assert not admits(entries, "2", budget), "50 + 20 running would exceed 60"
    entries["1"] = entry(30)
    assert admits(entries, "2", budget)


def test_small_tests_fill_in_beside_a_large_one_but_leave_the_largest_waiting_its_room() -> None:
    # A 50 runs and a second 50 waits for it: a small test may run beside the first.
    entries = {"big": entry(50), "next": entry(0, want=50, since=1.0), "a": entry(0, want=2, since=2.0)}
    assert not admits(entries, "next", 3 * R + 60)
    assert admits(entries, "a", 3 * R + 60), "beside the running 50, with room left for the waiting one"
    # The first 50 has ended; small tests run: one more fits in what is free, but only if it still
    # leaves the waiting 50 its room (4 residents, 2 + 4 running, 60 for tests).
    entries = {"next": entry(0, want=50, since=1.0), "a": entry(2), "b": entry(4), "c": entry(0, want=5, since=3.0)}
    budget = 4 * R + 60
    assert not admits(entries, "c", budget), "2 + 4 + 5 beside it would leave the waiting 50 too little"
    entries["c"] = entry(0, want=4, since=3.0)
    assert admits(entries, "c", budget) and admits(entries, "next", budget)
    # Equal needs go in the order they came: the later one waits for the earlier.
    entries = {"one": entry(0, want=50, since=1.0), "two": entry(0, want=50, since=2.0), "x": entry(10)}
    assert admits(entries, "one", 3 * R + 60) and not admits(entries, "two", 3 * R + 60)


GATE_CHILD = """
import json, sys, time
sys.path.insert(0, {tests!r})
from gpu_memory import MemoryGate
gate = MemoryGate(__import__("pathlib").Path({ledger!r}), budget_gib={budget}, poll_s=0.05)
waited = gate.acquire({want}, "t")
start = time.time()
time.sleep(0.4)
end = time.time()
gate.release()
gate.leave()
print(json.dumps([start, end]))
"""


def test_the_gate_lets_through_at_once_only_what_fits(tmp_path: Path) -> None:
    """Four processes wanting 5 GiB each, in a budget that holds two of them beside four residents."""
    ledger = tmp_path / "ledger.json"
    budget = 4 * R + 10
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", GATE_CHILD.format(tests=str(TESTS), ledger=str(ledger), budget=budget, want=5)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    spans = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    for t in [s for span in spans for s in span]:
        running = sum(1 for start, end in spans if start <= t < end)
        assert running <= 2, spans
    assert max(end for _, end in spans) - min(start for start, _ in spans) >= 0.75, "two rounds at most two at a time"
    assert json.loads(ledger.read_text()) == {}, "each left the ledger"


def test_a_dead_workers_share_is_freed(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.json"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ledger.write_text(json.dumps({str(dead.pid): entry(50)}))
    started = time.monotonic()
    gate = MemoryGate(ledger, budget_gib=R + 20, poll_s=0.05)
    gate.acquire(20, "t")
    assert time.monotonic() - started < 5
    assert set(json.loads(ledger.read_text())) == {str(os.getpid())}
    gate.leave()


# What a test held, and the summary.


def test_the_sampler_follows_the_test_processes_descendants() -> None:
    sleeper = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import time; time.sleep(30)'])"
    child = subprocess.Popen([sys.executable, "-c", sleeper])
    try:
        deadline = time.monotonic() + 20
        grandchildren: list[psutil.Process] = []
        while not grandchildren and time.monotonic() < deadline:
            grandchildren = psutil.Process(child.pid).children()
            time.sleep(0.05)
        assert grandchildren and gpu_memory.descends_from(grandchildren[0].pid, os.getpid())
        assert not gpu_memory.descends_from(1, os.getpid()) and not gpu_memory.descends_from(os.getppid(), os.getpid())
    finally:
        child.kill()
        child.wait()
    sampler = gpu_memory.PeakSampler(interval_s=0.05).start()
    time.sleep(0.2)
    sampler.stop()
    assert sampler.samples > 0 or sampler.error, "where NVML finds no GPU, the sampler says why and the test goes on"


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="1" skipped="2" tests="6" time="301.5">
<testcase classname="tests.test_gpu" name="test_a" time="90.0"/>
<testcase classname="tests.test_gpu" name="test_b" time="12.5"><failure message="boom"/></testcase>
<testcase classname="tests.test_isolation" name="test_c[cuda]" time="40.25"/>
<testcase classname="tests.test_gpu" name="test_d" time="0.0"><skipped message="too large"/></testcase>
<testcase classname="tests.test_gpu" name="test_e" time="0.0"><skipped message="too large"/></testcase>
<testcase classname="tests.test_pch" name="test_f" time="3.0"/>
</testsuite></testsuites>
"""


def test_the_summary_counts_and_names_the_slowest_tests_and_the_largest_peaks(tmp_path: Path) -> None:
    (tmp_path / "gpu.xml").write_text(JUNIT)
    lines = tmp_path / "peaks.jsonl"
    gpu_memory.append_line(lines, {"test": "tests/test_gpu.py::test_a", "estimate_gib": 54.1, "peak_gib": 41.7})
    gpu_memory.append_line(lines, {"test": "tests/test_pch.py::test_f", "estimate_gib": 1.0, "peak_gib": 0.6})
    peaks = tmp_path / "gpu_peaks.json"
    assert gpu_memory.main(["report", "--junit", str(tmp_path / "gpu.xml"), "--peaks", str(peaks), "--lines", str(lines)]) == 0
    written = json.loads(peaks.read_text())
    assert [t["test"] for t in written["tests"]] == ["tests/test_gpu.py::test_a", "tests/test_pch.py::test_f"], "largest first"
    text = gpu_memory.summary(tmp_path / "gpu.xml", peaks)
    first, slowest, *rest = text.splitlines()
    assert first == "3 passed, 1 failed, 0 errors, 2 skipped of 6 in 302 s"
    assert slowest == "slowest 6:" and "90.0 s  tests.test_gpu::test_a" in rest[0] and "test_c[cuda]" in rest[1]
    assert any("41.7 (est. 54.1)  tests/test_gpu.py::test_a" in line for line in rest)
    assert "no JUnit results" in gpu_memory.summary(tmp_path / "missing.xml", peaks)


def test_the_gpu_suite_script_is_shellcheck_clean() -> None:
    shellcheck = subprocess.run(["sh", "-c", "command -v shellcheck"], capture_output=True, text=True).stdout.strip()
    if not shellcheck:
        pytest.skip("shellcheck is not installed here (apt-get install shellcheck)")
    done = subprocess.run([shellcheck, ".ci/device/gpu-suite", ".ci/device/fetch-wheels"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout
