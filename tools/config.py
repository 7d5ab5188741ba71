"""Settings of the evaluator: one frozen model, passed to every step."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kernel_refinery.core.errors import ConfigError
from kernel_refinery.core.numerics import Numerics, Precision

Device = Literal["cpu", "cuda"]

CompilerChoice = Literal["auto", "gcc", "clang"]
COMPILER_CHOICES: tuple[CompilerChoice, ...] = ("auto", "gcc", "clang")


class Tolerance(BaseModel):
    model_config = ConfigDict(frozen=True)
    atol: float
    rtol: float


REDUCED_PRECISION_TOLERANCE = 1e-2
"""What TF32, bf16 or fp16 arithmetic typically reaches: the paper's fp32 tolerance."""


def default_tolerances() -> dict[str, Tolerance]:
    # KernelBench HEAD (eval.py, get_tolerance_for_precision): atol = rtol = 1e-4 for fp32 and
    # 1e-2 for fp16 and bf16. float64 is stricter still.
    return {
        "float64": Tolerance(atol=1e-5, rtol=1e-5),
        "float32": Tolerance(atol=1e-4, rtol=1e-4),
        "float16": Tolerance(atol=1e-2, rtol=1e-2),
        "bfloat16": Tolerance(atol=1e-2, rtol=1e-2),
    }


def default_cache_dir() -> Path:
    """Built kernels and compile logs; REFINERY_CACHE_DIR moves it."""
    override = os.environ.get("REFINERY_CACHE_DIR")
    return Path(override) if override else Path.home() / ".cache" / "kernel-refinery"


def default_pch_dir() -> Path:
    """The precompiled headers of this machine (tools/steps/pch.py); REFINERY_PCH_DIR moves it. Workers get
    it passed explicitly, since they run with a HOME of their own."""
    override = os.environ.get("REFINERY_PCH_DIR")
    return Path(override) if override else Path.home() / ".cache" / "kernel-refinery" / "pch"


def default_quiet() -> Literal["require", "record"]:
    """REFINERY_QUIET=record keeps timings taken beside other work (with a note), for a machine that is never idle."""
    return "record" if os.environ.get("REFINERY_QUIET") == "record" else "require"


def default_compiler() -> CompilerChoice:
    """EvalConfig.compiler's default: REFINERY_COMPILER where it is set, else "auto"."""
    raw = os.environ.get("REFINERY_COMPILER", "").strip()
    for choice in COMPILER_CHOICES:
        if raw == choice:
            return choice
    if not raw:
        return "auto"
    raise ConfigError(
        f"REFINERY_COMPILER={raw!r} is not a compiler choice: give gcc, clang or auto, or unset it "
        "(the setting is eval.compiler, e.g. --set eval.compiler=clang)"
    )


class Guards(BaseModel):
    """Guards against stale, aliased, deferred or decoy outputs; each can be switched off for an
    ablation or a cost benchmark, and the settings in force travel with every result."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fresh_inputs: bool = True
    """Every warm-up and timed call of either side gets input values no earlier call saw (else two
    seeded sets rotate, as before these guards: a content-keyed memo then hits on every call)."""
    fresh_input_source: Literal["auto", "draw", "mix"] = "auto"
    """Where fresh inputs come from. "draw": `get_inputs()` from a new seed per call. "mix": each
    floating-point tensor a random convex combination of two of a few drawn sets (one pass over the
    inputs; keeps signs, bounds, symmetry, triangularity and normalisation of the task's inputs).
    "auto": draw on CUDA, mix on CPU, where torch's single-threaded generator costs some 18 times a
    memory-bound kernel on the same tensor and would dominate a cached evaluation."""
    checked_timed_calls: int = Field(8, ge=0)
    """Timed calls, drawn at random, whose outputs are compared with the reference on their own
    inputs after the call; the last timed call is always checked as well (when this is above 0).
    A candidate stale on half its calls (enough to move the median) escapes 8 draws 1 time in 256."""
    input_distributions: tuple[Literal["normal", "normal_x4"], ...] = ("normal", "normal_x4")
    """Correctness also runs on floating-point inputs redrawn from these: signed values exercise
    the operator where the task's own `get_inputs()` (often `torch.rand`) never goes."""
    plain_outputs: bool = True
    """Outputs must be plain tensors that share no storage with an input."""
    speed_of_light: bool = True
    """A time below writing the outputs at the device's peak bandwidth is re-checked, then rejected."""
    min_kernel_share: float = Field(0.10, ge=0.0, le=1.0)
    """Least fraction of the forward's compute time spent in the candidate's own kernels."""
    kernelguard: bool = False
    """Also run kernelguard's rules (the `kernelguard` extra, tools/guards/kernelguard_layer.py) in the static
    step; its findings are recorded in the result and reject the candidate. Off by default: it adds
    two catches on the tests' hacks (results/kernelguard_eval.json) but goes by names."""


CLOCKS: dict[str, str] = {"events": "judge", "host": "judge", "graph": "judge/cuda-graph", "cpu": "judge"}
"""The clock each timing records: always the judge's monotonic clock around a hand-over
(tools/steps/timing_stage.py); with EvalConfig.timing "graph" on CUDA, each call replays a CUDA graph."""


def clock_of(device: str, timing: str) -> str:
    """The clock a timing on `device` with method `timing` records."""
    return CLOCKS[timing] if device == "cuda" else CLOCKS["cpu"]


class EvalConfig(BaseModel):
    """How a candidate is checked and timed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: Device = "cpu"
    precision: Precision = Precision.FP32
    """Floating-point inputs, parameters and buffers of both models are cast to this, as KernelBench does."""
    tolerance: float | None = Field(None, gt=0, allow_inf_nan=False)
    """atol = rtol for every floating dtype instead of the per-dtype table (e.g. the paper's 1e-2)."""
    allow_tf32: bool = False
    """TF32 for fp32 matmul and convolution (torch's default leaves cuDNN's on); off unless asked."""
    backend: Literal["cpp", "cuda", "triton"] | None = None
    """Kernel language the candidate is expected to use; None means the device's default."""
    correctness_trials: int = Field(5, ge=1, description="fresh random inputs and weights per trial")
    seed: int = 42
    tolerances: dict[str, Tolerance] = Field(default_factory=default_tolerances)
    warmup: int = Field(3, ge=0)
    trials: int = Field(100, ge=1, description="timed calls of each of reference and candidate")
    time_compiled_reference: bool = True
    """Also time torch.compile of the reference (costs a compile per task; cached per run)."""
    timing: Literal["events", "host", "graph"] = "events"
    """How each call runs on CUDA, the reference's and the candidate's alike: "graph" replays a CUDA
    graph of the forward captured once (no Python in the timed calls); "events" and "host" call the
    forward. Either way the judge's clock times the hand-over (tools/steps/timing_stage.py); the
    runner's own figure, a diagnostic, is taken with CUDA events or the host's clock."""
    baseline: Literal["eager", "compile", "best"] = "eager"
    """What a speedup is measured against: eager PyTorch (the paper's), torch.compile of the
    reference, or the faster of the two per task. "compile" and "best" time the compiled reference
    whatever `time_compiled_reference` says; where torch.compile fails, the task falls back to eager
    and its result says why (TimingReport.baseline_fallback)."""
    noise_band: bool = True
    """Time the reference against itself once per task (an A/A run, cached with the baseline): a
    speedup inside that band is marked "no difference from the reference"."""
    baseline_cache: bool = True
    """Keep reference timings on disk (`baseline_root`) for new workers and later runs; a stored
    one is used only after a short re-timing of the reference in the worker agrees with it."""
    baseline_dir: Path | None = None
    """Where the baseline cache keeps its files; None: cache_dir/baselines, beside the builds. A folder
    of its own keeps one set of baselines apart from another's while builds stay shared."""
    remeasure_baselines: bool = False
    """Time every reference in full even when a stored baseline exists, and overwrite the file."""
    quiet: Literal["require", "record"] = Field(default_factory=lambda: default_quiet())
    """The reference, the harness's cost and the candidate are timed while every other candidate
    runner is stopped and the machine is checked idle (tools/processes/quiet.py). "require": a timing
    that finds the machine busy after a few tries fails with what ran beside it; "record": it is
    kept, and its report says what ran."""
    reverify_speedup: float = 10.0
    reverify_trials: int = 10
    profile_rows: int = 12
    timeout_s: float = Field(300.0, description="wall-clock limit of correctness, timing and profile together")
    compile_timeout_s: float = Field(900.0, description="wall-clock limit of loading and compiling a candidate")
    memory_limit_gb: float = Field(12.0, description="host memory of the worker process tree")
    cpu_threads: int | None = None
    """Threads for torch and OpenMP in the worker; None: the cores given to it."""
    cache_dir: Path = Field(default_factory=default_cache_dir)
    compiler: CompilerChoice = Field(default_factory=default_compiler)
    """The C++ compiler of a CPU candidate's build (tools/steps/compilers.py): "gcc" (`c++`, or CXX
    where it names a GCC), "clang" (clang++-19 or clang++ with LLVM's OpenMP runtime, or CXX where it
    names a clang), or "auto" (CXX where it is set, else GCC). A compiler asked for and not installed
    is an error before any candidate runs. REFINERY_COMPILER gives the default; a CUDA build's
    main.cpp stays with CXX/GCC, nvcc's host compiler. Each result names the compiler that built it
    (CompileReport.compiler), and a run's manifest both."""
    guards: Guards = Field(default_factory=Guards)
    shapes: Literal["off", "report", "require"] = "report"
    """Shape and init variants (tools/steps/shape_variants.py): after the trials pass, the candidate
    also runs on a few other values of the task's module-level constants (smaller, larger, odd
    sizes, other hyper-parameters) where the reference allows them. "report" records each
    variant's outcome beside the verdict (CorrectnessReport.shapes: the `general` share of the
    reports) without changing it, as KernelBench allows kernels specialised to the task's shapes;
    "require" makes a failed variant `incorrect` (a PyTorch fallback there: `rejected`); "off"
    runs none, nor the probe of whether the reference's outputs vary (CorrectnessReport.degenerate)."""

    @property
    def baseline_root(self) -> Path:
        """The baseline cache's folder: baseline_dir, else cache_dir/baselines."""
        return self.baseline_dir if self.baseline_dir is not None else self.cache_dir / "baselines"

    @property
    def times_compiled_reference(self) -> bool:
        """torch.compile of the reference is timed: asked for, or the speedup's baseline needs it."""
        return self.time_compiled_reference or self.baseline != "eager"

    def tolerance_for(self, dtype_name: str) -> Tolerance | None:
        if self.tolerance is not None:
            return Tolerance(atol=self.tolerance, rtol=self.tolerance)
        return self.tolerances.get(dtype_name.removeprefix("torch."))

    @property
    def dtype_name(self) -> str:
        return Precision(self.precision).dtype_name  # Precision(): model_copy(update=...) may have set a string

    @property
    def precision_tolerance(self) -> Tolerance:
        """The tolerance in force for outputs of the run's precision."""
        tol = self.tolerance_for(self.dtype_name)
        assert tol is not None, f"no tolerance for {self.dtype_name}"
        return tol

    @property
    def numerics(self) -> Numerics:
        """The precision, the tolerance in force for its outputs and the TF32 policy: what a result is judged at."""
        tol = self.precision_tolerance
        return Numerics(precision=self.precision, atol=tol.atol, rtol=tol.rtol, allow_tf32=self.allow_tf32)

    @property
    def kernel_backend(self) -> str:
        if self.backend is not None:
            return self.backend
        return "cuda" if self.device == "cuda" else "cpp"
