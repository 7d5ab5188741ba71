"""Nsight Compute feedback on CPU: parsing a real ncu report, the fall-back, and variant composition."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_refinery.agent.config import Variant
from kernel_refinery.agent.prompting import evaluation_feedback
from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.tools.results import EvalResult, KernelCounters, NsightReport, ProfileReport, TimingReport, TimingStats
from kernel_refinery.tools.steps.nsight import parse_raw_csv, profile_with_ncu, roofline_verdict

FIXTURE = Path(__file__).parent / "fixtures" / "ncu_softmax_h200.csv"


def test_parses_a_real_h200_report() -> None:
    # Saved from `ncu --csv --page raw` of the softmax CUDA candidate on the lent H200.
    (kernel,) = parse_raw_csv(FIXTURE.read_text())
    assert kernel.name.startswith("softmax_kernel")
    assert kernel.duration_us == pytest.approx(2361.984)
    assert kernel.dram_pct == pytest.approx(56.52)
    assert kernel.sm_pct == pytest.approx(35.17)
    assert kernel.occupancy_pct == pytest.approx(95.67)
    assert kernel.registers == 20 and kernel.shared_bytes == 128
    assert kernel.top_stall == "long_scoreboard"
    assert kernel.verdict.startswith("memory-bound")


def test_framework_kernels_are_left_out() -> None:
    text = FIXTURE.read_text().replace("softmax_kernel(const float *, float *, long)", "void at::native::vectorized_elementwise_kernel<4>")
    assert parse_raw_csv(text) == ()


def test_roofline_verdicts() -> None:
    assert roofline_verdict(85, 30, "long_scoreboard").startswith("memory-bound")
    assert roofline_verdict(20, 80, "math_pipe_throttle").startswith("compute-bound")
    assert roofline_verdict(10, 15, "barrier").startswith("latency-bound") and "barrier" in roofline_verdict(10, 15, "barrier")


def test_falls_back_when_ncu_is_absent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("kernel_refinery.tools.steps.nsight.Path.glob", lambda self, pattern: iter(()))
    report = profile_with_ncu(TaskProgram(name="t", source=""), "", EvalConfig(device="cuda", cache_dir=tmp_path))
    assert not report.available and "ncu is not installed" in report.reason
    assert report.block().startswith("(Nsight Compute unavailable")


def _correct_result(nsight: NsightReport | None) -> EvalResult:
    stats = TimingStats(median=1.0, mean=1.0, std=0.0, min=1.0, max=1.0, trials=10, clock="cuda-events")
    return EvalResult(
        status=EvalStatus.CORRECT,
        timing=TimingReport(candidate=stats, reference=stats.model_copy(update={"median": 2.0}), speedup=2.0),
        profile=ProfileReport(device="CUDA", table="top operators by self CUDA time\nsoftmax_kernel 1 2.0"),
        nsight=nsight,
    )


def test_variants_compose() -> None:
    kernel = KernelCounters(
        name="softmax_kernel",
        duration_us=2362.0,
        dram_pct=56.5,
        sm_pct=35.2,
        occupancy_pct=95.7,
        registers=20,
        shared_bytes=128,
        top_stall="long_scoreboard",
        top_stall_ratio=36.9,
        verdict=roofline_verdict(56.5, 35.2, "long_scoreboard"),
    )
    result = _correct_result(NsightReport(available=True, kernels=(kernel,)))
    assert Variant.parse("G+E+P+N").parts == {"E", "P", "N"}
    with pytest.raises(ValueError):
        Variant.parse("G+N")
    gep = evaluation_feedback(result, Variant.parse("G+E+P"))
    gepn = evaluation_feedback(result, Variant.parse("G+E+P+N"))
    ge = evaluation_feedback(result, Variant.parse("G+E"))
    assert "speedup of 2x" in ge and "top operators" not in ge and "Nsight" not in ge
    assert "top operators" in gep and "Nsight" not in gep
    assert "top operators" in gepn and "DRAM 56% of peak" in gepn and "memory-bound" in gepn
    # Without counters, N says why and the profiler table stands in.
    fallback = evaluation_feedback(_correct_result(NsightReport(available=False, reason="ncu is not installed")), Variant.parse("G+E+P+N"))
    assert "Nsight Compute unavailable: ncu is not installed" in fallback and "top operators" in fallback
