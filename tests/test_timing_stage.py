"""The timing stage in process: a torch.compile baseline that fails says why in the report."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

from tools.config import EvalConfig
from tools.programs import Program
from tools.timing import Timer
from tools.timing_stage import Baseline, time_candidate

TASK = """
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn(256)]

def get_init_inputs():
    return []
"""


def test_a_failed_compiled_baseline_records_why(monkeypatch: pytest.MonkeyPatch) -> None:
    task = types.ModuleType("task")
    exec(TASK, task.__dict__)  # noqa: S102 - the test's own task program
    program = Program(task=task, candidate=task, device=torch.device("cpu"))

    def no_toolchain(model: Any, **_: Any) -> Any:
        raise RuntimeError("no C++ compiler found\n")

    # As on a machine without a toolchain: torch.compile raises.
    monkeypatch.setattr(torch, "compile", no_toolchain)
    cfg = EvalConfig(trials=3, warmup=1, time_compiled_reference=True)
    cfg = cfg.model_copy(update={"guards": cfg.guards.model_copy(update={"speed_of_light": False})})
    reference = program.reference(cfg.seed)
    baselines: dict[tuple[Any, ...], Baseline] = {}
    report = time_candidate(Timer(program.device), program, cfg, reference, program.reference(cfg.seed), baselines, ("relu",))
    assert report.reference_compiled is None and report.speedup_vs_compiled is None
    assert report.compiled_error == "RuntimeError: no C++ compiler found"
    # Not asked for, nothing to explain.
    off = cfg.model_copy(update={"time_compiled_reference": False})
    report = time_candidate(Timer(program.device), program, off, reference, program.reference(cfg.seed), {}, ("relu",))
    assert report.reference_compiled is None and report.compiled_error is None
