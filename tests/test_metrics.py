import math

import pytest
import torch

from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.metrics import TaskOutcome, compile_rate, correctness_rate, fast_p, fast_p_at_k, geomean_speedup
from kernel_refinery.tools.steps.correctness import compare


def outcomes() -> list[TaskOutcome]:
    return [
        TaskOutcome("a", correct=True, speedup=2.0),
        TaskOutcome("b", correct=True, speedup=0.5),
        TaskOutcome("c", correct=False, speedup=None),
        TaskOutcome("d", correct=False, compiled=False),
    ]


def test_fast_p_counts_correct_and_strictly_faster_over_all_tasks() -> None:
    r = outcomes()
    assert fast_p(r, 0.0) == 0.5
    assert fast_p(r, 1.0) == 0.25
    assert fast_p(r, 2.0) == 0.0  # strictly greater than p
    assert fast_p(r, 1.0, total=8) == 0.125  # missing tasks are failures
    assert correctness_rate(r) == 0.5 and compile_rate(r) == 0.75


def test_geomean_over_correct_tasks_only() -> None:
    assert geomean_speedup(outcomes()) == pytest.approx(1.0)
    assert geomean_speedup([TaskOutcome("x", correct=False)]) is None


def test_fast_p_at_k_is_the_unbiased_estimator() -> None:
    fast, slow = TaskOutcome("t", True, 2.0), TaskOutcome("t", True, 0.5)
    samples = [[fast, slow, slow, slow]]
    assert fast_p_at_k(samples, 1.0, k=1) == pytest.approx(0.25)
    assert fast_p_at_k(samples, 1.0, k=2) == pytest.approx(1 - math.comb(3, 2) / math.comb(4, 2))
    assert fast_p_at_k(samples, 1.0, k=4) == 1.0


def test_zero_output_passes_allclose_but_fails_relative_error() -> None:
    expected = torch.rand(64, 64) * 1e-3
    actual = torch.zeros_like(expected)
    assert torch.allclose(actual, expected, atol=1e-2, rtol=1e-2)
    verdict = compare(expected, actual, EvalConfig())
    assert not verdict.passed and "all zeros" in verdict.reason


def test_constant_output_fails() -> None:
    expected = torch.rand(64, 64) * 1e-3
    verdict = compare(expected, torch.full_like(expected, 5e-4), EvalConfig())
    assert not verdict.passed and "constant" in verdict.reason


def test_nan_where_reference_is_finite_fails() -> None:
    expected = torch.rand(8, 8)
    actual = expected.clone()
    actual[3, 4] = float("nan")
    verdict = compare(expected, actual, EvalConfig())
    assert not verdict.passed
    assert verdict.mismatches[0].index == (3, 4)


def test_tolerance_is_configurable() -> None:
    expected = torch.rand(32, 32) + 1
    actual = expected * (1 + 5e-3)
    # fp32 defaults to KernelBench HEAD's 1e-4; --tolerance (or the per-dtype table) loosens it.
    default = compare(expected, actual, EvalConfig())
    assert not default.passed and "outside atol=0.0001, rtol=0.0001" in default.reason
    assert "the error is at reduced-precision level" in default.reason
    assert compare(expected, actual, EvalConfig(tolerance=1e-2)).passed
    assert compare(expected, actual, EvalConfig(tolerances={"float32": {"atol": 1e-2, "rtol": 1e-2}})).passed


def test_a_wrong_output_is_described_by_where_its_values_lie() -> None:
    """A step left out everywhere (the numerator of a normalisation without its exponential) gives
    a few worst mismatches that look like any other error; the ranges and the sign say what it is."""
    x = torch.randn(16, 256)
    expected = torch.softmax(x, dim=1)
    actual = x / torch.exp(x).sum(dim=1, keepdim=True)
    verdict = compare(expected, actual, EvalConfig())
    assert not verdict.passed
    assert "the reference's values lie in [" in verdict.reason and "the output's in [" in verdict.reason
    assert "no reference value is negative, yet the output has negative values" in verdict.reason


def test_a_wrong_output_of_the_right_sign_gets_ranges_but_no_sign_clause() -> None:
    expected = torch.rand(32, 32) + 1
    verdict = compare(expected, expected * 2, EvalConfig())
    assert not verdict.passed and "the output's in [" in verdict.reason
    assert "yet the output has" not in verdict.reason
