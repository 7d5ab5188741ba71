"""The run's context: the live objects every strategy, trajectory and turn of a run works with.

Built once where a run starts (bench/launch.py for `refinery run`, bench/experiment.py for an
experiment) and handed down unchanged; a trajectory adds only its id and its share of the budget
(agent/nodes.py's AgentContext). Never checkpointed. A new dependency of the loop (a cost meter, a
tracer) is one field here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from langchain_core.language_models import BaseChatModel

from kernel_refinery.agent.config import RunConfig
from kernel_refinery.agent.quiet import QuietHost
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.tools.results import EvalResult, Stage

if TYPE_CHECKING:
    from kernel_refinery.agent.state import Attempt


class CandidateEvaluator(Protocol):
    """What the loop needs of an evaluator: tools.evaluator.Evaluator, tools.processes.pool.EvaluatorPool and
    bench.ray_pool.RayEvaluatorPool each fit (a pool's `run` is thread-safe)."""

    def run(self, task: TaskProgram, candidate: str, stages: Sequence[Stage]) -> EvalResult: ...

    def nsight(self, task: TaskProgram, candidate: str) -> EvalResult: ...


@dataclass(frozen=True)
class RunContext:
    """What a run's turns run with, besides their state."""

    config: RunConfig
    model: BaseChatModel
    evaluator: CandidateEvaluator
    run_dir: Path
    run_id: str
    hardware: str | None = None
    """The prompt's hardware block (tools/hardware.py), or None without one."""
    resume: bool = True
    """Continue a trajectory that has a checkpoint (else refuse to touch it)."""
    on_turn: Callable[[Attempt], None] | None = None
    """Called with each finished turn, e.g. to print it."""
    host: QuietHost = field(default_factory=lambda: QuietHost(enabled=False))
    """Shared by every trajectory of a run: LLM calls and evaluations take turns where it is in force (agent/quiet.py)."""

    def with_config(self, config: RunConfig) -> RunContext:
        """The same run under another config (an experiment's variant, strategy or precision; beam's rounds)."""
        return replace(self, config=config)
