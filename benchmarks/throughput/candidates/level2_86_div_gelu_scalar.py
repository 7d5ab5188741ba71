"""KernelBench level2/86 Matmul_Divide_GELU: cuBLAS GEMM with bias, then the division and exact GELU in one plain kernel."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cstdint>

__device__ __forceinline__ float div_gelu_op(float g, float divisor) {
    const float v = g / divisor;
    return v * 0.5f * (1.0f + erff(v * 0.70710678118654752f));
}

__global__ void div_gelu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n, float divisor) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        y[i] = div_gelu_op(x[i], divisor);
    }
}

torch::Tensor div_gelu_forward(torch::Tensor x, double divisor_value) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "expects a float32 CUDA tensor");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float divisor = static_cast<float>(divisor_value);
    const int64_t n = xc.numel();
    if (n == 0) return y;
    const int threads = 512;
    const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 132 * 32);
    div_gelu_kernel<<<(unsigned)blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), y.data_ptr<float>(), n, divisor);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_source = "torch::Tensor div_gelu_forward(torch::Tensor x, double divisor_value);"

ext = load_inline(
    name="tp_l2_86_divgelu_scalar",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["div_gelu_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, input_size: int, output_size: int, divisor: float) -> None:
        super().__init__()
        self.linear = nn.Linear(input_size, output_size)
        self.divisor = divisor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.div_gelu_forward(self.linear(x), self.divisor)
