"""KernelBench level1/88 MinGPTNewGelu: the tanh GELU written as x * sigmoid(2z), one plain kernel."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cstdint>

__device__ __forceinline__ float new_gelu_op(float x) {
    // 0.5 * (1 + tanh(z)) == 1 / (1 + exp(-2z))
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    const float inner = k * (x + 0.044715f * x * x * x);
    return x / (1.0f + expf(-2.0f * inner));
}

__global__ void new_gelu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        y[i] = new_gelu_op(x[i]);
    }
}

torch::Tensor new_gelu_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "expects a float32 CUDA tensor");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t n = xc.numel();
    if (n == 0) return y;
    const int threads = 512;
    const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 132 * 32);
    new_gelu_kernel<<<(unsigned)blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), y.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_source = "torch::Tensor new_gelu_forward(torch::Tensor x);"

ext = load_inline(
    name="tp_l1_88_gelu_sigmoid",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["new_gelu_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.new_gelu_forward(x)
