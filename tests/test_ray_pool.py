"""`--executor ray`: the same worker code as Ray actors (skipped where Ray is not installed)."""

from __future__ import annotations

import pytest
from candidates import candidate

from tools.config import EvalConfig
from tools.jobs import TaskProgram
from tools.results import EvalStatus, Stage

ray = pytest.importorskip("ray", reason="the optional Ray extra is not installed")


def test_ray_actors_evaluate_like_local_workers(cpu_config: EvalConfig, relu_task: TaskProgram) -> None:
    from bench.ray_pool import RayEvaluatorPool

    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
    pool = RayEvaluatorPool(cpu_config, workers=2)
    try:
        good = pool.run(relu_task, candidate("return ext.relu_fwd(x)"), (Stage.STATIC, Stage.COMPILE, Stage.CORRECTNESS))
        bad = pool.run(relu_task, candidate("return ext.leaky_wrong(x)"), (Stage.STATIC, Stage.COMPILE, Stage.CORRECTNESS))
        crash = pool.run(relu_task, candidate("return ext.crash(x)"), (Stage.STATIC, Stage.COMPILE, Stage.CORRECTNESS))
    finally:
        pool.close()
        ray.shutdown()
    assert good.status is EvalStatus.CORRECT
    assert bad.status is EvalStatus.INCORRECT and bad.correctness is not None
    assert crash.status is EvalStatus.RUNTIME_ERROR and "SIGSEGV" in crash.message
