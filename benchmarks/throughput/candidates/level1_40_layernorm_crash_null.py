"""KernelBench level1/40 LayerNorm: the scratch buffer is never allocated; the first kernel writes through a null pointer."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cstdint>

constexpr int LN_THREADS = 256;
constexpr int LN_CHUNKS = 256;

__device__ __forceinline__ double warp_sum(double v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffff, v, offset);
    return v;
}

// Sums of a and b over the thread group; the result is valid in thread 0.
__device__ void group_sum2(double& a, double& b) {
    __shared__ double sa[32];
    __shared__ double sb[32];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    a = warp_sum(a);
    b = warp_sum(b);
    if (lane == 0) {
        sa[warp] = a;
        sb[warp] = b;
    }
    __syncthreads();
    if (warp == 0) {
        const int warps = blockDim.x >> 5;
        a = lane < warps ? sa[lane] : 0.0;
        b = lane < warps ? sb[lane] : 0.0;
        a = warp_sum(a);
        b = warp_sum(b);
    }
}

// Per (chunk, row): sum and sum of squares of one chunk of the row, in double.
__global__ void ln_partial_kernel(const float* __restrict__ x, double* __restrict__ partial, int64_t n, int64_t chunk) {
    const int64_t row = blockIdx.y;
    const int64_t begin = (int64_t)blockIdx.x * chunk;
    const int64_t end = begin + chunk < n ? begin + chunk : n;
    const float* src = x + row * n;
    double s = 0.0, ss = 0.0;
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const double v = src[i];
        s += v;
        ss += v * v;
    }
    group_sum2(s, ss);
    if (threadIdx.x == 0) {
        const int64_t slot = row * gridDim.x + blockIdx.x;
        partial[2 * slot] = s;
        partial[2 * slot + 1] = ss;
    }
}

__global__ void ln_finalize_kernel(const double* __restrict__ partial, float* __restrict__ mean, float* __restrict__ rstd,
                                   int chunks, int64_t n, double eps) {
    const int64_t row = blockIdx.x;
    double s = 0.0, ss = 0.0;
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
        s += partial[2 * (row * chunks + c)];
        ss += partial[2 * (row * chunks + c) + 1];
    }
    group_sum2(s, ss);
    if (threadIdx.x == 0) {
        const double m = s / (double)n;
        double var = ss / (double)n - m * m;
        if (var < 0.0) var = 0.0;
        mean[row] = (float)m;
        rstd[row] = (float)(1.0 / sqrt(var + eps));
    }
}

__global__ void ln_apply_kernel(const float* __restrict__ x, const float* __restrict__ gamma, const float* __restrict__ beta,
                                const float* __restrict__ mean, const float* __restrict__ rstd, float* __restrict__ y, int64_t n) {
    const int64_t row = blockIdx.y;
    const float m = mean[row];
    const float r = rstd[row];
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
    auto stats = torch::empty({2, rows}, xc.options());
    // Scratch for the per-chunk sums, one (sum, sum of squares) pair per chunk.
    double* partial = nullptr;
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const int64_t chunk = (n + LN_CHUNKS - 1) / LN_CHUNKS;
    ln_partial_kernel<<<dim3(LN_CHUNKS, (unsigned)rows), LN_THREADS, 0, stream>>>(xc.data_ptr<float>(), partial, n, chunk);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    float* mean = stats.data_ptr<float>();
    float* rstd = mean + rows;
    ln_finalize_kernel<<<(unsigned)rows, LN_THREADS, 0, stream>>>(partial, mean, rstd, LN_CHUNKS, n, eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    const unsigned apply_blocks = (unsigned)std::min<int64_t>((n + LN_THREADS - 1) / LN_THREADS, 1024);
    ln_apply_kernel<<<dim3(apply_blocks, (unsigned)rows), LN_THREADS, 0, stream>>>(
        xc.data_ptr<float>(), g.data_ptr<float>(), b.data_ptr<float>(), mean, rstd, y.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_source = "torch::Tensor layer_norm_forward(torch::Tensor x, torch::Tensor gamma, torch::Tensor beta, double eps);"

ext = load_inline(
    name="tp_l1_40_ln_nullscratch",
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
