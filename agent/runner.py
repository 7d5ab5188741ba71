"""Running one trajectory through the graph, checkpointed in SQLite so a killed run resumes."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import structlog
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import StateSnapshot
from tenacity import retry, retry_if_exception_type, stop_after_delay, wait_random_exponential

from kernel_refinery.agent.budget import Budget
from kernel_refinery.agent.context import RunContext
from kernel_refinery.agent.graph import build_graph
from kernel_refinery.agent.nodes import AgentContext
from kernel_refinery.agent.state import Attempt, Outcome, RefineInput, RefineState, TaskSpec, best_attempt
from kernel_refinery.traces.schema import TokenUsage, TrajectoryId
from kernel_refinery.traces.store import trace_path

log = structlog.get_logger()


class AttemptsSummary:
    """The best attempt, turns and evaluations of anything holding `attempts`."""

    attempts: tuple[Attempt, ...]

    @property
    def best(self) -> Attempt | None:
        return best_attempt(list(self.attempts))

    @property
    def turns(self) -> int:
        return len(self.attempts)

    @property
    def evals(self) -> int:
        return evaluations(self.attempts)


@dataclass(frozen=True)
class TrajectoryResult(AttemptsSummary):
    trajectory: TrajectoryId
    attempts: tuple[Attempt, ...]
    tokens: TokenUsage
    trace: Path


def evaluations(attempts: tuple[Attempt, ...] | list[Attempt]) -> int:
    """Candidates that reached the evaluator (a reply without code has no result)."""
    return sum(1 for a in attempts if a.result is not None)


def _state_types() -> list[tuple[str, str]]:
    """Every type the graph's state may hold, allowed explicitly for checkpoint decoding."""
    import inspect
    from enum import Enum

    from pydantic import BaseModel

    import kernel_refinery.agent.state
    import kernel_refinery.core.verdict
    import kernel_refinery.tools.results
    import kernel_refinery.traces.schema

    allowed = []
    modules = (kernel_refinery.agent.state, kernel_refinery.core.verdict, kernel_refinery.tools.results, kernel_refinery.traces.schema)
    for module in modules:
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and obj.__module__ == module.__name__ and issubclass(obj, (BaseModel, Enum)):
                allowed.append((module.__name__, name))
    return allowed


def checkpoint_path(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints.sqlite"


_wal_lock = threading.Lock()
_wal_files: set[Path] = set()


@retry(
    retry=retry_if_exception_type(sqlite3.OperationalError),
    wait=wait_random_exponential(multiplier=0.05, max=2.0),
    stop=stop_after_delay(60),
    reraise=True,
)
def _switch_to_wal(path: Path) -> None:
    # Switching the journal mode upgrades a shared lock to an exclusive one, and SQLite answers
    # "database is locked" at once, without its busy timeout, when another connection holds a lock.
    with closing(sqlite3.connect(str(path), timeout=60)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")


def open_checkpointer(run_dir: Path) -> SqliteSaver:
    path = checkpoint_path(run_dir).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    # WAL lets parallel trajectories share the file; the mode is stored in the file, so set it once.
    with _wal_lock:
        if path not in _wal_files:
            _switch_to_wal(path)
            _wal_files.add(path)
    conn = sqlite3.connect(str(path), check_same_thread=False, timeout=60)
    return SqliteSaver(conn, serde=JsonPlusSerializer(allowed_msgpack_modules=_state_types()))


def run_trajectory(run: RunContext, task: TaskSpec, trajectory: TrajectoryId, budget: Budget | None = None) -> TrajectoryResult:
    """Run (or resume, or just read back) one trajectory to its end.

    With a budget, what the checkpoint already spent is charged to it first, and a trajectory
    whose budget is spent does not start.
    """
    budget = budget if budget is not None else Budget()
    run_dir = run.run_dir
    saver = open_checkpointer(run_dir)
    with closing(saver.conn):
        graph = build_graph(checkpointer=saver)
        thread: RunnableConfig = {"configurable": {"thread_id": trajectory.slug}, "recursion_limit": 4 * run.config.loop.turns + 20}
        ctx = AgentContext(run=run, trajectory=trajectory, budget=budget)
        snapshot = graph.get_state(thread, subgraphs=True)
        started = bool(snapshot.values)
        if started and not run.resume:
            raise FileExistsError(
                f"trajectory {trajectory.slug} already has a checkpoint in {run_dir}; pass --resume to continue it "
                "or choose another --run-dir"
            )
        if started and _unfinished_older_layout(saver, graph, thread):
            # The turn in flight cannot be found again in today's graph, so the trajectory starts over.
            log.warning(
                "checkpoint_restart",
                trajectory=trajectory.slug,
                reason="an unfinished checkpoint of an older version of the loop; the trajectory starts again",
            )
            saver.delete_thread(trajectory.slug)
            trace_path(run_dir, trajectory).unlink(missing_ok=True)
            started = False
        if started:
            _charge(budget, snapshot)
        if not started and budget.can_generate():
            graph.invoke({"task": task}, thread, context=ctx)
        elif snapshot.next or snapshot.tasks:
            # A kill between a node's saved writes and the next checkpoint leaves `next` empty
            # with that node's task still listed: the run is not over, and invoke applies the writes.
            graph.invoke(None, thread, context=ctx)
        values = graph.get_state(thread).values
    return TrajectoryResult(
        trajectory=trajectory,
        attempts=tuple(values.get("attempts", [])),
        tokens=values.get("tokens", TokenUsage()),
        trace=trace_path(run_dir, trajectory),
    )


def _unfinished_older_layout(
    saver: SqliteSaver, graph: CompiledStateGraph[RefineState, AgentContext, RefineInput, RefineState], thread: RunnableConfig
) -> bool:
    """A checkpoint of the loop before the turn subgraph (generate, compile, ... were the loop's own
    nodes) that did not reach its end: it names nodes this graph does not have."""
    saved = saver.get_tuple(thread)
    if saved is None:
        return False
    scheduled = {c.removeprefix("branch:to:") for c in saved.checkpoint["channel_versions"] if c.startswith("branch:to:")}
    return bool(scheduled - set(graph.nodes)) and saved.checkpoint["channel_values"].get("outcome") != Outcome.DONE


def _charge(budget: Budget, snapshot: StateSnapshot) -> None:
    """Charge what a checkpointed trajectory already spent (the budget lives outside the checkpoint),
    the turn in flight inside the turn subgraph included."""
    states = [snapshot.values, *(t.state.values for t in snapshot.tasks if isinstance(t.state, StateSnapshot))]
    attempts = list(snapshot.values.get("attempts", []))
    attempts += [d for d in (s.get("draft") for s in states) if d is not None and d.result is not None]
    tokens = sum(s.get("tokens", TokenUsage()).total for s in states)
    charged: Budget | None = budget
    while charged is not None:
        charged.tokens += tokens
        charged.evals += evaluations(attempts)
        charged = charged.parent
