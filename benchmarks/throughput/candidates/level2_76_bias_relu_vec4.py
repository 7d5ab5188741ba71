"""KernelBench level2/76 Gemm_Add_ReLU: cuBLAS GEMM, then bias add and ReLU in one float4 kernel."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cstdint>

__device__ __forceinline__ float bias_relu_op(float g, float b) {
    return fmaxf(g + b, 0.0f);
}

__global__ void bias_relu_vec4_kernel(const float4* __restrict__ g, const float* __restrict__ bias, float4* __restrict__ y,
                                      int64_t n4, int64_t cols4) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t c = (i % cols4) * 4;
        float4 v = g[i];
        v.x = bias_relu_op(v.x, bias[c]);
        v.y = bias_relu_op(v.y, bias[c + 1]);
        v.z = bias_relu_op(v.z, bias[c + 2]);
        v.w = bias_relu_op(v.w, bias[c + 3]);
        y[i] = v;
    }
}

__global__ void bias_relu_scalar_kernel(const float* __restrict__ g, const float* __restrict__ bias, float* __restrict__ y,
                                        int64_t n, int64_t cols) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        y[i] = bias_relu_op(g[i], bias[i % cols]);
    }
}

torch::Tensor bias_relu_forward(torch::Tensor g, torch::Tensor bias) {
    TORCH_CHECK(g.is_cuda() && g.dim() == 2, "expects the (batch, features) GEMM output on the GPU");
    TORCH_CHECK(bias.numel() == g.size(1), "one bias value per output feature");
    auto gc = g.contiguous();
    auto bc = bias.contiguous();
    auto y = torch::empty_like(gc);
    const int64_t n = gc.numel();
    const int64_t cols = gc.size(1);
    if (n == 0) return y;
    const float* gp = gc.data_ptr<float>();
    const float* bp = bc.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const int threads = 256;
    const bool aligned = (reinterpret_cast<uintptr_t>(gp) % 16 == 0) && (reinterpret_cast<uintptr_t>(yp) % 16 == 0);
    if (aligned && cols % 4 == 0) {
        const int64_t n4 = n / 4;
        const int64_t blocks = std::min<int64_t>((n4 + threads - 1) / threads, 132 * 64);
        bias_relu_vec4_kernel<<<(unsigned)blocks, threads, 0, stream>>>(
            reinterpret_cast<const float4*>(gp), bp, reinterpret_cast<float4*>(yp), n4, cols / 4);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        return y;
    }
    const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 132 * 64);
    bias_relu_scalar_kernel<<<(unsigned)blocks, threads, 0, stream>>>(gp, bp, yp, n, cols);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_source = "torch::Tensor bias_relu_forward(torch::Tensor g, torch::Tensor bias);"

ext = load_inline(
    name="tp_l2_76_biasrelu_vec4",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["bias_relu_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias_shape: tuple) -> None:
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.bias_relu_forward(self.gemm(x), self.bias)
