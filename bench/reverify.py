"""`refinery reverify RUN_DIR`: judge a run's best kernels again, on this machine, with fresh seeds.

For every trajectory in RUN_DIR/traces (or those the filters pick, or one trace record by its id),
the best kernel's code, as the trace kept it, goes through the EvaluatorPool an experiment uses,
against the task file it was written for. Each re-check sets the recorded verdict and speedup (with
its 95% interval) beside the new ones and flags what did not reproduce: a verdict that changed, a
speedup whose interval no longer overlaps the recorded one, a task whose fast_p membership changed
at one of the report's thresholds. RUN_DIR/reverify.json keeps every re-check as it finishes, so a
killed reverify resumes where it stopped.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from kernel_refinery.agent.config import RunConfig, Variant
from kernel_refinery.bench.experiment import read_precisions, read_saved_config
from kernel_refinery.bench.provenance import collect_manifest, sha256_of
from kernel_refinery.bench.report import P_VALUES
from kernel_refinery.bench.tasks import Task, load_task_file, matches, resolve_suite
from kernel_refinery.core.errors import ConfigError, RunDirError
from kernel_refinery.core.verdict import Verdict
from kernel_refinery.tools.config import EvalConfig, default_cache_dir
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.tools.results import NONFINITE_AS_STRINGS, EvalResult
from kernel_refinery.traces.inspect import Trajectory, load_run, speedup_interval, summarise
from kernel_refinery.traces.manifest import Difference, RunManifest, differences, read_manifest
from kernel_refinery.traces.schema import TrajectoryId, TurnRecord

REVERIFY_SCHEMA_VERSION = 1


def reverify_path(run_dir: Path, timing: str | None = None) -> Path:
    """reverify.json; a re-check with another timing method than the run's keeps its own file."""
    return Path(run_dir) / ("reverify.json" if timing is None else f"reverify-timing-{timing}.json")


def record_id(record: TurnRecord) -> str:
    """A trace record's id: its trajectory's file name, its turn, and its node where a search named one."""
    node = f":{record.node_id}" if record.node_id else ""
    return f"{record.trajectory.slug}:{record.turn}{node}"


class Measured(BaseModel):
    """One verdict on a kernel: what it was judged, its speedup and the speedup's 95% interval."""

    model_config = ConfigDict(frozen=True, extra="forbid", **NONFINITE_AS_STRINGS)
    verdict: Verdict
    speedup: float | None = None
    interval: tuple[float, float] | None = None

    @classmethod
    def of_record(cls, record: TurnRecord) -> Measured:
        return cls(verdict=record.status, speedup=record.speedup, interval=speedup_interval(record))

    @classmethod
    def of_result(cls, result: EvalResult) -> Measured:
        timing = result.timing if result.correct else None
        ci = timing.speedup_ci95 if timing is not None else None
        return cls(verdict=Verdict.of_result(result), speedup=result.speedup, interval=(float(ci[0]), float(ci[1])) if ci else None)

    def fast(self, p: float) -> bool:
        """In fast_p: correct and faster than p times the reference."""
        return self.verdict is Verdict.CORRECT and self.speedup is not None and self.speedup > p


class Recheck(BaseModel):
    """One kernel judged again: the recorded verdict beside the new one, and what did not reproduce."""

    model_config = ConfigDict(frozen=True, extra="forbid", **NONFINITE_AS_STRINGS)
    record_id: str
    trajectory: TrajectoryId
    turn: int
    recorded: Measured
    now: Measured
    headline: str
    """The new result's one-line verdict (why it failed, where it did)."""
    seed: int
    task_changed: bool = False
    """The task file's sha256 differs from the one in the run's manifest: the kernel met another program."""

    @property
    def verdict_changed(self) -> bool:
        return self.recorded.verdict is not self.now.verdict

    @property
    def speedup_moved(self) -> bool:
        """Both intervals known and disjoint: the new timing is not the recorded one's noise."""
        a, b = self.recorded.interval, self.now.interval
        return a is not None and b is not None and (b[0] > a[1] or b[1] < a[0])

    @property
    def fast_p_changed(self) -> tuple[float, ...]:
        """The report's thresholds p at which the kernel's fast_p membership changed."""
        return tuple(p for p in P_VALUES if self.recorded.fast(p) != self.now.fast(p))

    @property
    def flags(self) -> tuple[str, ...]:
        out = []
        if self.verdict_changed:
            out.append(f"verdict changed: {self.recorded.verdict.words} → {self.now.verdict.words}")
        if self.speedup_moved:
            out.append("speedup interval moved")
        if self.fast_p_changed:
            out.append(f"fast_p changed at p = {', '.join(f'{p:g}' for p in self.fast_p_changed)}")
        if self.task_changed:
            out.append("task file changed since the run")
        return tuple(out)


class ReverifyFile(BaseModel):
    """RUN_DIR/reverify.json."""

    model_config = ConfigDict(frozen=True, extra="forbid", **NONFINITE_AS_STRINGS)
    schema_version: int = REVERIFY_SCHEMA_VERSION
    manifest: RunManifest | None = None
    """This machine's, as of the latest reverify on the run."""
    measured_differently: list[Difference] = []
    """What differs from the run's own manifest (machine, software, settings, code)."""
    rechecks: list[Recheck] = []


def read_reverify(run_dir: Path, timing: str | None = None) -> ReverifyFile:
    path = reverify_path(run_dir, timing)
    if not path.is_file():
        return ReverifyFile()
    try:
        return ReverifyFile.model_validate_json(path.read_text(encoding="utf-8"))
    except ValidationError as exc:
        raise RunDirError(
            f"{path} is not a reverify file this version of refinery reads ({exc.errors()[0]['msg']}); "
            "move it away, or start over with --restart"
        ) from exc


@dataclass(frozen=True)
class Target:
    """A kernel to judge again: its trace record and the task it was written for."""

    record: TurnRecord
    task: Task

    @property
    def id(self) -> str:
        return record_id(self.record)


def _task_paths(run_dir: Path, suite: str | None) -> Callable[[str], Path]:
    """Where each task key's file is: in --suite when given; else where the run's manifest says it
    ran (when that file is still there); else in the suite of the run's config.json (builtin without one)."""
    manifest = read_manifest(run_dir)
    recorded = {t.key: Path(t.path) for t in manifest.tasks} if manifest is not None and suite is None else {}
    if suite is None:
        try:
            suite = read_saved_config(Path(run_dir) / "config.json").suite
        except (OSError, ValueError):
            suite = "builtin"  # `refinery run` keeps a RunConfig, which names no suite
    root = resolve_suite(suite)

    def path_of(key: str) -> Path:
        found = recorded.get(key)
        return found if found is not None and found.is_file() else root / f"{key}.py"

    return path_of


def _level_of(key: str) -> int:
    head = key.split("/", 1)[0]
    return int(head[5:]) if head.startswith("level") and head[5:].isdigit() else 1


def choose_targets(
    run_dir: Path,
    task: str | None = None,
    variant: str | None = None,
    precision: str | None = None,
    record: str | None = None,
    suite: str | None = None,
) -> list[Target]:
    """The best kernel of every trajectory the filters keep, or the one record named by `record`.

    A trajectory whose best attempt had no code has nothing to judge and is left out."""
    trajectories = load_run(run_dir)  # TraceLookupError (a user error) without traces
    path_of = _task_paths(run_dir, suite)
    tasks: dict[str, Task] = {}

    def task_of(key: str) -> Task:
        if key not in tasks:
            path = path_of(key)
            if not path.is_file():
                raise RunDirError(f"the task file of {key} is not at {path}; give the suite it came from with --suite")
            tasks[key] = load_task_file(path, level=_level_of(key))
        return tasks[key]

    if record is not None:
        found = [r for t in trajectories for r in t.records if record_id(r) == record]
        if not found:
            some = ", ".join(sorted(record_id(best) for t in trajectories if (best := summarise(t).best))[:3])
            raise ConfigError(f"no trace record {record!r} in {run_dir}; ids are FILE-STEM:TURN, e.g. {some}")
        if found[0].code is None:
            raise ConfigError(f"trace record {record} holds no code (the reply had none): nothing to judge again")
        return [Target(record=found[0], task=task_of(found[0].trajectory.task))]
    try:
        wanted_variant = str(Variant.parse(variant)) if variant is not None else None
    except ValueError as exc:
        raise ConfigError(f"--variant {variant}: {exc}") from exc

    def kept(t: Trajectory) -> bool:
        return (
            (task is None or t.id.task == task or matches(t.id.task, task))
            and (wanted_variant is None or t.id.variant == wanted_variant)
            and (precision is None or t.id.precision == precision)
        )

    chosen = [t for t in trajectories if kept(t)]
    if not chosen:
        filters = {"task": task, "variant": variant, "precision": precision}
        raise ConfigError(
            f"no trajectory of {run_dir} matches {' '.join(f'--{k} {v}' for k, v in filters.items() if v is not None)}; "
            f"tasks: {', '.join(sorted({t.id.task for t in trajectories}))}; "
            f"variants: {', '.join(sorted({t.id.variant for t in trajectories}))}"
        )
    out = []
    for t in chosen:
        best = summarise(t).best
        if best is not None and best.code is not None:
            out.append(Target(record=best, task=task_of(t.id.task)))
    return out


def run_eval_config(run_dir: Path, timing: str | None = None) -> tuple[EvalConfig, int]:
    """The evaluator settings the run measured with (config.json), and the workers its experiment used;
    with `timing`, that timing method instead of the run's (`--timing`: does a verdict flip between methods?)."""
    base, workers = _recorded_eval_config(run_dir)
    if timing is None:
        return base, workers
    try:
        return EvalConfig.model_validate({**base.model_dump(), "timing": timing}), workers
    except ValidationError as exc:
        raise ConfigError(f"--timing must be events, host or graph, not {timing!r}") from exc


def _recorded_eval_config(run_dir: Path) -> tuple[EvalConfig, int]:
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise RunDirError(f"{path} is missing: reverify judges with the run's own settings; is {run_dir} a run directory?")
    try:
        experiment = read_saved_config(path)
        return experiment.eval, experiment.worker_count()
    except ValueError:
        pass
    try:
        return RunConfig.model_validate_json(path.read_text(encoding="utf-8")).eval, 1
    except ValidationError as exc:
        raise RunDirError(
            f"{path} is neither an experiment's nor a run's config this version of refinery reads; "
            "reverify it with the version that made it"
        ) from exc


def eval_config_for(base: EvalConfig, precision: str, run_dir: Path, seed: int) -> EvalConfig:
    """The run's settings at one of its precisions, with a fresh seed, this machine's build cache, and
    every reference timed anew (a stored baseline is the thing under question)."""
    update: dict[str, object] = {"precision": precision, "seed": seed, "cache_dir": default_cache_dir(), "remeasure_baselines": True}
    numerics = read_precisions(run_dir).get(precision)
    if numerics is not None:
        update.update(tolerance=numerics.tolerance, allow_tf32=numerics.allow_tf32)
    return EvalConfig.model_validate({**base.model_dump(), **update})


class ReverifyLog:
    """reverify.json, rewritten whole (through a temporary file) after each re-check: a kill leaves
    the last complete file."""

    def __init__(self, run_dir: Path, start: ReverifyFile, timing: str | None = None):
        self.path = reverify_path(run_dir, timing)
        self.state = start
        self._lock = threading.Lock()

    def add(self, recheck: Recheck) -> None:
        with self._lock:
            kept = [r for r in self.state.rechecks if r.record_id != recheck.record_id]
            self.state = self.state.model_copy(update={"rechecks": [*kept, recheck]})
            temporary = self.path.with_suffix(".json.tmp")
            temporary.write_text(self.state.model_dump_json(indent=2) + "\n", encoding="utf-8")
            os.replace(temporary, self.path)


@dataclass(frozen=True)
class ReverifyPlan:
    """What a reverify will do: the kernels to judge, those already judged, and this machine's facts."""

    todo: list[Target]
    done: list[Recheck]
    manifest: RunManifest
    measured_differently: list[Difference]


def plan_reverify(run_dir: Path, targets: Sequence[Target], again: bool = False, timing: str | None = None) -> ReverifyPlan:
    """Targets already in reverify.json are skipped (a killed reverify resumes) unless `again`."""
    base, _ = run_eval_config(run_dir, timing)
    earlier = read_reverify(run_dir, timing)
    wanted = {t.id for t in targets}
    done = [] if again else [r for r in earlier.rechecks if r.record_id in wanted]
    finished = {r.record_id for r in done}
    manifest = collect_manifest(base, sorted({(t.task.key, t.task.path) for t in targets}))
    recorded = read_manifest(run_dir)
    measured_differently = differences(recorded, manifest) if recorded is not None else []
    return ReverifyPlan(
        todo=[t for t in targets if t.id not in finished], done=done, manifest=manifest, measured_differently=measured_differently
    )


def reverify(
    run_dir: Path,
    plan: ReverifyPlan,
    workers: int | None = None,
    on_done: Callable[[Recheck], None] | None = None,
    timing: str | None = None,
) -> list[Recheck]:
    """Judge each planned kernel again through an EvaluatorPool per precision (one fresh seed for the
    whole reverify); returns every re-check of the plan, those done before included, by task and variant."""
    from kernel_refinery.tools.processes.pool import EvaluatorPool

    base, run_workers = run_eval_config(run_dir, timing)
    facts = {"manifest": plan.manifest, "measured_differently": plan.measured_differently}
    log = ReverifyLog(run_dir, read_reverify(run_dir, timing).model_copy(update=facts), timing)
    recorded = read_manifest(run_dir)
    hashes = {t.key: t.sha256 for t in recorded.tasks} if recorded is not None else {}
    by_precision: dict[str, list[Target]] = defaultdict(list)
    for target in plan.todo:
        by_precision[target.record.trajectory.precision].append(target)
    results: dict[str, Recheck] = {}
    seed = secrets.randbelow(2**31)
    for precision, targets in by_precision.items():
        config = eval_config_for(base, precision, run_dir, seed)
        n = max(1, min(workers or run_workers, len(targets)))
        with EvaluatorPool(config, workers=n) as pool:

            def one(target: Target, pool: EvaluatorPool = pool, config: EvalConfig = config) -> Recheck:
                task = target.task
                assert target.record.code is not None  # choose_targets keeps records with code only
                result = pool.evaluate(TaskProgram(name=task.name, source=task.source_for(config.device)), target.record.code)
                known = hashes.get(task.key)
                recheck = Recheck(
                    record_id=target.id,
                    trajectory=target.record.trajectory,
                    turn=target.record.turn,
                    recorded=Measured.of_record(target.record),
                    now=Measured.of_result(result),
                    headline=result.headline(),
                    seed=config.seed,
                    task_changed=known is not None and known != sha256_of(task.path),
                )
                log.add(recheck)
                if on_done is not None:
                    on_done(recheck)
                return recheck

            with ThreadPoolExecutor(max_workers=n, thread_name_prefix="reverify") as threads:
                for recheck in threads.map(one, targets):
                    results[recheck.record_id] = recheck
    shown = (*plan.done, *(results[t.id] for t in plan.todo if t.id in results))
    return sorted(shown, key=lambda r: (r.trajectory.task, r.trajectory.variant, r.trajectory.sample, r.record_id))


def restart(run_dir: Path, timing: str | None = None) -> None:
    """Forget earlier re-checks (`--restart`)."""
    path = reverify_path(run_dir, timing)
    if path.exists():
        path.unlink()
