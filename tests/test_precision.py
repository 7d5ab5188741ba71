"""Precision runs (fp32, fp16, bf16) and KernelBench HEAD's tolerances, on real C++ candidates."""

from __future__ import annotations

import pytest
import torch
from candidates import candidate

from kernel_refinery.bench.tasks import builtin_suite_root, load_suite
from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.evaluator import Evaluator
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.tools.results import Stage

CHECKED = (Stage.STATIC, Stage.COMPILE, Stage.CORRECTNESS)

# Rounds through bf16 on the way in: about 3 significant digits, what a bf16 or TF32 kernel gives.
BF16_ROUNDED = candidate("return ext.relu_fwd(x.to(torch.bfloat16).to(torch.float32))")

ANY_FLOAT_RELU = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>

template <typename T>
void relu_loop(const T* x, T* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        float v = static_cast<float>(x[i]);
        y[i] = static_cast<T>(v > 0.f ? v : 0.f);
    }
}

torch::Tensor relu_any(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16, xc.scalar_type(), "relu_any", [&] {
        relu_loop<scalar_t>(xc.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), xc.numel());
    });
    return y;
}
"""

ext = load_inline(name="relu_any_dtype", cpp_sources=source, functions=["relu_any"], extra_cflags=["-O2"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.relu_any(x)
'''


def _builtin(name: str) -> TaskProgram:
    task = next(t for t in load_suite(builtin_suite_root(), levels=[1]) if t.name == name)
    return TaskProgram(name=task.name, source=task.source_for("cpu"))


def test_default_fp32_tolerance_is_kernelbench_heads(cpu_config: EvalConfig) -> None:
    assert cpu_config.precision == "fp32" and cpu_config.tolerance is None
    tol = cpu_config.precision_tolerance
    assert (tol.atol, tol.rtol) == (1e-4, 1e-4)
    assert cpu_config.model_copy(update={"precision": "bf16"}).precision_tolerance.rtol == 1e-2
    assert cpu_config.model_copy(update={"precision": "fp16"}).precision_tolerance.rtol == 1e-2
    assert cpu_config.model_copy(update={"tolerance": 1e-2}).precision_tolerance.atol == 1e-2


def test_correct_fp32_kernel_passes_at_1e_4_and_records_the_setting(cpu_config: EvalConfig, relu_task: TaskProgram) -> None:
    with Evaluator(cpu_config) as ev:
        result = ev.run(relu_task, candidate("return ext.relu_fwd(x)"), CHECKED)
    assert result.status is EvalStatus.CORRECT, result.message
    assert result.correctness is not None and (result.correctness.atol, result.correctness.rtol) == (1e-4, 1e-4)
    assert (result.precision, result.tolerance, result.allow_tf32) == ("fp32", 1e-4, False)


def test_bf16_rounding_fails_at_the_default_and_passes_at_the_papers_1e_2(cpu_config: EvalConfig, relu_task: TaskProgram) -> None:
    with Evaluator(cpu_config) as ev:
        strict = ev.run(relu_task, BF16_ROUNDED, CHECKED)
    with Evaluator(cpu_config.model_copy(update={"tolerance": 1e-2})) as ev:
        paper = ev.run(relu_task, BF16_ROUNDED, CHECKED)
    assert strict.status is EvalStatus.INCORRECT
    assert "outside atol=0.0001, rtol=0.0001" in strict.message
    assert "the error is at reduced-precision level" in strict.message
    assert paper.status is EvalStatus.CORRECT, paper.message
    assert paper.tolerance == 1e-2


@pytest.mark.parametrize("precision,dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_half_precision_run_of_a_builtin_task(cpu_config: EvalConfig, precision: str, dtype: torch.dtype) -> None:
    """The inputs and both models are cast: the reference runs in that dtype, and so must the kernel."""
    config = cpu_config.model_copy(update={"precision": precision})
    with Evaluator(config) as ev:
        result = ev.evaluate(_builtin("1_relu"), ANY_FLOAT_RELU)
        fp32_only = ev.run(_builtin("1_relu"), candidate("return ext.relu_fwd(x)"), (Stage.COMPILE, Stage.CORRECTNESS))
    assert result.status is EvalStatus.CORRECT, result.message
    assert result.precision == precision and result.tolerance == 1e-2
    assert result.timing is not None and result.timing.speedup > 0
    # A kernel written for fp32 only meets half-precision tensors and says so.
    assert fp32_only.status is EvalStatus.RUNTIME_ERROR
    found = {torch.float16: "Half", torch.bfloat16: "BFloat16"}[dtype]
    assert f"expected scalar type Float but found {found}" in fp32_only.message, fp32_only.message
