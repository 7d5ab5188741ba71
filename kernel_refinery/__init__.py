"""kernel-refinery: an LLM writes fast kernels by iterative refinement, judged by an honest evaluator.

The public Python API (kernel_refinery/api.py), stable across minor versions: `from kernel_refinery import evaluate, load_task`.
Every other module is private by convention. The subpackages are the repository's top-level folders:

- `kernel_refinery.core`: the shared vocabulary (errors, verdicts, trajectory ids, numerics, statistics);
- `kernel_refinery.tools`: the evaluator (steps, processes, guards);
- `kernel_refinery.agent`: the refinement loop, and its chat models in `agent.chat`;
- `kernel_refinery.prompts`: prompt templates, examples and hints;
- `kernel_refinery.traces`: the trace schema, store, scorer and reports;
- `kernel_refinery.bench`: suites, experiments, the CLI, the service and the RL environment.

The API is loaded on first use, so that `refinery` starts without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kernel_refinery.api import (
        Client,
        EvalConfig,
        EvalResult,
        Experiment,
        ExperimentConfig,
        GroupScores,
        RunConfig,
        ServiceError,
        StrategyResult,
        Task,
        TrajectoryId,
        TrajectoryRecord,
        TurnRecord,
        evaluate,
        evaluate_many,
        load_suite,
        load_task,
        load_traces,
        refine,
        report_run,
        task_from_source,
    )

__all__ = [
    "Client",
    "EvalConfig",
    "EvalResult",
    "Experiment",
    "ExperimentConfig",
    "GroupScores",
    "RunConfig",
    "ServiceError",
    "StrategyResult",
    "Task",
    "TrajectoryId",
    "TrajectoryRecord",
    "TurnRecord",
    "evaluate",
    "evaluate_many",
    "load_suite",
    "load_task",
    "load_traces",
    "refine",
    "report_run",
    "task_from_source",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from kernel_refinery import api

        return getattr(api, name)
    raise AttributeError(f"module 'kernel_refinery' has no attribute {name!r}")
