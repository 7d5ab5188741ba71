"""The graph's nodes: each a small function of the state, returning a partial update.

Live objects (the chat model, the evaluator, where traces go) come from the runtime context,
so tests pass a scripted model and the real evaluator.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import structlog
from langchain_core.language_models import BaseChatModel
from langgraph.runtime import Runtime

from agent.budget import Budget
from agent.config import RunConfig
from agent.extract import extract_candidate
from agent.llm import TASK_KEY, TURN_KEY, call_model
from agent.prompting import build_messages
from agent.state import Attempt, Outcome, RefineState
from tools.evaluator import Evaluator
from tools.jobs import TaskProgram
from tools.results import EvalStatus, Stage
from traces.schema import TraceMessage, TrajectoryId, TurnRecord
from traces.store import append_turn

log = structlog.get_logger()


@dataclass
class AgentContext:
    """What the nodes need besides the state; never checkpointed."""

    config: RunConfig
    model: BaseChatModel
    evaluator: Evaluator
    run_dir: Path
    run_id: str
    trajectory: TrajectoryId
    hardware: str | None = None
    on_turn: Callable[[Attempt], None] | None = None
    budget: Budget = field(default_factory=Budget)
    """Evaluations and tokens left; shared by every trajectory of one strategy run."""


def _draft(state: RefineState) -> Attempt:
    draft = state.get("draft")
    assert draft is not None, "a node after generate ran without an attempt in flight"
    return draft


def _timed(draft: Attempt, phase: str, seconds: float, **update: Any) -> Attempt:
    return draft.model_copy(update={"phase_seconds": {**draft.phase_seconds, phase: seconds}, **update})


def _program(state: RefineState) -> TaskProgram:
    return TaskProgram(name=state["task"].name, source=state["task"].source)


def generate(state: RefineState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    ctx = runtime.context
    cfg = ctx.config
    turn = state.get("turn", 0) + 1
    attempts = state.get("attempts", [])
    tol = cfg.eval.precision_tolerance
    messages = build_messages(
        task=state["task"],
        backend=cfg.eval.kernel_backend,
        variant=cfg.loop.parsed_variant,
        turn=turn,
        turns=cfg.loop.turns,
        previous=attempts[-1] if attempts else None,
        hardware=ctx.hardware if cfg.loop.hardware_prompt else None,
        tolerance=tol.rtol,
        idea=state.get("idea"),
        precision=cfg.eval.precision,
    )
    started = time.perf_counter()
    reply = call_model(ctx.model, messages, cfg.llm, config={"metadata": {TURN_KEY: turn, TASK_KEY: ctx.trajectory.task}})
    ctx.budget.spend_tokens(reply.tokens.total)
    draft = Attempt(
        turn=turn,
        messages=tuple(TraceMessage(role=m.type, content=str(m.content)) for m in messages),
        reply=reply.text,
        tokens=reply.tokens,
        phase_seconds={"generate": time.perf_counter() - started},
        started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    log.info("node", node="generate", task=state["task"].name, turn=turn, tokens=reply.tokens.total)
    return {"turn": turn, "draft": draft, "tokens": reply.tokens}


def extract(state: RefineState) -> dict[str, Any]:
    draft = _draft(state)
    found = extract_candidate(draft.reply)
    outcome = Outcome.CODE if found.code is not None else Outcome.NO_CODE
    log.info("node", node="extract", task=state["task"].name, turn=draft.turn, outcome=outcome.value)
    return {"draft": draft.model_copy(update={"code": found.code, "extract_error": found.problem}), "outcome": outcome}


def _evaluate(state: RefineState, runtime: Runtime[AgentContext], node: str, stages: tuple[Stage, ...]) -> Attempt:
    draft = _draft(state)
    assert draft.code is not None
    started = time.perf_counter()
    found = runtime.context.evaluator.run(_program(state), draft.code, stages)
    result = found if draft.result is None else draft.result.merge(found)
    return _timed(draft, node, time.perf_counter() - started, result=result)


def compile_candidate(state: RefineState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    runtime.context.budget.spend_eval()
    draft = _evaluate(state, runtime, "compile", (Stage.STATIC, Stage.COMPILE))
    assert draft.result is not None
    outcome = Outcome.COMPILED if draft.result.status is None else Outcome.COMPILE_FAIL
    log.info("node", node="compile", task=state["task"].name, turn=draft.turn, outcome=outcome.value)
    return {"draft": draft, "outcome": outcome}


def execute(state: RefineState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    draft = _evaluate(state, runtime, "execute", (Stage.CORRECTNESS,))
    assert draft.result is not None
    outcome = Outcome.CORRECT if draft.result.status is EvalStatus.CORRECT else Outcome.WRONG
    log.info("node", node="execute", task=state["task"].name, turn=draft.turn, outcome=outcome.value)
    return {"draft": draft, "outcome": outcome}


def profile(state: RefineState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    draft = _evaluate(state, runtime, "profile", (Stage.TIMING, Stage.PROFILE))
    if runtime.context.config.loop.parsed_variant.nsight and draft.correct and draft.code is not None:
        started = time.perf_counter()
        counters = runtime.context.evaluator.nsight(_program(state), draft.code)
        assert draft.result is not None
        draft = _timed(draft, "nsight", time.perf_counter() - started, result=draft.result.merge(counters))
    log.info("node", node="profile", task=state["task"].name, turn=draft.turn, speedup=draft.speedup)
    return {"draft": draft}


def decide(state: RefineState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    """End the turn: record it, then stop at the target speedup or when the budget is spent."""
    ctx = runtime.context
    draft = _draft(state)
    record = turn_record(ctx, state, draft)
    append_turn(ctx.run_dir, record)
    if ctx.on_turn is not None:
        ctx.on_turn(draft)
    target_met = draft.correct and (draft.speedup or 0.0) >= ctx.config.loop.target_speedup
    done = target_met or draft.turn >= ctx.config.loop.turns or ctx.budget.exhausted
    outcome = Outcome.DONE if done else Outcome.CONTINUE
    log.info("node", node="decide", task=state["task"].name, turn=draft.turn, status=record.status, outcome=outcome.value)
    return {"attempts": [draft], "draft": None, "outcome": outcome}


def turn_record(ctx: AgentContext, state: RefineState, draft: Attempt, node_id: str | None = None,
                parent_id: str | None = None, idea: str | None = None) -> TurnRecord:
    """The trace record of a finished attempt; search strategies add the node's place in their tree."""
    return TurnRecord(
        run_id=ctx.run_id, trajectory=ctx.trajectory, level=state["task"].level, turn=draft.turn,
        model=ctx.config.llm.model, messages=draft.messages, reply=draft.reply, code=draft.code,
        extract_error=draft.extract_error, result=draft.result, phase_seconds=draft.phase_seconds,
        tokens=draft.tokens, started_at=draft.started_at, node_id=node_id, parent_id=parent_id, idea=idea,
    )
