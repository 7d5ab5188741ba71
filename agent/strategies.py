"""Search strategies: different schedules of the same nodes and evaluator.

- refine: one trajectory through the graph (agent/runner.py).
- best-of-n: N independent trajectories, run one after another, each with an equal share of
  what is left of the budget; the best correct kernel of any wins.
- beam: each round, one idea call per seed kernel proposes K optimisation ideas; one kernel is
  generated per idea and taken through extract → compile → execute → profile by the graph's own
  routing table (a failed step ends the attempt, as in the loop). The W best kernels found so far
  (correct first, then fastest) seed the next round; round 1 starts from the reference. Every
  evaluated kernel is a trace record with its node_id, parent_id and idea.

A budget (evaluations, tokens) caps any strategy; see agent/budget.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import structlog
from langchain_core.language_models import BaseChatModel
from langgraph.graph import END
from langgraph.runtime import Runtime

from agent.budget import Budget
from agent.config import RunConfig
from agent.graph import NODES, ROUTES
from agent.llm import CALL_KEY, TASK_KEY, TURN_KEY, call_model
from agent.nodes import AgentContext, turn_record
from agent.prompting import idea_messages
from agent.runner import AttemptsSummary, TrajectoryResult, run_trajectory
from agent.state import Attempt, RefineState, TaskSpec
from tools.evaluator import Evaluator
from traces.schema import TokenUsage, TrajectoryId
from traces.store import append_turn, trace_path

log = structlog.get_logger()


@dataclass(frozen=True)
class StrategyResult(AttemptsSummary):
    """What a strategy found on one task: every attempt in evaluation order, and what it cost."""

    strategy: str
    trajectory: TrajectoryId
    attempts: tuple[Attempt, ...]
    tokens: TokenUsage
    traces: tuple[Path, ...]

    @property
    def trace(self) -> Path:
        return self.traces[0]


@dataclass(frozen=True)
class StrategyRun:
    """One strategy run's fixed inputs (the live objects it schedules the nodes with)."""

    task: TaskSpec
    config: RunConfig
    model: BaseChatModel
    evaluator: Evaluator
    run_dir: Path
    trajectory: TrajectoryId
    run_id: str
    hardware: str | None = None
    resume: bool = True
    on_turn: Callable[[Attempt], None] | None = None


def run_strategy(run: StrategyRun, budget: Budget | None = None) -> StrategyResult:
    """Run the config's strategy on one task within the config's budget (or the one given)."""
    search = run.config.search
    budget = budget if budget is not None else Budget(max_evals=search.budget_evals, max_tokens=search.budget_tokens)
    trajectory = run.trajectory.model_copy(update={"strategy": run.config.strategy})
    run = replace(run, trajectory=trajectory)
    if run.config.strategy == "beam":
        return run_beam(run, budget)
    samples = search.n if run.config.strategy == "best-of-n" else 1
    attempts: list[Attempt] = []
    tokens = TokenUsage()
    traces: list[Path] = []
    for index in range(samples):
        if not budget.can_generate() or any(_target_met(a, run.config) for a in attempts):
            break
        # Each sample gets an equal share of what is left, so early samples cannot starve late ones.
        share = budget.share(samples - index) if samples > 1 else budget
        sample = trajectory.model_copy(update={"sample": trajectory.sample * samples + index}) if samples > 1 else trajectory
        result: TrajectoryResult = run_trajectory(
            run.task, run.config, run.model, run.evaluator, run.run_dir, sample, run_id=run.run_id,
            hardware=run.hardware, resume=run.resume, on_turn=run.on_turn, budget=share,
        )
        attempts.extend(result.attempts)
        tokens = tokens + result.tokens
        traces.append(result.trace)
    return StrategyResult(strategy=run.config.strategy, trajectory=trajectory, attempts=tuple(attempts), tokens=tokens,
                          traces=tuple(traces) or (trace_path(run.run_dir, trajectory),))


def _target_met(attempt: Attempt, config: RunConfig) -> bool:
    """Every strategy stops where the loop does: at a correct kernel this fast."""
    return attempt.correct and (attempt.speedup or 0.0) >= config.loop.target_speedup


_LIST_ITEM = re.compile(r"^\s*(?:\d+[.):]|[-*•])\s+(.+?)\s*$")


def parse_ideas(reply: str, count: int) -> list[str]:
    """The first `count` items of a numbered or bulleted list; without a list, the non-empty lines."""
    lines = [line for line in reply.splitlines() if line.strip() and not line.strip().startswith("```")]
    items = [m.group(1) for m in map(_LIST_ITEM.match, lines) if m]
    if not items:
        items = [line.strip() for line in lines]
    ideas: list[str] = []
    for item in items:
        text = item.replace("**", "").strip()[:300]  # markdown bold, as small models write it
        if text and text not in ideas:
            ideas.append(text)
    return ideas[:count]


@dataclass(frozen=True)
class BeamNode:
    node_id: str
    parent_id: str | None
    idea: str | None
    attempt: Attempt


def rank_key(node: BeamNode) -> tuple[bool, float, int]:
    """Correct before not, then faster, then the failure closest to correct (the verdict's rank)."""
    a = node.attempt
    return (a.correct, a.speedup or 0.0, a.verdict.rank)


def select_seeds(nodes: list[BeamNode], width: int) -> list[BeamNode]:
    """The `width` best kernels so far (parents stay in the pool, so a round that finds nothing
    better does not lose the best); ties go to the earliest node."""
    with_code = [n for n in nodes if n.attempt.code is not None]
    order = sorted(range(len(with_code)), key=lambda i: (rank_key(with_code[i]), -i), reverse=True)
    return [with_code[i] for i in order[:width]]


def _step_until_decide(state: RefineState, runtime: Runtime[AgentContext]) -> RefineState:
    """generate → … → (the node before decide), routed by the graph's own table."""
    fixed = {"generate": "extract", "profile": "decide"}
    node = "generate"
    while node not in ("decide", END):
        fn: Any = NODES[node]
        update = fn(state) if node == "extract" else fn(state, runtime)
        state = {**state, **update}  # type: ignore[typeddict-item]
        node = fixed[node] if node in fixed else ROUTES[node][state["outcome"]]
    return state


def run_beam(run: StrategyRun, budget: Budget) -> StrategyResult:
    search = run.config.search
    config = run.config.model_copy(update={"loop": run.config.loop.model_copy(update={"turns": search.rounds})})
    ctx = AgentContext(
        config=config, model=run.model, evaluator=run.evaluator, run_dir=run.run_dir, run_id=run.run_id,
        trajectory=run.trajectory, hardware=run.hardware, on_turn=run.on_turn, budget=budget,
    )
    runtime = Runtime(context=ctx)
    path = trace_path(run.run_dir, run.trajectory)
    # Beam search keeps no checkpoint: an unfinished one starts again, so its old records go.
    path.unlink(missing_ok=True)
    tol = config.eval.precision_tolerance
    hardware = run.hardware if config.loop.hardware_prompt else None
    nodes: list[BeamNode] = []
    tokens = TokenUsage()
    seeds: list[BeamNode | None] = [None]

    def stop() -> bool:
        return not budget.can_generate() or any(_target_met(n.attempt, config) for n in nodes)

    for round_no in range(1, search.rounds + 1):
        index = 0
        for seed in seeds:
            if stop():
                break
            tried = [n.idea for n in nodes if n.parent_id == (seed.node_id if seed else None) and n.idea]
            messages = idea_messages(
                run.task, config.eval.kernel_backend, config.loop.parsed_variant, seed.attempt if seed else None,
                tried, search.ideas, hardware, tol.rtol, config.eval.precision,
            )
            metadata = {TURN_KEY: round_no, TASK_KEY: run.trajectory.task, CALL_KEY: "ideas"}
            reply = call_model(run.model, messages, config.llm, config={"metadata": metadata})
            budget.spend_tokens(reply.tokens.total)
            tokens = tokens + reply.tokens
            # Without a usable list the kernel call still runs, as a plain refinement step.
            ideas: list[str | None] = list(parse_ideas(reply.text, search.ideas)) or [None]
            idea_tokens = reply.tokens
            log.info("beam_ideas", task=run.task.name, round=round_no, parent=seed.node_id if seed else None, ideas=len(ideas))
            for idea in ideas:
                if stop():
                    break
                state: RefineState = {
                    "task": run.task, "turn": round_no - 1, "attempts": [seed.attempt] if seed else [], "idea": idea,
                }
                state = _step_until_decide(state, runtime)
                draft = state["draft"]
                assert draft is not None
                tokens = tokens + draft.tokens
                # The idea call's tokens go on its first kernel's record, so the trace adds up to the run.
                draft = draft.model_copy(update={"tokens": draft.tokens + idea_tokens})
                idea_tokens = TokenUsage()
                node = BeamNode(node_id=f"r{round_no}-{index:02d}", parent_id=seed.node_id if seed else None, idea=idea, attempt=draft)
                index += 1
                nodes.append(node)
                append_turn(run.run_dir, turn_record(ctx, state, draft, node.node_id, node.parent_id, idea))
                if run.on_turn is not None:
                    run.on_turn(draft)
        if stop():
            break
        seeds = list(select_seeds(nodes, search.beam_width)) or [None]
        log.info("beam_round", task=run.task.name, round=round_no, seeds=[s.node_id for s in seeds if s is not None])
    return StrategyResult(strategy="beam", trajectory=run.trajectory, attempts=tuple(n.attempt for n in nodes), tokens=tokens, traces=(path,))

