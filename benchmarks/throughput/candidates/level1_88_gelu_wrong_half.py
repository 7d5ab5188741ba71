"""KernelBench level1/88 MinGPTNewGelu: float4 kernel that drops the 0.5 factor (outputs twice the GELU)."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cstdint>

__device__ __forceinline__ float new_gelu_op(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    const float inner = k * (x + 0.044715f * x * x * x);
    return x * (1.0f + tanhf(inner));
}

__global__ void new_gelu_vec4_kernel(const float4* __restrict__ x, float4* __restrict__ y, int64_t n4) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (; i < n4; i += step) {
        float4 v = x[i];
        v.x = new_gelu_op(v.x);
        v.y = new_gelu_op(v.y);
        v.z = new_gelu_op(v.z);
        v.w = new_gelu_op(v.w);
        y[i] = v;
    }
}

__global__ void new_gelu_scalar_kernel(const float* __restrict__ x, float* __restrict__ y,
                                        int64_t start, int64_t n) {
    int64_t i = start + (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += step) {
        y[i] = new_gelu_op(x[i]);
    }
}

torch::Tensor new_gelu_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "expects a float32 CUDA tensor");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
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
        new_gelu_vec4_kernel<<<(unsigned)blocks, threads, 0, stream>>>(
            reinterpret_cast<const float4*>(xp), reinterpret_cast<float4*>(yp), n4);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        start = n4 * 4;
    }
    if (start < n) {
        const int64_t rest = n - start;
        const int64_t blocks = std::min<int64_t>((rest + threads - 1) / threads, 132 * 64);
        new_gelu_scalar_kernel<<<(unsigned)blocks, threads, 0, stream>>>(xp, yp, start, n);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    return y;
}
"""

cpp_source = "torch::Tensor new_gelu_forward(torch::Tensor x);"

ext = load_inline(
    name="tp_l1_88_gelu_nohalf",
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
