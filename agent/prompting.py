"""Prompt text for a turn, from the raw state and the feedback variant.

- G: the task and the previous attempt's code, no evaluation feedback.
- G+E: adds the verdict: compiler log, runtime error, correctness diff, or time and speedup.
- G+E+P: adds the profiler table to a correct verdict.
A reply the loop could not use (no code block, a syntax error) is told back in every variant:
it is about the answer's form, not an evaluation.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

from kernel_refinery import prompts
from kernel_refinery.agent.config import RunConfig, Variant
from kernel_refinery.agent.extract import REFERENCE_ECHO
from kernel_refinery.agent.state import Attempt, TaskSpec
from kernel_refinery.core.numerics import Numerics, Precision
from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.results import EvalResult

_RUN_FAILURES = (EvalStatus.RUNTIME_ERROR, EvalStatus.CUDA_FAULT, EvalStatus.TIMEOUT, EvalStatus.OOM)


@dataclass(frozen=True)
class Interface:
    """The signatures of the task Model's constructor and forward, as written in its source."""

    init: str
    forward: str
    inputs: tuple[str, ...]
    """forward's parameter names after self, in order (a *args or **kwargs keeps its stars)."""


def _signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    returns = f" -> {ast.unparse(fn.returns)}" if fn.returns is not None else ""
    return f"def {fn.name}({ast.unparse(fn.args)}){returns}"


def model_interface(source: str, class_name: str = "Model") -> Interface | None:
    """The exact `__init__` and `forward` signatures of `class_name` in a task's source.

    None when the source does not parse or has no such class with a forward; a class without its
    own `__init__` takes no constructor arguments.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    if cls is None:
        return None
    methods = {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    forward = methods.get("forward")
    if forward is None:
        return None
    init = methods.get("__init__")
    args = forward.args
    names = [a.arg for a in (*args.posonlyargs, *args.args)][1:]
    if args.vararg is not None:
        names.append("*" + args.vararg.arg)
    names += [a.arg for a in args.kwonlyargs]
    if args.kwarg is not None:
        names.append("**" + args.kwarg.arg)
    return Interface(
        init=_signature(init) if init is not None else "def __init__(self)",
        forward=_signature(forward),
        inputs=tuple(names),
    )


def _ms(value: float) -> str:
    return f"{value:.4g}"


def evaluation_feedback(result: EvalResult, variant: Variant) -> str:
    status = result.status
    if status is EvalStatus.COMPILE_ERROR:
        log = result.compile.log if result.compile is not None and result.compile.log else result.message
        return prompts.render("feedback/compile_error.j2", log=log.strip(), hints=prompts.hints_for(log))
    if status in _RUN_FAILURES:
        return prompts.render(
            "feedback/runtime_error.j2",
            status=status.value,
            message=result.message.strip(),
            printed=result.worker_log.strip()[-1500:],
            hints=prompts.hints_for(result.message),
        )
    if status is EvalStatus.INCORRECT:
        summary = result.correctness.summary() if result.correctness is not None else result.message
        return prompts.render("feedback/incorrect.j2", summary=summary, hints=prompts.hints_for(summary))
    if status is EvalStatus.REJECTED:
        return prompts.render("feedback/rejected.j2", message=result.message.strip())
    if status is EvalStatus.CORRECT and result.timing is not None:
        t = result.timing
        warnings = "; ".join(result.static.warnings) if result.static is not None else ""
        profile = result.profile.table if variant.profiler and result.profile is not None else ""
        nsight = result.nsight.block() if variant.nsight and result.nsight is not None else ""
        return prompts.render(
            "feedback/correct.j2",
            candidate_ms=_ms(t.candidate.median),
            reference_ms=_ms(t.reference.median),
            compiled_ms=_ms(t.reference_compiled.median) if t.reference_compiled else "",
            speedup=f"{t.speedup:.3g}",
            warnings=warnings,
            profile=profile,
            nsight=nsight,
        )
    return ""


def turn_feedback(previous: Attempt, variant: Variant) -> str:
    if previous.code is None:
        # An echo of the reference is not shown again: a small model copies the nearest code it sees.
        head = "" if previous.extract_error == REFERENCE_ECHO else previous.reply.strip()[:600] or "(empty reply)"
        return prompts.render("feedback/no_code.j2", problem=previous.extract_error or "no code", reply_head=head)
    if not variant.execution or previous.result is None:
        return ""
    return evaluation_feedback(previous.result, variant)


def _dtype(precision: str) -> str:
    """A reduced precision is named in the prompt: the kernels must read and write that dtype."""
    named = Precision(precision)
    return named.dtype_name if named.reduced else ""


def build_messages(
    task: TaskSpec,
    backend: str,
    variant: Variant,
    turn: int,
    turns: int,
    previous: Attempt | None,
    hardware: str | None,
    tolerance: float,
    idea: str | None = None,
    precision: str = Precision.FP32,
) -> list[BaseMessage]:
    spec = prompts.backend(backend)
    system = prompts.render("system.j2", backend=spec, tolerance=f"{tolerance:g}")
    user = prompts.render(
        "task.j2",
        interface=model_interface(task.source),
        examples=spec.examples,
        module_parts=spec.module_parts,
        correct=previous is not None and previous.correct,
        hardware=hardware or "",
        task_name=task.name,
        task_source=task.source.strip(),
        turn=turn,
        turns=turns,
        previous_code=previous.code.strip() if previous is not None and previous.code else None,
        previous_reply=previous.reply if previous is not None else None,
        feedback=turn_feedback(previous, variant) if previous is not None else "",
        idea=idea,
        dtype=_dtype(precision),
    )
    return [SystemMessage(content=system), HumanMessage(content=user)]


def idea_messages(
    task: TaskSpec,
    backend: str,
    variant: Variant,
    parent: Attempt | None,
    tried: list[str],
    count: int,
    hardware: str | None,
    tolerance: float,
    precision: str = Precision.FP32,
) -> list[BaseMessage]:
    """Ask for `count` short optimisation ideas for the parent kernel (the reference when None)."""
    spec = prompts.backend(backend)
    system = prompts.render("system.j2", backend=spec, tolerance=f"{tolerance:g}")
    user = prompts.render(
        "idea.j2",
        hardware=hardware or "",
        task_name=task.name,
        task_source=task.source.strip(),
        parent_code=parent.code.strip() if parent is not None and parent.code else None,
        feedback=turn_feedback(parent, variant) if parent is not None else "",
        tried=tried,
        count=count,
        dtype=_dtype(precision),
    )
    return [SystemMessage(content=system), HumanMessage(content=user)]


@dataclass(frozen=True)
class PromptFrame:
    """What every prompt of a run states besides the task and its history, read from the config in
    one place: the backend, the feedback variant, the numerics (the precision and the tolerance in
    force: an explicit `eval.tolerance`, else the precision's default) and the hardware block, if the
    loop shows it."""

    backend: str
    variant: Variant
    numerics: Numerics
    hardware: str | None

    @classmethod
    def of(cls, config: RunConfig, hardware: str | None) -> PromptFrame:
        return cls(
            backend=config.eval.kernel_backend,
            variant=config.loop.variant,
            numerics=config.eval.numerics,
            hardware=hardware if config.loop.hardware_prompt else None,
        )

    @property
    def tolerance(self) -> float:
        """The tolerance the system prompt states."""
        assert self.numerics.tolerance is not None, "a run's numerics always hold its tolerance"
        return self.numerics.tolerance

    def turn(self, task: TaskSpec, turn: int, turns: int, previous: Attempt | None, idea: str | None = None) -> list[BaseMessage]:
        return build_messages(
            task=task,
            backend=self.backend,
            variant=self.variant,
            turn=turn,
            turns=turns,
            previous=previous,
            hardware=self.hardware,
            tolerance=self.tolerance,
            idea=idea,
            precision=self.numerics.precision,
        )

    def ideas(self, task: TaskSpec, parent: Attempt | None, tried: list[str], count: int) -> list[BaseMessage]:
        return idea_messages(task, self.backend, self.variant, parent, tried, count, self.hardware, self.tolerance, self.numerics.precision)
