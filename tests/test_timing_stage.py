"""The judge's timing of the reference, in process: a torch.compile baseline that fails says why."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

from tools.config import EvalConfig
from tools.programs import Program
from tools.timing import Timer
from tools.timing_stage import args_for_calls, measure_baseline

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
    calls = args_for_calls(program, cfg, reference)
    base = measure_baseline(Timer(program.device), program, cfg, reference, calls.make)
    assert base.compiled is None
    assert base.compiled_error == "RuntimeError: no C++ compiler found"
    # Not asked for, nothing to explain.
    off = cfg.model_copy(update={"time_compiled_reference": False})
    base = measure_baseline(Timer(program.device), program, off, reference, calls.make)
    assert base.compiled is None and base.compiled_error is None
