"""Correctness, in the judge: fresh inputs and weights per trial, the reference run here, the
candidate in its own process (tools/processes/remote.py), the outputs compared here.

The input seeds are salted by the OS in the judge and never sent to the candidate's process, and
the reference never runs there, so its outputs cannot linger in memory the candidate could read.
Guards, each with a test:
- inputs are compared before and after the candidate's call, so mutating them fails;
- every trial has fresh inputs, so an output cached across calls fails;
- a relative L2 error against the reference's norm, so an all-zero or constant output fails
  even where the absolute tolerance alone would let it pass;
- the aten compute ops each side ran are recorded; a candidate that runs every compute op of
  the reference is only wrapping PyTorch, and is rejected;
- each output must be a plain tensor over memory of its own: a tensor subclass (a deferred or
  lazy output) or an output sharing storage with an input is rejected;
- after the task's own inputs, inputs of the same structure with floating-point values redrawn
  from other distributions (a signed standard normal, and the same times 4): an identity "ReLU"
  passes on `torch.rand` inputs, never on signed ones;
- the share of the forward's compute time spent in the candidate's own kernels: a decoy kernel
  beside PyTorch operators that do the work is rejected;
- last, shape and init variants (EvalConfig.shapes): other values of the task's module-level
  constants, chosen in tools/steps/shape_variants.py, each a fresh reference and ModelNew built
  with them and one call; a kernel specialised to the task's own sizes fails one. Recorded in
  `CorrectnessReport.shapes`; only "require" makes a failure the verdict's. Beside them, whether
  the reference itself measures anything (tools/steps/degenerate.py), judged on the trials' own
  reference calls.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal, Self

import structlog
import torch

from kernel_refinery.tools.config import REDUCED_PRECISION_TOLERANCE, EvalConfig
from kernel_refinery.tools.processes.channel import Spec
from kernel_refinery.tools.processes.jobs import Rejected, StageFailed
from kernel_refinery.tools.processes.programs import Program, clone_args, tensors_of
from kernel_refinery.tools.processes.remote import NoKernel, RemoteModel
from kernel_refinery.tools.results import (
    CorrectnessReport,
    DistributionOutcome,
    KernelShare,
    Mismatch,
    ShapeVariant,
    ShapeVariantsReport,
    TrialOutcome,
    VariantStatus,
)
from kernel_refinery.tools.steps.aten_ops import NON_COMPUTE, OpRecorder, synchronize
from kernel_refinery.tools.steps.degenerate import SpreadProbe, combine
from kernel_refinery.tools.steps.shape_variants import Plan, Structure, resolve, settle, short, structure

log = structlog.get_logger()

DISTRIBUTION_NAMES = {"normal": "a signed standard normal", "normal_x4": "a signed standard normal times 4"}


@dataclass(frozen=True)
class Comparison:
    passed: bool
    reason: str
    max_abs: float
    mean_abs: float
    rel_l2: float
    mismatches: tuple[Mismatch, ...]


def _mismatches(expected: torch.Tensor, actual: torch.Tensor, bad: torch.Tensor, limit: int = 5) -> tuple[Mismatch, ...]:
    diff = (actual.double() - expected.double()).abs().nan_to_num(nan=math.inf, posinf=math.inf)
    diff = torch.where(bad, diff, torch.zeros_like(diff)).flatten()
    k = min(limit, int(bad.sum().item()))
    if k == 0:
        return ()
    _, flat_idx = torch.topk(diff, k)
    found = []
    for flat in flat_idx.tolist():
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), expected.shape))
        found.append(Mismatch(index=index, expected=float(expected[index]), actual=float(actual[index])))
    return tuple(found)


def _value_ranges(exp: torch.Tensor, act: torch.Tensor, finite_ref: torch.Tensor) -> str:
    """Where the reference's values lie and where the output's do: a sign, a scale or an offset
    that is wrong everywhere shows here at once, which a few mismatched values do not tell."""

    def span(t: torch.Tensor, mask: torch.Tensor) -> tuple[str, float, float]:
        if not bool(mask.any()):
            return "none finite", math.inf, -math.inf
        low = float(torch.where(mask, t, math.inf).min())
        high = float(torch.where(mask, t, -math.inf).max())
        mean = float(torch.where(mask, t, 0.0).sum()) / int(mask.sum())
        return f"[{low:.4g}, {high:.4g}], mean {mean:.4g}", low, high

    ref_text, ref_low, ref_high = span(exp, finite_ref)
    ranges = f"the reference's values lie in {ref_text}; the output's in {span(act, torch.isfinite(act))[0]}"
    # A sign the reference never has is a missing or misplaced step, not rounding: said in words.
    if ref_low >= 0 and bool((act < 0).any()):
        ranges += "; no reference value is negative, yet the output has negative values"
    elif ref_high <= 0 and bool((act > 0).any()):
        ranges += "; no reference value is positive, yet the output has positive values"
    return ranges


def _within_everywhere(exp: torch.Tensor, act: torch.Tensor, diff: torch.Tensor, atol: float, rtol: float) -> Comparison | None:
    """The passing verdict with its statistics in a few reads, when every value is finite and within
    tolerance, the relative L2 error too, and the output is not a constant; None otherwise."""
    if not bool((diff <= exp.abs().mul_(rtol).add_(atol)).all()):  # NaN compares false: not here
        return None
    ref_norm = float(torch.linalg.vector_norm(exp))
    err_norm = float(torch.linalg.vector_norm(diff))
    rel_l2 = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else math.inf)
    if rel_l2 > rtol:
        return None
    if exp.numel() > 1:
        low, high = torch.aminmax(exp)
        if bool(high > low):
            act_low, act_high = torch.aminmax(act)
            if bool(act_low == act_high):
                return None
    return Comparison(True, "", float(diff.max()), float(diff.mean()), rel_l2, ())


def compare(expected: torch.Tensor, actual: Any, cfg: EvalConfig, which: str = "output", atol_by_rms: bool = False) -> Comparison:
    """allclose with the run's tolerance, plus relative L2 and a constant-output check.

    `atol_by_rms` (for redrawn signed inputs) raises atol to rtol times the reference output's RMS:
    signed values cancel toward zero, where any honest reordering or reduced-precision arithmetic
    misses a fixed atol, while a wrong operator still misses by the output's own size."""
    if not isinstance(actual, torch.Tensor):
        return Comparison(False, f"{which} is a {type(actual).__name__}, expected a tensor", 0, 0, 0, ())
    if actual.shape != expected.shape:
        return Comparison(False, f"{which} has shape {tuple(actual.shape)}, expected {tuple(expected.shape)}", 0, 0, 0, ())
    if actual.dtype != expected.dtype:
        return Comparison(False, f"{which} has dtype {actual.dtype}, expected {expected.dtype}", 0, 0, 0, ())
    if actual.device != expected.device:
        actual = actual.to(expected.device)
    if not expected.is_floating_point():
        equal = bool(torch.equal(actual, expected))
        bad = actual != expected
        return Comparison(equal, "" if equal else f"{which} differs", 0, 0, 0, () if equal else _mismatches(expected, actual, bad))
    tol = cfg.tolerance_for(str(expected.dtype)) or cfg.precision_tolerance
    exp = expected.float()
    act = actual.float()
    # Fast paths first: the full diagnosis below reads a large output some 60 times over.
    if bool(torch.equal(act, exp)):
        return Comparison(True, "", 0.0, 0.0, 0.0, ())  # bit for bit (NaN never equals itself)
    finite_ref = torch.isfinite(exp)
    rms = float(torch.where(finite_ref, exp, 0.0).square().mean().sqrt()) if atol_by_rms and exp.numel() else 0.0
    if atol_by_rms:
        tol = tol.model_copy(update={"atol": max(tol.atol, tol.rtol * rms)})
    diff = (act - exp).abs_()
    passed = _within_everywhere(exp, act, diff, tol.atol, tol.rtol)
    if passed is not None:
        return passed
    # A NaN or inf where the reference is finite is wrong whatever the tolerance says.
    bad = ~(diff <= tol.atol + tol.rtol * exp.abs()) & finite_ref
    bad |= ~finite_ref & ~((act == exp) | (act.isnan() & exp.isnan()))
    # Masks through torch.where, never boolean indexing: that would materialise an index tensor
    # several times the size of a multi-GB output.
    both = finite_ref & torch.isfinite(act)
    counted = int(both.sum())
    max_abs = float(diff.nan_to_num(nan=math.inf).max()) if diff.numel() else 0.0
    mean_abs = float(torch.where(both, diff, 0.0).sum()) / counted if counted else 0.0
    ref_norm = float(torch.linalg.vector_norm(torch.where(finite_ref, exp, 0.0)))
    err_norm = float(torch.linalg.vector_norm(torch.where(finite_ref, act - exp, 0.0)))
    rel_l2 = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else math.inf)
    if math.isnan(rel_l2):
        rel_l2 = math.inf
    n_bad = int(bad.sum())
    reason = ""
    if n_bad:
        reason = f"{which}: {n_bad} of {exp.numel()} values outside atol={tol.atol:g}, rtol={tol.rtol:g}"
    elif rel_l2 > tol.rtol:
        reason = (
            f"{which}: relative L2 error {rel_l2:.3g} exceeds {tol.rtol:g} although each value is within "
            f"atol; the output is too far from the reference as a whole"
        )
    if reason and expected.dtype == torch.float32 and tol.rtol < REDUCED_PRECISION_TOLERANCE:
        loose = REDUCED_PRECISION_TOLERANCE
        # Judged against the output's scale: reduced-precision error grows with it, on any inputs.
        scale = rms or float(torch.where(finite_ref, exp, 0.0).square().mean().sqrt())
        loose_atol = max(loose, loose * scale)
        within_loose = bool(torch.where(finite_ref, diff <= loose_atol + loose * exp.abs(), True).all()) and rel_l2 <= loose
        if within_loose:
            reason += (
                f"; every value is within {loose:g}: the error is at reduced-precision level (what TF32, bf16 or fp16 "
                "arithmetic gives), so compute in full fp32 (or evaluate with --set eval.tolerance=1e-2 to accept it)"
            )
    if n_bad and exp.numel() > 1:
        reason += "; " + _value_ranges(exp, act, finite_ref)
    if exp.numel() > 1:
        low = float(torch.where(finite_ref, exp, math.inf).min())
        high = float(torch.where(finite_ref, exp, -math.inf).max())
        first_value = act.flatten()[0]
        if high > low and bool((act == first_value).all()):
            value = float(first_value)
            reason = (
                f"{which} is all zeros; the reference is not" if value == 0 else f"{which} is constant ({value:.6g}); the reference is not"
            )
    mism = _mismatches(exp, act, bad) if n_bad else ()
    return Comparison(not reason, reason, max_abs, mean_abs, rel_l2, mism)


def _fail(trial: int, seed: int, reason: str, cmp: Comparison | None = None) -> TrialOutcome:
    if cmp is None:
        return TrialOutcome(trial=trial, seed=seed, passed=False, reason=reason)
    return TrialOutcome(
        trial=trial,
        seed=seed,
        passed=False,
        reason=reason,
        max_abs_diff=cmp.max_abs,
        mean_abs_diff=cmp.mean_abs,
        rel_l2=cmp.rel_l2,
        mismatches=cmp.mismatches,
    )


def _judge_call(
    program: Program,
    ref_model: Any,
    new_model: RemoteModel,
    inputs: list[Any],
    cfg: EvalConfig,
    record_ops: bool,
    atol_by_rms: bool = False,
    spread: SpreadProbe | None = None,
) -> tuple[Comparison, set[str], set[str]]:
    """One reference call here and one candidate call in its own process, on the same inputs;
    the runner's outputs are compared here, and every guard applied (see tools/processes/remote.py).
    `spread` sees the reference's outputs (does the reference measure anything?)."""
    expected, ref_ops = _reference_outputs(program, ref_model, inputs, record_ops)
    if spread is not None:
        spread.add(expected)
    cmp, new_ops = _candidate_against(new_model, inputs, expected, cfg, record_ops, atol_by_rms)
    return cmp, ref_ops, new_ops


def _reference_outputs(program: Program, ref_model: Any, inputs: list[Any], record_ops: bool) -> tuple[list[torch.Tensor], set[str]]:
    with torch.no_grad():
        with OpRecorder() if record_ops else _Null() as rec:
            ref_out = ref_model(*clone_args(inputs))
        ref_ops = set(rec.ops) if record_ops else set()
        synchronize(program.device)
    return [t.detach() for t in tensors_of(ref_out)], ref_ops


def _candidate_against(
    new_model: RemoteModel, inputs: list[Any], expected: list[torch.Tensor], cfg: EvalConfig, record_ops: bool, atol_by_rms: bool = False
) -> tuple[Comparison, set[str]]:
    """The candidate's call on `inputs`, its outputs compared with the reference's `expected`."""
    call, actual = new_model.call(inputs, tuple(Spec.of(t) for t in expected), record_ops=record_ops)
    new_ops = set(call.reply.ops)
    if call.mismatch:
        return Comparison(False, call.mismatch, 0, 0, 0, ()), new_ops
    worst = Comparison(True, "", 0.0, 0.0, 0.0, ())
    for i, (exp, act) in enumerate(zip(expected, actual, strict=True)):
        cmp = compare(exp, act, cfg, which="output" if len(expected) == 1 else f"output {i}", atol_by_rms=atol_by_rms)
        if not cmp.passed:
            return cmp, new_ops
        if cmp.max_abs >= worst.max_abs:
            worst = cmp
    return worst, new_ops


class _Null:
    ops: ClassVar[set[str]] = set()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def run_trial(
    program: Program, cfg: EvalConfig, trial: int, seed: int, record_ops: bool, spread: SpreadProbe | None = None
) -> tuple[TrialOutcome, set[str], set[str]]:
    """Fresh weights from the trial's seed, then two calls of the same instance on two fresh
    input sets: an output cached inside the instance fails the second call. `spread`, where given,
    judges the reference's two outputs: do they vary at all (tools/steps/degenerate.py)?"""
    ref_model = program.reference(seed)
    new_model = program.new_model(seed, reference=ref_model)
    ref_ops: set[str] = set()
    new_ops: set[str] = set()
    worst = Comparison(True, "", 0.0, 0.0, 0.0, ())
    for call, input_seed in enumerate((seed + 1_000_003, seed + 2_000_003)):
        inputs = program.inputs(input_seed)
        cmp, r_ops, n_ops = _judge_call(program, ref_model, new_model, inputs, cfg, record_ops and call == 0, spread=spread)
        ref_ops |= r_ops
        new_ops |= n_ops
        if not cmp.passed:
            reason = cmp.reason if call == 0 else f"{cmp.reason} (on the second call of the same model: is an output cached?)"
            return _fail(trial, seed, reason, cmp), ref_ops, new_ops
        if cmp.max_abs >= worst.max_abs:
            worst = cmp
    outcome = TrialOutcome(
        trial=trial, seed=seed, passed=True, max_abs_diff=worst.max_abs, mean_abs_diff=worst.mean_abs, rel_l2=worst.rel_l2
    )
    return outcome, ref_ops, new_ops


def verify_after_timing(program: Program, cfg: EvalConfig, ref_model: Any, new_model: RemoteModel, seed: int) -> Comparison:
    """The timed instance, called once more on inputs it has never seen."""
    cmp, _, _ = _judge_call(program, ref_model, new_model, program.inputs(seed), cfg, record_ops=False)
    return cmp


def _all_finite(value: Any) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors_of(value) if t.is_floating_point() or t.is_complex())


def _distribution_skip(program: Program, ref_model: Any, seed: int, distribution: str) -> str:
    """Why the reference itself is no judge on this distribution, or "" when it is."""
    with torch.no_grad():
        try:
            redrawn = ref_model(*program.inputs(seed, distribution))
        except Exception as exc:  # noqa: BLE001 - the reference may refuse values its task never feeds it
            return f"the reference raised {type(exc).__name__} on it"
        if _all_finite(redrawn):
            return ""
        if _all_finite(ref_model(*program.inputs(seed))):
            return "the reference gives non-finite values on it"
    return ""


def check_distributions(program: Program, cfg: EvalConfig, first_seed: int) -> tuple[tuple[DistributionOutcome, ...], TrialOutcome | None]:
    """One call per extra distribution, each with fresh weights; the first failure ends it."""
    outcomes: list[DistributionOutcome] = []
    for k, name in enumerate(cfg.guards.input_distributions):
        seed = first_seed + 7_000_003 * (k + 1)
        ref_model = program.reference(seed)
        new_model = program.new_model(seed, reference=ref_model)
        skipped = _distribution_skip(program, ref_model, seed, name)
        if skipped:
            outcomes.append(DistributionOutcome(name=name, passed=False, skipped=skipped))
            continue
        cmp, _, _ = _judge_call(program, ref_model, new_model, program.inputs(seed, name), cfg, record_ops=False, atol_by_rms=True)
        outcomes.append(DistributionOutcome(name=name, passed=cmp.passed))
        if not cmp.passed:
            reason = f"on inputs redrawn from {DISTRIBUTION_NAMES.get(name, name)} ({name}): {cmp.reason}"
            return tuple(outcomes), _fail(-1, seed, reason, cmp)
    return tuple(outcomes), None


def kernel_share(program: Program, cfg: EvalConfig, reference_ops: set[str]) -> KernelShare:
    """Profile the candidate's forward; raises Rejected when its kernels do almost none of the work."""
    seed = cfg.seed + 9_000_011
    ref_model = program.reference(seed)
    model = program.new_model(seed, reference=ref_model)
    arg_sets = [program.inputs(seed + k) for k in range(4)]
    share = model.kernel_share(arg_sets, frozenset(NON_COMPUTE), reference_ops)
    if share.judged_share < cfg.guards.min_kernel_share:
        raise Rejected(
            f"the candidate's own kernels do {share.judged_share:.1%} of its forward's compute time "
            f"({share.custom_ms:.3f} ms, against {share.aten_ms:.3f} ms in PyTorch operators"
            + (f" and {share.library_ms:.3f} ms in PyTorch matmul/convolution" if share.library_ms else "")
            + f"); at least {cfg.guards.min_kernel_share:.0%} must be custom: do the work in your kernel, not beside it"
        )
    return share


def _variant(plan: Plan, status: VariantStatus, reason: str = "") -> ShapeVariant:
    return ShapeVariant(name=plan.name, kind=plan.kind, overrides=dict(plan.overrides), status=status, reason=reason)


def _variant_outcome(program: Program, cfg: EvalConfig, plan: Plan, own: Structure | None, seed: int) -> ShapeVariant:
    """A fresh reference and ModelNew built with the variant's constants, one call on inputs drawn with them."""

    def outcome(status: VariantStatus, reason: str = "", cmp: Comparison | None = None) -> ShapeVariant:
        found = _variant(plan, status, reason)
        if cmp is None:
            return found
        update = {"max_abs_diff": cmp.max_abs, "mean_abs_diff": cmp.mean_abs, "rel_l2": cmp.rel_l2, "mismatches": cmp.mismatches}
        return found.model_copy(update=update)

    refused = ""
    for overrides in (plan.overrides, *plan.fallbacks):
        try:
            variant = program.variant(overrides)
            inputs = variant.inputs(seed + 1_000_003)
            expected, _ = _reference_outputs(variant, variant.reference(seed), inputs, record_ops=False)
        except Exception as exc:  # noqa: BLE001 - the reference may refuse values it was not written for
            refused = refused or f"the reference raised {short(exc)}"
            continue
        if own is not None and structure(expected) != own:
            refused = refused or "the reference's outputs change structure (count, dtype or rank)"
            continue
        if plan.fallbacks:  # unverified on the meta device: what ran is kept for the task's later candidates
            plan = replace(plan, overrides=overrides, fallbacks=())
            settle(program, plan)
        break
    else:
        if plan.fallbacks:
            plan = replace(plan, fallbacks=(), skip=refused)
            settle(program, plan)
        return outcome("not_applicable", refused)
    if not _all_finite(expected):
        return outcome("not_applicable", "the reference gives non-finite values there")
    try:
        cmp, _ = _candidate_against(variant.new_model(seed), inputs, expected, cfg, record_ops=False)
    except NoKernel:
        return outcome("fallback", "ModelNew.forward ran none of its compiled kernels there: a PyTorch fallback for other sizes")
    except StageFailed as exc:
        if exc.fatal:
            raise  # the candidate's process is gone (a CUDA fault): nothing more can run in it
        first = next((line for line in exc.message.splitlines() if line.strip()), exc.status.value)
        return outcome("crashed", f"{exc.status.value}: {first.strip()[:300]}")
    if cmp.passed:
        return outcome("passed", cmp=cmp)
    return outcome("wrong", cmp.reason, cmp)


def check_variants(program: Program, cfg: EvalConfig, first_seed: int) -> ShapeVariantsReport:
    """The candidate on the task's shape and init variants (tools/steps/shape_variants.py), in order;
    after the first that fails, the rest are not run."""
    started = time.perf_counter()
    variants = resolve(program)
    own = variants.structure
    if own is None and any(not p.skip for p in variants.plans):
        # The meta device could not give the task's own outputs' structure: one real call does.
        seed = first_seed + 13_000_003
        try:
            own = structure(_reference_outputs(program, program.reference(seed), program.inputs(seed), record_ops=False)[0])
            settle(program, None, own)
        except Exception as exc:  # noqa: BLE001 - the trials ran this reference: it does not raise here in practice
            log.info("variants_base_structure_failed", reason=short(exc))
    outcomes: list[ShapeVariant] = []
    for k, plan in enumerate(variants.plans):
        if plan.skip:
            outcomes.append(_variant(plan, "not_applicable", plan.skip))
        elif any(o.failed for o in outcomes):
            outcomes.append(_variant(plan, "not_run", "an earlier variant failed"))
        else:
            outcomes.append(_variant_outcome(program, cfg, plan, own, first_seed + 13_000_003 * (k + 1)))
    mode = "require" if cfg.shapes == "require" else "report"
    return ShapeVariantsReport(mode=mode, constants=variants.constants, variants=tuple(outcomes), seconds=time.perf_counter() - started)


def _required(report: CorrectnessReport) -> CorrectnessReport:
    """With EvalConfig.shapes "require": a failed variant fails the check, its diff named (a PyTorch
    fallback there is rejected, as one on the task's own inputs is)."""
    shapes = report.shapes
    failure = shapes.failure if shapes is not None else None
    if shapes is None or failure is None:
        return report
    own = ", ".join(f"{k}={shapes.constants[k]}" for k in failure.overrides if k in shapes.constants)
    where = f"on the {failure.kind} variant {failure.label()} of the task's constants (its own: {own})"
    if failure.status == "fallback":
        raise Rejected(f"{where}: {failure.reason}; the kernel must handle other sizes itself (eval.shapes = require)")
    return report.model_copy(
        update={
            "passed": False,
            "reason": f"{where}: {failure.reason}",
            "max_abs_diff": failure.max_abs_diff,
            "mean_abs_diff": failure.mean_abs_diff,
            "rel_l2": failure.rel_l2,
            "mismatches": failure.mismatches,
        }
    )


def check_correctness(
    program: Program, cfg: EvalConfig, trials: int | None = None, first_seed: int | None = None, full: bool = True
) -> CorrectnessReport:
    """Run the trials; raises Rejected for a hack, returns a report for right or wrong answers.

    `full` adds the extra input distributions and the kernel share (the re-verification of a
    large speedup runs the plain trials only)."""
    started = time.perf_counter()
    n = trials or cfg.correctness_trials
    base = cfg.seed if first_seed is None else first_seed
    tol = cfg.precision_tolerance
    outcomes: list[TrialOutcome] = []
    torch_ops: set[str] = set()
    reference_ops: set[str] = set()
    variants_on = full and cfg.shapes != "off"
    mode: Literal["report", "require"] = "require" if cfg.shapes == "require" else "report"
    # Whether the reference measures anything, from the trials' own reference calls (two input sets
    # per model): nothing more is run for it.
    spreads: list[SpreadProbe] = []

    def degenerate() -> str | None:
        if not variants_on:
            return None
        judged = [s.verdict() for s in spreads if s.sets >= 2]
        # One trial seen varying settles it (`combine` gives None); later trials were not probed.
        found = combine(judged, "trials (fresh weights each)") if judged else None
        return found.describe() if found is not None else ("" if judged else None)

    def failed(outcome: TrialOutcome, trial: int | None, distributions: tuple[DistributionOutcome, ...] = ()) -> CorrectnessReport:
        return CorrectnessReport(
            passed=False,
            trials=n,
            atol=tol.atol,
            rtol=tol.rtol,
            failed_trial=trial,
            reason=outcome.reason,
            max_abs_diff=outcome.max_abs_diff,
            mean_abs_diff=outcome.mean_abs_diff,
            rel_l2=outcome.rel_l2,
            mismatches=outcome.mismatches,
            outcomes=tuple(outcomes),
            torch_ops_in_candidate=tuple(sorted(torch_ops)),
            distributions=distributions,
            shapes=ShapeVariantsReport(mode=mode, reached=False) if variants_on else None,
            degenerate=degenerate(),
        )

    for trial in range(n):
        seed = base + trial
        # Until a trial shows the reference varies: after that no trial can make it degenerate.
        spread = SpreadProbe(tol.atol, tol.rtol) if variants_on and not any(s.varies for s in spreads) else None
        if spread is not None:
            spreads.append(spread)
        outcome, ref_ops, new_ops = run_trial(program, cfg, trial, seed, record_ops=trial == 0, spread=spread)
        if trial == 0:
            torch_ops = new_ops
            reference_ops = ref_ops
            if ref_ops and ref_ops <= new_ops:
                raise Rejected(
                    "ModelNew runs every compute op of the reference ("
                    + ", ".join(f"aten::{op}" for op in sorted(ref_ops))
                    + "); it wraps PyTorch instead of replacing it with a kernel"
                )
        outcomes.append(outcome)
        if not outcome.passed:
            return failed(outcome, trial)
    distributions: tuple[DistributionOutcome, ...] = ()
    share = None
    phases = {"trials": time.perf_counter() - started}
    if full:
        distributions, bad = check_distributions(program, cfg, base)
        phases["distributions"] = time.perf_counter() - started - sum(phases.values())
        if bad is not None:
            return failed(bad, None, distributions)
        if cfg.guards.min_kernel_share > 0:
            share = kernel_share(program, cfg, reference_ops)
            phases["kernel_share"] = time.perf_counter() - started - sum(phases.values())
    shapes = None
    if variants_on:
        shapes = check_variants(program, cfg, base)
        phases["variants"] = time.perf_counter() - started - sum(phases.values())
    log.info("correctness_phases", **{k: round(v, 3) for k, v in phases.items()})
    report = CorrectnessReport(
        passed=True,
        trials=n,
        atol=tol.atol,
        rtol=tol.rtol,
        max_abs_diff=max(o.max_abs_diff for o in outcomes),
        mean_abs_diff=sum(o.mean_abs_diff for o in outcomes) / n,
        rel_l2=max(o.rel_l2 for o in outcomes),
        outcomes=tuple(outcomes),
        torch_ops_in_candidate=tuple(sorted(torch_ops)),
        distributions=distributions,
        kernel_share=share,
        shapes=shapes,
        degenerate=degenerate(),
    )
    return _required(report) if cfg.shapes == "require" else report
