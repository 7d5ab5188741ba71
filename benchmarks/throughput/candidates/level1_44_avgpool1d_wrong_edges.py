"""KernelBench level1/44 Average_Pooling_1D: divides by the in-bounds count, so the outputs at both edges are off."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cstdint>

__global__ void avgpool1d_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t total, int L, int OL, int k, int s, int p) {
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (int64_t)gridDim.x * blockDim.x) {
        const int o = (int)(idx % OL);
        const int64_t row = idx / OL;
        const float* src = x + row * L;
        const int start = o * s - p;
        const int end_padded = min(start + k, L + p);
        const int lo = max(start, 0);
        const int hi = min(start + k, L);
        float acc = 0.0f;
        for (int i = lo; i < hi; ++i) acc += src[i];
        const int divisor = hi > lo ? hi - lo : 1;  // only the positions inside the input
        y[idx] = acc / (float)divisor;
    }
}

torch::Tensor avgpool1d_forward(torch::Tensor x, int64_t k, int64_t s, int64_t p) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 3, "expects an (N, C, L) CUDA tensor");
    auto xc = x.contiguous();
    const int64_t N = xc.size(0), C = xc.size(1), L = xc.size(2);
    const int64_t OL = (L + 2 * p - k) / s + 1;
    auto y = torch::empty({N, C, OL}, xc.options());
    const int64_t total = y.numel();
    if (total == 0) return y;
    const int threads = 256;
    const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, 132 * 64);
    avgpool1d_kernel<<<(unsigned)blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), y.data_ptr<float>(), total, (int)L, (int)OL, (int)k, (int)s, (int)p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_source = "torch::Tensor avgpool1d_forward(torch::Tensor x, int64_t k, int64_t s, int64_t p);"

ext = load_inline(
    name="tp_l1_44_avgpool_edges",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["avgpool1d_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, kernel_size: int, stride: int = 1, padding: int = 0) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.avgpool1d_forward(x, self.kernel_size, self.stride, self.padding)
