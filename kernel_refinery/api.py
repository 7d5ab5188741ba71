"""kernel-refinery as a library: evaluate candidates, run experiments, read their results.

    from kernel_refinery import evaluate, load_task

    result = evaluate(load_task("1_relu"), open("my_relu.py").read())
    print(result.status, result.speedup)

Everything here is importable from `kernel_refinery` itself. A result is the same EvalResult that
`refinery eval --json` prints; candidate code runs in worker processes, never in the caller's.
Names outside `__all__` are private.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernel_refinery import __all__ as _public_names
from kernel_refinery.agent.config import RunConfig
from kernel_refinery.agent.strategies import StrategyResult
from kernel_refinery.bench.experiment import ExperimentConfig, TrajectoryRecord
from kernel_refinery.bench.report import GroupScores
from kernel_refinery.bench.tasks import SuiteError, Task, builtin_suite_root, load_task_file, resolve_suite
from kernel_refinery.bench.tasks import load_suite as _load_suite_at
from kernel_refinery.bench.tasks import task_from_source as task_from_source  # public, re-exported
from kernel_refinery.core.errors import RunDirError
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.tools.results import EvalResult
from kernel_refinery.traces.schema import TrajectoryId, TurnRecord

try:  # the service's client needs httpx, from the `serve` extra
    from kernel_refinery.bench.serve.client import Client as Client  # public, re-exported
    from kernel_refinery.bench.serve.client import ServiceError as ServiceError  # public, re-exported
except ModuleNotFoundError as missing:
    _CLIENT_MISSING: ModuleNotFoundError | None = missing
else:
    _CLIENT_MISSING = None

if TYPE_CHECKING:
    from langchain_core.language_models.chat_models import BaseChatModel


# The public names, listed once: in the package (kernel_refinery/__init__.py), which re-exports them lazily.
__all__ = list(_public_names)

TaskLike = Task | Path | str
"""A Task, a task file's path, or a built-in task's name (`1_relu`, `level2/9_bias_tanh_clamp_chain`)."""


def load_task(spec: str | Path) -> Task:
    """A task file (a KernelBench program; its level from a `levelN` folder, else 1) or a built-in
    task by name, e.g. `1_relu` or `level1/1_relu`. SuiteError when it is neither."""
    path = Path(spec)
    if path.is_file():
        parent = path.resolve().parent.name
        level = int(parent[5:]) if parent.startswith("level") and parent[5:].isdigit() else 1
        return load_task_file(path, level)
    for task in _load_suite_at(builtin_suite_root()):
        if str(spec) in (task.name, task.key):
            return task
    raise SuiteError(f"{spec} is neither a task file nor a built-in task; built-in tasks are named like 1_relu or level1/1_relu")


def load_suite(suite: str = "builtin", levels: Iterable[int] | None = None, tasks: str | None = None) -> list[Task]:
    """The tasks of a suite, in level order: 'builtin' or a KernelBench checkout's KernelBench/ folder;
    `levels` picks levels, `tasks` filters names (a substring, or a glob with * ? [)."""
    return _load_suite_at(resolve_suite(suite), levels, tasks)


def _task(task: TaskLike) -> Task:
    return task if isinstance(task, Task) else load_task(task)


def _program(task: Task, config: EvalConfig) -> TaskProgram:
    # As `refinery eval` does: the task's sizes for the device.
    return TaskProgram(name=task.name, source=task.source_for(config.device))


def evaluate(task: TaskLike, code: str, settings: EvalConfig | None = None) -> EvalResult:
    """Judge one candidate (a module defining ModelNew) against `task`: static check, compile,
    correctness, timing and profile, with `settings` (default EvalConfig(): CPU, fp32, 100 trials).
    The verdict is `result.status`; `result.speedup` is set when it is correct."""
    from kernel_refinery.tools.evaluator import Evaluator

    config = settings or EvalConfig()
    program = _program(_task(task), config)
    with Evaluator(config) as evaluator:
        return evaluator.evaluate(program, code)


def evaluate_many(pairs: Sequence[tuple[TaskLike, str]], settings: EvalConfig | None = None, workers: int = 2) -> list[EvalResult]:
    """Judge several (task, code) pairs over a pool of `workers` worker processes (tools/processes/pool.py,
    as experiments use); results in the order of `pairs`. A candidate that crashes its worker
    gets its own runtime_error; the others are not affected."""
    from kernel_refinery.tools.processes.pool import EvaluatorPool

    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    config = settings or EvalConfig()
    jobs = [(_program(_task(task), config), code) for task, code in pairs]  # every task read before a worker starts
    if not jobs:
        return []
    with EvaluatorPool(config, workers=workers) as pool, ThreadPoolExecutor(max_workers=workers) as threads:
        return list(threads.map(lambda job: pool.evaluate(*job), jobs))


def refine(
    task: TaskLike,
    model: BaseChatModel | str | None = None,
    settings: RunConfig | None = None,
    run_dir: Path | str | None = None,
    resume: bool = False,
) -> StrategyResult:
    """Run the refinement loop on one task, as `refinery run` does: the settings' strategy, feedback
    variant and turn budget (default RunConfig(): G+E+P, 10 turns, the embedded model, CPU).

    `model` is a LangChain chat model to call, or a model name for `settings.llm.model` ('local',
    'local-0.5b', 'scripted:FILE', or an endpoint's model with `settings.llm.base_url`); None keeps
    the settings' own. The run directory (default a new one under runs/) gets the checkpoints,
    traces, config and manifest; `resume=True` continues a trajectory that is already there.
    Returns every attempt with its verdict, the best one (`.best`) and the tokens spent."""
    from kernel_refinery.agent.chat.models import open_chat_model
    from kernel_refinery.bench.launch import refine_task

    config = settings or RunConfig()
    if isinstance(model, str):
        config = config.model_copy(update={"llm": config.llm.model_copy(update={"model": model})})
    chosen = _task(task)
    directory = Path(run_dir) if run_dir is not None else Path("runs") / f"refine-{chosen.name}-{uuid.uuid4().hex[:6]}"
    if model is not None and not isinstance(model, str):
        return refine_task(config, chosen, directory, model, resume=resume)
    with open_chat_model(config.llm) as chat:
        return refine_task(config, chosen, directory, chat, resume=resume)


class Experiment:
    """An experiment (suites × variants × samples × strategies, see ExperimentConfig) in one run
    directory, as `refinery experiment` runs it, without the progress display. Re-running on the
    same directory resumes it."""

    def __init__(self, config: ExperimentConfig, run_dir: Path | str | None = None):
        self.config = config
        self.run_dir = Path(run_dir) if run_dir is not None else Path("runs") / f"experiment-{uuid.uuid4().hex[:6]}"

    @classmethod
    def from_toml(cls, path: Path | str, run_dir: Path | str | None = None) -> Experiment:
        """The settings of a TOML file, as `refinery experiment --config` reads them; the run directory
        is `run_dir`, else the file's `run_dir`, else a new one under runs/."""
        from kernel_refinery.bench.settings import load_settings

        config, file_run_dir = load_settings(ExperimentConfig, Path(path), {})
        return cls(config, run_dir if run_dir is not None else file_run_dir)

    def run(self) -> list[TrajectoryRecord]:
        """Every trajectory not finished yet; returns all records of the experiment's precision."""
        from kernel_refinery.agent.chat.models import open_chat_model
        from kernel_refinery.bench.experiment import prepare_run_dir, run_experiment
        from kernel_refinery.bench.launch import make_pool
        from kernel_refinery.tools.hardware import describe

        prepare_run_dir(self.run_dir, self.config)
        with open_chat_model(self.config.llm) as chat:
            pool = make_pool(self.config)
            try:
                return run_experiment(self.config, self.run_dir, chat, pool, hardware=describe(self.config.eval.device).block())
            finally:
                pool.close()

    def report(self, plots: bool = False) -> list[GroupScores]:
        """The scores of what has finished (see `report_run`)."""
        return report_run(self.run_dir, plots=plots)


def report_run(run_dir: Path | str, plots: bool = False) -> list[GroupScores]:
    """fast_p, correctness and speedups per level and variant with 95% intervals, as `refinery
    report` computes them; also writes RUN_DIR/report.json (and PNG plots with `plots`).
    (Not `report`: that name is the module kernel_refinery.bench.report.)"""
    from kernel_refinery.bench.report import report as score_run

    return score_run(Path(run_dir), console=None, plots=plots)


def load_traces(run_dir: Path | str) -> dict[TrajectoryId, list[TurnRecord]]:
    """Every trajectory's turns in a run directory (RUN_DIR/traces/*.jsonl), in turn order."""
    from kernel_refinery.traces.store import iter_trajectories, traces_dir

    if not traces_dir(Path(run_dir)).is_dir():
        raise RunDirError(f"{run_dir} has no traces/ folder; give the run directory of `refinery run` or `refinery experiment`")
    return {turns[0].trajectory: turns for _, turns in iter_trajectories(Path(run_dir)) if turns}


def __getattr__(name: str) -> Any:
    if name in ("Client", "ServiceError") and _CLIENT_MISSING is not None:
        raise ImportError(f"kernel_refinery.{name} needs the `serve` extra: pip install 'kernel-refinery[serve]' ({_CLIENT_MISSING})")
    raise AttributeError(f"module 'kernel_refinery.api' has no attribute {name!r}")
