"""The optional kernelguard layer on real candidate sources; skipped where kernelguard is not installed."""

from __future__ import annotations

import hacks
import pytest
from candidates import FIXTURES, candidate, cuda_candidate

from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.guards import kernelguard_layer
from kernel_refinery.tools.guards.kernelguard_layer import kernelguard_findings

pytest.importorskip("kernelguard")

CORRECT = "return ext.relu_fwd(x)"


def test_pointer_memo_is_a_finding() -> None:
    findings = kernelguard_findings(hacks.pointer_memo(candidate))
    assert findings is not None and len(findings) == 1
    assert findings[0].startswith("kernelguard POINTER_REPLAY: ") and "data_ptr" in findings[0]


def test_output_cache_is_a_finding() -> None:
    cached = cuda_candidate("ext.touch(x)\nif not _CACHE:\n    _CACHE.append(ext.relu_fwd(x))\nreturn _CACHE[0]", prelude="_CACHE = []\n")
    findings = kernelguard_findings(cached)
    assert findings is not None and [f.split(":")[0] for f in findings] == ["kernelguard OUTPUT_REPLAY_CACHE"]


@pytest.mark.parametrize("path", ["cuda_solutions/4_softmax.py", "triton_solutions/1_relu.py", "cpu_solutions/1_relu.py"])
def test_honest_kernels_have_no_findings(path: str) -> None:
    assert kernelguard_findings((FIXTURES / path).read_text()) == ()


def test_correct_candidate_and_a_rule_it_only_rates_low_have_no_findings() -> None:
    assert kernelguard_findings(candidate(CORRECT)) == ()
    # LAZY_TENSOR is telemetry in kernelguard's own policy (our static check rejects the class itself).
    assert kernelguard_findings(hacks.lazy(candidate)) == ()


def test_a_source_it_cannot_judge_in_time_fails_closed() -> None:
    findings = kernelguard_findings("a" * 40_000 + " = 1\n", timeout=0.5)
    assert findings is not None and len(findings) == 1
    assert findings[0].startswith("kernelguard did not finish within 0.5 s")


def test_none_when_kernelguard_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernelguard_layer, "find_spec", lambda name: None)
    assert kernelguard_findings(candidate(CORRECT)) is None


def test_the_evaluator_records_kernelguard_findings_when_asked(cpu_config: EvalConfig) -> None:
    """Guards.kernelguard on: the static step runs it, records its findings and rejects by them;
    off (the default): it does not run, and the result says so (None)."""
    from kernel_refinery.tools.evaluator import Evaluator

    asked = cpu_config.model_copy(update={"guards": cpu_config.guards.model_copy(update={"kernelguard": True})})
    with Evaluator(asked) as ev:
        report = ev.static(hacks.pointer_memo(candidate))
        honest = ev.static(candidate(CORRECT))
    assert report.kernelguard is not None and report.kernelguard[0].startswith("kernelguard POINTER_REPLAY")
    assert not report.ok and report.kernelguard[0] in report.rejections
    assert honest.ok and honest.kernelguard == ()
    with Evaluator(cpu_config) as ev:
        assert ev.static(hacks.pointer_memo(candidate)).kernelguard is None
