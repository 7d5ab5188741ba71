"""Typed results of each evaluation step, and the verdict that combines them.

Every step returns a frozen pydantic model, so results cross the worker's pipe, land in
traces as JSON and come back unchanged.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kernel_refinery.core.numerics import Numerics
from kernel_refinery.core.verdict import EvalStatus

# NaN and inf as the strings "NaN" and "Infinity" in JSON: pydantic's default writes null, which
# a float field then refuses to read back (a candidate's NaN output once stopped a whole run).
NONFINITE_AS_STRINGS = ConfigDict(ser_json_inf_nan="strings")


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", **NONFINITE_AS_STRINGS)


class Stage(str, Enum):
    """Steps of an evaluation, in the order they run."""

    STATIC = "static"
    COMPILE = "compile"
    CORRECTNESS = "correctness"
    TIMING = "timing"
    PROFILE = "profile"


class StaticReport(Frozen):
    """What the AST check found: reasons to reject, and warnings for the model."""

    rejections: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    kernelguard: tuple[str, ...] | None = None
    """kernelguard's findings when its optional layer ran (Guards.kernelguard), each also a rejection; None when it did not."""

    @property
    def ok(self) -> bool:
        return not self.rejections


class CompileReport(Frozen):
    ok: bool
    seconds: float = 0.0
    cache_hits: int = 0
    cache_misses: int = 0
    log: str = ""
    """The compiler output, trimmed to the first errors with their lines."""
    compiler: str | None = None
    """The run's C++ compiler and its version (tools/steps/pch.py), e.g. "clang++-19 19.1.7 (clang)"."""


class Mismatch(Frozen):
    index: tuple[int, ...]
    expected: float
    actual: float


class TrialOutcome(Frozen):
    trial: int
    seed: int
    passed: bool
    reason: str = ""
    max_abs_diff: float = 0.0
    mean_abs_diff: float = 0.0
    rel_l2: float = 0.0
    mismatches: tuple[Mismatch, ...] = ()


class DistributionOutcome(Frozen):
    """One extra input distribution of the correctness check (see Guards.input_distributions)."""

    name: str
    passed: bool
    skipped: str = ""
    """Why it did not run: the reference itself raised or gave non-finite values on it."""


class KernelShare(Frozen):
    """Where the candidate's forward spends its compute time, from the profiler (ms per call)."""

    custom_ms: float
    """In the candidate's own compiled or Triton kernels (and anything they call)."""
    aten_ms: float
    """In PyTorch compute operators called from Python, other than matmul and convolution."""
    library_ms: float
    """In PyTorch matmul and convolution operators (cuBLAS/cuDNN/MKL) called from Python."""
    share: float
    """custom / (custom + aten + library): how much of the compute is custom."""
    judged_share: float
    """The share the guard judges: matmul and convolution left in PyTorch are not held against a
    candidate when the reference does more than them (fusing around a library GEMM is legitimate)."""


VariantStatus = Literal["passed", "wrong", "crashed", "fallback", "not_applicable", "not_run"]
"""What became of one shape or init variant:
- passed: the candidate's outputs matched the reference's on it;
- wrong: they did not (the diff is in the variant's reason and figures);
- crashed: the candidate raised on it (in its constructor or its forward);
- fallback: its forward ran none of its compiled kernels there (a PyTorch fallback for other sizes);
- not_applicable: the reference itself fails there, changes its outputs' structure, gives
  non-finite values, or the variant would exceed the memory or time budget: never held against
  the candidate;
- not_run: an earlier variant failed, which settles the candidate's generality; the rest are not
  risked (a kernel that reads past its buffers could take its process down)."""

FAILED_VARIANT: frozenset[str] = frozenset({"wrong", "crashed", "fallback"})


class ShapeVariant(Frozen):
    """One variant of the task's module-level constants (tools/steps/shape_variants.py), and how the candidate did on it."""

    name: str
    """larger, odd, small or init: how its values were chosen."""
    kind: Literal["shape", "init"]
    """shape: it changes the inputs' sizes (and any init inputs read from the same constants);
    init: it changes only hyper-parameters of get_init_inputs()."""
    overrides: dict[str, int | float | tuple[int, ...]]
    """The constants it sets, with their values there (the rest as the task has them)."""
    status: VariantStatus
    reason: str = ""
    """Why it failed or does not apply: the diff, the exception, the reference's refusal."""
    max_abs_diff: float = 0.0
    mean_abs_diff: float = 0.0
    rel_l2: float = 0.0
    mismatches: tuple[Mismatch, ...] = ()

    @property
    def failed(self) -> bool:
        return self.status in FAILED_VARIANT

    def label(self) -> str:
        """`odd (batch_size=15, dim=1023)`."""
        values = ", ".join(f"{k}={v}" for k, v in self.overrides.items())
        return f"{self.name} ({values})" if values else self.name


class ShapeVariantsReport(Frozen):
    """The candidate on other values of the task's constants, after the trials on its own passed (EvalConfig.shapes)."""

    mode: Literal["report", "require"]
    reached: bool = True
    """False where the candidate failed before the variants (its trials, distributions or kernel
    share): none ran, and it is not general."""
    constants: dict[str, int | float | tuple[int, ...]] = Field(default_factory=dict)
    """The task's own values of the constants the variants change."""
    variants: tuple[ShapeVariant, ...] = ()
    seconds: float = 0.0

    @property
    def failure(self) -> ShapeVariant | None:
        return next((v for v in self.variants if v.failed), None)

    @property
    def general(self) -> bool:
        """No variant the reference allows failed: the kernel is not specialised to the task's values
        (true also where no variant applies: nothing shows otherwise). False where they were not reached."""
        return self.reached and self.failure is None

    @property
    def passed(self) -> int:
        return sum(v.status == "passed" for v in self.variants)

    def summary(self) -> str:
        if not self.reached:
            return "shape and init variants not reached"
        failure = self.failure
        if failure is not None:
            return f"failed {failure.label()}: {failure.reason}"
        other = len(self.variants) - self.passed
        return f"passed {self.passed} shape/init variant{'s' if self.passed != 1 else ''}" + (f" ({other} not applicable)" if other else "")


class CorrectnessReport(Frozen):
    passed: bool
    trials: int
    atol: float
    rtol: float
    failed_trial: int | None = None
    reason: str = ""
    max_abs_diff: float = 0.0
    mean_abs_diff: float = 0.0
    rel_l2: float = 0.0
    mismatches: tuple[Mismatch, ...] = ()
    outcomes: tuple[TrialOutcome, ...] = ()
    torch_ops_in_candidate: tuple[str, ...] = ()
    """aten compute ops the candidate ran (custom kernels are not dispatcher ops)."""
    distributions: tuple[DistributionOutcome, ...] = ()
    """Extra input distributions tried after the task's own inputs passed."""
    kernel_share: KernelShare | None = None
    shapes: ShapeVariantsReport | None = None
    """Shape and init variants, tried after everything above passed (EvalConfig.shapes); None when
    off or not reached."""
    degenerate: str | None = None
    """Whether the reference measures anything: why its outputs in the trials (two input sets per
    model) are all zeros, one constant, or the same on every input within the tolerance
    (tools/steps/degenerate.py); "" when they vary; None when not judged (EvalConfig.shapes "off",
    no trial got to its second call, or results from before it)."""

    def summary(self) -> str:
        if self.passed:
            extra = [d.name for d in self.distributions if d.passed]
            also = f" and on {', '.join(extra)} inputs" if extra else ""
            shapes = f"; {self.shapes.summary()}" if self.shapes is not None else ""
            return f"passed {self.trials} trials{also} (max |diff| {self.max_abs_diff:.3g}){shapes}"
        where = "; ".join(f"at {list(m.index)} expected {m.expected:.6g} got {m.actual:.6g}" for m in self.mismatches[:3])
        head = f"trial {self.failed_trial}: {self.reason}" if self.failed_trial is not None else self.reason
        stats = f"max |diff| {self.max_abs_diff:.4g}, mean |diff| {self.mean_abs_diff:.4g}, rel L2 {self.rel_l2:.3g}"
        return f"{head} ({stats})" + (f"; {where}" if where else "")


class TimingStats(Frozen):
    """Milliseconds per call over `trials` timed calls."""

    median: float
    mean: float
    std: float
    min: float
    max: float
    trials: int
    clock: str = Field(description="cuda-events, host-wall or cuda-graph (EvalConfig.timing), or monotonic on CPU")


class WindowReport(Frozen):
    """What ran beside one timing window (tools/processes/quiet.py)."""

    what: Literal["reference", "harness", "candidate", "spot check"]
    seconds: float
    others_cpu_ms: float
    """CPU time of processes other than the judge and the runner being timed."""
    steal_ms: float = 0.0
    """Time the hypervisor gave these cores to other machines (recorded, not judged)."""
    held: int = 0
    """Runner processes stopped for the window."""
    attempts: int = 1
    quiet: bool = True
    gpu_checked: str = ""
    """How the GPU was checked for other processes' work ("nvml", or why not); "" on CPU."""
    note: str = ""
    """What ran beside it, when it was not quiet."""


class TimingReport(Frozen):
    candidate: TimingStats
    reference: TimingStats
    reference_compiled: TimingStats | None = None
    compiled_error: str | None = None
    """Why there is no torch.compile baseline although one was asked for (its exception, trimmed)."""
    speedup: float
    speedup_vs_compiled: float | None = None
    suspicious: bool = False
    """Speedup above the re-verification threshold; extra correctness trials were run."""
    reverified_trials: int = 0
    speedup_ci95: tuple[float, float] | None = None
    """95% bootstrap interval of the speedup (ratio of medians, resampling both sides' trials)."""
    fresh_inputs: bool = False
    """Every timed call had input values no earlier call saw."""
    input_source: Literal["drawn", "mixed", "rotating"] | None = None
    """How the timed calls' inputs were made: `get_inputs()` per call, mixes of drawn sets, or (guard off) two sets in turn."""
    checked_calls: tuple[int, ...] = ()
    """Timed calls (0-based) whose outputs were compared with the reference afterwards."""
    floor_ms: float | None = None
    """Speed-of-light floor: the outputs' bytes at the device's peak bandwidth plus a launch."""
    reference_roofline_ms: float | None = None
    """Information only: the reference's bytes moved and FLOPs at the device's peaks."""
    floor_retimed: bool = False
    """Timed below the speed-of-light floor, then timed again with every output checked: the
    candidate's figures are the second timing's."""
    timed_by: Literal["judge", "runner"] = "runner"
    """"judge": every figure here is the judge's clock (tools/steps/timing_stage.py). "runner": a
    result from before that, whose candidate times the candidate's own process reported."""
    batch_calls: int = 1
    """Calls per hand-over of the candidate: the judge times batches of this many calls, chosen from
    the reference's time so that the harness's cost is a small share of a batch (from the
    candidate's own, when it is far faster than the reference)."""
    reference_batch_calls: int = 1
    """Calls per hand-over of the reference."""
    harness_ms: float | None = None
    """The harness's cost of one batch (writing the inputs, the round trip, reading the outputs
    back), measured the same way on the null model and subtracted from every batch of both sides."""
    harness_single_ms: float | None = None
    """The same for a hand-over of one call."""
    single_call: TimingStats | None = None
    """The candidate handed one call at a time (when batch_calls > 1), per call, harness subtracted."""
    reference_single: TimingStats | None = None
    """The reference the same way."""
    scored_from: Literal["batches", "single_calls"] = "batches"
    """"single_calls": the candidate gained more from batching than the reference did (its calls
    overlapped, or it read ahead): it is scored from single calls on both sides."""
    runner_reported_ms: float | None = None
    """What the candidate's own process measured per call (median): a diagnostic, never used."""
    windows: tuple[WindowReport, ...] = ()
    """The quiet windows the timings were taken in."""
    note: str = ""
    """What happened on the way, in words (a spot check refused, a window timed again)."""
    judge_wall_ms: float | None = None
    """Results before `timed_by` "judge": the judge's own clock per call, which bounded the reported times."""
    clock_attempts: int = 1
    """Results before `timed_by` "judge": timings the old clock check took."""
    reference_source: Literal["measured", "cached", "remeasured"] = "measured"
    """Where the reference's timings came from: timed in full by this judge, read from the baseline
    cache after a spot check in quiet agreed with them (see tools/steps/baseline_cache.py), or timed
    again in quiet after two spot checks disagreed with the cache."""
    reference_spot_ms: float | None = None
    """The median of the spot check, whenever one ran: with "cached", the check that let the stored
    baseline be used; with "measured", the one that rejected it."""
    baseline: Literal["eager", "compile"] = "eager"
    """What `speedup` and `speedup_ci95` are measured against: the eager reference, or torch.compile
    of it (EvalConfig.baseline "compile", or "best" where compile was faster)."""
    baseline_fallback: str | None = None
    """Why the speedup is against eager although another baseline was asked for (compile failed)."""
    noise_band: tuple[float, float] | None = None
    """The reference timed against itself (an A/A run, same method and calls): the 95% interval of
    that ratio. A speedup inside it is no difference from the reference that the timing can show."""
    within_noise: bool | None = None
    """The speedup lies inside `noise_band`: "no difference from the reference"."""


class ProfileRow(Frozen):
    name: str
    calls: int
    self_ms: float
    total_ms: float
    percent: float


class ProfileReport(Frozen):
    device: str
    rows: tuple[ProfileRow, ...] = ()
    table: str = ""
    """A compact text table, sized for a prompt."""


class KernelCounters(Frozen):
    name: str
    duration_us: float
    dram_pct: float
    sm_pct: float
    occupancy_pct: float
    registers: int
    shared_bytes: int
    top_stall: str
    top_stall_ratio: float
    verdict: str


class NsightReport(Frozen):
    available: bool
    reason: str = ""
    kernels: tuple[KernelCounters, ...] = ()

    def block(self) -> str:
        if not self.available:
            return f"(Nsight Compute unavailable: {self.reason})"
        lines = ["Nsight Compute, per kernel of your forward (clocks not locked):"]
        for k in self.kernels:
            lines.append(
                f"- {k.name[:60]}: {k.duration_us:.1f} us; DRAM {k.dram_pct:.0f}% of peak; SM {k.sm_pct:.0f}%; "
                f"achieved occupancy {k.occupancy_pct:.0f}%; {k.registers} registers/thread; "
                f"{k.shared_bytes} B shared/block; top stall: {k.top_stall} ({k.top_stall_ratio:.1f} cycles/issue) "
                f"-> {k.verdict}"
            )
        return "\n".join(lines)


class EvalResult(Frozen):
    """The verdict on one candidate, with what each step that ran found."""

    status: EvalStatus | None
    """None while the stages run so far passed and the verdict is still open."""
    message: str = ""
    device: str = "cpu"
    precision: str = "fp32"
    tolerance: float | None = None
    """atol = rtol in force for outputs of the run's precision (None in results from before it was recorded)."""
    allow_tf32: bool = False
    static: StaticReport | None = None
    compile: CompileReport | None = None
    correctness: CorrectnessReport | None = None
    timing: TimingReport | None = None
    profile: ProfileReport | None = None
    nsight: NsightReport | None = None
    stage_seconds: dict[str, float] = Field(default_factory=dict)
    worker_log: str = ""
    isolation: str | None = None
    """How the candidate's process was confined (writes, capabilities, audit hook), as it reported at load."""
    """The tail of what the candidate printed, when it failed."""

    def merge(self, later: EvalResult) -> EvalResult:
        """This result followed by a later stage's: later fields win where they are set."""
        update = {k: v for k, v in later if v is not None and k not in ("stage_seconds", "device", "precision", "tolerance", "allow_tf32")}
        update["stage_seconds"] = {**self.stage_seconds, **later.stage_seconds}
        if later.status is None:
            update["status"] = self.status
        else:
            update.update(status=later.status, message=later.message, worker_log=later.worker_log)
        return self.model_copy(update=update)

    @property
    def correct(self) -> bool:
        return self.status is EvalStatus.CORRECT

    @property
    def speedup(self) -> float | None:
        return self.timing.speedup if self.timing is not None and self.correct else None

    def judged_at(self) -> str:
        """`fp16, atol = rtol = 0.01, TF32 off`: the precision and tolerance the result was judged at."""
        return Numerics.recorded(self.precision, self.tolerance, self.allow_tf32).describe()

    def headline(self) -> str:
        if self.status is EvalStatus.CORRECT and self.timing is not None:
            t = self.timing
            return f"correct: {t.candidate.median:.3f} ms vs reference {t.reference.median:.3f} ms (speedup {t.speedup:.2f}x)"
        if self.status is None:
            return "passed so far"
        first = self.message.strip().splitlines()[0] if self.message.strip() else ""
        return f"{self.status.value}: {first}" if first else self.status.value
