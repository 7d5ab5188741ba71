import torch
import torch.nn as nn


class Model(nn.Module):
    """Matrix-vector product y = A x, with A of shape (M, K) and x of shape (K, 1)."""

    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, x)


M = 8192
K = 4096

REFINERY_SIZES = {"cuda": {"M": 98304, "K": 16384}}


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, 1)]


def get_init_inputs():
    return []
