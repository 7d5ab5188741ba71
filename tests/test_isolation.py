"""Nothing a verdict depends on is within the candidate's reach: hacks of every class that reached
into the timer, the seeds, the checks or global state from inside the candidate's process, each
run as a real candidate through the evaluator (runner and judge in their own processes), on CPU
with `make test` and on CUDA with `make test-gpu` (the same tests, the kernels built for each).

Each test names the defence that fired, then checks that a later honest candidate in the same
evaluator gets the same reference timing as before the hack, and that the baseline cache on disk
is byte for byte what it was: a folder of baselines of this module's own, since other tests' judges
(other pytest workers, a shared REFINERY_CACHE_DIR) write theirs meanwhile; the builds stay shared.
The static check is skipped (stages from COMPILE on) unless a test
says otherwise: these are the run-time defences, which must hold without it.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import textwrap
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path

import pytest
import torch
from candidates import candidate, cuda_candidate

from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.evaluator import Evaluator
from kernel_refinery.tools.processes.jobs import EvalJob, TaskProgram
from kernel_refinery.tools.processes.remote import RunnerLink
from kernel_refinery.tools.results import EvalResult, Stage, TimingStats

RUNTIME = (Stage.COMPILE, Stage.CORRECTNESS, Stage.TIMING)
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])])
def device(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def build(device: str) -> Callable[..., str]:
    return candidate if device == "cpu" else cuda_candidate


@pytest.fixture(scope="module")
def reps(device: str) -> int:
    """Passes of the slow honest ReLU: milliseconds on either device, so that a quarter of it shows."""
    return 60 if device == "cpu" else 3000


@pytest.fixture(scope="module")
def config(cpu_config: EvalConfig, device: str, tmp_path_factory: pytest.TempPathFactory) -> EvalConfig:
    # Two torch threads, so that a candidate setting one is a change; the baseline cache on, in a
    # folder no other test writes to (the builds stay in the shared cache).
    baselines = tmp_path_factory.mktemp(f"baselines-{device}")
    return cpu_config.model_copy(
        update={
            "device": device,
            "trials": 15,
            "warmup": 2,
            "cpu_threads": 2,
            "baseline_cache": True,
            "baseline_dir": baselines,
            "reverify_speedup": 1e9,
        }
    )


@pytest.fixture(scope="module")
def evaluator(config: EvalConfig) -> Iterator[Evaluator]:
    with Evaluator(config) as ev:
        yield ev


@pytest.fixture(scope="module")
def honest_source(build: Callable[..., str], reps: int) -> str:
    return build(f"return ext.relu_slow(x, {reps})")


def baselines_digest(config: EvalConfig) -> str:
    assert config.baseline_root != config.cache_dir / "baselines", "a folder of this module's own"
    digest = hashlib.sha256()
    for path in sorted(config.baseline_root.glob("*.json")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def honest(evaluator: Evaluator, relu_task: TaskProgram, honest_source: str) -> EvalResult:
    result = evaluator.run(relu_task, honest_source, RUNTIME)
    assert result.status is EvalStatus.CORRECT, result.message
    return result


def reference_of(result: EvalResult) -> TimingStats:
    assert result.timing is not None, result.message
    return result.timing.reference


def judged(evaluator: Evaluator, task: TaskProgram, source: str, honest: EvalResult, honest_source: str) -> EvalResult:
    """The hack's result, after checking that it left the reference and the baseline cache alone."""
    before = baselines_digest(evaluator.config)
    result = evaluator.run(task, source, RUNTIME)
    later = evaluator.run(task, honest_source, RUNTIME)
    assert later.status is EvalStatus.CORRECT, later.message
    assert reference_of(later) == reference_of(honest), "a later honest candidate meets the same reference timing"
    assert baselines_digest(evaluator.config) == before, "the baseline cache is unchanged"
    return result


def test_thread_count_changed_in_init_is_rejected_by_name(
    evaluator: Evaluator, relu_task: TaskProgram, honest: EvalResult, honest_source: str, build: Callable[..., str], reps: int
) -> None:
    """The old hack: one thread for everyone (the reference too) from __init__, all threads back
    for its own kernel. The reference is timed in the judge, where it changes nothing; the
    runner's pinned settings name it."""
    hack = build(
        f"torch.set_num_threads(self.n)\ny = ext.relu_slow(x, {reps})\ntorch.set_num_threads(1)\nreturn y",
        init="self.n = torch.get_num_threads()\ntorch.set_num_threads(1)",
    )
    result = judged(evaluator, relu_task, hack, honest, honest_source)
    assert result.status is EvalStatus.REJECTED, result.message
    assert "changed settings the evaluation pins" in result.message and "get_num_threads()" in result.message and "-> 1" in result.message


def test_backend_flag_changed_in_init_is_rejected_by_name(
    evaluator: Evaluator, relu_task: TaskProgram, honest: EvalResult, honest_source: str, build: Callable[..., str], reps: int
) -> None:
    """cuDNN off from __init__ (on CPU its counterpart, oneDNN): once it slowed the reference."""
    backend = "mkldnn" if evaluator.config.device == "cpu" else "cudnn"
    hack = build(f"return ext.relu_slow(x, {reps})", init=f"torch.backends.{backend}.enabled = False")
    result = judged(evaluator, relu_task, hack, honest, honest_source)
    assert result.status is EvalStatus.REJECTED, result.message
    assert "changed settings the evaluation pins" in result.message and backend in result.message


def test_torch_function_replaced_through_sys_modules_is_rejected_by_name(
    evaluator: Evaluator, relu_task: TaskProgram, honest: EvalResult, honest_source: str, build: Callable[..., str], reps: int
) -> None:
    """torch.relu slowed down through sys.modules at import: the reference never runs in this
    process, and the pinned identities of torch's functions name the change."""
    prelude = """
    import sys as _s
    _torch = _s.modules["torch"]
    _relu = _torch.relu
    def _slow_relu(x):
        for _ in range(20):
            x.clone()
        return _relu(x)
    _torch.relu = _slow_relu
    """
    result = judged(
        evaluator, relu_task, build(f"return ext.relu_slow(x, {reps})", prelude=textwrap.dedent(prelude)), honest, honest_source
    )
    assert result.status is EvalStatus.REJECTED, result.message
    assert "torch.relu" in result.message


def test_the_runners_clock_patched_from_python_is_refused_by_name(
    evaluator: Evaluator, relu_task: TaskProgram, honest: EvalResult, honest_source: str, build: Callable[..., str], reps: int
) -> None:
    """The clock the candidate's process reads made to report a quarter of each call. That figure is
    a diagnostic now (the judge's clock times the calls, tests/test_judge_clock.py has the native
    version); from Python the patch is also a pinned setting changed, refused by name."""
    prelude = """
    import time as _t
    _real = _t.perf_counter_ns
    _t.perf_counter_ns = lambda: _real() // 4
    """
    hack = build(f"return ext.relu_slow(x, {2 * reps})", prelude=textwrap.dedent(prelude))
    result = judged(evaluator, relu_task, hack, honest, honest_source)
    assert result.status is EvalStatus.REJECTED, result.message
    assert "time.perf_counter_ns replaced" in result.message


def test_reading_the_harness_frames_is_refused(
    evaluator: Evaluator, relu_task: TaskProgram, honest: EvalResult, honest_source: str, build: Callable[..., str], reps: int
) -> None:
    """The timing loop's locals once told which timed calls would be checked. Those are now chosen
    in the judge after the timing, so the runner's frames hold nothing; reading them is refused."""
    hack = build(
        f"""
        frame = _s._getframe(1)
        while frame is not None and "/tools/" not in frame.f_code.co_filename:
            frame = frame.f_back
        seen = dict(frame.f_locals) if frame is not None else {{}}
        return ext.relu_slow(x, {reps})
        """,
        prelude="import sys as _s\n",
    )
    result = judged(evaluator, relu_task, hack, honest, honest_source)
    assert result.status is EvalStatus.REJECTED, result.message
    assert "refused by the evaluator" in result.message and "reached a frame of the evaluator's own code" in result.message


def test_the_judges_modules_are_not_in_the_candidates_process(
    evaluator: Evaluator, relu_task: TaskProgram, build: Callable[..., str]
) -> None:
    """Nothing to hook: the check, the choice of checked calls, the seeds and the statistics live
    in modules the runner never imports (the candidate lists what it can see, then fails on purpose)."""
    spy = build(
        "raise RuntimeError('harness: ' + ','.join(sorted(m for m in _s.modules if m.startswith('kernel_refinery.tools.'))))",
        prelude="import sys as _s\n",
    )
    result = evaluator.run(relu_task, spy, (Stage.COMPILE, Stage.CORRECTNESS))
    assert result.status is EvalStatus.RUNTIME_ERROR
    seen = result.message.split("harness: ", 1)[1].split()[0].split(",")
    assert "kernel_refinery.tools.processes.channel" in seen and "kernel_refinery.tools.steps.timing" in seen
    for judge_only in (
        "kernel_refinery.tools.processes.judge",
        "kernel_refinery.tools.steps.timing_stage",
        "kernel_refinery.tools.steps.baseline_cache",
        "kernel_refinery.tools.processes.remote",
        "kernel_refinery.tools.steps.correctness",
    ):
        assert judge_only not in seen, seen


def test_a_hook_on_the_check_finds_no_check_and_its_deferred_work_fails(
    evaluator: Evaluator, relu_task: TaskProgram, honest: EvalResult, honest_source: str, build: Callable[..., str], reps: int
) -> None:
    """The old hack wrapped the harness's check object to do the real work after the end event and
    before the check read the output. There is no check object here; an output left to be filled
    in later is read the moment the call ends, and is wrong."""
    hack = build(
        """
        _stage = _s.modules.get("kernel_refinery.tools.steps.timing_stage")
        if _stage is not None:
            raise RuntimeError("the check object is within reach")
        self.calls += 1
        if self.calls <= 2:
            return ext.relu_fwd(x)
        ext.touch(x)
        return torch.empty_like(x)
        """,
        init="self.calls = 0",
        prelude="import sys as _s\n",
    )
    result = judged(evaluator, relu_task, hack, honest, honest_source)
    assert result.status is EvalStatus.INCORRECT, result.message
    assert "returned a wrong output for its own inputs" in result.message and "read the moment its batch ended" in result.message


def test_inputs_predicted_from_the_global_seed_never_hit(
    evaluator: Evaluator, relu_task: TaskProgram, honest: EvalResult, honest_source: str, build: Callable[..., str], reps: int
) -> None:
    """The candidate works out the next calls' inputs from torch.initial_seed() as the old seed
    scheme would, computes their outputs during the warm-up and looks them up. The inputs now come
    from the judge, from the OS's entropy: no lookup hits, and it is timed as the slow kernel it is."""
    hack = build(
        f"""
        if not self.table:
            base = torch.initial_seed()
            for call in range(64):
                torch.manual_seed(base + 50_000_017 + 7919 * call)
                guess = torch.randn(256, 1024, device=x.device)
                self.table[float(guess[0, 0])] = ext.relu_fwd(guess)
        hit = self.table.get(float(x[0, 0]))
        if hit is not None:
            self.hits += 1
            ext.touch(x)
            return hit.clone()
        return ext.relu_slow(x, {reps})
        """,
        init="self.table = {}\nself.hits = 0",
    )
    result = judged(evaluator, relu_task, hack, honest, honest_source)
    assert result.status is EvalStatus.CORRECT, result.message
    assert result.timing is not None and honest.timing is not None
    assert result.timing.input_source == ("mixed" if evaluator.config.device == "cpu" else "drawn")
    assert result.timing.speedup < 2 * honest.timing.speedup, "no lookup hit: timed as the slow kernel"
    static = evaluator.evaluate(relu_task, hack)
    assert static.status is EvalStatus.REJECTED and "initial_seed" in static.message, "the static check names it first"


LINEAR_TASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(512, 512) / 22)

    def forward(self, x):
        return x @ self.weight


def get_inputs():
    return [torch.randn(1024, 512)]


def get_init_inputs():
    return []
"""

CPU_MM = r"""
#include <torch/extension.h>
torch::Tensor mm(torch::Tensor a, torch::Tensor b) {
    auto ac = a.contiguous(), bc = b.contiguous();
    const int64_t n = ac.size(0), k = ac.size(1), m = bc.size(1);
    auto c = torch::zeros({n, m}, ac.options());
    const float* pa = ac.data_ptr<float>();
    const float* pb = bc.data_ptr<float>();
    float* pc = c.data_ptr<float>();
    #pragma omp parallel for
    for (int64_t i = 0; i < n; ++i)
        for (int64_t p = 0; p < k; ++p)
            for (int64_t j = 0; j < m; ++j) pc[i * m + j] += pa[i * k + p] * pb[p * m + j];
    return c;
}
void touch(torch::Tensor x) {}
"""

CUDA_MM = r"""
#include <torch/types.h>
#include <c10/cuda/CUDAStream.h>
__global__ void mm_kernel(const float* a, const float* b, float* c, int n, int k, int m) {
    int i = blockIdx.y * blockDim.y + threadIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || j >= m) return;
    float acc = 0.f;
    for (int p = 0; p < k; ++p) acc += a[i * k + p] * b[p * m + j];
    c[i * m + j] = acc;
}
torch::Tensor mm(torch::Tensor a, torch::Tensor b) {
    auto ac = a.contiguous(), bc = b.contiguous();
    const int n = ac.size(0), k = ac.size(1), m = bc.size(1);
    auto c = torch::empty({n, m}, ac.options());
    dim3 block(16, 16), grid((m + 15) / 16, (n + 15) / 16);
    auto stream = c10::cuda::getCurrentCUDAStream();
    mm_kernel<<<grid, block, 0, stream>>>(ac.data_ptr<float>(), bc.data_ptr<float>(), c.data_ptr<float>(), n, k, m);
    return c;
}
void touch(torch::Tensor x) {}
"""

MEMO = """

SEEN = 12  # inputs stored before the memo answers: enough that mixes of pairs of the judge's few sets span them all


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(512, 512) / 22)
        self.seen, self.outs = [], []
        self.basis = self.outmat = None

    def forward(self, x):
        flat = x.reshape(-1)
        if len(self.seen) == SEEN:
            # A span memo: x as a combination of inputs seen before, its output the same combination.
            if self.basis is None:
                self.basis = torch.stack(self.seen).double()
                self.outmat = torch.stack(self.outs).reshape(SEEN, -1).double()
            coef = torch.linalg.pinv(self.basis[:, :512].T) @ flat[:512].double()
            if torch.allclose(self.basis[:, 512:1024].T @ coef, flat[512:1024].double(), atol=1e-4, rtol=1e-4):
                ext.touch(x)
                return (coef @ self.outmat).float().reshape(x.shape[0], -1)
        y = ext.mm(x, self.weight)
        if len(self.seen) < SEEN:
            self.seen.append(flat.clone())
            self.outs.append(y.clone())
        return y
"""


def span_memo(device: str) -> str:
    """A linear layer built as the device's extension, with a span memo in front of it."""
    header = "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n"
    if device == "cpu":
        build = f'ext = load_inline(name="refinery_test_mm", cpp_sources={CPU_MM!r}, functions=["mm", "touch"], '
        build += 'extra_cflags=["-O2", "-fopenmp"], extra_ldflags=["-fopenmp"])\n'
    else:
        decls = "torch::Tensor mm(torch::Tensor a, torch::Tensor b);\nvoid touch(torch::Tensor x);"
        build = f'ext = load_inline(name="refinery_test_mm_cuda", cpp_sources={decls!r}, cuda_sources={CUDA_MM!r}, '
        build += 'functions=["mm", "touch"], extra_cuda_cflags=["-O3"])\n'
    return header + build + MEMO


def test_a_span_memo_for_a_linear_operator_gains_nothing_from_drawn_inputs(evaluator: Evaluator) -> None:
    """A linear operator answered as a combination of stored outputs: on CPU, inputs used to be
    mixes of 4 drawn sets, a 4-dimensional span. Forced to mix, the memo wins; by default the
    judge draws every call afresh (on CPU because it sees the operator's FLOPs per input element),
    and it does not."""
    task = TaskProgram(name="linear", source=LINEAR_TASK)
    quiet = evaluator.config.guards.model_copy(update={"min_kernel_share": 0.0})
    # 40 timed calls, so that the calls after the memo's first SEEN decide the median (with the
    # suite's 10 and 6 stored, a set of the judge's mixes could go unseen: the test failed now and then).
    settings = evaluator.config.model_copy(update={"trials": 40})
    mixing = Evaluator(
        settings.model_copy(update={"guards": quiet.model_copy(update={"fresh_input_source": "mix"})}), judge=evaluator.judge
    )
    memo = span_memo(evaluator.config.device)
    with mixing:
        fooled = mixing.run(task, memo, RUNTIME)
    drawing = Evaluator(settings.model_copy(update={"guards": quiet}), judge=evaluator.judge)
    with drawing:
        result = drawing.run(task, memo, RUNTIME)
        honest = drawing.run(task, memo.replace("if len(self.seen) == SEEN:", "if False:"), RUNTIME)
    assert fooled.status is EvalStatus.CORRECT and fooled.timing is not None, fooled.message
    assert result.status is EvalStatus.CORRECT and result.timing is not None, result.message
    assert honest.status is EvalStatus.CORRECT and honest.timing is not None, honest.message
    assert fooled.timing.input_source == "mixed" and result.timing.input_source == "drawn"
    if evaluator.config.device == "cpu":  # on a GPU the memo's own solve costs more than the small matmul
        assert fooled.timing.speedup > 3 * honest.timing.speedup, "the hole the drawn inputs close is real"
    assert result.timing.speedup < 2 * honest.timing.speedup, "on drawn inputs the memo never answers"


def test_a_kernel_first_timed_below_the_floor_is_scored_from_its_retiming(
    evaluator: Evaluator, relu_task: TaskProgram, honest_source: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The judge in this process (so that its first timing of the candidate can be made to fall below
    the floor), real runners: the re-timing, with every output checked, is above the floor, and the
    candidate's figures are the re-timing's, not the first's."""
    from kernel_refinery.tools.processes import judge
    from kernel_refinery.tools.processes.worker import Worker
    from kernel_refinery.tools.steps import timing_stage

    real = timing_stage.TimedPath.side
    sides: list[timing_stage.Side] = []

    def first_below(self: timing_stage.TimedPath, *args: object, **kwargs: object) -> timing_stage.Side:
        side = real(self, *args, **kwargs)  # type: ignore[arg-type]  # passed through as the stage called it
        if kwargs.get("keep"):
            if "budget_s" in kwargs:  # the candidate's timing (each window of it), not the re-timing
                side.per_call_ms = [ms * 1e-6 for ms in side.per_call_ms]
            sides.append(side)
        return side

    monkeypatch.setattr(timing_stage.TimedPath, "side", first_below)
    loaded = evaluator.run(relu_task, honest_source, (Stage.COMPILE,))
    assert loaded.status is None, loaded.message
    worker = evaluator.worker
    assert worker.judge_end is not None
    cfg = evaluator.config
    job = EvalJob(task_name="relu", task_source=relu_task.source, candidate_source=honest_source, stages=(Stage.TIMING,), config=cfg)
    device = torch.device("cpu" if cfg.device == "cpu" else "cuda:0")
    reference = Worker(device=cfg.device, cache_dir=cfg.cache_dir, threads=cfg.cpu_threads, reference=True)
    reference.start()
    try:
        assert reference.judge_end is not None
        state = judge.JudgeState(device=device, workdir=tmp_path)
        state.reference = judge._ReferenceLink(Connection(os.dup(reference.judge_end.fileno())), device)
        state.reference_pid = reference.pid
        reply = judge.run_job(state, job, RunnerLink(Connection(os.dup(worker.judge_end.fileno())), device), runner_pid=worker.pid)
    finally:
        reference.shutdown()
    assert reply.failure is None, reply.message
    timing = reply.timing
    assert timing is not None and timing.floor_retimed
    assert len(sides) >= 2
    assert timing.candidate.trials == len(sides[-1].per_call_ms) <= min(cfg.trials, 20)
    assert timing.candidate.median == pytest.approx(statistics.median(sides[-1].per_call_ms))
    assert timing.floor_ms is not None and timing.candidate.median >= timing.floor_ms
    assert len(timing.checked_calls) == timing.candidate.trials * timing.batch_calls, "every output of the re-timing was checked"


def test_guards_record_what_confines_the_candidate(honest: EvalResult) -> None:
    assert honest.isolation is not None and "audit hook armed" in honest.isolation
    assert honest.timing is not None and honest.timing.timed_by == "judge"
    assert honest.timing.runner_reported_ms is not None, "the candidate's own figure is kept, as a diagnostic"
