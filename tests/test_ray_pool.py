"""`--executor ray`: the same worker code as Ray actors (skipped where Ray is not installed).

The tests share one local Ray with this machine's CPUs, as CI starts it; it is shut down when the
module ends, whether its tests passed or not.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from candidates import candidate
from langchain_core.messages import AIMessage

from kernel_refinery.agent.chat.scripted import ScriptedChatModel
from kernel_refinery.agent.config import LoopSettings, ModelSettings
from kernel_refinery.bench.experiment import ExperimentConfig, TrajectoryRecord, run_experiment
from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.tools.processes.pool import EvaluatorPool
from kernel_refinery.tools.results import Stage
from kernel_refinery.traces.store import iter_trajectories

ray = pytest.importorskip("ray", reason="the optional Ray extra is not installed")

# A Ray call that never returns must not hang CI. The thread method ends the test run with every
# thread's stack: a timeout raised by signal in the main thread could not unwind an experiment
# whose trajectory threads wait in ray.get (the executor joins them first). The limits allow for
# building the kernels on a busy 2-core machine; a full test run finds them built.
pytestmark = pytest.mark.timeout(600, method="thread")

SOLUTIONS = Path(__file__).parent / "fixtures" / "cpu_solutions"
WORKERS = min(2, os.cpu_count() or 1)


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    try:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        yield
    finally:
        ray.shutdown()


@pytest.mark.usefixtures("local_ray")
def test_ray_actors_evaluate_like_local_workers(cpu_config: EvalConfig, relu_task: TaskProgram) -> None:
    from kernel_refinery.bench.ray_pool import RayEvaluatorPool

    pool = RayEvaluatorPool(cpu_config, workers=WORKERS)
    try:
        good = pool.run(relu_task, candidate("return ext.relu_fwd(x)"), (Stage.STATIC, Stage.COMPILE, Stage.CORRECTNESS))
        bad = pool.run(relu_task, candidate("return ext.leaky_wrong(x)"), (Stage.STATIC, Stage.COMPILE, Stage.CORRECTNESS))
        crash = pool.run(relu_task, candidate("return ext.crash(x)"), (Stage.STATIC, Stage.COMPILE, Stage.CORRECTNESS))
    finally:
        pool.close()
    assert good.status is EvalStatus.CORRECT
    assert bad.status is EvalStatus.INCORRECT and bad.correctness is not None
    assert crash.status is EvalStatus.RUNTIME_ERROR and "SIGSEGV" in crash.message


@pytest.mark.usefixtures("local_ray")
def test_actors_ray_cannot_place_are_dropped_not_waited_on(cpu_config: EvalConfig, relu_task: TaskProgram) -> None:
    """One actor more than the cluster has CPUs: a call handed to it would wait forever."""
    from kernel_refinery.bench.ray_pool import RayEvaluatorPool

    cpus = int(ray.cluster_resources()["CPU"])
    pool = RayEvaluatorPool(cpu_config, workers=cpus + 1, placement_timeout_s=30)
    try:
        assert len(pool.actors) == cpus
        for _ in range(cpus + 1):  # every actor in turn, and round again
            assert pool.run(relu_task, candidate("return ext.relu_fwd(x)"), (Stage.STATIC, Stage.COMPILE)).status is None
    finally:
        pool.close()


def fence(code: str) -> str:
    return f"My kernel:\n```python\n{code}```\n"


def script() -> dict[str, list[str]]:
    """One reply per turn: real C++ kernels that are correct, wrong, or do not compile (the sources
    tests/test_experiment.py builds, so a full test run compiles each once)."""
    correct_relu = (SOLUTIONS / "1_relu_slow.py").read_text()
    broken = correct_relu.replace("auto y = torch::empty_like(xc);", "auto y = torch::empty_like(xc)", 1)
    wrong_gelu = (SOLUTIONS / "2_gelu_wrong.py").read_text()  # a GELU off by a constant: wrong for ReLU too
    chain = (SOLUTIONS / "9_bias_tanh_clamp_chain.py").read_text()
    return {
        "level1/1_relu": [fence(broken), fence(wrong_gelu), fence(correct_relu)],
        "level1/2_gelu": [fence(wrong_gelu), fence(broken), fence(wrong_gelu)],
        "level2/9_bias_tanh_clamp_chain": [fence(chain), fence(broken), fence(chain)],
    }


EXPECTED = {
    "level1/1_relu": ["compile_error", "incorrect", "correct"],
    "level1/2_gelu": ["incorrect", "compile_error", "incorrect"],
    "level2/9_bias_tanh_clamp_chain": ["correct", "compile_error", "correct"],
}


def scripted_experiment(cache_dir: Path) -> ExperimentConfig:
    return ExperimentConfig(
        suite="builtin",
        levels=[1, 2],
        tasks="[129]_[rgb]*",  # 1_relu, 2_gelu, 9_bias_tanh_clamp_chain
        variants=["G+E"],
        # A target no kernel reaches: every trajectory runs every turn, however the timings fall.
        loop=LoopSettings(turns=3, target_speedup=1e9, hardware_prompt=False),
        workers=WORKERS,
        concurrency=3,
        llm=ModelSettings(model="scripted:inline"),
        eval=EvalConfig(trials=5, warmup=1, correctness_trials=3, time_compiled_reference=False, cache_dir=cache_dir, cpu_threads=1),
    )


def verdicts(records: list[TrajectoryRecord]) -> dict[str, list[str]]:
    return {f"{r.task} {r.variant} sample {r.sample}": [t.status.value for t in r.per_turn] for r in records}


def differences(local: dict[str, list[str]], remote: dict[str, list[str]]) -> list[str]:
    lines = []
    for trajectory in sorted(local.keys() | remote.keys()):
        if trajectory not in local or trajectory not in remote:
            lines.append(f"{trajectory}: only in the {'local' if trajectory in local else 'Ray'} run")
            continue
        turns = itertools.zip_longest(local[trajectory], remote[trajectory], fillvalue="(no turn)")
        lines += [f"{trajectory} turn {n}: local {a}, Ray {b}" for n, (a, b) in enumerate(turns, 1) if a != b]
    return lines


def failures(run_dir: Path) -> str:
    """The messages of a run's turns that ended in a runtime error or a timeout: why a verdict differed."""
    lines = []
    for path, turns in iter_trajectories(run_dir):
        for turn in turns:
            if turn.result is not None and turn.result.status in (EvalStatus.RUNTIME_ERROR, EvalStatus.TIMEOUT):
                lines.append(f"{run_dir.name} {path.stem} turn {turn.turn}: {turn.result.message[:600]}")
    return "\n".join(lines)


@pytest.mark.usefixtures("local_ray")
@pytest.mark.timeout(1500, method="thread")
def test_scripted_experiment_gets_the_same_verdicts_through_ray(tmp_path: Path, cache_dir: Path) -> None:
    from kernel_refinery.bench.ray_pool import RayEvaluatorPool

    config = scripted_experiment(cache_dir)
    model = ScriptedChatModel(responses=[AIMessage(content="(no reply)")], by_task=script())
    # Ray first, so the kernels compile inside its actors; the local run then finds them built.
    ray_pool = RayEvaluatorPool(config.eval, workers=config.workers)
    try:
        through_ray = run_experiment(config, tmp_path / "ray", model, ray_pool)
    finally:
        ray_pool.close()
    with EvaluatorPool(config.eval, workers=config.workers) as local_pool:
        local = run_experiment(config, tmp_path / "local", model, local_pool)

    mismatches = differences(verdicts(local), verdicts(through_ray))
    assert not mismatches, "verdicts differ:\n" + "\n".join(mismatches) + "\n" + failures(tmp_path / "ray") + failures(tmp_path / "local")
    best = {r.task: r.best_status.value for r in local}
    assert best == {r.task: r.best_status.value for r in through_ray}
    assert {r.task: [t.status.value for t in r.per_turn] for r in local} == EXPECTED
