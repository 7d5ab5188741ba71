"""Feedback text: error hints from prompts/hints.toml go with E feedback, and only where they match."""

from __future__ import annotations

from agent.config import Variant
from agent.prompting import evaluation_feedback
from tools.results import CompileReport, EvalResult, EvalStatus

MODULE_CALLED = (
    "correctness: TypeError: 'module' object is not callable\n"
    '  File "candidate.py", line 38, in forward\n    return self.elementwise_gelu(x)\n'
)


def test_calling_the_extension_module_gets_its_hint() -> None:
    text = evaluation_feedback(EvalResult(status=EvalStatus.RUNTIME_ERROR, message=MODULE_CALLED), Variant.parse("G+E"))
    assert "'module' object is not callable" in text
    assert text.count("Hint:") == 1 and "call the function it exposes" in text


def test_a_compile_error_gets_the_hint_its_log_matches() -> None:
    log = "line 11 of the candidate (main.cpp:8): error: declaration of 'const float* x' shadows a parameter"
    result = EvalResult(status=EvalStatus.COMPILE_ERROR, compile=CompileReport(ok=False, log=log, seconds=1.0))
    text = evaluation_feedback(result, Variant.parse("G+E"))
    assert "shadows a parameter" in text and "Hint: A local variable has the same name" in text


def test_wrong_arity_forward_gets_its_hint_and_other_errors_none() -> None:
    arity = "correctness: TypeError: ModelNew.forward() takes 2 positional arguments but 3 were given"
    text = evaluation_feedback(EvalResult(status=EvalStatus.RUNTIME_ERROR, message=arity), Variant.parse("G+E"))
    assert "Hint: ModelNew.forward must take exactly the inputs" in text
    plain = evaluation_feedback(EvalResult(status=EvalStatus.RUNTIME_ERROR, message="RuntimeError: boom"), Variant.parse("G+E"))
    assert "Hint:" not in plain
