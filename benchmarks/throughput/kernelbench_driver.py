"""KernelBench's batch evaluation, scripts/eval_from_generations.py, run through the vendored code.

`run_kernelbench` does what that script's `main()` does with `eval_mode=local` (see
benchmarks/kernelbench_vendor/NOTE.md for the mapping), at its best settings for one GPU:

1. the candidates are written where its `fetch_kernel_from_disk` reads them
   (`runs_dir/run_name/level_{level}_problem_{id}_sample_{id}_kernel.py`), and its dataset is an
   object with `get_problem_by_id(id).code` holding each reference program;
2. `build_cache` on: `compile.batch_compile` builds every candidate into
   `kernel_eval_build_dir/run_name/{problem}/{sample}` in a pool of `num_cpu_workers` spawned
   processes (the host's cores);
3. `batch_eval` evaluates them one GPU batch at a time (`num_gpu_devices` = 1: one spawned process
   per candidate, `timeout` seconds each) with `eval_kernel_against_ref` at its defaults:
   5 correctness trials, 100 perf trials, cuda_event timing, the reference timed too.

Each distinct task is one problem id; a task's candidates are its samples. Nothing here changes
how a candidate is judged. One addition: when `batch_eval` raises (it does when a candidate's
evaluation returns None, which `eval_kernel_against_ref` does for a compile error whose text
mentions "lock"), the run goes on with the candidates it had not written yet, as rerunning
the script would, and the candidate it stopped on is recorded as a harness error.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.throughput.manifest import Work

RUN_NAME = "throughput"
LEVEL_TAG = "mixed"
"""eval_from_generations names kernel files by one level; these tasks come from levels 1 and 2."""


@dataclass
class Problem:
    """What eval_from_generations reads of a dataset problem."""

    problem_id: int
    name: str
    code: str
    path: str | None = None


class CandidateDataset:
    """The part of KernelBench's dataset interface that batch evaluation uses (picklable: it is
    sent to every evaluation process)."""

    def __init__(self, problems: dict[int, Problem]):
        self.problems = problems

    def get_problem_by_id(self, problem_id: int) -> Problem:
        return self.problems[problem_id]

    def get_problem_ids(self) -> list[int]:
        return sorted(self.problems)


@dataclass
class KernelBenchRun:
    wall_s: float
    compile_s: float
    eval_s: float
    results: dict[str, dict[str, Any]]
    """Per candidate: what eval_from_generations wrote to eval_results.json for it, plus its problem and sample ids."""
    compiled_in_cache: dict[str, bool | None]
    """Per candidate: whether batch_compile built it (None: its worker failed)."""
    harness_errors: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)


def verdict(entry: dict[str, Any] | None) -> str:
    """The benchmark's verdict for one eval_results.json entry (see manifest.VERDICTS)."""
    if entry is None:
        return "missing"
    metadata = entry.get("metadata") or {}
    if entry.get("correctness"):
        return "correct"
    if "cuda_error" in metadata:
        return "runtime_error"  # evaluate_single_sample records a CUDA error as compiled=False
    if metadata.get("error") == "Evaluation timed out":
        return "timeout"
    if "error" in metadata:
        return "harness_error"  # batch_eval's outer catch: the evaluation process itself failed
    if "other_error" in metadata:
        return "runtime_error"
    if not entry.get("compiled"):
        return "compile_error"
    if "runtime_error" in metadata:
        return "runtime_error"
    return "incorrect"


@contextlib.contextmanager
def _restored_process_state(cwd: Path) -> Iterator[None]:
    """Run in `cwd` (batch_compile may write error_log.txt there) and give back the environment
    afterwards (set_gpu_arch sets TORCH_CUDA_ARCH_LIST, which the evaluator pool must not inherit)."""
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


def _evaluated(eval_file: Path) -> set[tuple[int, int]]:
    if not eval_file.exists():
        return set()
    data = json.loads(eval_file.read_text())
    return {(int(pid), int(entry["sample_id"])) for pid, entries in data.items() for entry in entries}


def run_kernelbench(
    work: list[Work],
    work_dir: Path,
    cpu_workers: int,
    gpu_arch: list[str],
    timeout_s: int | None = None,
    on_phase: Callable[[str, str], None] | None = None,
) -> KernelBenchRun:
    """Evaluate `work` as eval_from_generations does (build cache first, then one GPU); see the module doc."""
    import torch

    from benchmarks.kernelbench_vendor import compile as kb_compile
    from benchmarks.kernelbench_vendor import eval_from_generations as efg
    from benchmarks.kernelbench_vendor.utils import set_gpu_arch

    work_dir.mkdir(parents=True, exist_ok=True)
    config = efg.EvalConfig()
    config.run_name = RUN_NAME
    config.dataset_src = "local"
    config.level = LEVEL_TAG
    config.gpu_arch = list(gpu_arch)
    config.runs_dir = str(work_dir / "runs")
    config.kernel_eval_build_dir = str(work_dir / "build")
    config.build_cache = True
    config.num_cpu_workers = cpu_workers
    config.num_gpu_devices = 1
    if timeout_s is not None:
        config.timeout = timeout_s

    # The dataset (one problem per task) and the kernels on disk, as fetch_kernel_from_disk reads them.
    problem_ids: dict[str, int] = {}
    problems: dict[int, Problem] = {}
    samples: dict[int, int] = {}
    ids: dict[tuple[int, int], str] = {}
    run_dir = Path(config.runs_dir) / config.run_name
    run_dir.mkdir(parents=True, exist_ok=True)
    for item in work:
        if item.task not in problem_ids:
            pid = len(problem_ids) + 1
            problem_ids[item.task] = pid
            problems[pid] = Problem(problem_id=pid, name=item.task.split("/")[-1] + ".py", code=item.task_source)
        pid = problem_ids[item.task]
        sid = samples.get(pid, 0)
        samples[pid] = sid + 1
        ids[(pid, sid)] = item.candidate
        (run_dir / f"level_{config.level}_problem_{pid}_sample_{sid}_kernel.py").write_text(item.kernel_source)
    dataset = CandidateDataset(problems)
    total_work = list(ids)
    eval_file = run_dir / "eval_results.json"

    harness_errors: dict[str, str] = {}
    with _restored_process_state(work_dir):
        started = time.perf_counter()
        # main(): local mode needs a GPU; set_gpu_arch picks what nvcc builds for.
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA device not available. Local evaluation requires GPU.")
        set_gpu_arch(config.gpu_arch)
        assert config.num_gpu_devices <= torch.cuda.device_count()
        # main() sets spawn when no start method is set, as in a fresh process; here something may
        # have set another, and forked children of a process that touched CUDA cannot use it.
        if mp.get_start_method(allow_none=True) != "spawn":
            mp.set_start_method("spawn", force=True)
        if on_phase:
            on_phase(
                "compile", f"KernelBench: compiling {len(total_work)} candidates on {config.num_cpu_workers} CPU workers (build_cache)"
            )
        built = kb_compile.batch_compile(total_work, config.to_dict())
        compiled_at = time.perf_counter()
        if on_phase:
            on_phase("eval", f"KernelBench: evaluating on the GPU, one process per candidate ({compiled_at - started:.0f} s of compiling)")
        remaining = list(total_work)
        while remaining:
            try:
                efg.batch_eval(remaining, config, dataset, str(run_dir), str(eval_file))
                remaining = []
            except Exception as exc:  # noqa: BLE001 - KernelBench's own failure: recorded, and the run goes on
                done = _evaluated(eval_file)
                left = [w for w in remaining if w not in done]
                if not left:
                    break
                harness_errors[ids[left[0]]] = f"batch_eval raised {type(exc).__name__}: {exc}"[:2000]
                remaining = left[1:]
        finished = time.perf_counter()

    results: dict[str, dict[str, Any]] = {}
    if eval_file.exists():
        for pid, entries in json.loads(eval_file.read_text()).items():
            for entry in entries:
                name = ids.get((int(pid), int(entry["sample_id"])))
                if name is not None:
                    results[name] = {"problem_id": int(pid), **entry}
    compiled_in_cache = {ids[w]: (bool(ok) if ok is not None else None) for w, ok in zip(total_work, built or [], strict=False)}
    settings = {k: v for k, v in config.to_dict().items() if isinstance(v, (str, int, float, bool, list, tuple, type(None)))}
    return KernelBenchRun(
        wall_s=finished - started,
        compile_s=compiled_at - started,
        eval_s=finished - compiled_at,
        results=results,
        compiled_in_cache=compiled_in_cache,
        harness_errors=harness_errors,
        settings=settings,
    )
