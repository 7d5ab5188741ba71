"""KernelBench level2/86 Matmul_Divide_GELU: cuBLAS GEMM with bias, then the division and exact (erf) GELU in one float4 kernel."""

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

__global__ void div_gelu_vec4_kernel(const float4* __restrict__ x, float4* __restrict__ y, int64_t n4, float divisor) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (; i < n4; i += step) {
        float4 v = x[i];
        v.x = div_gelu_op(v.x, divisor);
        v.y = div_gelu_op(v.y, divisor);
        v.z = div_gelu_op(v.z, divisor);
        v.w = div_gelu_op(v.w, divisor);
        y[i] = v;
    }
}

__global__ void div_gelu_scalar_kernel(const float* __restrict__ x, float* __restrict__ y,
                                        int64_t start, int64_t n, float divisor) {
    int64_t i = start + (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += step) {
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
    const float* xp = xc.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const int threads = 256;
    int64_t start = 0;
    const bool aligned = (reinterpret_cast<uintptr_t>(xp) % 16 == 0) && (reinterpret_cast<uintptr_t>(yp) % 16 == 0);
    if (aligned && n >= 4) {
        const int64_t n4 = n / 4;
        const int64_t blocks = std::min<int64_t>((n4 + threads - 1) / threads, 132 * 64);
        div_gelu_vec4_kernel<<<(unsigned)blocks, threads, 0, stream>>>(
            reinterpret_cast<const float4*>(xp), reinterpret_cast<float4*>(yp), n4, divisor);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        start = n4 * 4;
    }
    if (start < n) {
        const int64_t rest = n - start;
        const int64_t blocks = std::min<int64_t>((rest + threads - 1) / threads, 132 * 64);
        div_gelu_scalar_kernel<<<(unsigned)blocks, threads, 0, stream>>>(xp, yp, start, n, divisor);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    return y;
}
"""

cpp_source = "torch::Tensor div_gelu_forward(torch::Tensor x, double divisor_value);"

ext = load_inline(
    name="tp_l2_86_divgelu_vec4",
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
