"""KernelBench level2/99 Matmul_GELU_Softmax: the host function returns a float pointer where a tensor is declared."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cstdint>

#include <cfloat>

constexpr int SM_THREADS = 256;

__device__ __forceinline__ float gelu_exact(float v) {
    return v * 0.5f * (1.0f + erff(v * 0.70710678118654752f));
}

__device__ __forceinline__ float group_reduce(float v, bool take_max, float* shared) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float other = __shfl_down_sync(0xffffffff, v, offset);
        v = take_max ? fmaxf(v, other) : v + other;
    }
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)(blockDim.x >> 5) ? shared[lane] : (take_max ? -FLT_MAX : 0.0f);
        for (int offset = 16; offset > 0; offset >>= 1) {
            const float other = __shfl_down_sync(0xffffffff, v, offset);
            v = take_max ? fmaxf(v, other) : v + other;
        }
        if (lane == 0) shared[0] = v;
    }
    __syncthreads();
    const float result = shared[0];
    __syncthreads();
    return result;
}

// One group of threads per row: GELU, the row maximum, the sum of exponentials, then the normalized output.
__global__ void gelu_softmax_kernel(const float* __restrict__ g, float* __restrict__ y, int64_t cols) {
    __shared__ float shared[32];
    const float* row = g + (int64_t)blockIdx.x * cols;
    float* out = y + (int64_t)blockIdx.x * cols;
    float m = -FLT_MAX;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, gelu_exact(row[c]));
    const float row_max = group_reduce(m, true, shared);
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += expf(gelu_exact(row[c]) - row_max);
    const float inv = 1.0f / group_reduce(s, false, shared);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[c] = expf(gelu_exact(row[c]) - row_max) * inv;
}

torch::Tensor gelu_softmax_forward(torch::Tensor g) {
    TORCH_CHECK(g.is_cuda() && g.dim() == 2, "expects the (batch, features) GEMM output on the GPU");
    auto gc = g.contiguous();
    auto y = torch::empty_like(gc);
    if (gc.numel() == 0) return y;
    gelu_softmax_kernel<<<(unsigned)gc.size(0), SM_THREADS, 0, at::cuda::getCurrentCUDAStream()>>>(
        gc.data_ptr<float>(), y.data_ptr<float>(), gc.size(1));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y.data_ptr<float>();
}
"""

cpp_source = "torch::Tensor gelu_softmax_forward(torch::Tensor g);"

ext = load_inline(
    name="tp_l2_99_gelusoftmax_ret",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["gelu_softmax_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.gelu_softmax_forward(self.linear(x))
