"""Loading a task and a candidate into the worker, and building seeded models and inputs."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from kernel_refinery.tools.processes.jobs import source_hash
from kernel_refinery.tools.steps.task_constants import Overrides, with_constants


def import_source(source: str, kind: str, workdir: Path) -> ModuleType:
    """Import a program from a real file: tracebacks show its lines, and Triton can read it."""
    digest = source_hash(source)
    name = f"refinery_{kind}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    path = workdir / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(to_device(v, device) for v in value)
    return value


DISTRIBUTION_SCALES = {"normal": 1.0, "normal_x4": 4.0}


def redraw(value: Any, distribution: str) -> Any:
    """Floating-point tensors drawn again from a signed standard normal times the distribution's scale."""
    if isinstance(value, (list, tuple)):
        return type(value)(redraw(v, distribution) for v in value)
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        return value
    scale = DISTRIBUTION_SCALES[distribution]
    drawn = torch.randn(value.shape, dtype=torch.float32, device=value.device).mul_(scale)
    return drawn.to(value.dtype)


def cast_floats(value: Any, dtype: torch.dtype) -> Any:
    """Floating-point tensors (nested in lists and tuples too) cast to dtype; the rest as they are."""
    if isinstance(value, (list, tuple)):
        return type(value)(cast_floats(v, dtype) for v in value)
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(dtype)
    return value


def clone_args(args: list[Any]) -> list[Any]:
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def tensors_of(value: Any) -> list[torch.Tensor]:
    """The tensors in a model's output, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_of(v)]
    if isinstance(value, dict):
        return [t for k in sorted(value) for t in tensors_of(value[k])]
    return []


@dataclass
class Program:
    """A loaded task and candidate: seeded construction of both models and of inputs."""

    task: ModuleType
    candidate: ModuleType | None
    """None in the judge, which never loads candidate code: `build` makes its models elsewhere."""
    device: torch.device
    dtype: torch.dtype = torch.float32
    """Floating-point inputs, parameters and buffers are cast to this (the run's precision)."""
    build: Callable[[int, Overrides], Any] | None = None
    """The judge's way to a ModelNew: construct one in the candidate's process from a seed (and the
    task's constants a variant sets)."""
    input_salt: int = 0
    """Added to every input seed; drawn from the OS per job by the judge and never sent to the
    candidate's process, which can therefore not work out the inputs from a model's seed."""
    task_source: str = ""
    """The task's program text, from which `variant` makes the task with other constants."""
    overrides: Overrides = ()
    """The task's constants this program's task module sets otherwise than the file (a shape or
    init variant, tools/steps/shape_variants.py); empty for the task as written."""

    def variant(self, overrides: Overrides) -> Program:
        """The same program on the task with these constants set otherwise (tools/steps/task_constants.py)."""
        source = with_constants(self.task_source, overrides)
        task = import_source(source, "task", Path(str(self.task.__file__)).parent) if overrides else self.task
        return dataclasses.replace(self, task=task, overrides=overrides)

    def init_inputs(self, seed: int) -> list[Any]:
        torch.manual_seed(seed)
        with self.device:
            return to_device(list(self.task.get_init_inputs()), self.device)

    def inputs(self, seed: int, distribution: str = "task") -> list[Any]:
        """`get_inputs()` from the seed; for another distribution its floating-point tensors are
        redrawn (same shapes, dtypes and devices), integer and bool tensors kept as they are."""
        # Generated on the device itself, from the seed: no host-to-device copy of large inputs.
        torch.manual_seed((seed + self.input_salt) % (1 << 63))
        with self.device:
            args = to_device(list(self.task.get_inputs()), self.device)
            if distribution != "task":
                args = [redraw(a, distribution) for a in args]
        return [cast_floats(a, self.dtype) for a in args] if self.dtype != torch.float32 else args

    def _placed(self, model: nn.Module) -> nn.Module:
        model = model.to(self.device)
        if self.dtype != torch.float32:
            model = model.to(self.dtype)  # floating parameters and buffers only, as Module.to does
        return model.eval()

    def reference(self, seed: int) -> nn.Module:
        init = self.init_inputs(seed)
        torch.manual_seed(seed)
        with self.device:
            model = self.task.Model(*init)
        return self._placed(model)

    def new_model(self, seed: int, reference: nn.Module | None = None) -> Any:
        if self.build is not None:
            return self.build(seed, self.overrides)
        assert self.candidate is not None
        init = self.init_inputs(seed)
        torch.manual_seed(seed)
        with self.device:
            model = self.candidate.ModelNew(*init)
        model = self._placed(model)
        if reference is not None:
            share_weights(reference, model)
        return model


def share_weights(reference: nn.Module, candidate: nn.Module) -> None:
    """Give the candidate the reference's weights when both hold the same named tensors.

    Same seed and same construction order already give the same weights; this covers a
    candidate that builds its parameters in another order but under the same names.
    """
    ref_state = reference.state_dict()
    new_state = candidate.state_dict()
    if set(ref_state) != set(new_state):
        return
    if any(ref_state[k].shape != new_state[k].shape or ref_state[k].dtype != new_state[k].dtype for k in ref_state):
        return
    candidate.load_state_dict(ref_state)
