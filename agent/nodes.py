"""The graph's nodes: each a small function of the state, returning a partial update.

A turn's nodes (generate, extract, compile, execute, profile, record) make the turn subgraph;
decide is the loop's. Live objects (the chat model, the evaluator, where traces go) come from the
runtime context, so tests pass a scripted model and the real evaluator.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

import structlog
from langchain_core.messages import BaseMessage
from langgraph.runtime import Runtime

from kernel_refinery.agent.budget import Budget
from kernel_refinery.agent.chat.llm import TASK_KEY, TURN_KEY, ChatReply, call_model
from kernel_refinery.agent.config import RunConfig
from kernel_refinery.agent.context import RunContext
from kernel_refinery.agent.extract import extract_candidate
from kernel_refinery.agent.prompting import PromptFrame
from kernel_refinery.agent.state import Attempt, Outcome, RefineState, TurnState
from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.tools.results import EvalResult, Stage
from kernel_refinery.traces.schema import TraceMessage, TrajectoryId, TurnRecord
from kernel_refinery.traces.store import append_turn

log = structlog.get_logger()


@dataclass
class AgentContext:
    """What one trajectory's nodes need besides the state: the run's context, the trajectory's id
    and its share of the budget; never checkpointed."""

    run: RunContext
    trajectory: TrajectoryId
    budget: Budget = field(default_factory=Budget)
    """Evaluations and tokens left; shared by every trajectory of one strategy run."""

    @property
    def config(self) -> RunConfig:
        return self.run.config

    @cached_property
    def prompts(self) -> PromptFrame:
        return PromptFrame.of(self.run.config, self.run.hardware)

    def ask(self, messages: Sequence[BaseMessage], metadata: dict[str, Any]) -> ChatReply:
        """One model call, charged to the budget (every call of a run goes through here)."""
        with self.run.host.llm_call():
            reply = call_model(self.run.model, messages, self.run.config.llm, config={"metadata": metadata})
        self.budget.spend_tokens(reply.tokens.total)
        return reply

    def evaluate(self, task: TaskProgram, code: str, stages: tuple[Stage, ...] | None = None) -> EvalResult:
        """Evaluator stages for a candidate (None: the Nsight Compute pass)."""
        evaluator = self.run.evaluator
        with self.run.host.evaluation():
            return evaluator.nsight(task, code) if stages is None else evaluator.run(task, code, stages)


def _draft(state: TurnState | RefineState) -> Attempt:
    draft = state.get("draft")
    assert draft is not None, "a node after generate ran without an attempt in flight"
    return draft


def _program(state: TurnState) -> TaskProgram:
    return TaskProgram(name=state["task"].name, source=state["task"].source)


def generate(state: TurnState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    ctx = runtime.context
    turn = state.get("turn", 0) + 1
    attempts = state.get("attempts", [])
    messages = ctx.prompts.turn(state["task"], turn, ctx.config.loop.turns, attempts[-1] if attempts else None, state.get("idea"))
    started = time.perf_counter()
    reply = ctx.ask(messages, {TURN_KEY: turn, TASK_KEY: ctx.trajectory.task})
    draft = Attempt(
        turn=turn,
        messages=tuple(TraceMessage(role=m.type, content=str(m.content)) for m in messages),
        reply=reply.text,
        tokens=reply.tokens,
        phase_seconds={"generate": time.perf_counter() - started},
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    log.info("node", node="generate", task=state["task"].name, turn=turn, tokens=reply.tokens.total)
    return {"turn": turn, "draft": draft, "tokens": reply.tokens}


def extract(state: TurnState) -> dict[str, Any]:
    draft = _draft(state)
    found = extract_candidate(draft.reply)
    outcome = Outcome.CODE if found.code is not None else Outcome.NO_CODE
    log.info("node", node="extract", task=state["task"].name, turn=draft.turn, outcome=outcome.value)
    return {"draft": draft.model_copy(update={"code": found.code, "extract_error": found.problem}), "outcome": outcome}


def _evaluate(state: TurnState, runtime: Runtime[AgentContext], phase: str, stages: tuple[Stage, ...] | None) -> Attempt:
    """The draft with what these stages found merged into its result, and their time."""
    draft = _draft(state)
    assert draft.code is not None
    started = time.perf_counter()
    found = runtime.context.evaluate(_program(state), draft.code, stages)
    result = found if draft.result is None else draft.result.merge(found)
    seconds = {**draft.phase_seconds, phase: time.perf_counter() - started}
    return draft.model_copy(update={"result": result, "phase_seconds": seconds})


def compile_candidate(state: TurnState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    runtime.context.budget.spend_eval()
    draft = _evaluate(state, runtime, "compile", (Stage.STATIC, Stage.COMPILE))
    assert draft.result is not None
    outcome = Outcome.COMPILED if draft.result.status is None else Outcome.COMPILE_FAIL
    log.info("node", node="compile", task=state["task"].name, turn=draft.turn, outcome=outcome.value)
    return {"draft": draft, "outcome": outcome}


def execute(state: TurnState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    draft = _evaluate(state, runtime, "execute", (Stage.CORRECTNESS,))
    assert draft.result is not None
    outcome = Outcome.CORRECT if draft.result.status is EvalStatus.CORRECT else Outcome.WRONG
    log.info("node", node="execute", task=state["task"].name, turn=draft.turn, outcome=outcome.value)
    return {"draft": draft, "outcome": outcome}


def profile(state: TurnState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    draft = _evaluate(state, runtime, "profile", (Stage.TIMING, Stage.PROFILE))
    if runtime.context.config.loop.variant.nsight and draft.correct:
        draft = _evaluate({**state, "draft": draft}, runtime, "nsight", None)
    log.info("node", node="profile", task=state["task"].name, turn=draft.turn, speedup=draft.speedup)
    return {"draft": draft}


def record(state: TurnState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    """End the turn: its one trace record (with its place in a search tree, if it has one)."""
    ctx = runtime.context
    draft = _draft(state)
    carried = state.get("carried")
    if carried is not None:
        draft = draft.model_copy(update={"tokens": draft.tokens + carried})
    place = state.get("place")
    append_turn(
        ctx.run.run_dir,
        TurnRecord(
            run_id=ctx.run.run_id,
            trajectory=ctx.trajectory,
            level=state["task"].level,
            turn=draft.turn,
            model=ctx.config.llm.model,
            messages=draft.messages,
            reply=draft.reply,
            code=draft.code,
            extract_error=draft.extract_error,
            result=draft.result,
            phase_seconds=draft.phase_seconds,
            tokens=draft.tokens,
            started_at=draft.started_at,
            node_id=place.node_id if place else None,
            parent_id=place.parent_id if place else None,
            idea=state.get("idea"),
        ),
    )
    if ctx.run.on_turn is not None:
        ctx.run.on_turn(draft)
    log.info("node", node="record", task=state["task"].name, turn=draft.turn, status=draft.verdict.value)
    return {"draft": draft}


def decide(state: RefineState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    """After a turn: stop at the target speedup, at the last turn, or when the budget is spent."""
    ctx = runtime.context
    draft = _draft(state)
    done = draft.reaches(ctx.config.loop.target_speedup) or draft.turn >= ctx.config.loop.turns or ctx.budget.exhausted
    outcome = Outcome.DONE if done else Outcome.CONTINUE
    log.info("node", node="decide", task=state["task"].name, turn=draft.turn, outcome=outcome.value)
    return {"attempts": [draft], "draft": None, "outcome": outcome}
