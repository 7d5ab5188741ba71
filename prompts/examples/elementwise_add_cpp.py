import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

add_source = r"""
#include <torch/extension.h>

torch::Tensor elementwise_add(torch::Tensor a, torch::Tensor b) {
    auto ac = a.contiguous();
    auto bc = b.contiguous();
    auto out = torch::empty_like(ac);
    const float* x = ac.data_ptr<float>();
    const float* y = bc.data_ptr<float>();
    float* z = out.data_ptr<float>();
    const int64_t n = ac.numel();
    #pragma omp parallel for simd
    for (int64_t i = 0; i < n; ++i) {
        z[i] = x[i] + y[i];
    }
    return out;
}
"""

elementwise_add = load_inline(
    name="elementwise_add",
    cpp_sources=add_source,
    functions=["elementwise_add"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.elementwise_add = elementwise_add

    def forward(self, a, b):
        return self.elementwise_add.elementwise_add(a, b)
