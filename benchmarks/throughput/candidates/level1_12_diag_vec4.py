"""KernelBench level1/12 Matmul_with_diagonal_matrices_: diag(A) @ B as a row scaling, float4 loads and stores."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cstdint>

__global__ void diag_scale_vec4_kernel(const float* __restrict__ a, const float4* __restrict__ b, float4* __restrict__ c,
                                       int64_t total4, int64_t cols4) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total4; i += (int64_t)gridDim.x * blockDim.x) {
        const float s = a[i / cols4];
        float4 v = b[i];
        v.x *= s;
        v.y *= s;
        v.z *= s;
        v.w *= s;
        c[i] = v;
    }
}

__global__ void diag_scale_scalar_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
                                         int64_t total, int64_t cols) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        c[i] = a[i / cols] * b[i];
    }
}

torch::Tensor diag_matmul_forward(torch::Tensor A, torch::Tensor B) {
    TORCH_CHECK(A.is_cuda() && B.is_cuda(), "expects CUDA tensors");
    TORCH_CHECK(A.dim() == 1 && B.dim() == 2 && A.size(0) == B.size(0), "A is (N,), B is (N, M)");
    auto ac = A.contiguous();
    auto bc = B.contiguous();
    auto c = torch::empty_like(bc);
    const int64_t total = bc.numel();
    const int64_t cols = bc.size(1);
    if (total == 0) return c;
    const float* ap = ac.data_ptr<float>();
    const float* bp = bc.data_ptr<float>();
    float* cp = c.data_ptr<float>();
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const int threads = 256;
    const bool aligned = (reinterpret_cast<uintptr_t>(bp) % 16 == 0) && (reinterpret_cast<uintptr_t>(cp) % 16 == 0);
    if (aligned && cols % 4 == 0) {
        const int64_t total4 = total / 4;
        const int64_t blocks = std::min<int64_t>((total4 + threads - 1) / threads, 132 * 64);
        diag_scale_vec4_kernel<<<(unsigned)blocks, threads, 0, stream>>>(
            ap, reinterpret_cast<const float4*>(bp), reinterpret_cast<float4*>(cp), total4, cols / 4);
    } else {
        const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, 132 * 64);
        diag_scale_scalar_kernel<<<(unsigned)blocks, threads, 0, stream>>>(ap, bp, cp, total, cols);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return c;
}
"""

cpp_source = "torch::Tensor diag_matmul_forward(torch::Tensor A, torch::Tensor B);"

ext = load_inline(
    name="tp_l1_12_diag_vec4",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["diag_matmul_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return ext.diag_matmul_forward(A, B)
