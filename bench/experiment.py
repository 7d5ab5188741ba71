"""Experiments: suites × variants × samples, run in parallel, resumable, one results file.

A run directory holds:
- config.json: the settings, versioned (CONFIG_SCHEMA_VERSION); re-running the same command resumes;
- results.jsonl: one versioned record per finished trajectory (see RESULTS_SCHEMA_VERSION);
- traces/: one JSONL trace per trajectory;
- checkpoints.sqlite: LangGraph checkpoints of unfinished trajectories;
- precisions.json: the tolerance and TF32 policy of each precision the directory holds;
- manifest.json: code, software, device, evaluator settings and task hashes (traces/manifest.py);
- reverify.json, where `refinery reverify` ran: the best kernels judged again (bench/reverify.py).

One run directory can hold the same experiment at several precisions (an fp32 and a bf16 ablation
side by side): the precision is part of each trajectory's identity, and only the precision, with
its tolerance and TF32 policy, may differ between the invocations that share it.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kernel_refinery.agent.config import LoopSettings, ModelSettings, RunConfig, SearchSettings, Variant, check_temperature
from kernel_refinery.agent.context import CandidateEvaluator, RunContext
from kernel_refinery.agent.quiet import QuietHost
from kernel_refinery.agent.state import TaskSpec
from kernel_refinery.agent.strategies import StrategyResult, run_strategy
from kernel_refinery.bench.settings import describe_validation, load_settings, nest_flat_keys
from kernel_refinery.bench.tasks import Task, load_suite, resolve_suite
from kernel_refinery.core.errors import ConfigError, RunDirError
from kernel_refinery.core.numerics import Numerics
from kernel_refinery.core.strategy import Strategy
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.traces.manifest import Difference, differences, flatten, manifest_path, read_manifest, write_manifest
from kernel_refinery.traces.outcome import RESULTS_SCHEMA_VERSION, TrajectoryRecord, trajectory_record
from kernel_refinery.traces.outcome import TurnOutcome as TurnOutcome  # re-exported: results.jsonl's types were defined here
from kernel_refinery.traces.schema import Migrations, TrajectoryId, migrate


class ExperimentConfig(BaseModel):
    """Everything an experiment needs; loadable from TOML and checked in.

    Each trajectory runs with the RunConfig that `run_config` gives: the experiment's llm, loop,
    eval and search settings, with one of its variants and strategies. Older flat keys (`turns`,
    `target_speedup`, `hardware_prompt`, `device`, `backend` at the top level) still load.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    suite: str = Field("builtin", description="'builtin' or the path of a KernelBench checkout's KernelBench/ folder")
    levels: list[int] = [1]
    tasks: str | None = Field(None, description="name filter: substring or glob")
    variants: list[str] = Field(["G", "G+E", "G+E+P"], description="feedback variants: each runs on every task")
    samples: int = Field(1, ge=1, description="independent trajectories per task and variant")
    strategies: list[Strategy] = Field([Strategy.REFINE], description="refine, best-of-n, beam: each runs on every task and variant")
    llm: ModelSettings = ModelSettings()
    loop: LoopSettings = Field(LoopSettings(), description="turns, target speedup and hardware prompt (the variant is each of `variants`)")
    eval: EvalConfig = Field(default_factory=EvalConfig)
    search: SearchSettings = Field(SearchSettings(), description="strategy options and the budget that caps each run")
    workers: int = Field(
        0, ge=0, description="evaluation workers; 0: one per core (at most 16 per GPU, at least one), or one per core on CPU"
    )
    concurrency: int = Field(4, ge=1, description="trajectories (and LLM calls) in flight at once")
    executor: Literal["local", "ray"] = "local"

    @model_validator(mode="before")
    @classmethod
    def _layout(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = nest_flat_keys(data)
        loop = data.get("loop")
        given = loop.model_fields_set if isinstance(loop, LoopSettings) else set(loop or ())
        if "variant" in given:
            raise ValueError('loop.variant: an experiment lists its feedback variants in `variants` (e.g. variants = ["G+E"])')
        return data

    @field_validator("variants")
    @classmethod
    def _valid_variants(cls, value: list[str]) -> list[str]:
        for v in value:
            Variant.parse(v)
        return value

    @field_validator("strategies", mode="before")
    @classmethod
    def _known_strategies(cls, value: Any) -> Any:
        known = [s.value for s in Strategy]
        unknown = [s for s in value if s not in known] if isinstance(value, list) else []
        if unknown or not value:
            raise ValueError(f"unknown strategy {unknown[0] if unknown else '(none)'!r}; strategies are {', '.join(known)}")
        return value

    @model_validator(mode="after")
    def _check(self) -> ExperimentConfig:
        for strategy in self.strategies:
            check_temperature(strategy, self.search, self.llm, self.samples)
        return self

    @classmethod
    def from_toml(cls, path: Path) -> ExperimentConfig:
        return load_settings(cls, path, {})[0]

    def eval_config(self) -> EvalConfig:
        """The evaluator settings (`.eval`); kept for callers written before the nesting (benchmarks/soak, benchmarks)."""
        return self.eval

    def run_config(self, variant: str, strategy: Strategy = Strategy.REFINE) -> RunConfig:
        loop = self.loop.model_copy(update={"variant": Variant.parse(variant)})
        return RunConfig(llm=self.llm, loop=loop, eval=self.eval, strategy=strategy, search=self.search)

    def saved(self) -> dict[str, Any]:
        """The settings as config.json keeps them (without the loop's unused variant)."""
        return {"schema_version": CONFIG_SCHEMA_VERSION, **self.model_dump(mode="json", exclude={"loop": {"variant"}})}

    def worker_count(self) -> int:
        if self.workers:
            return self.workers
        cores = len(os.sched_getaffinity(0))
        if self.eval.device == "cuda":
            from kernel_refinery.tools.processes.pool import gpu_count

            # Compiles take most of a candidate's time and need no GPU: nvcc builds a candidate's .cu on
            # one core (57 s on the H200's host, benchmarks/compile.py), so the pool compiles on every
            # core while each GPU's lock lets one candidate run. With half the cores, 16 level-2
            # candidates kept the GPU busy 32% of the time (results/throughput_h200_level2.json).
            gpus = max(1, gpu_count())
            return max(gpus, min(cores, _WORKERS_PER_GPU * gpus))
        return max(1, cores)


_WORKERS_PER_GPU = 16
"""A cap on the default: each worker holds a CUDA context and a few GB of host memory."""

CONFIG_SCHEMA_VERSION = 1
"""Version history of an experiment's config.json (read_saved_config migrates older ones):
- 0: before the version field: turns, target_speedup, hardware_prompt, device and backend at the
  top level, `eval` null for the defaults.
- 1: `schema_version`; those keys in `loop` and `eval`."""


def _config_v0_to_v1(raw: dict[str, Any]) -> dict[str, Any]:
    return {**nest_flat_keys(raw), "schema_version": 1}


def read_saved_config(path: Path) -> ExperimentConfig:
    """An experiment's config.json, of any known version (ValueError when it is not one)."""
    raw = migrate(path.read_text(), CONFIG_SCHEMA_VERSION, {0: _config_v0_to_v1}, "experiment config")
    raw.pop("schema_version")
    return ExperimentConfig.model_validate(raw)


def record_of(
    task: Task,
    variant: str,
    sample: int,
    result: StrategyResult,
    strategy: Strategy = Strategy.REFINE,
    eval_config: EvalConfig | None = None,
) -> TrajectoryRecord:
    numerics = (eval_config or EvalConfig()).numerics
    trajectory = TrajectoryId(task=task.key, variant=variant, sample=sample, strategy=strategy, precision=numerics.precision)
    return trajectory_record(
        trajectory,
        task.level,
        result.attempts,
        tokens=result.tokens.total,
        evals=result.evals,
        tolerance=numerics.tolerance,
        allow_tf32=numerics.allow_tf32,
    )


def results_path(run_dir: Path) -> Path:
    return Path(run_dir) / "results.jsonl"


def _v0_to_v1(raw: dict[str, Any]) -> dict[str, Any]:
    """Version 0 kept each turn as a [status, speedup] pair."""
    per_turn = [{"status": status, "speedup": speedup} for status, speedup in raw.get("per_turn", [])]
    return {**raw, "per_turn": per_turn, "schema_version": 1}


_MIGRATIONS: Migrations = {0: _v0_to_v1}


def read_result(line: str) -> TrajectoryRecord:
    """One line of results.jsonl, of any known schema version."""
    return TrajectoryRecord.model_validate(migrate(line, RESULTS_SCHEMA_VERSION, _MIGRATIONS, "results"))


def _torn(line: str) -> bool:
    """A line cut short by a kill is not JSON at all; a whole line that does not read is another matter."""
    try:
        json.loads(line)
    except ValueError:
        return True
    return False


def read_results(run_dir: Path) -> list[TrajectoryRecord]:
    """Finished trajectories; a torn last line from a killed run is ignored, duplicates collapse."""
    path = results_path(run_dir)
    if not path.exists():
        return []
    records: dict[TrajectoryId, TrajectoryRecord] = {}
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = read_result(line)
        except ValueError as exc:
            if number == len(lines) and _torn(line):
                continue
            raise RunDirError(
                f"{path}:{number} is not a trajectory record this version of refinery reads "
                f"({exc.errors()[0]['msg'] if hasattr(exc, 'errors') else exc}); was the run made by another version? "
                "Report it with that version, or start a new --run-dir"
            ) from exc
        records[record.id] = record
    return list(records.values())


class ResultsWriter:
    def __init__(self, run_dir: Path):
        self.path = results_path(run_dir)
        self._lock = threading.Lock()

    def append(self, record: TrajectoryRecord) -> None:
        with self._lock, self.path.open("a") as fh:
            fh.write(record.model_dump_json() + "\n")
            fh.flush()
            os.fsync(fh.fileno())


@dataclass(frozen=True)
class PlannedTrajectory:
    """One trajectory an experiment runs: its suite task and its identity."""

    task: Task
    id: TrajectoryId


def plan(config: ExperimentConfig) -> list[PlannedTrajectory]:
    """Every trajectory the experiment runs, at the experiment's precision."""
    tasks = load_suite(resolve_suite(config.suite), levels=config.levels, name_filter=config.tasks)
    if not tasks:
        raise ConfigError(
            f"no task in suite {config.suite!r} levels {config.levels} matches {config.tasks!r}; "
            "check --suite, --levels and --tasks (`refinery experiment --help`)"
        )
    precision = config.eval.precision
    variants = [str(Variant.parse(v)) for v in config.variants]
    return [
        PlannedTrajectory(task=t, id=TrajectoryId(task=t.key, variant=v, sample=s, strategy=strategy, precision=precision))
        for t in tasks
        for v in variants
        for strategy in config.strategies
        for s in range(config.samples)
    ]


_RUNTIME_ONLY = {"workers", "concurrency", "executor", "eval.cache_dir", "llm.timeout_s", "llm.retries"}
"""Settings that say how a run is carried out, not what it measures: a resumed run may change them
(more workers, or a longer wait for a slow model on a busy machine)."""
_PRECISION_FIELDS = {"eval.precision", "eval.tolerance", "eval.allow_tf32"}
"""Evaluator settings that may differ between invocations sharing a run directory: each precision's
trajectories are its own (TrajectoryRecord.id), and precisions.json pins its tolerance and TF32."""


def _comparable(config: ExperimentConfig) -> dict[str, object]:
    """The settings every invocation on one run directory must share, by dotted key."""
    data = flatten(config.saved())
    return {k: v for k, v in data.items() if k not in _RUNTIME_ONLY | _PRECISION_FIELDS | {"schema_version"}}


class HeldPrecision(BaseModel):
    """One entry of precisions.json, as it has always been written: the tolerance (atol = rtol) the
    precision's results are judged at, and the TF32 policy."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    tolerance: float
    allow_tf32: bool


def held_numerics(config: EvalConfig) -> Numerics:
    """The numerics a run directory pins for the config's precision: as results record them (one tolerance)."""
    numerics = config.numerics
    return Numerics.recorded(numerics.precision, numerics.tolerance, numerics.allow_tf32)


def precisions_path(run_dir: Path) -> Path:
    return Path(run_dir) / "precisions.json"


def read_precisions(run_dir: Path) -> dict[str, Numerics]:
    """Each precision the run directory holds, with its tolerance and TF32 policy ({} before any)."""
    path = precisions_path(run_dir)
    if path.exists():
        try:
            held = {p: HeldPrecision.model_validate(v) for p, v in json.loads(path.read_text()).items()}
            return {p: Numerics.recorded(p, h.tolerance, h.allow_tf32) for p, h in held.items()}
        except (ValueError, AttributeError) as exc:
            raise RunDirError(f"{path} is not a precision table this version of refinery reads ({exc}); choose another --run-dir") from exc
    saved = Path(run_dir) / "config.json"
    if saved.exists():
        # A run directory from before precisions.json: its one precision is the saved config's.
        try:
            eval_config = read_saved_config(saved).eval
        except ValueError:
            return {}
        return {eval_config.precision: held_numerics(eval_config)}
    return {}


def prepare_run_dir(run_dir: Path, config: ExperimentConfig) -> list[Difference]:
    """Keep the config and this machine's manifest with the run; other settings on an existing run are refused.

    Workers, concurrency and executor may change between a run and its resumption, and so may the
    precision (another precision is another set of trajectories in the same directory); a precision
    the directory already holds keeps its tolerance and TF32 policy. Returns what differs from the
    manifest of the invocation before (another machine, torch, commit): the caller warns.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    saved = run_dir / "config.json"
    precisions = read_precisions(run_dir)
    if saved.exists():
        try:
            before = _comparable(read_saved_config(saved))
        except ValueError as exc:
            raise RunDirError(
                f"{saved} is not an experiment config this version of refinery reads (written by another version, "
                f"or by `refinery run`: {describe_validation(exc) if isinstance(exc, ValidationError) else exc}); choose another --run-dir"
            ) from exc
        now = _comparable(config)
        if before != now:
            changed = sorted(k for k in now.keys() | before.keys() if before.get(k) != now.get(k))
            raise RunDirError(
                f"{run_dir} holds a run with other settings ({saved}; differing: {', '.join(changed) or 'fields'}); "
                "resume it with the same settings or choose another --run-dir"
            )
    eval_config = config.eval
    numerics = held_numerics(eval_config)
    held = precisions.get(eval_config.precision)
    if held is not None and held != numerics:
        raise RunDirError(
            f"{run_dir} holds trajectories judged at {held.describe()}; this run asks for "
            f"{numerics.describe()}: resume with the same eval.tolerance and eval.allow_tf32, or choose another --run-dir"
        )
    precisions[eval_config.precision] = numerics
    entries = {p: HeldPrecision(tolerance=n.tolerance, allow_tf32=n.allow_tf32) for p, n in precisions.items() if n.tolerance is not None}
    precisions_path(run_dir).write_text(json.dumps({p: h.model_dump() for p, h in entries.items()}, indent=2) + "\n")
    saved.write_text(json.dumps(config.saved(), indent=2) + "\n")
    return _record_manifest(run_dir, config)


def _record_manifest(run_dir: Path, config: ExperimentConfig) -> list[Difference]:
    """manifest.json: the facts of this invocation; an earlier invocation's, where they differ, is
    kept as manifest-before-<its time>.json so a resumed run's mixed provenance stays visible."""
    from kernel_refinery.bench.provenance import collect_manifest

    tasks = load_suite(resolve_suite(config.suite), levels=config.levels, name_filter=config.tasks)
    manifest = collect_manifest(config.eval, [(t.key, t.path) for t in tasks])
    before = read_manifest(run_dir)
    changed = differences(before, manifest) if before is not None else []
    if before is not None and changed:
        stamp = before.created_at.replace(":", "").replace("+0000", "Z")
        manifest_path(run_dir).replace(Path(run_dir) / f"manifest-before-{stamp}.json")
    write_manifest(run_dir, manifest)
    return changed


def run_experiment(
    config: ExperimentConfig,
    run_dir: Path,
    model: BaseChatModel,
    evaluator: CandidateEvaluator,
    on_done: Callable[[TrajectoryRecord], None] | None = None,
    hardware: str | None = None,
) -> list[TrajectoryRecord]:
    """Run every planned trajectory not already in results.jsonl; returns all records of the
    experiment's precision (others the run directory holds are left as they are).

    One context (agent/context.py) serves every trajectory: the chat `model`, called from parallel
    threads, and the `evaluator`, a pool whose `run` is thread-safe; a trajectory swaps in its config. Where the embedded model shares the
    CPU with the evaluator, every trajectory's LLM calls and evaluations take turns (agent/quiet.py).
    """
    eval_config = config.eval
    host = QuietHost.for_settings(config.llm, eval_config)
    precision = eval_config.precision
    finished = {r.id: r for r in read_results(run_dir) if r.precision == precision}
    todo = [planned for planned in plan(config) if planned.id not in finished]
    writer = ResultsWriter(run_dir)
    run_id = Path(run_dir).name or uuid.uuid4().hex[:8]
    # One context for every trajectory; each swaps in its own config (variant, strategy), so the
    # one given here, the first planned combination's, is never run as such.
    base = RunContext(
        config=config.run_config(config.variants[0], config.strategies[0]),
        model=model,
        evaluator=evaluator,
        run_dir=run_dir,
        run_id=run_id,
        hardware=hardware,
        resume=True,
        host=host,
    )

    def one(planned: PlannedTrajectory) -> TrajectoryRecord:
        task, trajectory = planned.task, planned.id
        spec = TaskSpec(name=task.name, source=task.source_for(eval_config.device), level=task.level)
        run = base.with_config(config.run_config(trajectory.variant, trajectory.strategy))
        result = run_strategy(run, spec, trajectory)
        record = record_of(task, trajectory.variant, trajectory.sample, result, trajectory.strategy, eval_config)
        writer.append(record)
        return record

    records = list(finished.values())
    with ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="trajectory") as pool:
        futures = [pool.submit(one, item) for item in todo]
        try:
            for future in as_completed(futures):
                record = future.result()
                records.append(record)
                if on_done is not None:
                    on_done(record)
        except BaseException:
            # One trajectory failed (an unreachable endpoint, a bug): start no more; those in flight
            # end by themselves and resume from their checkpoints on the next run.
            for future in futures:
                future.cancel()
            raise
    return records


def is_correct(record: TrajectoryRecord) -> bool:
    return record.correct
