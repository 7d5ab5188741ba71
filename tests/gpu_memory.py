"""The GPU suite's memory: each GPU test's peak, how many tests run at once, and what they really took.

`bash .ci/device/gpu-suite` runs the GPU tests with pytest-xdist on whichever card it is lent (an
H100 with 80 GB or an H200 with 141 GB). Each evaluation runs in a judge and a runner of its own
(tools/processes/), so a test's memory is those processes', not the test process's; with 8 workers
on 80 GB, tests allocating up to 16 GiB of inputs at once ran out of memory (one process held
41.7 GB). Here:

- `PEAKS`: each GPU test's peak estimate in GiB, read from what it allocates (`evaluation_gib`
  says how), one entry per test; a GPU test without one is a usage error, so a new test cannot
  slip in unsized.
- `plan`: the worker count for the card's free memory: what fits with a margin, at most 8. A test
  whose peak cannot fit beside the other workers' idle processes skips, saying what it needs.
- `MemoryGate`: the workers hold a test's estimate in a shared ledger while it runs, and a test
  starts only when it fits in what the card has left; the largest test waiting keeps its room,
  and smaller ones fill in beside the running ones.
- `PeakSampler`: what each GPU test really held, sampled through NVML over the test process and
  its children (judge, runners, Nsight Compute), with torch's own peak in the test process, one
  line per test; `write_peaks` gathers them into gpu_peaks.json so the estimates can be set from
  measurements on the next run.

`python tests/gpu_memory.py plan` prints the plan for this card (tab-separated: PLAN_FIELDS);
`python tests/gpu_memory.py report ...` prints the suite's closing summary (gpu-suite calls both).
No torch here: the suite's controller and the plan never touch CUDA.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GIB = float(1 << 30)
MAX_WORKERS = 8

# What one evaluation holds, by reading tools/processes/judge.py, tools/steps/correctness.py,
# tools/steps/timing_stage.py and tools/processes/remote.py (to be replaced by measured figures:
# the suite records every test's real peak in gpu_peaks.json).
CONTEXT_GIB = 0.55
"""One process's CUDA context with torch's kernels loaded (what nvidia-smi shows for a process that
has run a few kernels): the judge, each runner, an Nsight Compute target, a test process using CUDA."""
FLUSH_GIB = 0.25
"""The judge's L2-flush buffer (tools/steps/timing.py, 256 MiB), held as long as the judge lives."""
SLACK = 1.1
"""The caching allocator's rounding and fragmentation over the tensors live at the peak."""
SMALL_GIB = 2.0
"""An evaluation of a task with inputs of a few MiB: two contexts, the flush buffer, cuBLAS's
workspace and torch.compile's kernels in the judge, with room to spare."""
RESIDENT_GIB = 2.0
"""What a worker may hold between its tests: a module-scoped evaluator left idle (its judge's
context and flush buffer, its last runner's context) and the test process's own context after a
test that used CUDA in that process."""


def evaluation_gib(inputs: float, outputs: float, cast_from: float = 0.0, graph: bool = False) -> float:
    """The peak of one evaluation over its judge and runner, for a task whose one set of inputs takes
    `inputs` GiB and whose outputs take `outputs` GiB at the run's precision (`cast_from`: one input
    set as drawn, in fp32, before the cast to a lower precision; 0 without a cast).

    Judge: the kernel share (tools/steps/correctness.py: kernel_share) draws 4 input sets and writes
    them all into a 4-set arena, while the job's one-set input arena and its output arena live on
    until the job ends (tools/processes/remote.py: RunnerLink.arenas): 9 inputs and 1 output, plus a
    drawn fp32 set that the allocator keeps after a cast. The timing that follows in the same job
    (reference calls, the candidate's inputs written call by call, the copies of its outputs) needs
    at most 7 inputs and 3 outputs at once, from blocks the kernel share freed and the allocator
    kept; the job's end empties that cache (tools/processes/judge.py: run_job). A CUDA graph
    (eval.timing=graph) keeps its static inputs and output in a pool of its own: one set more.
    Runner: its context, and a candidate's outputs of two calls (one being copied into the output
    arena, one being made); with a graph, its own static set too. Without the slack, a judge on a
    4 GiB task holds 40 GiB at its kernel share; the H100 run that ran out of memory saw one process
    at 41.7 GB (38.8 GiB), which one was not recorded."""
    judge = CONTEXT_GIB + FLUSH_GIB + SLACK * (9 * inputs + outputs + cast_from)
    runner = CONTEXT_GIB + SLACK * 2 * outputs
    # The judge's reference runner (tools/steps/timing_stage.py): the reference's outputs of two calls.
    reference = CONTEXT_GIB + SLACK * 2 * outputs
    if graph:
        judge += SLACK * (inputs + outputs)
        runner += SLACK * (inputs + outputs)
        reference += SLACK * (inputs + outputs)
    return round(max(judge + runner + reference, SMALL_GIB), 1)


# The tasks' sizes on CUDA (bench/suites/builtin/level1/*.py: REFINERY_SIZES), in GiB of one input
# set and of the output, fp32: 4096 x 262144 and 4096 x 131072 floats.
RELU_GELU = 4096 * 262144 * 4 / GIB  # 4 GiB, input and output alike
SOFTMAX = 4096 * 131072 * 4 / GIB  # 2 GiB

PEAKS: dict[str, tuple[float, str]] = {
    # tests/test_gpu.py: built-in tasks at their CUDA sizes (GiB-sized), everything else on tasks of
    # 256 x 1024 floats (1 MiB).
    "tests/test_gpu.py::test_correct_cuda_candidate_for_builtin_task[1_relu]": (
        evaluation_gib(RELU_GELU, RELU_GELU),
        "1_relu at 4 GiB in and out, fp32",
    ),
    "tests/test_gpu.py::test_correct_cuda_candidate_for_builtin_task[2_gelu]": (
        evaluation_gib(RELU_GELU, RELU_GELU),
        "2_gelu at 4 GiB in and out, fp32",
    ),
    "tests/test_gpu.py::test_correct_cuda_candidate_for_builtin_task[4_softmax]": (
        evaluation_gib(SOFTMAX, SOFTMAX),
        "4_softmax at 2 GiB in and out, fp32",
    ),
    "tests/test_gpu.py::test_bf16_run_of_a_builtin_task[1_relu]": (
        evaluation_gib(RELU_GELU / 2, RELU_GELU / 2, cast_from=RELU_GELU),
        "1_relu in bf16 (2 GiB), drawn in fp32 first",
    ),
    "tests/test_gpu.py::test_bf16_run_of_a_builtin_task[2_gelu]": (
        evaluation_gib(RELU_GELU / 2, RELU_GELU / 2, cast_from=RELU_GELU),
        "2_gelu in bf16 (2 GiB), drawn in fp32 first",
    ),
    "tests/test_gpu.py::test_bf16_run_of_a_builtin_task[4_softmax]": (
        evaluation_gib(SOFTMAX / 2, SOFTMAX / 2, cast_from=SOFTMAX),
        "4_softmax in bf16 (1 GiB), drawn in fp32 first",
    ),
    "tests/test_gpu.py::test_triton_candidate_end_to_end": (
        evaluation_gib(RELU_GELU, RELU_GELU),
        "1_relu at 4 GiB, a Triton candidate",
    ),
    "tests/test_gpu.py::test_each_timing_method_times_both_sides_and_records_itself[host-judge]": (
        evaluation_gib(RELU_GELU, RELU_GELU),
        "1_relu at 4 GiB, two evaluations one after the other",
    ),
    "tests/test_gpu.py::test_each_timing_method_times_both_sides_and_records_itself[graph-judge/cuda-graph]": (
        evaluation_gib(RELU_GELU, RELU_GELU, graph=True),
        "1_relu at 4 GiB timed by CUDA-graph replay: each side's graph keeps a set of its own",
    ),
    "tests/test_gpu.py::test_a_forward_that_cannot_be_captured_is_told_to_use_events": (
        evaluation_gib(RELU_GELU, RELU_GELU, graph=True),
        "1_relu at 4 GiB: the reference's graph is captured, the candidate's capture fails after its warm-up",
    ),
    "tests/test_gpu.py::test_nsight_compute_metrics_for_a_cuda_candidate": (
        round(CONTEXT_GIB + SLACK * 3 * SOFTMAX + 1.0, 1),
        "4_softmax at 2 GiB under Nsight Compute: its inputs and output and the kernel replay's saved output, in ncu's target",
    ),
    "tests/test_gpu.py::test_tf32_matmul_fails_fp32_at_the_default_and_passes_at_the_papers_tolerance": (
        SMALL_GIB,
        "2048 x 2048 matmul: 48 MiB a set",
    ),
    "tests/test_gpu.py::*": (SMALL_GIB, "tasks of 1 MiB"),
    # tests/test_isolation.py: tasks of 1-2 MiB; one test runs a judge inside the test process.
    "tests/test_isolation.py::test_a_kernel_first_timed_below_the_floor_is_scored_from_its_retiming[cuda]": (
        round(SMALL_GIB + CONTEXT_GIB + FLUSH_GIB, 1),
        "1 MiB task, a second judge in the test process",
    ),
    "tests/test_isolation.py::*": (SMALL_GIB, "tasks of 1-2 MiB"),
    # tests/test_judge_clock.py: a 32 MiB task on CUDA (batches of its inputs and outputs up to 512 MiB
    # a runner); two evaluators alive at once in one test (six processes with contexts), and a
    # candidate that holds 256 MiB of its own to load the GPU.
    "tests/test_judge_clock.py::*": (6.0, "32 MiB task, two evaluators at once, a 256 MiB loader"),
    # tests/test_examples.py: the prompts' sigmoid example, 256 x 16384 floats (16 MiB).
    "tests/test_examples.py::test_gpu_example_is_correct_on_cuda*": (SMALL_GIB, "16 MiB task"),
    # tests/test_pch.py: an extension loaded in the test process, on 16 KiB.
    "tests/test_pch.py::test_a_cuda_builds_main_cpp_takes_its_header": (1.0, "the test process's own context"),
}
"""Each GPU test's peak in GiB over all its processes, and what it runs on. A key ending in `*`
covers the tests whose node id starts with the rest; the longest key that matches decides."""


MEASURED: dict[str, float] = {
    "tests/test_examples.py::test_gpu_example_is_correct_on_cuda[cuda-0]": 9.5,
    "tests/test_examples.py::test_gpu_example_is_correct_on_cuda[triton-0]": 9.4,
    "tests/test_gpu.py::TestCudaGuards::test_content_memo_gains_nothing": 5.9,
    "tests/test_gpu.py::TestCudaGuards::test_correct_kernel_records_the_guards": 2.7,
    "tests/test_gpu.py::TestCudaGuards::test_decoy_beside_a_substitute_op_is_rejected_by_kernel_share": 2.4,
    "tests/test_gpu.py::TestCudaGuards::test_deferred_tensor_subclass_is_rejected": 2.0,
    "tests/test_gpu.py::TestCudaGuards::test_identity_on_non_negative_inputs_fails": 2.1,
    "tests/test_gpu.py::TestCudaGuards::test_output_reused_across_timed_calls_fails": 2.1,
    "tests/test_gpu.py::TestCudaGuards::test_output_sharing_an_input_is_rejected[returned_input]": 2.4,
    "tests/test_gpu.py::TestCudaGuards::test_output_sharing_an_input_is_rejected[returned_view]": 2.1,
    "tests/test_gpu.py::TestCudaGuards::test_pointer_memo_fails_on_a_reused_address": 2.4,
    "tests/test_gpu.py::TestCudaHacks::test_all_zero_output_fails": 2.4,
    "tests/test_gpu.py::TestCudaHacks::test_correct_reference_kernel": 2.7,
    "tests/test_gpu.py::TestCudaHacks::test_downcast_beyond_tolerance_fails": 2.4,
    "tests/test_gpu.py::TestCudaHacks::test_illegal_memory_access_is_a_cuda_fault_and_worker_is_replaced": 2.2,
    "tests/test_gpu.py::TestCudaHacks::test_input_mutation_rejected": 16.9,
    "tests/test_gpu.py::TestCudaHacks::test_output_caching_fails": 2.7,
    "tests/test_gpu.py::TestCudaHacks::test_torch_op_behind_a_decoy_kernel_rejected": 2.4,
    "tests/test_gpu.py::TestCudaHacks::test_try_except_fallback_rejected": 2.4,
    "tests/test_gpu.py::TestCudaHacks::test_uninitialised_output_holding_the_reference_fails": 2.4,
    "tests/test_gpu.py::TestCudaHacks::test_work_on_a_side_stream_is_timed": 2.2,
    "tests/test_gpu.py::test_bf16_run_of_a_builtin_task[1_relu]": 37.4,
    "tests/test_gpu.py::test_bf16_run_of_a_builtin_task[4_softmax]": 41.8,
    "tests/test_gpu.py::test_nsight_compute_metrics_for_a_cuda_candidate": 8.7,
    "tests/test_gpu.py::test_tf32_matmul_fails_fp32_at_the_default_and_passes_at_the_papers_tolerance": 5.5,
    "tests/test_isolation.py::test_a_hook_on_the_check_finds_no_check_and_its_deferred_work_fails[cuda]": 3.9,
    "tests/test_isolation.py::test_a_kernel_first_timed_below_the_floor_is_scored_from_its_retiming[cuda]": 5.3,
    "tests/test_isolation.py::test_a_span_memo_for_a_linear_operator_gains_nothing_from_drawn_inputs[cuda]": 7.5,
    "tests/test_isolation.py::test_backend_flag_changed_in_init_is_rejected_by_name[cuda]": 3.5,
    "tests/test_isolation.py::test_guards_record_what_confines_the_candidate[cuda]": 3.5,
    "tests/test_isolation.py::test_inputs_predicted_from_the_global_seed_never_hit[cuda]": 3.5,
    "tests/test_isolation.py::test_reading_the_harness_frames_is_refused[cuda]": 2.7,
    "tests/test_isolation.py::test_the_judges_modules_are_not_in_the_candidates_process[cuda]": 2.4,
    "tests/test_isolation.py::test_the_runners_clock_patched_from_python_is_refused_by_name[cuda]": 3.7,
    "tests/test_isolation.py::test_thread_count_changed_in_init_is_rejected_by_name[cuda]": 3.8,
    "tests/test_isolation.py::test_torch_function_replaced_through_sys_modules_is_rejected_by_name[cuda]": 3.5,
    "tests/test_judge_clock.py::test_loading_the_machine_between_calls_moves_no_time[cuda]": 6.2,
}
"""Peaks measured above their estimate (GiB, all of a test's processes, gpu_peaks.json of the GPU
suite on an H100 80 GB, 2026-12-06, 8 workers; a class's tests share its evaluator, whose processes
count in each). `estimate` takes 1.2 times these where they exceed PEAKS."""
MEASURED_MARGIN = 1.2


def estimate(nodeid: str) -> tuple[float, str] | None:
    """A GPU test's peak estimate and its reason, or None where PEAKS has none."""
    found = [key for key in PEAKS if key == nodeid or (key.endswith("*") and nodeid.startswith(key[:-1]))]
    if not found:
        return None
    gib, why = PEAKS[max(found, key=len)]
    seen = MEASURED.get(nodeid)
    if seen is not None and seen * MEASURED_MARGIN > gib:
        return round(seen * MEASURED_MARGIN, 1), f"{why}; measured {seen} GiB on an H100"
    return gib, why


# The card and the plan.


@dataclass(frozen=True)
class Card:
    name: str
    total_gib: float
    free_gib: float

    def describe(self) -> str:
        return f"{self.name}, {self.total_gib:.1f} GiB ({self.free_gib:.1f} GiB free)"


def read_card(index: int = 0) -> Card | None:
    """The card as nvidia-smi sees it; None where there is none."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "-i", str(index), "--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else ""
    parts = [p.strip() for p in line.rsplit(",", 2)]
    if len(parts) != 3:
        return None
    return Card(name=parts[0], total_gib=float(parts[1]) / 1024, free_gib=float(parts[2]) / 1024)


def margin_gib(total_gib: float) -> float:
    """Left free: what the driver and CUDA's own allocations take beyond the estimates (3% of the card, at least 2 GiB)."""
    return max(2.0, 0.03 * total_gib)


@dataclass(frozen=True)
class Plan:
    workers: int
    usable_gib: float
    """The card's free memory less the margin: what the workers' processes may hold together."""

    @property
    def capacity_gib(self) -> float:
        """The most one test may need: what is usable beside every worker's idle processes."""
        return self.usable_gib - self.workers * RESIDENT_GIB


def plan(card: Card) -> Plan:
    """As many workers as fit in the card's free memory less the margin, each with room for its idle
    processes and a small test, at most 8. A test larger than what is left to one test beside
    every worker's idle processes (`Plan.capacity_gib`) skips, saying so (`too_large`)."""
    usable = card.free_gib - margin_gib(card.total_gib)
    workers = max(1, min(MAX_WORKERS, int(usable // (RESIDENT_GIB + SMALL_GIB))))
    return Plan(workers=workers, usable_gib=round(usable, 1))


def too_large(peak_gib: float, the_plan: Plan, where: str = "this card") -> str | None:
    """Why a test of this peak skips under this plan on the card described, or None where it fits."""
    if peak_gib <= the_plan.capacity_gib:
        return None
    return (
        f"needs about {peak_gib:.1f} GiB of GPU memory at its peak (tests/gpu_memory.py), and {where} gives one test "
        f"at most {the_plan.capacity_gib:.1f} GiB beside {the_plan.workers} workers' idle processes: it runs on a larger "
        "card (an H200) or with fewer workers"
    )


# The gate: the workers' shared ledger of what each holds.


@dataclass
class MemoryGate:
    """A ledger file the suite's workers share under a lock: each worker holds RESIDENT_GIB while it
    lives and a test's estimate more while the test runs; a test starts only when it fits in
    `budget_gib`. The largest test waiting (the earliest among equals) keeps its room: another
    starts only if what runs beside the large ones, itself included, still leaves that room, so the
    largest always starts once the large ones before it end, and smaller ones fill in meanwhile."""

    path: Path
    budget_gib: float
    poll_s: float = 0.5
    pid: int = field(default_factory=os.getpid)

    @contextlib.contextmanager
    def _ledger(self) -> Iterator[dict[str, dict[str, Any]]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            fh.seek(0)
            text = fh.read()
            entries: dict[str, dict[str, Any]] = json.loads(text) if text.strip() else {}
            for pid in [p for p in entries if not _alive(int(p))]:
                del entries[pid]  # a worker that died holds nothing
            yield entries
            fh.seek(0)
            fh.truncate()
            fh.write(json.dumps(entries))

    def join(self) -> None:
        with self._ledger() as entries:
            entries[str(self.pid)] = {"held": RESIDENT_GIB, "test": None, "want": None, "since": None}

    def leave(self) -> None:
        with self._ledger() as entries:
            entries.pop(str(self.pid), None)

    def acquire(self, gib: float, test: str) -> float:
        """Wait until the test fits; the seconds waited."""
        started = time.monotonic()
        while True:
            with self._ledger() as entries:
                mine = entries.setdefault(str(self.pid), {"held": RESIDENT_GIB, "test": None, "want": None, "since": None})
                if mine["since"] is None:
                    mine.update(want=gib, since=time.time(), test=test)
                if admits(entries, str(self.pid), self.budget_gib):
                    mine.update(held=RESIDENT_GIB + gib, want=None, since=None)
                    return time.monotonic() - started
            time.sleep(self.poll_s)

    def release(self) -> None:
        with self._ledger() as entries:
            entries[str(self.pid)] = {"held": RESIDENT_GIB, "test": None, "want": None, "since": None}


def admits(entries: dict[str, dict[str, Any]], pid: str, budget_gib: float) -> bool:
    """Whether the waiting test of `pid` may start (see MemoryGate)."""
    mine = entries[pid]
    want, since = float(mine["want"]), float(mine["since"])
    held = sum(float(e["held"]) for p, e in entries.items() if p != pid) + RESIDENT_GIB
    if held + want > budget_gib:
        return False
    ahead = [
        float(e["want"])
        for p, e in entries.items()
        if p != pid and e.get("want") is not None and (float(e["want"]), -float(e["since"])) > (want, -since)
    ]
    if not ahead:
        return True
    largest = max(ahead)
    residents = RESIDENT_GIB * len(entries)
    beside = sum(float(e["held"]) - RESIDENT_GIB for p, e in entries.items() if p != pid and float(e["held"]) - RESIDENT_GIB < largest)
    return residents + beside + want + largest <= budget_gib


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# What a test really held.


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _role(pid: int, root: int) -> str:
    if pid == root:
        return "test"
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "other"
    if "tools.processes.judge" in command:
        return "judge"
    if "ncu" in command.split()[0:1] or "/ncu" in command:
        return "ncu"
    return "runner"  # the runners, forked from the warm template (whose command line they show) or started plainly


def descends_from(pid: int, root: int) -> bool:
    seen = 0
    while pid > 1 and seen < 64:
        if pid == root:
            return True
        parent = _parent(pid)
        if parent is None:
            return False
        pid, seen = parent, seen + 1
    return pid == root


@dataclass
class PeakSampler:
    """Samples NVML every `interval_s` from `start` to `stop`: the GPU memory of this process and its
    descendants, their sum and each role's largest, and the card's memory in use."""

    interval_s: float = 0.2
    root: int = field(default_factory=os.getpid)
    peak_gib: float = 0.0
    by_role: dict[str, float] = field(default_factory=dict)
    card_used_gib: float = 0.0
    samples: int = 0
    error: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> PeakSampler:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(_nvml_index())
        except Exception as exc:  # noqa: BLE001 - no NVML here: the test runs, unmeasured
            self.error = f"{type(exc).__name__}: {exc}"
            return self
        self._thread = threading.Thread(target=self._run, args=(pynvml, handle), name="gpu-peaks", daemon=True)
        self._thread.start()
        return self

    def _run(self, pynvml: Any, handle: Any) -> None:
        while True:
            try:
                self._sample(pynvml, handle)
            except Exception as exc:  # noqa: BLE001 - one failed read ends the series, not the test
                self.error = f"{type(exc).__name__}: {exc}"
                return
            if self._stop.wait(self.interval_s):
                return

    def _sample(self, pynvml: Any, handle: Any) -> None:
        total = 0.0
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            used = getattr(proc, "usedGpuMemory", None)
            if not used or not descends_from(int(proc.pid), self.root):
                continue
            gib = used / GIB
            total += gib
            role = _role(int(proc.pid), self.root)
            self.by_role[role] = round(max(self.by_role.get(role, 0.0), gib), 2)
        self.peak_gib = round(max(self.peak_gib, total), 2)
        self.card_used_gib = round(max(self.card_used_gib, pynvml.nvmlDeviceGetMemoryInfo(handle).used / GIB), 2)
        self.samples += 1

    def stop(self) -> PeakSampler:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        return self


def _nvml_index() -> int:
    """The NVML index of CUDA device 0: the first of CUDA_VISIBLE_DEVICES when it names one by number."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(visible) if visible.isdigit() else 0


def append_line(path: Path, record: dict[str, Any]) -> None:
    """One test's record, appended whole under a lock (several workers write the same file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.write(json.dumps(record) + "\n")


def write_peaks(lines: Path, out: Path, header: dict[str, Any]) -> dict[str, Any]:
    """The tests' records, largest measured peak first, under the run's header, as one JSON file."""
    tests = []
    if lines.exists():
        tests = [json.loads(line) for line in lines.read_text().splitlines() if line.strip()]
    tests.sort(key=lambda t: (-(t.get("peak_gib") or 0.0), t["test"]))
    data = {**header, "tests": tests}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    return data


# The command line: the plan for gpu-suite, and its closing summary.


PLAN_FIELDS = ("card", "workers", "usable_gib", "capacity_gib", "too_large")
"""What `plan` prints, tab-separated on one line, in this order (gpu-suite reads them so)."""


def _plan_command() -> int:
    card = read_card()
    if card is None:
        print("nvidia-smi sees no GPU", file=sys.stderr)
        return 1
    chosen = plan(card)
    skipped = [key for key, (gib, _) in PEAKS.items() if too_large(gib, chosen)]
    values = (card.describe(), str(chosen.workers), f"{chosen.usable_gib:.1f}", f"{chosen.capacity_gib:.1f}", " ".join(skipped) or "-")
    print("\t".join(values))
    return 0


def summary(junit: Path, peaks: Path, slowest: int = 10) -> str:
    """The suite's counts and slowest tests from its JUnit file, and the largest measured peaks."""
    lines = []
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError) as exc:
        return f"no JUnit results ({exc}): the run ended before pytest wrote them"
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    count = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    passed = count["tests"] - count["failures"] - count["errors"] - count["skipped"]
    took = sum(float(s.get("time", 0)) for s in suites)
    lines.append(
        f"{passed} passed, {count['failures']} failed, {count['errors']} errors, {count['skipped']} skipped "
        f"of {count['tests']} in {took:.0f} s"
    )
    cases = sorted(root.iter("testcase"), key=lambda c: -float(c.get("time", 0)))
    lines.append(f"slowest {min(slowest, len(cases))}:")
    lines += [f"  {float(c.get('time', 0)):7.1f} s  {c.get('classname')}::{c.get('name')}" for c in cases[:slowest]]
    if peaks.exists():
        measured = [t for t in json.loads(peaks.read_text()).get("tests", []) if t.get("peak_gib")]
        lines.append(f"largest measured peaks (GiB, all of a test's processes; estimate beside), of {len(measured)} measured:")
        lines += [f"  {t['peak_gib']:6.1f} (est. {t.get('estimate_gib', '?')})  {t['test']}" for t in measured[:slowest]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("plan", help=f"this card's plan, tab-separated: {', '.join(PLAN_FIELDS)}")
    report = commands.add_parser("report", help="the suite's closing summary")
    report.add_argument("--junit", type=Path, required=True)
    report.add_argument("--peaks", type=Path, required=True, help="gpu_peaks.json; made from --lines where the run ended before writing it")
    report.add_argument("--lines", type=Path, help="the tests' records, one JSON line each")
    args = parser.parse_args(argv)
    if args.command == "plan":
        return _plan_command()
    if not args.peaks.exists() and args.lines is not None and args.lines.exists():
        write_peaks(args.lines, args.peaks, {"note": "written after the run: pytest ended before writing it"})
    print(summary(args.junit, args.peaks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
