"""The time in a verdict is the judge's, taken while nothing else runs (tools/steps/timing_stage.py,
tools/processes/quiet.py).

Real compiled candidates whose native code tries to move the time, each against its honest twin
(the same work, the same kernel): the candidate's own process under-reporting through the C API,
and a candidate that loads the machine whenever its own calls are not running. Each is scored as
its twin is, or refused with both figures. Then the method itself: the same honest kernel ten
times with one cache, and a kernel of tens of microseconds, batched.
"""

from __future__ import annotations

import statistics
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch
from candidates import FIXTURES, candidate

from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.evaluator import Evaluator
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.tools.results import EvalResult, Stage, TimingReport
from kernel_refinery.tools.steps.timing import Timer

RUNTIME = (Stage.COMPILE, Stage.CORRECTNESS, Stage.TIMING)
pytestmark = pytest.mark.alone

CLOCK_PATCH = (FIXTURES / "clock_patch.inc").read_text()
HACKS = CLOCK_PATCH + (FIXTURES / "clock_hacks.cpp").read_text()
CPU_HEADER = f'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

ext = load_inline(
    name="refinery_clock_hacks",
    cpp_sources=r"""
{HACKS}""",
    functions=["relu_reps", "relu_stream", "relu_hidden", "relu_loading"],
    extra_cflags=["-O2"],
)
'''
CUDA_HACKS = CLOCK_PATCH + (FIXTURES / "clock_hacks.cu").read_text()
CUDA_HEADER = f'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

ext = load_inline(
    name="refinery_clock_hacks_cuda",
    cpp_sources=r"""
torch::Tensor relu_reps(torch::Tensor x, int64_t reps);
torch::Tensor relu_hidden(torch::Tensor x, int64_t reps, double scale);
torch::Tensor relu_loading(torch::Tensor x, int64_t reps);
""",
    cuda_sources=r"""
{CUDA_HACKS}""",
    functions=["relu_reps", "relu_hidden", "relu_loading"],
    extra_cuda_cflags=["-O3"],
)
'''


def relu_task(rows: int, cols: int) -> TaskProgram:
    return TaskProgram(
        name=f"clock_relu_{rows}x{cols}",
        source=textwrap.dedent(
            f"""
            import torch
            import torch.nn as nn

            class Model(nn.Module):
                def forward(self, x):
                    return torch.relu(x)

            def get_inputs():
                return [torch.randn({rows}, {cols})]

            def get_init_inputs():
                return []
            """
        ),
    )


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@dataclass(frozen=True)
class Kernels:
    """The device's candidates, and the passes that make a kernel shorter or longer than the old
    clock check's allowance (3 x (round trip + timer + copy) + 1 ms: a millisecond or two)."""

    device: str
    header: str
    short: int
    long: int
    loader: str
    """The forward of the candidate that loads the machine between its calls."""
    task: TaskProgram
    """A ReLU whose reference (one pass) the method resolves on this device."""

    def build(self, forward: str) -> str:
        return candidate(forward, header=self.header)


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])])
def kernels(request: pytest.FixtureRequest) -> Kernels:
    if request.param == "cpu":
        # About 0.6 and 6 ms on a 2-core Xeon: one pass over 128 x 1024 floats is ~0.6 ms. One loading
        # thread: with two on two cores the runner's own thread would wait for a core.
        return Kernels("cpu", CPU_HEADER, short=1, long=10, loader="return ext.relu_loading(x, 1, 1)", task=relu_task(128, 1024))
    # About 0.1 and 5 ms on an H100 or H200: one pass over 2048 x 4096 floats moves 64 MB, ~20 us. On
    # 128 x 1024 a pass is ~3 us, less than the harness's jitter over a batch: the reference read 0.
    return Kernels("cuda", CUDA_HEADER, short=5, long=250, loader="return ext.relu_loading(x, 5)", task=relu_task(2048, 4096))


def timing(result: EvalResult) -> TimingReport:
    assert result.status is EvalStatus.CORRECT and result.timing is not None, result.message
    return result.timing


@pytest.fixture(scope="module")
def config(cpu_config: EvalConfig, kernels: Kernels, tmp_path_factory: pytest.TempPathFactory) -> EvalConfig:
    # The builds are shared with the session; the baselines are this module's own.
    return cpu_config.model_copy(update={"device": kernels.device, "trials": 30, "warmup": 2, "cpu_threads": 1, "reverify_speedup": 1e9})


@pytest.fixture(scope="module")
def evaluator(config: EvalConfig) -> Iterator[Evaluator]:
    with Evaluator(config) as ev:
        yield ev


@pytest.mark.parametrize("length", ["short", "long"])
@pytest.mark.parametrize("scale", [0.25, 0.80])
def test_a_clock_shortened_through_the_c_api_gains_nothing(evaluator: Evaluator, kernels: Kernels, length: str, scale: float) -> None:
    """The runner's clock function replaced from native code for the one read after each timed call,
    and put back by that read: the candidate's process believes it, the verdict does not use it."""
    reps = kernels.short if length == "short" else kernels.long
    honest_source = kernels.build(f"return ext.relu_reps(x, {reps})")
    hidden_source = kernels.build(f"return ext.relu_hidden(x, {reps}, {scale})")
    # Honest and hidden in turn, five of the hidden, an honest one at either end, compared by their
    # medians: on a 2-core VM one evaluation's candidate reads up to a sixth off the next one's either
    # way (in CI a hidden reading sat 15% below both honest twins; here another, 17% above; the
    # medians of three against four still missed 10% in one run of four).
    honest: list[TimingReport] = [timing(evaluator.run(kernels.task, honest_source, RUNTIME))]
    hidden: list[TimingReport] = []
    for _ in range(5):
        result = evaluator.run(kernels.task, hidden_source, RUNTIME)
        if result.status is EvalStatus.REJECTED:
            assert "ms" in result.message, result.message
            return
        hidden.append(timing(result))
        honest.append(timing(evaluator.run(kernels.task, honest_source, RUNTIME)))
    assert all(h.timed_by == "judge" for h in hidden)
    reported = [h.runner_reported_ms for h in hidden]
    honest_reported = honest[0].runner_reported_ms
    assert honest_reported is not None and all(r is not None for r in reported), (reported, honest_reported)
    if scale < 0.5:
        # The hack was real: its own process saw the shortened times (on CUDA the shortened span
        # starts inside forward, after the launch overhead, so less than the full quarter shows).
        assert all(r is not None and r < 0.75 * honest_reported for r in reported), (reported, honest_reported)
    # No gain (a hack that worked would read 1.25x at 80%, 4x at 25%) and no loss beyond the drift
    # (a method that charged the hack for its clock patch would be wrong too): 10% either side.
    shortened = statistics.median(h.speedup for h in hidden)
    twins = statistics.median(h.speedup for h in honest)
    assert 0.9 * twins <= shortened <= 1.1 * twins, (
        f"shortened {[round(h.candidate.median, 4) for h in hidden]} ms ({[round(h.speedup, 4) for h in hidden]}x) against honest "
        f"{[round(h.candidate.median, 4) for h in honest]} ms ({[round(h.speedup, 4) for h in honest]}x)"
    )


@dataclass(frozen=True)
class LoaderReadings:
    """An honest twin, the loader, and the twin again, each in a judge of its own that times the
    reference itself (a small VM's speed drifts by a third over a minute, so one twin alone is no yardstick)."""

    before: TimingReport
    loading: TimingReport
    after: TimingReport

    @property
    def references(self) -> tuple[float, float]:
        return (self.before.reference.median, self.after.reference.median)

    def describe(self) -> str:
        return f"the reference read {self.loading.reference.median:.4g} ms beside the loader, {self.references} ms beside its twins"


@pytest.fixture(scope="module")
def loader_readings(config: EvalConfig, kernels: Kernels) -> LoaderReadings:
    fresh = config.model_copy(update={"baseline_cache": False})
    honest_source = kernels.build(f"return ext.relu_reps(x, {kernels.short})")
    readings = []
    for source in (honest_source, kernels.build(kernels.loader), honest_source):
        with Evaluator(fresh) as ev:
            readings.append(timing(ev.run(kernels.task, source, RUNTIME)))
    return LoaderReadings(*readings)


def test_loading_the_machine_between_calls_moves_no_time(loader_readings: LoaderReadings) -> None:
    """Native threads stream memory (on CUDA: launch kernels on a stream of their own) whenever no
    call of the candidate's has run for 2 ms, as while the judge times the reference: the runner is
    stopped then, and the window checked idle (on CUDA, kernels already launched are seen by NVML
    and the window is timed again). The reference it meets is not raised beyond its twins', and
    its speedup gains nothing over theirs."""
    before, loading, after = loader_readings.before, loader_readings.loading, loader_readings.after
    assert before.noise_band is not None
    low, _ = before.noise_band
    references = loader_readings.references
    # Upward, where the attack moves it (it read 17x), within a third of the twins or the A/A band,
    # whichever is tighter. Downward no attack can move it (a faster reference lowers the candidate's
    # speedup), and on a 2-core VM this reference moves between evaluations by more than one
    # evaluation's A/A band either way (test_the_reference_beside_a_loader_is_its_twins_within_the_band
    # below): half the twins' is the floor a broken method (a reference read near 0) breaks.
    slack = min(1 / low, 4 / 3)
    assert min(references) / 2 <= loading.reference.median <= max(references) * slack, loader_readings.describe()
    # No gain. A loader may lose: its threads run on until they see a call (up to 1024 strided reads),
    # and the judge's clock charges that to the batch it ran in, as it should.
    speedups = (before.speedup, after.speedup)
    assert loading.speedup <= max(speedups) * 1.1, (
        f"the loader read {loading.speedup:.3g}x ({loading.reference.median:.4g} / {loading.candidate.median:.4g} ms), its honest "
        f"twins {speedups} ({[(r.reference.median, r.candidate.median) for r in (before, after)]} ms)"
    )
    reference_windows = [w for w in loading.windows if w.what in ("reference", "harness")]
    assert reference_windows and all(w.held >= 1 and w.quiet for w in reference_windows), loading.windows


@pytest.mark.drift
def test_the_reference_beside_a_loader_is_its_twins_within_the_band(loader_readings: LoaderReadings) -> None:
    """Both ways within the A/A band, as the issue asks. On CI's 2-core VMs the reference of these
    evaluations moved by more than that (a drift test): 0.082 ms beside the loader against twins of
    0.121-0.142 ms in CI, 0.107 against 0.139-0.156 on the development VM, 0.136 against
    0.127-0.143 in the next run there; within one evaluation its batches spread 60-300 us."""
    assert loader_readings.before.noise_band is not None
    low, high = loader_readings.before.noise_band
    references = loader_readings.references
    assert min(references) * low <= loader_readings.loading.reference.median <= max(references) * high, loader_readings.describe()


# On CI's shared 2-core VMs one evaluation's candidate reads 10-18% off the next one's, more than one
# evaluation's A/A band allows: these two failed there (and here) on the machine's drift, with the
# reference (what the bug moved) steady. They run with `make test-drift`, not in `make test`.
@pytest.mark.drift
def test_the_same_kernel_ten_times_with_one_cache_reads_the_same(config: EvalConfig, kernels: Kernels) -> None:
    """As `refinery eval` ten times in a row: a new judge each time, the baseline from the cache,
    spot-checked in quiet. Every speedup lies within the first one's A/A band. The issue's case: an
    honest memory-bound ReLU on 64 x 65536, a reference of about a millisecond. Bound by memory as the
    reference is: a shared VM's memory bandwidth moves by a half between evaluations (in CI the
    reference read 1.27, 1.63, 1.46 and 1.93 ms, each confirmed in quiet), and a kernel bound by
    arithmetic (relu_reps, 21.6 ms throughout) would turn that drift into its speedup's."""
    if kernels.device != "cpu":
        pytest.skip("ten evaluations take minutes on a GPU machine's lease: the CPU makes the case")
    cfg = config.model_copy(update={"trials": 20})
    task = relu_task(64, 65536)
    source = kernels.build("return ext.relu_stream(x)")
    readings: list[TimingReport] = []
    for _ in range(10):
        with Evaluator(cfg.model_copy(update={"remeasure_baselines": not readings})) as ev:
            readings.append(timing(ev.run(task, source, RUNTIME)))
    first = readings[0]
    assert first.noise_band is not None
    low, high = first.noise_band
    ratios = [r.speedup / first.speedup for r in readings]
    references = [r.reference.median / first.reference.median for r in readings]
    # The reference, which the bug moved (0.55 ms, then 3.48 ms and 4.41x), within the band
    # every time; the speedup at most once outside it: a 2-core VM in CI ran one whole evaluation of
    # ten 18% slow on the candidate's side (26.5 ms against 22.5 in the other nine, which agreed
    # within 2%), a burst no method inside one evaluation can see.
    outside = [r for r in ratios if not low <= r <= high]
    assert all(low <= r <= high for r in references) and len(outside) <= 1, [
        (round(ratio, 3), r.reference_source, round(r.reference.median, 4), round(r.candidate.median, 3))
        for ratio, r in zip(ratios, readings, strict=True)
    ]
    assert {r.reference_source for r in readings[1:]} <= {"cached", "remeasured"}


TINY_TASK = relu_task(64, 1024)
"""torch.relu on 64 x 1024 floats: about 20 us a call on a 2-core VM, its input and output (256 KB each)
in the core's cache, in the judge's batches as in the in-process timing. On 64 x 4096 (1 MB each)
the reference's time depends on the cache and the allocator more than on the method: the in-process
timing of one process read 35 us, of another 630 us (its outputs page-faulted)."""


@pytest.mark.drift
def test_a_kernel_of_microseconds_is_batched_and_reads_as_timed_in_process(evaluator: Evaluator, kernels: Kernels) -> None:
    """A reference of about 20 us (TINY_TASK): a round trip costs more, so the judge hands over
    batches; its speedup agrees, within the A/A band, with both sides timed call by call in one
    process, as the harness before timed them."""
    if kernels.device != "cpu":
        # A ReLU on 64 x 1024 takes ~2 us on an H100: below the method's resolution there.
        pytest.skip("on CUDA this ReLU is below the method's resolution (the reference reads 0): the CPU makes the case")
    source = kernels.build("return ext.relu_reps(x, 1)")
    namespace: dict[str, object] = {}
    exec(compile(TINY_TASK.source, "task", "exec"), namespace)  # noqa: S102 - the test's own task
    exec(compile(source, "candidate", "exec"), namespace)  # noqa: S102 - the test's own candidate, in the test's process
    torch.set_num_threads(1)
    timer = Timer(torch.device("cpu"))
    ref, new = namespace["Model"](), namespace["ModelNew"]()  # type: ignore[operator]  # the classes the exec defined

    def make(i: int) -> list[torch.Tensor]:
        return [torch.randn(64, 1024)]

    def in_process() -> float:
        return statistics.median(timer.time(ref, make, 20, 200).samples_ms) / statistics.median(timer.time(new, make, 20, 200).samples_ms)

    # Five of each, taken in turn, each batched one with a reference timed afresh: one reading of a
    # 20 us reference on a 2-core VM may be a third off either way (in CI the in-process readings of
    # one run were 0.081, 0.073 and 0.140x, the batched ones 0.123, 0.123 and 0.104x), and the
    # medians are the case.
    batched: list[TimingReport] = []
    old: list[float] = []
    for _ in range(5):
        old.append(in_process())
        with Evaluator(evaluator.config.model_copy(update={"remeasure_baselines": True})) as ev:
            batched.append(timing(ev.run(TINY_TASK, source, RUNTIME)))
    assert all(r.reference_batch_calls > 1 and r.harness_ms is not None for r in batched), [r.reference_batch_calls for r in batched]
    report = sorted(batched, key=lambda r: r.speedup)[len(batched) // 2]
    assert report.noise_band is not None
    low, high = report.noise_band
    ratio = report.speedup / statistics.median(old)
    assert low <= ratio <= high, (
        f"batched {[round(r.speedup, 4) for r in batched]}x (K {report.reference_batch_calls}), "
        f"in process {[round(o, 4) for o in old]}x, band {report.noise_band}"
    )
