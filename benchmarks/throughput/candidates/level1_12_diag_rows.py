"""KernelBench level1/12 Matmul_with_diagonal_matrices_: diag(A) @ B, a 2-D grid with one row of the grid per matrix row."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cstdint>

// One grid row per matrix row: the diagonal entry is read once per thread, columns are coalesced.
__global__ void diag_rows_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
                                 int64_t rows, int64_t cols) {
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        const float s = a[r];
        const float* src = b + r * cols;
        float* dst = c + r * cols;
        for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < cols; j += (int64_t)gridDim.x * blockDim.x) {
            dst[j] = s * src[j];
        }
    }
}

torch::Tensor diag_matmul_forward(torch::Tensor A, torch::Tensor B) {
    TORCH_CHECK(A.is_cuda() && B.is_cuda(), "expects CUDA tensors");
    TORCH_CHECK(A.dim() == 1 && B.dim() == 2 && A.size(0) == B.size(0), "A is (N,), B is (N, M)");
    auto ac = A.contiguous();
    auto bc = B.contiguous();
    auto c = torch::empty_like(bc);
    const int64_t rows = bc.size(0);
    const int64_t cols = bc.size(1);
    if (rows == 0 || cols == 0) return c;
    const int threads = 256;
    dim3 grid((unsigned)std::min<int64_t>((cols + threads - 1) / threads, 64), (unsigned)std::min<int64_t>(rows, 65535));
    diag_rows_kernel<<<grid, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        ac.data_ptr<float>(), bc.data_ptr<float>(), c.data_ptr<float>(), rows, cols);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return c;
}
"""

cpp_source = "torch::Tensor diag_matmul_forward(torch::Tensor A, torch::Tensor B);"

ext = load_inline(
    name="tp_l1_12_diag_rows",
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
