"""The one-shot examples in prompts/examples/ are themselves correct candidates for their reference.

Every backend in prompts/backends.toml is checked through the real evaluator: the C++ example on
the CPU here (one compile), the CUDA and Triton examples with `-m gpu`.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import torch

from kernel_refinery import prompts
from kernel_refinery.agent.extract import extract_candidate
from kernel_refinery.agent.prompting import model_interface
from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.evaluator import Evaluator
from kernel_refinery.tools.processes.jobs import TaskProgram

BACKENDS = sorted(tomllib.loads((prompts.ROOT / "backends.toml").read_text()))
EXAMPLES = prompts.ROOT / "examples"


EXAMPLE_IDS = [(b, i) for b in BACKENDS for i in range(len(prompts.backend(b).examples))]


def _example(backend: str, index: int) -> tuple[TaskProgram, str]:
    example = prompts.backend(backend).examples[index]
    return TaskProgram(name=f"example_{backend}_{index}", source=example.reference + "\n"), example.solution + "\n"


def test_every_example_file_is_one_a_backend_shows() -> None:
    table = tomllib.loads((prompts.ROOT / "backends.toml").read_text())
    shown = {Path(e[key]).name for entry in table.values() for e in entry["examples"] for key in ("reference", "solution")}
    assert {p.name for p in EXAMPLES.glob("*.py")} == shown


@pytest.mark.parametrize(("backend", "index"), EXAMPLE_IDS)
def test_example_keeps_its_reference_interface_and_extracts(backend: str, index: int) -> None:
    task, solution = _example(backend, index)
    reference, candidate = model_interface(task.source), model_interface(solution, class_name="ModelNew")
    assert reference is not None and candidate is not None
    assert (candidate.init, candidate.forward) == (reference.init, reference.forward)
    # The example, answered as the prompt asks (one python block), is what extraction returns.
    assert extract_candidate(f"```python\n{solution}```\n").code == solution


def test_cpp_examples_are_correct_on_the_cpu(cpu_config: EvalConfig) -> None:
    with Evaluator(cpu_config.model_copy(update={"backend": "cpp"})) as ev:
        for index in range(len(prompts.backend("cpp").examples)):
            task, solution = _example("cpp", index)
            result = ev.evaluate(task, solution)
            assert result.status is EvalStatus.CORRECT, f"example {index}: {result.message}"
            assert result.correctness is not None and result.correctness.passed


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(("backend", "index"), [(b, i) for b, i in EXAMPLE_IDS if b != "cpp"])
def test_gpu_example_is_correct_on_cuda(cache_dir: Path, backend: str, index: int) -> None:
    task, solution = _example(backend, index)
    config = EvalConfig(device="cuda", cache_dir=cache_dir, trials=20, time_compiled_reference=False, backend=backend)
    with Evaluator(config) as ev:
        result = ev.evaluate(task, solution)
    assert result.status is EvalStatus.CORRECT, result.message
