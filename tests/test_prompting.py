"""Feedback text: error hints from prompts/hints.toml go with E feedback, and only where they match."""

from __future__ import annotations

from kernel_refinery.agent.config import Variant
from kernel_refinery.agent.prompting import evaluation_feedback
from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.results import CompileReport, EvalResult

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


def test_a_python_comment_in_cpp_gets_the_comment_hint() -> None:
    log = "line 19 of the candidate (main.cpp:16): error: invalid preprocessing directive #This"
    result = EvalResult(status=EvalStatus.COMPILE_ERROR, compile=CompileReport(ok=False, log=log, seconds=1.0))
    text = evaluation_feedback(result, Variant.parse("G+E"))
    assert text.count("Hint:") == 1 and "write comments with `//`" in text


def test_an_openmp_reduction_over_an_array_gets_its_hint() -> None:
    log = "line 23 of the candidate (main.cpp:20): error: user defined reduction not found for 'sums'"
    result = EvalResult(status=EvalStatus.COMPILE_ERROR, compile=CompileReport(ok=False, log=log, seconds=1.0))
    text = evaluation_feedback(result, Variant.parse("G+E"))
    assert text.count("Hint:") == 1 and "keep the row's sum in a local scalar" in text


def test_a_reduction_over_a_loop_local_gets_its_hint() -> None:
    # The demo's softmax, turn 2: the variable is declared inside the loop the pragma parallelises.
    log = (
        "line 19 of the candidate (main.cpp:16): error: \u2018sum_exp\u2019 has not been declared\n"
        "       16 |     #pragma omp parallel for reduction(+:sum_exp)\n"
        "          |                                          ^~~~~~~\n"
    )
    result = EvalResult(status=EvalStatus.COMPILE_ERROR, compile=CompileReport(ok=False, log=log, seconds=1.0))
    text = evaluation_feedback(result, Variant.parse("G+E"))
    assert text.count("Hint:") == 1 and "declared before the loop" in text
    elsewhere = "error: 'n' has not been declared\n  5 | int f(n);\n"
    other = EvalResult(status=EvalStatus.COMPILE_ERROR, compile=CompileReport(ok=False, log=elsewhere, seconds=1.0))
    assert "declared before the loop" not in evaluation_feedback(other, Variant.parse("G+E"))


def test_a_timeout_gets_the_row_loop_shape() -> None:
    """The demo's softmax, turn 1: a row's sum recomputed for every element, killed at the time
    limit. The hint shows the loop shape (rows outside, the row's reduction once) in a closed code
    block, with placeholders where the operation goes, so it is no task's kernel."""
    result = EvalResult(status=EvalStatus.TIMEOUT, message="no result within 30 s; the worker was killed")
    text = evaluation_feedback(result, Variant.parse("G+E"))
    assert text.count("Hint:") == 1 and "reduce each row once" in text
    hint = text[text.index("Hint:") :]
    assert hint.count("```") == 2, "the loop shape's code block is not closed"
    assert "for (int64_t r = 0; r < rows; ++r)" in hint and "acc += ...;" in hint and "out[c] = ...;" in hint
    assert "exp" not in hint, "the shape must not carry an operation of its own"


def test_wrong_arity_forward_gets_its_hint_and_other_errors_none() -> None:
    arity = "correctness: TypeError: ModelNew.forward() takes 2 positional arguments but 3 were given"
    text = evaluation_feedback(EvalResult(status=EvalStatus.RUNTIME_ERROR, message=arity), Variant.parse("G+E"))
    assert "Hint: ModelNew.forward must take exactly the inputs" in text
    plain = evaluation_feedback(EvalResult(status=EvalStatus.RUNTIME_ERROR, message="RuntimeError: boom"), Variant.parse("G+E"))
    assert "Hint:" not in plain


# --- the task Model's interface, rendered into the prompt ---

from kernel_refinery.agent.prompting import build_messages, model_interface  # noqa: E402
from kernel_refinery.agent.state import TaskSpec  # noqa: E402

TWO_INPUTS = '''
import torch
import torch.nn as nn


class Helper(nn.Module):
    def forward(self, z):
        return z


class Model(nn.Module):
    """C = A @ B."""

    def __init__(self, features: int, eps: float = 1e-5, *, bias=True):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
        return A @ B * scale


def get_inputs():
    return [torch.randn(4, 4), torch.randn(4, 4)]
'''


def test_interface_is_the_exact_signatures_of_model() -> None:
    found = model_interface(TWO_INPUTS)
    assert found is not None
    assert found.init == "def __init__(self, features: int, eps: float=1e-05, *, bias=True)"
    assert found.forward == "def forward(self, A: torch.Tensor, B: torch.Tensor, scale: float=2.0) -> torch.Tensor"
    assert found.inputs == ("A", "B", "scale")


def test_interface_of_a_model_without_init_and_with_star_args() -> None:
    source = "class Model:\n    def forward(self, x, *rest, **options):\n        return x\n"
    found = model_interface(source)
    assert found is not None
    assert found.init == "def __init__(self)"
    assert found.forward == "def forward(self, x, *rest, **options)"
    assert found.inputs == ("x", "*rest", "**options")


def test_no_interface_without_a_model_forward_or_for_broken_source() -> None:
    assert model_interface("class Model:\n    def __init__(self):\n        pass\n") is None
    assert model_interface("class Other:\n    def forward(self, x):\n        return x\n") is None
    assert model_interface("class Model(:\n") is None


def _prompt(source: str) -> str:
    task = TaskSpec(name="t", source=source)
    messages = build_messages(task, "cpp", Variant.parse("G+E"), 1, 3, None, None, 1e-2)
    return str(messages[-1].content)


def test_the_prompt_states_the_task_interface_after_the_instruction() -> None:
    prompt = _prompt(TWO_INPUTS)
    line = (
        "ModelNew keeps the interface of t's Model: `def __init__(self, features: int, eps: float=1e-05, *, bias=True)` "
        "and `def forward(self, A: torch.Tensor, B: torch.Tensor, scale: float=2.0) -> torch.Tensor` "
        "(3 inputs: A, B, scale)."
    )
    assert line in prompt
    assert prompt.index("Write ModelNew with custom kernels") < prompt.index(line)
    one = _prompt("class Model:\n    def __init__(self):\n        pass\n\n    def forward(self, x):\n        return x\n")
    assert "`def __init__(self)` and `def forward(self, x)` (1 input: x)." in one
    assert "keeps the interface" not in _prompt("def get_inputs():\n    return []\n")


# --- code-block extraction ---

from kernel_refinery.agent.extract import REFERENCE_ECHO, extract_candidate  # noqa: E402
from kernel_refinery.agent.prompting import turn_feedback  # noqa: E402
from kernel_refinery.agent.state import Attempt  # noqa: E402

ECHO = """Here is the code:
```python
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)
```
"""


def test_a_reply_that_repeats_the_reference_is_named_as_such() -> None:
    found = extract_candidate(ECHO)
    assert found.code is None and found.problem == REFERENCE_ECHO
    # A block without either class keeps the plain message; one with ModelNew is taken.
    assert extract_candidate("```python\nx = 1\n```").problem == "no code block defines class ModelNew"
    both = ECHO + "```python\nclass ModelNew:\n    pass\n```\n"
    assert extract_candidate(both).code == "class ModelNew:\n    pass\n"
    # `class ModelNew` alone is not an echo of `class Model`, and a nested Model is not at line start.
    assert extract_candidate("```python\n    class Model:\n        pass\n```").problem == "no code block defines class ModelNew"


def test_the_echo_is_not_shown_back_but_other_unusable_replies_are() -> None:
    echo = turn_feedback(Attempt(turn=1, reply=ECHO, extract_error=REFERENCE_ECHO), Variant.parse("G"))
    assert REFERENCE_ECHO in echo and "softmax" not in echo and "The start of that reply" not in echo
    prose = turn_feedback(
        Attempt(turn=1, reply="I would use OpenMP.", extract_error="it contained no ```python code block"), Variant.parse("G")
    )
    assert "The start of that reply was:\nI would use OpenMP." in prose


def test_a_repeated_attempt_without_feedback_is_the_same_prompt_on_every_turn() -> None:
    """No turn number in the prompt: G's prompt after an unchanged kernel repeats word for word, so a
    greedy reply is reused (llm.reuse_replies) rather than decoded again."""
    task = TaskSpec(name="two", source=TWO_INPUTS)
    same = Attempt(turn=1, reply="r", code="CODE")
    prompts_by_turn = [
        [m.content for m in build_messages(task, "cpp", Variant.parse("G"), turn, 5, same, None, 1e-2)] for turn in (2, 3, 4)
    ]
    assert prompts_by_turn[0] == prompts_by_turn[1] == prompts_by_turn[2]


def test_the_profile_starts_its_own_line_after_the_speedup() -> None:
    from kernel_refinery import prompts

    text = prompts.render(
        "feedback/correct.j2",
        candidate_ms="13.8",
        reference_ms="12.6",
        speedup="0.911",
        compiled_ms="",
        warnings="",
        profile="TABLE",
        nsight="",
    )
    assert "0.911x.\nProfile of your forward:\n```\nTABLE\n```\nMake it faster" in text


def test_a_wrong_result_of_a_sign_the_reference_never_gives_gets_its_hint() -> None:
    """The correctness step's sign clause reaches the model as a hint that names no operation."""
    import torch

    from kernel_refinery.tools.config import EvalConfig
    from kernel_refinery.tools.results import CorrectnessReport
    from kernel_refinery.tools.steps.correctness import compare

    expected = torch.rand(8, 64)
    cmp = compare(expected, expected - 0.5, EvalConfig())
    report = CorrectnessReport(passed=False, trials=1, atol=1e-4, rtol=1e-4, failed_trial=0, reason=cmp.reason)
    text = evaluation_feedback(EvalResult(status=EvalStatus.INCORRECT, correctness=report), Variant.parse("G+E"))
    assert "gave wrong results" in text and text.count("Hint:") == 1
    hint = text[text.index("Hint:") :]
    assert "go through Model.forward step by step" in hint
    assert not any(op in hint for op in ("exp", "softmax", "sum", "max")), "the hint must name no operation"
    plain = CorrectnessReport(passed=False, trials=1, atol=1e-4, rtol=1e-4, failed_trial=0, reason="output differs")
    assert "Hint:" not in evaluation_feedback(EvalResult(status=EvalStatus.INCORRECT, correctness=plain), Variant.parse("G+E"))
