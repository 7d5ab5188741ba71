"""The one-shot examples in prompts/examples/ are themselves correct candidates for their reference.

Every backend in prompts/backends.toml is checked through the real evaluator: the C++ example on
the CPU here (one compile), the CUDA and Triton examples with `-m gpu`.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import torch

import prompts
from agent.extract import extract_candidate
from agent.prompting import model_interface
from tools.config import EvalConfig
from tools.evaluator import Evaluator
from tools.jobs import TaskProgram
from tools.results import EvalStatus

BACKENDS = sorted(tomllib.loads((prompts.ROOT / "backends.toml").read_text()))
EXAMPLES = prompts.ROOT / "examples"


def _example(backend: str) -> tuple[TaskProgram, str]:
    spec = prompts.backend(backend)
    return TaskProgram(name=f"example_{backend}", source=spec.example_reference + "\n"), spec.example_solution + "\n"


def test_every_example_file_is_one_a_backend_shows() -> None:
    table = tomllib.loads((prompts.ROOT / "backends.toml").read_text())
    shown = {Path(entry[key]).name for entry in table.values() for key in ("example_reference", "example_solution")}
    assert {p.name for p in EXAMPLES.glob("*.py")} == shown


@pytest.mark.parametrize("backend", BACKENDS)
def test_example_keeps_its_reference_interface_and_extracts(backend: str) -> None:
    task, solution = _example(backend)
    reference, candidate = model_interface(task.source), model_interface(solution, class_name="ModelNew")
    assert reference is not None and candidate is not None
    assert (candidate.init, candidate.forward) == (reference.init, reference.forward)
    # The example, answered as the prompt asks (one python block), is what extraction returns.
    assert extract_candidate(f"```python\n{solution}```\n").code == solution


def test_cpp_example_is_correct_on_the_cpu(cpu_config: EvalConfig) -> None:
    task, solution = _example("cpp")
    with Evaluator(cpu_config.model_copy(update={"backend": "cpp"})) as ev:
        result = ev.evaluate(task, solution)
    assert result.status is EvalStatus.CORRECT, result.message
    assert result.correctness is not None and result.correctness.passed


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "cpp"])
def test_gpu_example_is_correct_on_cuda(cache_dir: Path, backend: str) -> None:
    task, solution = _example(backend)
    config = EvalConfig(device="cuda", cache_dir=cache_dir, trials=20, time_compiled_reference=False, backend=backend)
    with Evaluator(config) as ev:
        result = ev.evaluate(task, solution)
    assert result.status is EvalStatus.CORRECT, result.message
