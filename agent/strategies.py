"""Search strategies: schedulers over runs of the one turn graph (agent/graph.py).

- refine: one trajectory through the loop graph (agent/runner.py).
- best-of-n: N independent trajectories, run one after another, each with an equal share of
  what is left of the budget; the best correct kernel of any wins.
- beam: each round, one idea call per seed kernel proposes K optimisation ideas; one kernel is
  generated per idea by a run of the turn graph (generate → compile → correctness → profile →
  record, a failed step ending the turn, as in the loop). The W best kernels found so far
  (correct first, then fastest) seed the next round; round 1 starts from the reference. Every
  evaluated kernel is a trace record with its node_id, parent_id and idea.

Every strategy stops where the loop does (Attempt.reaches); a budget (evaluations, tokens) caps
any strategy; see agent/budget.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import structlog

from kernel_refinery.agent.budget import Budget
from kernel_refinery.agent.chat.llm import CALL_KEY, TASK_KEY, TURN_KEY
from kernel_refinery.agent.context import RunContext
from kernel_refinery.agent.graph import TURN
from kernel_refinery.agent.nodes import AgentContext
from kernel_refinery.agent.runner import AttemptsSummary, TrajectoryResult, run_trajectory
from kernel_refinery.agent.state import Attempt, TaskSpec, TreePlace, TurnInput
from kernel_refinery.core.strategy import Strategy
from kernel_refinery.core.verdict import Verdict, merit
from kernel_refinery.traces.schema import TokenUsage, TrajectoryId
from kernel_refinery.traces.store import trace_path

log = structlog.get_logger()


@dataclass(frozen=True)
class StrategyResult(AttemptsSummary):
    """What a strategy found on one task: every attempt in evaluation order, and what it cost."""

    strategy: Strategy
    trajectory: TrajectoryId
    attempts: tuple[Attempt, ...]
    tokens: TokenUsage
    traces: tuple[Path, ...]

    @property
    def trace(self) -> Path:
        return self.traces[0]


def run_strategy(run: RunContext, task: TaskSpec, trajectory: TrajectoryId, budget: Budget | None = None) -> StrategyResult:
    """Run the config's strategy on one task within the config's budget (or the one given)."""
    config = run.config
    search = config.search
    budget = budget if budget is not None else Budget(max_evals=search.budget_evals, max_tokens=search.budget_tokens)
    trajectory = trajectory.model_copy(update={"strategy": config.strategy})
    if config.strategy is Strategy.BEAM:
        return run_beam(run, task, trajectory, budget)
    samples = search.n if config.strategy is Strategy.BEST_OF_N else 1
    attempts: list[Attempt] = []
    tokens = TokenUsage()
    traces: list[Path] = []
    for index in range(samples):
        if not budget.can_generate() or any(a.reaches(config.loop.target_speedup) for a in attempts):
            break
        # Each sample gets an equal share of what is left, so early samples cannot starve late ones.
        share = budget.share(samples - index) if samples > 1 else budget
        sample = trajectory.model_copy(update={"sample": trajectory.sample * samples + index}) if samples > 1 else trajectory
        result: TrajectoryResult = run_trajectory(run, task, sample, budget=share)
        attempts.extend(result.attempts)
        tokens = tokens + result.tokens
        traces.append(result.trace)
    return StrategyResult(
        strategy=config.strategy,
        trajectory=trajectory,
        attempts=tuple(attempts),
        tokens=tokens,
        traces=tuple(traces) or (trace_path(run.run_dir, trajectory),),
    )


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

    @property
    def status(self) -> Verdict:
        return self.attempt.verdict

    @property
    def speedup(self) -> float | None:
        return self.attempt.speedup


def select_seeds(nodes: list[BeamNode], width: int) -> list[BeamNode]:
    """The `width` best kernels so far (parents stay in the pool, so a round that finds nothing
    better does not lose the best); ties go to the earliest node. Ranked by kernel_refinery.core.verdict.merit,
    the order `best` picks by."""
    with_code = [n for n in nodes if n.attempt.code is not None]
    order = sorted(range(len(with_code)), key=lambda i: (merit(with_code[i]), -i), reverse=True)
    return [with_code[i] for i in order[:width]]


def run_beam(run: RunContext, task: TaskSpec, trajectory: TrajectoryId, budget: Budget) -> StrategyResult:
    search = run.config.search
    config = run.config.model_copy(update={"loop": run.config.loop.model_copy(update={"turns": search.rounds})})
    ctx = AgentContext(run=run.with_config(config), trajectory=trajectory, budget=budget)
    path = trace_path(run.run_dir, trajectory)
    # Beam search keeps no checkpoint: an unfinished one starts again, so its old records go.
    path.unlink(missing_ok=True)
    nodes: list[BeamNode] = []
    tokens = TokenUsage()
    seeds: list[BeamNode | None] = [None]

    def stop() -> bool:
        return not budget.can_generate() or any(n.attempt.reaches(config.loop.target_speedup) for n in nodes)

    for round_no in range(1, search.rounds + 1):
        index = 0
        for seed in seeds:
            if stop():
                break
            parent_id = seed.node_id if seed else None
            tried = [n.idea for n in nodes if n.parent_id == parent_id and n.idea]
            messages = ctx.prompts.ideas(task, seed.attempt if seed else None, tried, search.ideas)
            reply = ctx.ask(messages, {TURN_KEY: round_no, TASK_KEY: trajectory.task, CALL_KEY: "ideas"})
            tokens = tokens + reply.tokens
            # Without a usable list the kernel call still runs, as a plain refinement step.
            ideas: list[str | None] = list(parse_ideas(reply.text, search.ideas)) or [None]
            carried = reply.tokens  # the idea call's tokens go on its first kernel's record, so the trace adds up
            log.info("beam_ideas", task=task.name, round=round_no, parent=parent_id, ideas=len(ideas))
            for idea in ideas:
                if stop():
                    break
                place = TreePlace(node_id=f"r{round_no}-{index:02d}", parent_id=parent_id)
                child: TurnInput = {
                    "task": task,
                    "turn": round_no - 1,
                    "attempts": [seed.attempt] if seed else [],
                    "idea": idea,
                    "place": place,
                    "carried": carried,
                }
                out = TURN.invoke(child, context=ctx)
                tokens = tokens + out["tokens"]
                carried = TokenUsage()
                nodes.append(BeamNode(node_id=place.node_id, parent_id=parent_id, idea=idea, attempt=out["draft"]))
                index += 1
        if stop():
            break
        seeds = list(select_seeds(nodes, search.beam_width)) or [None]
        log.info("beam_round", task=task.name, round=round_no, seeds=[s.node_id for s in seeds if s is not None])
    return StrategyResult(
        strategy=Strategy.BEAM, trajectory=trajectory, attempts=tuple(n.attempt for n in nodes), tokens=tokens, traces=(path,)
    )
