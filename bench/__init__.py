"""kernel-refinery's public Python API, from bench/api.py: `from bench import evaluate, load_task`.

Loaded on first use, so that `refinery` and the other bench modules start without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.api import (
        EvalConfig,
        EvalResult,
        Experiment,
        ExperimentConfig,
        GroupScores,
        Task,
        TrajectoryId,
        TrajectoryRecord,
        TurnRecord,
        evaluate,
        evaluate_many,
        load_suite,
        load_task,
        load_traces,
        report_run,
        task_from_source,
    )

__all__ = [
    "EvalConfig",
    "EvalResult",
    "Experiment",
    "ExperimentConfig",
    "GroupScores",
    "Task",
    "TrajectoryId",
    "TrajectoryRecord",
    "TurnRecord",
    "evaluate",
    "evaluate_many",
    "load_suite",
    "load_task",
    "load_traces",
    "report_run",
    "task_from_source",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from bench import api

        return getattr(api, name)
    raise AttributeError(f"module 'bench' has no attribute {name!r}")
