"""The timing stage, in the judge: every time in a verdict is the judge's own clock.

Nothing the candidate's process reports decides a verdict, its clock included: native code in that
process can make any figure it produces say anything. So:

- Both sides are timed the same way, by the same path: the judge hands a runner a batch of K
  calls and times the batch from before it writes the batch's inputs into shared memory until it
  has read every call's outputs back (`RemoteModel.hand_over`). The candidate runs in its own
  runner; the reference in the judge's reference runner, a runner that never loaded candidate code.
  A call's time is (batch time - harness cost) / K.
- The harness cost is measured the same way, by the same path, on the null model (no work,
  outputs of the reference's specs) in the reference runner, and taken at its lower quartile: an
  underestimate leaves some harness time in both sides, which pulls a speedup towards 1, never
  away from it.
- K is chosen from the reference's time, so that a batch's calls take `BATCH_TARGET` times the
  harness cost of one hand-over: 1 for calls of milliseconds, up to `MAX_BATCH` for microseconds.
  Every call's inputs are fresh (see `args_for_calls`), drawn before the clock and written inside
  it; each call has its own output slot; every slot is sampled when the batch ends, inside the
  clock; which calls are compared with the reference is drawn afterwards.
- Quiet (tools/processes/quiet.py): the reference, its A/A run, the harness cost and any spot
  check are timed with every candidate runner stopped, the job's own too, and the machine checked
  idle; the candidate with every other runner stopped. A window that was not quiet is timed again.
- Batching must not pay: a candidate whose calls gain more from being batched than the
  reference's do (calls overlapped, inputs read ahead) is scored from calls handed over one at a
  time on both sides (`overlap`).
- A candidate faster than writing its outputs at the device's peak bandwidth is timed again with
  every output checked; still below that floor it is rejected. With the judge's clock this guards
  the harness subtraction and any work that escapes the batch, not a misreported time.
"""

from __future__ import annotations

import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, TypeVar

import structlog
import torch

from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.config import EvalConfig, clock_of
from kernel_refinery.tools.processes.channel import Arena, Spec
from kernel_refinery.tools.processes.jobs import Rejected, StageFailed
from kernel_refinery.tools.processes.programs import Program, clone_args, tensors_of
from kernel_refinery.tools.processes.remote import RemoteModel, RunnerLink
from kernel_refinery.tools.results import TimingReport, TimingStats, WindowReport
from kernel_refinery.tools.steps.aten_ops import synchronize
from kernel_refinery.tools.steps.baseline_cache import BaselineStore, StoredBaseline, agrees, baseline_key, baseline_setting, spot_calls
from kernel_refinery.tools.steps.correctness import compare
from kernel_refinery.tools.steps.roofline import OpCost, nbytes, output_floor_ms, peaks, reference_roofline_ms
from kernel_refinery.tools.steps.timing import MakeArgs, Timed, speedup_interval, stats

_SEED_STRIDE = 7919
_COMPILED_ERROR_CHARS = 500
_FIRST_TIMING_SEED = 50_000_017

log = structlog.get_logger()


def call_seed(cfg: EvalConfig, call: int, salt: int) -> int:
    return cfg.seed + _FIRST_TIMING_SEED + salt + _SEED_STRIDE * call


@dataclass(frozen=True)
class CallInputs:
    """The inputs of every warm-up and timed call, made again from the call's index on demand."""

    make: MakeArgs
    source: str
    """"drawn", "mixed" or "rotating", as recorded in the timing report."""


MIX_FLOPS_PER_ELEMENT = 2 * 4
"""Up to this many counted FLOPs per input element, "auto" mixes on CPU. A memo that spans the
pool's MIX_POOL sets must project each input onto them (2 FLOPs per element per set) and then
combine stored outputs, so where the operator itself costs no more, the memo is not faster than
the work. Matmul and convolution (the linear operators such a memo targets) cost more, and get
inputs drawn afresh on every call: their span is then the whole input space."""


def flops_per_input_element(ref_model: Any, inputs: list[Any]) -> float:
    """Matmul, convolution and attention FLOPs (torch's flop counter) per input element, one call."""
    counter = OpCost()
    with torch.no_grad(), counter:
        ref_model(*clone_args(inputs))
    elements = sum(t.numel() for t in tensors_of(inputs))
    return counter.flops / max(1, elements)


def input_source(cfg: EvalConfig, program: Program, ref_model: Any = None) -> str:
    if not cfg.guards.fresh_inputs:
        return "rotating"
    choice = cfg.guards.fresh_input_source
    if choice == "auto":
        choice = "draw"
        if program.device.type != "cuda" and ref_model is not None:
            dense = flops_per_input_element(ref_model, program.inputs(cfg.seed + 1_000_003)) > MIX_FLOPS_PER_ELEMENT
            choice = "draw" if dense else "mix"
    return "drawn" if choice == "draw" else "mixed"


MIX_POOL = 4
"""Drawn sets a mixed call combines two of; each set costs one `get_inputs()`."""


def args_for_calls(program: Program, cfg: EvalConfig, ref_model: Any = None) -> CallInputs:
    """Fresh inputs per call (drawn or mixed); with the guard off, clones of two rotating sets (as before it).

    A salt drawn from the OS per timing run keeps the values new across evaluations too: a later
    candidate in the same worker never meets the values an earlier one was timed on."""
    source = input_source(cfg, program, ref_model)
    if source == "rotating":
        sets = [program.inputs(cfg.seed + 1_000_003), program.inputs(cfg.seed + 2_000_003)]
        return CallInputs(lambda call: clone_args(sets[call % len(sets)]), source)
    salt = random.SystemRandom().getrandbits(40)
    if source == "mixed":
        pool = [program.inputs(call_seed(cfg, -1 - k, salt)) for k in range(MIX_POOL)]
        if any(isinstance(a, torch.Tensor) and a.is_floating_point() for a in pool[0]):
            return CallInputs(lambda call: mixed_inputs(pool, random.Random(salt * _SEED_STRIDE + call)), source)
        source = "drawn"  # nothing to mix: integer or bool inputs only
    return CallInputs(lambda call: program.inputs(call_seed(cfg, call, salt)), source)


def mixed_inputs(pool: list[list[Any]], rng: random.Random) -> list[Any]:
    """Each floating-point tensor `lerp(a, b, w)` of two pool sets, w in [0.25, 0.75] (so no call is
    near a pool set or a plain copy of one); other tensors cloned from the first set, the rest as they are.

    A convex combination keeps what a task's `get_inputs()` may promise: signs, bounds, symmetry,
    triangularity, positive definiteness, rows that sum to one. Its values are new on every call, so a
    memo keyed by content never hits; one keyed by pointer is met by the checked timed outputs."""
    first, second = rng.sample(range(len(pool)), 2)
    weight = rng.uniform(0.25, 0.75)
    return [
        a.mul(1 - weight).add_(b, alpha=weight)  # lerp, in half lerp's time on CPU
        if isinstance(a, torch.Tensor) and a.is_floating_point()
        else a.clone()
        if isinstance(a, torch.Tensor)
        else a
        for a, b in zip(pool[first], pool[second], strict=True)
    ]


def symmetric_band(interval: tuple[float, float] | None) -> tuple[float, float] | None:
    """The A/A ratio's interval made symmetric about 1 (as a ratio): which of two timings of the same
    program is "A" is arbitrary, so a ratio r and 1/r are the same noise. It always holds 1."""
    if interval is None or not interval[0] > 0 or not math.isfinite(interval[1]):
        return None  # a side timed at zero (the harness's cost not told apart): no band to give
    low, high = interval
    reach = max(high, 1 / low, 1.0)
    return 1 / reach, reach


def chosen_baseline(cfg: EvalConfig, base: Baseline) -> tuple[Literal["eager", "compile"], tuple[float, ...], str | None]:
    """What the speedup is against (EvalConfig.baseline), its per-call samples, and why eager stands
    in when torch.compile gave no baseline."""
    eager = tuple(base.reference.samples_ms)
    if cfg.baseline == "eager":
        return "eager", eager, None
    if base.compiled is None or not base.compiled_samples:
        why = base.compiled_error or "torch.compile of the reference was not timed"
        return "eager", eager, f"baseline {cfg.baseline!r} asked for, but torch.compile gave none ({why}): against eager"
    if cfg.baseline == "best" and base.reference.stats.median <= base.compiled.median:
        return "eager", eager, None
    return "compile", base.compiled_samples, None


HARNESS_QUANTILE = 0.25
"""Which quantile of the null model's hand-overs is the harness's cost (see the module's docstring)."""
BATCH_TARGET = 10.0
"""A batch's calls should take this many times the harness cost of handing over one call."""
MAX_BATCH = 256
BATCH_BYTES = {"cpu": 256 << 20, "cuda": 512 << 20}
"""At most this many bytes of inputs and outputs in one batch's arenas."""
HARNESS_TRIALS = 20
"""Null-model hand-overs measured for the harness's cost, of each size."""
PROBE_CALLS = 12
"""Hand-overs of one call that estimate the reference's time, to choose K."""
BATCH_ATTEMPTS = 3
"""Measurements of a new baseline with a larger K, when the first K proved too small for the reference."""
SINGLE_CALLS_BASE = 1 << 40
"""Call indices of single-call hand-overs start here (batches count from 0): their inputs differ."""
SNAPSHOT_VALUES = 1 << 16
"""Values of each timed output the judge copies when a batch ends, over its K calls: all of a small
output, else positions drawn by the judge's own generator (at least MIN_SLOT_VALUES a call). An
output left unfinished, stale or deferred is wrong almost everywhere, so a sample finds it."""
MIN_SLOT_VALUES = 512
OVERLAP_SHARE = 0.10
"""How much more a candidate may gain from batching than the reference does, as a share of its
single-call time, beyond three standard errors of the two medians, before it is scored from single calls."""


def batches(trials: int, batch: int) -> int:
    """Timed batches for `trials` asked for, in batches of `batch` calls: about as many calls as
    asked (a batch of K calls is a steadier sample than one call), and at least MIN_BATCHES batches
    for the median and its interval."""
    return min(trials, max(MIN_BATCHES, math.ceil(trials / batch)))


MIN_BATCHES = 20
MIN_TRIALS = 10
"""Timed batches a candidate gets at least, when its time budget ends its timing early."""
BUDGET_FACTOR = 3.0
"""A candidate's timing may take this many times the reference's (at least MIN_BUDGET_S): a slow
candidate handed batches sized for a fast reference stops after MIN_TRIALS batches, not hours."""
MIN_BUDGET_S = 2.0
SPOT_PAUSE_S = 0.5
"""Before a second spot check of a stored baseline that the first disagreed with."""

log = structlog.get_logger()
T = TypeVar("T")


def clock_name(device: torch.device, cfg: EvalConfig) -> str:
    return clock_of(device.type, cfg.timing)


class QuietWindows(Protocol):
    """The judge's way to a quiet window (tools/processes/judge.py): `measure` runs while every other
    candidate runner is stopped (the job's own too when `hold_runner`), is run again while the
    machine was not idle, and comes back with what ran beside it."""

    def run(
        self, what: Literal["reference", "harness", "candidate", "spot check"], hold_runner: bool, measure: Callable[[], T]
    ) -> tuple[T, WindowReport]: ...


@dataclass(frozen=True)
class Harness:
    """What a hand-over costs the harness, measured on the null model."""

    batch: int
    batch_ms: float
    """A hand-over of `batch` calls."""
    single_ms: float
    """A hand-over of one call."""


@dataclass(frozen=True)
class Baseline:
    """The reference's timings for one task and setting, reused across candidates by the judge."""

    reference: Timed
    """Per call, from batches of `batch` calls, the harness's cost subtracted."""
    compiled: TimingStats | None
    roofline_ms: float | None
    compiled_error: str | None = None
    """Why torch.compile of the reference gave no baseline, when it failed."""
    source: Literal["measured", "cached", "remeasured"] = "measured"
    spot_ms: float | None = None
    """The spot check's median, whenever one ran."""
    compiled_samples: tuple[float, ...] = ()
    noise_band: tuple[float, float] | None = None
    """The reference timed against itself: the 95% interval of that ratio (see `measure_baseline`)."""
    batch: int = 1
    single: Timed | None = None
    """Per call, handed over one at a time (when batch > 1)."""
    note: str = ""


Snapshot = tuple[tuple[torch.Tensor | None, torch.Tensor], ...]
"""Per output of a batch: the positions read (None: all of it) and their values, one row a call."""


def _reader(per_call: int, calls: int, generator: torch.Generator, device: torch.device) -> Callable[[Arena], Snapshot]:
    """Inside the judge's clock: every slot of the batch's outputs sampled, one gather per output."""
    wanted = max(MIN_SLOT_VALUES, SNAPSHOT_VALUES // calls)

    def read(arena: Arena) -> Snapshot:
        taken: list[tuple[torch.Tensor | None, torch.Tensor]] = []
        for view in arena.stacked(per_call):
            if view.shape[1] <= wanted:
                taken.append((None, view.clone()))
            else:
                picks = torch.randint(view.shape[1], (wanted,), device=view.device, generator=generator)
                taken.append((picks, view.index_select(1, picks)))
        synchronize(device)
        return tuple(taken)

    return read


@dataclass
class Side:
    """One side's hand-overs, as the judge timed them."""

    per_call_ms: list[float] = field(default_factory=list)
    """(batch time - harness) / K, per timed batch."""
    single_ms: list[float] = field(default_factory=list)
    """Single-call hand-overs, harness subtracted (when K > 1)."""
    snapshots: list[Snapshot] = field(default_factory=list)
    single_snapshots: list[Snapshot] = field(default_factory=list)
    runner_ms: list[float] = field(default_factory=list)
    """The runner's own figures (a diagnostic)."""


@dataclass
class TimedPath:
    """The judge's hand-overs of one task's calls to a runner, and its clock around them."""

    program: Program
    cfg: EvalConfig
    make_args: MakeArgs
    specs: tuple[Spec, ...]
    source: str = "drawn"
    """How the calls' inputs are made: "drawn", "mixed" or "rotating" (see `args_for_calls`)."""
    flush: torch.Tensor | None = None
    """The judge's L2 flush buffer (CUDA): zeroed inside the clock, after the inputs are written."""
    generator: torch.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.generator = torch.Generator(device=self.program.device)
        self.generator.manual_seed(random.SystemRandom().getrandbits(63))
        if self.program.device.type == "cuda" and self.flush is None:
            self.flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device=self.program.device)

    @property
    def graph(self) -> bool:
        return self.program.device.type == "cuda" and self.cfg.timing == "graph"

    def _before_call(self) -> None:
        if self.flush is not None:
            self.flush.zero_()
            torch.cuda.synchronize(self.program.device)

    def hand_over(self, model: RemoteModel, first: int, calls: int) -> tuple[float, Snapshot, tuple[float, ...]]:
        """One hand-over of calls first..first+calls-1: the judge's milliseconds, the outputs' samples, the runner's figures."""
        sets = [self.make_args(first + j) for j in range(calls)]  # drawn before the clock starts
        read = _reader(len(self.specs), calls, self.generator, self.program.device)
        done = model.hand_over(sets, self.specs, read, self._before_call, graph=self.graph)
        if done.mismatch:
            raise StageFailed(EvalStatus.INCORRECT, f"timed call {first + 1}: {done.mismatch}")
        return done.wall_ms, done.read, done.reply.runner_ms

    def walls(self, model: RemoteModel, calls: int, count: int, first: int = 0) -> list[float]:
        return [self.hand_over(model, first + i * calls, calls)[0] for i in range(count)]

    def harness(self, null: RemoteModel, batch: int) -> Harness:
        """The null model's hand-overs, at their lower quartile (after two unrecorded ones)."""

        def cost(calls: int) -> float:
            walls = self.walls(null, calls, HARNESS_TRIALS + 2)[2:]
            return _quantile(walls, HARNESS_QUANTILE)

        single = cost(1)
        return Harness(batch, cost(batch) if batch > 1 else single, single)

    def side(self, model: RemoteModel, harness: Harness, trials: int, keep: bool, budget_s: float | None = None) -> Side:
        """Warm-up batches, then `trials` timed batches, each followed by one single-call hand-over
        when K > 1; snapshots kept when `keep` (the candidate's, for the checks after it). Past
        `budget_s`, the timing ends after MIN_TRIALS batches."""
        k = harness.batch
        started = time.monotonic()
        for w in range(self.cfg.warmup):
            self.hand_over(model, w * k, k)
        side = Side()
        first = self.cfg.warmup * k
        for t in range(batches(trials, k)):
            if budget_s is not None and t >= MIN_TRIALS and time.monotonic() - started > budget_s:
                break
            wall, snapshot, runner = self.hand_over(model, first + t * k, k)
            side.per_call_ms.append(max(wall - harness.batch_ms, 0.0) / k)
            side.runner_ms.extend(runner)
            if keep:
                side.snapshots.append(snapshot)
            if k > 1:
                wall, snapshot, _ = self.hand_over(model, SINGLE_CALLS_BASE + t, 1)
                side.single_ms.append(max(wall - harness.single_ms, 0.0))
                if keep:
                    side.single_snapshots.append(snapshot)
        return side

    def choose_batch(self, reference: RemoteModel, null: RemoteModel) -> int:
        """K: a batch's calls take BATCH_TARGET hand-overs' worth of harness, within MAX_BATCH and the arenas' bytes."""
        single = _quantile(self.walls(null, 1, PROBE_CALLS + 2)[2:], HARNESS_QUANTILE)
        call = _quantile(self.walls(reference, 1, PROBE_CALLS + 1)[1:], HARNESS_QUANTILE) - single
        return self.batch_for(call, single)

    def batch_for(self, call_ms: float, single_ms: float) -> int:
        per_call_bytes = sum(t.nbytes for t in tensors_of(self.make_args(0))) + sum(s.nbytes for s in self.specs)
        by_bytes = max(1, BATCH_BYTES[self.program.device.type] // max(1, per_call_bytes))
        wanted = math.ceil(BATCH_TARGET * single_ms / max(call_ms, 1e-4))
        return max(1, min(MAX_BATCH, by_bytes, wanted))


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _timed(samples: list[float], clock: str) -> Timed:
    return Timed(stats(samples, clock), tuple(samples))


@dataclass
class ReferenceRunner:
    """The task's models in the judge's reference runner, built once per job."""

    link: RunnerLink
    program: Program
    cfg: EvalConfig
    specs: tuple[Spec, ...]
    source: str
    _models: dict[str, RemoteModel] = field(default_factory=dict)
    compile_failure: str | None = None
    """Why torch.compile of the reference failed in its warm-up (`warm_reference`); it is then not timed."""

    def model(self, role: Literal["reference", "compiled", "null"]) -> RemoteModel:
        if not self._models:
            self.link.load_task(self.source, self.cfg.dtype_name, self.cfg.allow_tf32)
        if role not in self._models:
            self._models[role] = self.link.build(self.cfg.seed, role, self.specs if role == "null" else ())
        return self._models[role]


def _failure_line(exc: StageFailed, default: str) -> str:
    return exc.message.strip().splitlines()[0][:500] if exc.message.strip() else default


def warm_reference(path: TimedPath, ref: ReferenceRunner) -> None:
    """The reference runner's models built and called once before any quiet window: torch.compile
    of the reference compiles on its first call, and the compiler processes it starts would make a
    window unquiet (they end before it closes, so only the per-core account sees them)."""
    ref.model("null")
    path.hand_over(ref.model("reference"), 0, 1)
    if path.cfg.times_compiled_reference and ref.compile_failure is None:
        try:
            path.hand_over(ref.model("compiled"), 0, 1)
        except StageFailed as exc:  # torch.compile can fail on a machine without a toolchain: the report says why
            ref.compile_failure = _failure_line(exc, "torch.compile failed")


def measure_baseline(path: TimedPath, ref: ReferenceRunner, harness: Harness, ref_model: Any) -> Baseline:
    """The reference timed through the path; with `cfg.noise_band`, timed again the same way (an
    A/A run), whose ratio's interval is the band a speedup must leave to be a difference the
    timing can show; torch.compile of it the same way when asked for."""
    cfg = path.cfg
    clock = clock_name(path.program.device, cfg)
    first = path.side(ref.model("reference"), harness, cfg.trials, keep=False)
    reference = _timed(first.per_call_ms, clock)
    band = None
    if cfg.noise_band:
        again = path.side(ref.model("reference"), harness, cfg.trials, keep=False)
        band = symmetric_band(speedup_interval(reference.samples_ms, tuple(again.per_call_ms), seed=cfg.seed))
    compiled = compiled_error = None
    compiled_samples: tuple[float, ...] = ()
    if cfg.times_compiled_reference and ref.compile_failure is not None:
        compiled_error = ref.compile_failure
    elif cfg.times_compiled_reference:
        try:
            timed = path.side(ref.model("compiled"), replace(harness), cfg.trials, keep=False)
            compiled, compiled_samples = stats(timed.per_call_ms, clock), tuple(timed.per_call_ms)
        except StageFailed as exc:
            compiled_error = _failure_line(exc, "torch.compile failed")
    try:
        roofline = reference_roofline_ms(ref_model, path.program.inputs(cfg.seed + 1_000_003), path.program.device)
    except Exception as exc:  # noqa: BLE001 - information only: an op the counter cannot follow leaves it unknown
        print(f"no roofline for the reference: {exc}", file=sys.stderr)
        roofline = None
    return Baseline(
        reference=reference,
        compiled=compiled,
        roofline_ms=roofline,
        compiled_error=compiled_error,
        compiled_samples=compiled_samples,
        noise_band=band,
        batch=harness.batch,
        single=_timed(first.single_ms, clock) if first.single_ms else None,
    )


def _stored(stored: StoredBaseline, clock: str, spot: float, note: str = "") -> Baseline:
    return Baseline(
        Timed(stored.reference, stored.reference_samples_ms),
        stored.compiled,
        stored.roofline_ms,
        source="cached",
        spot_ms=spot,
        compiled_samples=stored.compiled_samples_ms,
        noise_band=stored.noise_band,
        batch=stored.batch_calls,
        single=_timed(list(stored.reference_single_ms), clock) if stored.reference_single_ms else None,
        note=note,
    )


@dataclass
class JudgedTiming:
    """Everything the stage needs of one job: the judge's path, its reference runner and quiet windows."""

    path: TimedPath
    ref: ReferenceRunner
    quiet: QuietWindows
    windows: list[WindowReport] = field(default_factory=list)

    def in_quiet(self, what: Literal["reference", "harness", "candidate", "spot check"], hold_runner: bool, measure: Callable[[], T]) -> T:
        value, report = self.quiet.run(what, hold_runner, measure)
        self.windows.append(report)
        return value

    def harness(self, batch: int) -> Harness:
        return self.in_quiet("harness", True, lambda: self.path.harness(self.ref.model("null"), batch))

    def new_baseline(self, ref_model: Any) -> tuple[Baseline, Harness]:
        """K from a probe; measured again with a larger K while the reference's batches turn out
        shorter than the harness target (a probe on a noisy machine guesses K low)."""

        def measure() -> tuple[Baseline, Harness]:
            batch = self.path.choose_batch(self.ref.model("reference"), self.ref.model("null"))
            for _ in range(BATCH_ATTEMPTS):
                harness = self.path.harness(self.ref.model("null"), batch)
                base = measure_baseline(self.path, self.ref, harness, ref_model)
                wanted = self.path.batch_for(base.reference.stats.median, harness.single_ms)
                if wanted <= batch:
                    break
                log.info("batch_too_small_for_the_reference", batch=batch, wanted=wanted, reference_ms=base.reference.stats.median)
                batch = wanted
            if base.reference.stats.median <= 0:
                raise StageFailed(
                    EvalStatus.RUNTIME_ERROR,
                    f"the reference's time could not be told from the harness's cost ({harness.batch_ms:.4g} ms a batch of "
                    f"{batch}): the machine is too noisy to time this task",
                )
            return base, harness

        warm_reference(self.path, self.ref)
        return self.in_quiet("reference", True, measure)

    def spot(self, stored: StoredBaseline) -> tuple[float, Harness]:
        def measure() -> tuple[float, Harness]:
            harness = self.path.harness(self.ref.model("null"), stored.batch_calls)
            k = stored.batch_calls
            trials = spot_calls(self.path.cfg)
            ref = self.ref.model("reference")
            for w in range(self.path.cfg.warmup):
                self.path.hand_over(ref, w * k, k)
            walls = self.path.walls(ref, k, trials, first=self.path.cfg.warmup * k)
            return statistics.median(max(w - harness.batch_ms, 0.0) / k for w in walls), harness

        return self.in_quiet("spot check", True, measure)

    def baseline(self, ref_model: Any, key: tuple[Any, ...], store: BaselineStore | None) -> tuple[Baseline, Harness]:
        """A stored baseline when spot checks in quiet agree with it, else measured in quiet (and stored).

        A spot check that disagrees is a sign of a noisy machine or an attack, not a reason to
        believe a new figure: the spot check is taken again in a new quiet window, and only when
        that one disagrees too is the reference measured again, in quiet, and the result says so."""
        cfg, device = self.path.cfg, self.path.program.device
        if store is None:
            return self.new_baseline(ref_model)
        setting = baseline_setting(cfg, device, key)
        digest = baseline_key(setting)
        stored = None if cfg.remeasure_baselines else store.load(digest)
        if stored is not None and cfg.noise_band and stored.noise_band is None:
            stored = None  # written before the A/A run: measured again, with it
        spots: list[float] = []
        if stored is not None:
            for attempt in range(2):
                spot, harness = self.spot(stored)
                spots.append(spot)
                if agrees(stored.reference.median, spot):
                    note = "" if attempt == 0 else f"the first spot check read {spots[0]:.4g} ms; the second, in a new quiet window, agreed"
                    return _stored(stored, clock_name(device, cfg), spot, note), harness
                log.info("stored baseline disagrees with a spot check in quiet", stored_ms=stored.reference.median, spot_ms=spot)
                time.sleep(SPOT_PAUSE_S)
        base, harness = self.new_baseline(ref_model)
        if stored is not None:
            base = replace(
                base,
                source="remeasured",
                spot_ms=spots[-1],
                note=(
                    f"the stored baseline ({stored.reference.median:.4g} ms) disagreed with two spot checks in quiet "
                    f"({', '.join(f'{s:.4g}' for s in spots)} ms): the reference was timed again in quiet"
                ),
            )
        # A failed torch.compile may be transient (a timeout, a busy compiler): the next judge tries again.
        if base.compiled_error is None:
            store.save(
                StoredBaseline(
                    key=digest,
                    setting=setting,
                    reference=base.reference.stats,
                    reference_samples_ms=base.reference.samples_ms,
                    compiled=base.compiled,
                    roofline_ms=base.roofline_ms,
                    compiled_samples_ms=base.compiled_samples,
                    noise_band=base.noise_band,
                    batch_calls=base.batch,
                    reference_single_ms=base.single.samples_ms if base.single else (),
                    harness_ms=harness.batch_ms,
                )
            )
        return base, harness

    def probe(self, model: RemoteModel, harness: Harness) -> float:
        """The candidate's time a call, from a few single-call hand-overs (after one unrecorded), at
        their lower quartile as the reference's probe reads its own: a noisy hand-over guesses the
        call long and K small, and a small K leaves each batch's figure to the harness's jitter."""

        def measure() -> float:
            walls = self.path.walls(model, 1, PROBE_CALLS // 3 + 1, first=SINGLE_CALLS_BASE - PROBE_CALLS)[1:]
            return max(_quantile(walls, HARNESS_QUANTILE) - harness.single_ms, 0.0)

        return self.in_quiet("candidate", False, measure)

    def candidate(self, model: RemoteModel, harness: Harness, trials: int, base: Baseline) -> Side:
        reference_s = trials * (harness.batch_ms + harness.batch * base.reference.stats.median) / 1e3
        budget = max(MIN_BUDGET_S, BUDGET_FACTOR * reference_s)
        return self.in_quiet("candidate", False, lambda: self.path.side(model, harness, trials, keep=True, budget_s=budget))


def check_timed_outputs(side: Side, checked: frozenset[int], path: TimedPath, ref_model: Any, batch: int) -> tuple[int, ...]:
    """The chosen timed calls' sampled outputs against the reference on those calls' own inputs.
    Call i is slot i % batch of timed batch i // batch."""
    cfg = path.cfg
    total = len(side.snapshots) * batch
    for i in sorted(checked):
        index = cfg.warmup * batch + i
        _check_one(path, ref_model, index, side.snapshots[i // batch], i % batch, f"timed call {i + 1} of {total}")
    return tuple(sorted(checked))


def _check_one(path: TimedPath, ref_model: Any, index: int, snapshot: Snapshot, row: int, which_call: str) -> None:
    with torch.no_grad():
        expected = tensors_of(ref_model(*clone_args(path.make_args(index))))
    for k, (exp, (picks, values)) in enumerate(zip(expected, snapshot, strict=True)):
        flat = exp.reshape(-1)
        wanted = flat if picks is None else flat[picks]
        cmp = compare(wanted, values[row], path.cfg, which="output" if len(expected) == 1 else f"output {k}")
        if not cmp.passed:
            raise StageFailed(
                EvalStatus.INCORRECT,
                f"{which_call} returned a wrong output for its own inputs: {cmp.reason} "
                "(read the moment its batch ended: is an output reused across calls, or left unfinished while timed?)",
            )


def choose_checked(cfg: EvalConfig, calls: int, every: bool = False) -> frozenset[int]:
    """Drawn from the OS after the timing, in the judge: nothing in the candidate's process can know them."""
    k = cfg.guards.checked_timed_calls
    if every:
        return frozenset(range(calls))
    if k == 0:
        return frozenset()
    draw = random.SystemRandom().sample(range(calls - 1), min(k, calls - 1)) if calls > 1 else []
    return frozenset([*draw, calls - 1])


def _median_se(values: list[float]) -> float:
    """Standard error of a median, from the median absolute deviation (normal approximation)."""
    if len(values) < 2:
        return 0.0
    mid = statistics.median(values)
    mad = statistics.median(abs(v - mid) for v in values)
    return 1.2533 * 1.4826 * mad / math.sqrt(len(values))


def overlap(candidate: Side, reference_single: Timed | None, reference: Timed) -> str:
    """Why the candidate's batches cannot be believed (it gained more from batching than the
    reference did beyond noise), or "". Both sides' single-call and batch medians are the judge's;
    a reference timed one call a hand-over gained nothing from batching."""
    if not candidate.single_ms:
        return ""
    single_c = statistics.median(candidate.single_ms)
    gain_c = single_c - statistics.median(candidate.per_call_ms)
    # A reference's single calls that read below its batches (a single call shorter than the harness
    # jitter reads 0) are no gain of the candidate's: the reference's gain counts from zero.
    gain_r = max(reference_single.stats.median - reference.stats.median, 0.0) if reference_single is not None else 0.0
    noise = [_median_se(candidate.single_ms), _median_se(list(reference_single.samples_ms)) if reference_single is not None else 0.0]
    if gain_c - gain_r <= OVERLAP_SHARE * single_c + 3 * math.hypot(*noise):
        return ""
    reference_single_ms = reference_single.stats.median if reference_single is not None else reference.stats.median
    return (
        f"handed over in batches the candidate took {statistics.median(candidate.per_call_ms) * 1e3:.2f} us a call, "
        f"one call at a time {single_c * 1e3:.2f} us; the reference {reference.stats.median * 1e3:.2f} and "
        f"{reference_single_ms * 1e3:.2f} us: its calls gained more from batching than the reference's "
        "(overlapped, or read ahead), so both sides are scored from single calls"
    )


def _ratio(reference_ms: Sequence[float], candidate_ms: Sequence[float]) -> float:
    """A speedup: the reference's median over the candidate's (inf when the candidate's reads 0)."""
    candidate = statistics.median(candidate_ms)
    return statistics.median(reference_ms) / candidate if candidate > 0 else float("inf")


def time_candidate(
    timed: JudgedTiming,
    ref_model: Any,
    new_model: RemoteModel,
    baselines: dict[tuple[Any, ...], Baseline],
    baseline_key: tuple[Any, ...],
    store: BaselineStore | None = None,
) -> TimingReport:
    """The reference (or its stored baseline, confirmed) and the harness's cost in quiet with the
    candidate's runner stopped, then the candidate in quiet; raises Rejected or StageFailed when a guard fires."""
    path, cfg = timed.path, timed.path.cfg
    key = (*baseline_key, cfg.guards.fresh_inputs, cfg.guards.fresh_input_source)
    if key not in baselines:
        baselines[key], harness = timed.baseline(ref_model, key, store)
    else:
        harness = timed.harness(baselines[key].batch)
    base = baselines[key]
    # K was sized for the reference. A candidate far slower would make each batch last seconds, one
    # far faster would leave too little of its own time in a batch to tell from the harness's: a
    # few single calls tell, and the candidate gets batches sized for itself.
    wanted = path.batch_for(timed.probe(new_model, harness), harness.single_ms)
    if not harness.batch / 2 <= wanted <= harness.batch * 2:
        harness = timed.harness(wanted)
    side = timed.candidate(new_model, harness, cfg.trials, base)
    total = len(side.per_call_ms) * harness.batch
    checked = check_timed_outputs(side, choose_checked(cfg, total), path, ref_model, harness.batch)
    _check_singles(side, path, ref_model)
    floor = None
    retimed = False
    if cfg.guards.speed_of_light:
        floor = output_floor_ms(nbytes(tensors_of(ref_model(*clone_args(path.make_args(0))))), path.program.device)
        if statistics.median(side.per_call_ms) < floor:
            side, checked = _below_floor(timed, new_model, harness, ref_model, floor)
            retimed = True
    clock = clock_name(path.program.device, cfg)
    why_single = overlap(side, base.single, base.reference)
    against, against_samples, fallback = chosen_baseline(cfg, base)
    samples = tuple(side.per_call_ms)
    single_scored = False
    if why_single:
        # A reference whose single calls read shorter than its batched ones (under the harness's
        # jitter they read 0, or nearly) is compared by its batches: a call alone is no shorter than
        # in a batch, so the candidate gains nothing by it.
        resolved = base.single is not None and base.single.stats.median >= base.reference.stats.median
        reference_single = base.single if base.single is not None and resolved else base.reference
        singles = tuple(side.single_ms)
        from_singles, batched = _ratio(reference_single.samples_ms, singles), _ratio(against_samples, samples)
        if from_singles <= batched:
            samples, against, against_samples = singles, "eager", reference_single.samples_ms
            single_scored = True
            fallback = fallback or (None if cfg.baseline == "eager" else "scored from single calls, against the eager reference's")
        else:
            # A single call carries a fixed cost the null model's does not quite (a launch, a
            # synchronisation), which pulls both sides toward 1: a kernel slower than its reference
            # read 0.26x from single calls against 0.15x batched (an H100). Single calls are a
            # defence against gains from batching, never a gain themselves.
            why_single += (
                f"; from single calls it read {from_singles:.3g}x, above the batches' {batched:.3g}x, so it is scored from the batches"
            )
    cand = stats(list(samples), clock)
    speedup = _ratio(against_samples, samples)
    band = base.noise_band
    compiled = base.compiled
    notes = [n for n in (base.note, why_single) if n]
    return TimingReport(
        candidate=cand,
        reference=base.reference.stats,
        reference_compiled=compiled,
        compiled_error=base.compiled_error,
        speedup=speedup,
        speedup_vs_compiled=(compiled.median / cand.median) if compiled and cand.median > 0 and not single_scored else None,
        speedup_ci95=speedup_interval(against_samples, samples, seed=cfg.seed),
        baseline=against,
        baseline_fallback=fallback,
        noise_band=band,
        within_noise=(band[0] <= speedup <= band[1]) if band is not None else None,
        fresh_inputs=cfg.guards.fresh_inputs,
        input_source=path.source,
        checked_calls=checked,
        floor_ms=floor,
        floor_retimed=retimed,
        reference_roofline_ms=base.roofline_ms,
        reference_source=base.source,
        reference_spot_ms=base.spot_ms,
        timed_by="judge",
        batch_calls=harness.batch,
        reference_batch_calls=base.batch,
        harness_ms=harness.batch_ms,
        harness_single_ms=harness.single_ms,
        single_call=stats(side.single_ms, clock) if side.single_ms else None,
        reference_single=base.single.stats if base.single else None,
        scored_from="single_calls" if single_scored else "batches",
        runner_reported_ms=statistics.median(side.runner_ms) if side.runner_ms else None,
        windows=tuple(timed.windows),
        note="; ".join(notes),
    )


def _check_singles(side: Side, path: TimedPath, ref_model: Any) -> None:
    """Two single-call hand-overs, drawn after the timing, checked like the batches' calls."""
    if not side.single_snapshots:
        return
    for t in random.SystemRandom().sample(range(len(side.single_snapshots)), min(2, len(side.single_snapshots))):
        _check_one(path, ref_model, SINGLE_CALLS_BASE + t, side.single_snapshots[t], 0, f"single timed call {t + 1}")


def _below_floor(
    timed: JudgedTiming, new_model: RemoteModel, harness: Harness, ref_model: Any, floor: float
) -> tuple[Side, tuple[int, ...]]:
    """Timed below the speed of light: again on fresh inputs, every output checked. Still below,
    rejected; above, the candidate is scored from this timing, not the first."""
    path = timed.path
    trials = min(path.cfg.trials, 20)
    # Fresh inputs: the path's calls are made again from new seeds.
    again_path = replace(path, make_args=args_for_calls(path.program, path.cfg, ref_model).make)
    again = timed.in_quiet("candidate", False, lambda: again_path.side(new_model, harness, trials, keep=True))
    checked = check_timed_outputs(again, choose_checked(path.cfg, trials * harness.batch, every=True), again_path, ref_model, harness.batch)
    median = statistics.median(again.per_call_ms)
    if median >= floor:
        return again, checked
    bandwidth, _, _ = peaks(path.program.device)
    raise Rejected(
        f"timed by the judge at {median * 1e3:.2f} us per call, below the speed-of-light floor of {floor * 1e3:.2f} us "
        f"(writing its outputs at {bandwidth / 1e12:.3g} TB/s, with slack, plus a launch), also when timed again on fresh "
        "inputs with every output checked: the work escapes the timing"
    )
