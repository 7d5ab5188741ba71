"""KernelBench level1/40 LayerNorm: row sums by double atomics, then the normalization reads them."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cstdint>

constexpr int LN_THREADS = 256;

__device__ __forceinline__ double warp_sum(double v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffff, v, offset);
    return v;
}

// Each group adds the sum and sum of squares of its share of the row into sums[row] with atomics.
__global__ void ln_accumulate_kernel(const float* __restrict__ x, double* __restrict__ sums, int64_t n) {
    const int64_t row = blockIdx.y;
    const float* src = x + row * n;
    double s = 0.0, ss = 0.0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const double v = src[i];
        s += v;
        ss += v * v;
    }
    s = warp_sum(s);
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(&sums[2 * row], s);
        atomicAdd(&sums[2 * row + 1], ss);
    }
}

__global__ void ln_normalize_kernel(const float* __restrict__ x, const float* __restrict__ gamma, const float* __restrict__ beta,
                                    const double* __restrict__ sums, float* __restrict__ y, int64_t n, double eps) {
    const int64_t row = blockIdx.y;
    __shared__ float row_mean;
    __shared__ float row_rstd;
    if (threadIdx.x == 0) {
        const double m = sums[2 * row] / (double)n;
        double var = sums[2 * row + 1] / (double)n - m * m;
        if (var < 0.0) var = 0.0;
        row_mean = (float)m;
        row_rstd = (float)(1.0 / sqrt(var + eps));
    }
    __syncthreads();
    const float m = row_mean;
    const float r = row_rstd;
    const float* src = x + row * n;
    float* dst = y + row * n;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        dst[i] = (src[i] - m) * r * gamma[i] + beta[i];
    }
}

torch::Tensor layer_norm_forward(torch::Tensor x, torch::Tensor gamma, torch::Tensor beta, double eps) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "expects a float32 CUDA tensor");
    auto xc = x.contiguous();
    auto g = gamma.contiguous();
    auto b = beta.contiguous();
    const int64_t n = g.numel();
    TORCH_CHECK(n > 0 && xc.numel() % n == 0, "the trailing dimensions must match normalized_shape");
    const int64_t rows = xc.numel() / n;
    auto y = torch::empty_like(xc);
    if (rows == 0) return y;
    auto sums = torch::zeros({rows, 2}, xc.options().dtype(torch::kFloat64));
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const unsigned blocks = (unsigned)std::min<int64_t>((n + LN_THREADS - 1) / LN_THREADS, 512);
    ln_accumulate_kernel<<<dim3(blocks, (unsigned)rows), LN_THREADS, 0, stream>>>(xc.data_ptr<float>(), sums.data_ptr<double>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    ln_normalize_kernel<<<dim3(blocks, (unsigned)rows), LN_THREADS, 0, stream>>>(
        xc.data_ptr<float>(), g.data_ptr<float>(), b.data_ptr<float>(), sums.data_ptr<double>(), y.data_ptr<float>(), n, eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_source = "torch::Tensor layer_norm_forward(torch::Tensor x, torch::Tensor gamma, torch::Tensor beta, double eps);"

ext = load_inline(
    name="tp_l1_40_ln_atomic",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["layer_norm_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.layer_norm_forward(x, self.ln.weight, self.ln.bias, self.ln.eps)
