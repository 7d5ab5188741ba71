import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

sigmoid_cuda_source = r"""
// torch/types.h, not torch/extension.h: this file needs no Python bindings, and nvcc builds it in half the time.
#include <torch/types.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>

// What Model.forward computes, written out for one output value before the code:
// out = 1 / (1 + exp(-x)) for each input value x
__global__ void sigmoid_kernel(const float* src_ptr, float* dst_ptr, int64_t count) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) {
        dst_ptr[i] = 1.0f / (1.0f + expf(-src_ptr[i]));
    }
}

torch::Tensor sigmoid_forward(torch::Tensor input) {
    auto src = input.contiguous();
    auto result = torch::empty_like(src);
    const int64_t count = src.numel();
    const int threads = 256;
    const int64_t blocks = (count + threads - 1) / threads;
    sigmoid_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        src.data_ptr<float>(), result.data_ptr<float>(), count);
    return result;
}
"""

sigmoid_cpp_source = "torch::Tensor sigmoid_forward(torch::Tensor input);"

# load_inline returns a module; the C++ function is the attribute named in functions=[...].
sigmoid_module = load_inline(
    name="sigmoid_module",
    cpp_sources=sigmoid_cpp_source,
    cuda_sources=sigmoid_cuda_source,
    functions=["sigmoid_forward"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sigmoid_module.sigmoid_forward(x)
