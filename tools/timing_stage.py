"""The timing stage: reference, torch.compile and candidate timed alike, each call on fresh inputs,
with the outputs of timed calls checked.

- Every warm-up and timed call of either side gets input values that no earlier call saw (seeds
  salted by the OS for each timing run; on CPU, random mixes of a few drawn sets, see
  `Guards.fresh_input_source`), made before the clock starts: a memo keyed by input content never
  hits, so it buys no speed.
- Each timed output must be a plain tensor over memory of its own (checked on every call, no data
  read), and the outputs of a few timed calls drawn at random, and of the last one, are compared with
  the reference on those calls' own inputs: a candidate stale or wrong while timed fails, named.
- A candidate faster than writing its outputs at the device's peak bandwidth is timed again with
  every output checked; still below that floor, it is rejected.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import structlog
import torch

from tools.baseline_cache import BaselineStore, StoredBaseline, agrees, baseline_key, baseline_setting, spot_calls
from tools.config import EvalConfig
from tools.correctness import Rejected, compare
from tools.jobs import StageFailed
from tools.output_guards import output_problem
from tools.programs import Program, clone_args, tensors_of
from tools.results import EvalStatus, TimingReport, TimingStats
from tools.roofline import nbytes, output_floor_ms, peaks, reference_roofline_ms
from tools.timing import MakeArgs, Timed, Timer, speedup_interval

_SEED_STRIDE = 7919
_COMPILED_ERROR_CHARS = 500
_FIRST_TIMING_SEED = 50_000_017

log = structlog.get_logger()


@dataclass(frozen=True)
class Baseline:
    """The reference's timings for one task and setting, reused across candidates in a worker."""

    reference: Timed
    compiled: TimingStats | None
    roofline_ms: float | None
    compiled_error: str | None = None
    """Why torch.compile of the reference gave no baseline, when it failed."""
    source: Literal["measured", "cached"] = "measured"
    """"measured" in this worker, or "cached": read from disk and confirmed by a spot check here."""
    spot_ms: float | None = None
    """The spot check's median, whenever one ran: measured with it, the stored baseline disagreed."""


def call_seed(cfg: EvalConfig, call: int, salt: int) -> int:
    return cfg.seed + _FIRST_TIMING_SEED + salt + _SEED_STRIDE * call


@dataclass(frozen=True)
class CallInputs:
    """The inputs of every warm-up and timed call, made again from the call's index on demand."""

    make: MakeArgs
    source: str
    """"drawn", "mixed" or "rotating", as recorded in the timing report."""


def input_source(cfg: EvalConfig, program: Program) -> str:
    if not cfg.guards.fresh_inputs:
        return "rotating"
    choice = cfg.guards.fresh_input_source
    if choice == "auto":
        choice = "draw" if program.device.type == "cuda" else "mix"
    return "drawn" if choice == "draw" else "mixed"


MIX_POOL = 4
"""Drawn sets a mixed call combines two of; each set costs one `get_inputs()`."""


def args_for_calls(program: Program, cfg: EvalConfig) -> CallInputs:
    """Fresh inputs per call (drawn or mixed); with the guard off, clones of two rotating sets (as before it).

    A salt drawn from the OS per timing run keeps the values new across evaluations too: a later
    candidate in the same worker never meets the values an earlier one was timed on."""
    source = input_source(cfg, program)
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
        torch.lerp(a, b, weight)
        if isinstance(a, torch.Tensor) and a.is_floating_point()
        else a.clone()
        if isinstance(a, torch.Tensor)
        else a
        for a, b in zip(pool[first], pool[second], strict=True)
    ]


@dataclass
class TimedOutputCheck:
    """After each timed call: the output's type and memory; for the drawn calls, its values."""

    program: Program
    cfg: EvalConfig
    ref_model: Any
    make_args: MakeArgs
    """The same arguments the timed call had, made again (from the same seed, or the same set)."""
    warmup: int
    trials: int
    checked: frozenset[int]
    output_bytes: int = 0
    seen: list[int] = field(default_factory=list)

    @classmethod
    def drawn(
        cls, program: Program, cfg: EvalConfig, ref_model: Any, make_args: MakeArgs, warmup: int, trials: int, every: bool = False
    ) -> TimedOutputCheck:
        k = cfg.guards.checked_timed_calls
        if every:
            checked = frozenset(range(trials))
        elif k == 0:
            checked = frozenset()
        else:
            # Drawn from the OS, not from a generator the candidate's process could read or reseed.
            draw = random.SystemRandom().sample(range(trials - 1), min(k, trials - 1)) if trials > 1 else []
            checked = frozenset([*draw, trials - 1])
        return cls(program, cfg, ref_model, make_args, warmup, trials, checked)

    def __call__(self, i: int, args: list[Any], out: Any) -> None:
        self.output_bytes = nbytes(out)
        if self.cfg.guards.plain_outputs:
            problem = output_problem(out, args)
            if problem:
                raise Rejected(f"timed call {i + 1} of {self.trials}: {problem}")
        if i not in self.checked:
            return
        # Compared at once, so no copy is kept; the reference gets its own new tensors.
        actual = tensors_of(out)
        inputs = self.make_args(self.warmup + i)
        with torch.no_grad():
            expected = tensors_of(self.ref_model(*inputs))
        self.seen.append(i)
        problem = ""
        if len(actual) != len(expected):
            problem = f"returned {len(actual)} tensors, expected {len(expected)}"
        for k, (exp, act) in enumerate(zip(expected, actual, strict=False)):
            exp, act = sampled(exp, act)
            cmp = compare(exp, act, self.cfg, which="output" if len(expected) == 1 else f"output {k}")
            if not cmp.passed:
                problem = cmp.reason
                break
        if problem:
            raise StageFailed(
                EvalStatus.INCORRECT,
                f"timed call {i + 1} of {self.trials} returned a wrong output for its own inputs: {problem} "
                "(is an output reused across calls, or left unfinished while timed?)",
            )


SAMPLED_VALUES = 1 << 20
"""A timed output larger than this is compared at this many positions drawn at random: a stale or
unfinished output is wrong almost everywhere, and a full comparison reads a large output some 20 times."""


def sampled(expected: torch.Tensor, actual: Any) -> tuple[torch.Tensor, Any]:
    """The same positions of both, drawn after the call from a generator seeded by the OS."""
    if (
        not isinstance(actual, torch.Tensor)
        or actual.shape != expected.shape
        or actual.device != expected.device
        or expected.numel() <= SAMPLED_VALUES
    ):
        return expected, actual
    generator = torch.Generator(device=expected.device)
    generator.manual_seed(random.SystemRandom().getrandbits(63))
    picks = torch.randint(expected.numel(), (SAMPLED_VALUES,), device=expected.device, generator=generator)
    return expected.reshape(-1)[picks], actual.reshape(-1)[picks]


def _baseline(timer: Timer, program: Program, cfg: EvalConfig, ref_model: Any, make_args: MakeArgs) -> Baseline:
    reference = timer.time(ref_model, make_args, cfg.warmup, cfg.trials)
    compiled = compiled_error = None
    if cfg.time_compiled_reference:
        try:
            compiled = timer.time(torch.compile(ref_model), make_args, max(cfg.warmup, 1), cfg.trials).stats
        except Exception as exc:  # noqa: BLE001 - torch.compile can fail on a machine without a toolchain: the report says why
            compiled_error = f"{type(exc).__name__}: {str(exc).strip()[:_COMPILED_ERROR_CHARS]}"
    try:
        roofline = reference_roofline_ms(ref_model, program.inputs(cfg.seed + 1_000_003), program.device)
    except Exception as exc:  # noqa: BLE001 - information only: an op the counter cannot follow leaves it unknown
        print(f"no roofline for the reference: {exc}", file=sys.stderr)
        roofline = None
    return Baseline(reference=reference, compiled=compiled, roofline_ms=roofline, compiled_error=compiled_error)


def _stored_or_measured(
    timer: Timer, program: Program, cfg: EvalConfig, ref_model: Any, key: tuple[Any, ...], store: BaselineStore | None
) -> Baseline:
    """The baseline from disk when a spot check of the reference in this process agrees with it, else measured (and stored)."""
    if store is None:
        return _baseline(timer, program, cfg, ref_model, args_for_calls(program, cfg).make)
    setting = baseline_setting(cfg, program.device, key)
    digest = baseline_key(setting)
    stored = None if cfg.remeasure_baselines else store.load(digest)
    spot = None
    if stored is not None:
        # Timed as the full measurement is (same inputs, warm-up and clock), only fewer calls.
        spot = timer.time(ref_model, args_for_calls(program, cfg).make, cfg.warmup, spot_calls(cfg)).stats.median
        if agrees(stored.reference.median, spot):
            reference = Timed(stored.reference, stored.reference_samples_ms)
            return Baseline(reference, stored.compiled, stored.roofline_ms, source="cached", spot_ms=spot)
        log.info(
            "stored baseline disagrees with the reference timed now; measuring it again", stored_ms=stored.reference.median, spot_ms=spot
        )
    base = replace(_baseline(timer, program, cfg, ref_model, args_for_calls(program, cfg).make), spot_ms=spot)
    # A failed torch.compile may be transient (a timeout, a busy compiler): the next worker tries again.
    if base.compiled_error is None:
        store.save(
            StoredBaseline(
                key=digest,
                setting=setting,
                reference=base.reference.stats,
                reference_samples_ms=base.reference.samples_ms,
                compiled=base.compiled,
                roofline_ms=base.roofline_ms,
            )
        )
    return base


def time_candidate(
    timer: Timer,
    program: Program,
    cfg: EvalConfig,
    ref_model: Any,
    new_model: Any,
    baselines: dict[tuple[Any, ...], Baseline],
    baseline_key: tuple[Any, ...],
    store: BaselineStore | None = None,
) -> TimingReport:
    """Time both sides; raises Rejected or StageFailed when a guard fires. With a store, the first
    baseline of a key in this worker may come from disk (see tools/baseline_cache.py)."""
    key = (*baseline_key, cfg.guards.fresh_inputs, cfg.guards.fresh_input_source)
    if key not in baselines:
        baselines[key] = _stored_or_measured(timer, program, cfg, ref_model, key, store)
    calls = args_for_calls(program, cfg)
    make_args = calls.make
    base = baselines[key]
    check = TimedOutputCheck.drawn(program, cfg, ref_model, make_args, cfg.warmup, cfg.trials)
    candidate = timer.time(new_model, make_args, cfg.warmup, cfg.trials, after_call=check)
    floor = None
    if cfg.guards.speed_of_light:
        floor = output_floor_ms(check.output_bytes, program.device)
        if candidate.stats.median < floor:
            _below_floor(timer, program, cfg, ref_model, new_model, make_args, floor)
    ref = base.reference.stats
    cand = candidate.stats
    speedup = ref.median / cand.median if cand.median > 0 else float("inf")
    compiled = base.compiled
    return TimingReport(
        candidate=cand,
        reference=ref,
        reference_compiled=compiled,
        compiled_error=base.compiled_error,
        speedup=speedup,
        speedup_vs_compiled=(compiled.median / cand.median) if compiled and cand.median > 0 else None,
        speedup_ci95=speedup_interval(base.reference.samples_ms, candidate.samples_ms, seed=cfg.seed),
        fresh_inputs=cfg.guards.fresh_inputs,
        input_source=calls.source,
        checked_calls=tuple(sorted(check.seen)),
        floor_ms=floor,
        reference_roofline_ms=base.roofline_ms,
        reference_source=base.source,
        reference_spot_ms=base.spot_ms,
    )


def _below_floor(
    timer: Timer, program: Program, cfg: EvalConfig, ref_model: Any, new_model: Any, make_args: MakeArgs, floor: float
) -> None:
    """Timed below the speed of light: again on fresh inputs, every output checked; still below, rejected."""
    trials = min(cfg.trials, 20)
    strict = TimedOutputCheck.drawn(program, cfg, ref_model, make_args, cfg.warmup, trials, every=True)
    again = timer.time(new_model, make_args, cfg.warmup, trials, after_call=strict)
    if again.stats.median >= floor:
        return
    bandwidth, _, _ = peaks(program.device)
    raise Rejected(
        f"timed at {again.stats.median * 1e3:.2f} us per call, below the speed-of-light floor of {floor * 1e3:.2f} us "
        f"(writing its {strict.output_bytes / 1e6:.3g} MB of outputs at {bandwidth / 1e12:.3g} TB/s, with slack, plus a "
        f"launch), also when timed again on fresh inputs with every output checked: the work escapes the timer"
    )
