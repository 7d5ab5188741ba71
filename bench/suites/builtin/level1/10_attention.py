import math

import torch
import torch.nn as nn


class Model(nn.Module):
    """Scaled dot-product attention, softmax(Q K^T / sqrt(d)) V, without a mask.

    Q, K and V have shape (batch, heads, seq_len, head_dim).
    """

    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        return torch.matmul(torch.softmax(scores, dim=-1), v)


batch_size = 2
heads = 8
seq_len = 512
head_dim = 64

REFINERY_SIZES = {"cuda": {"batch_size": 8, "heads": 16, "seq_len": 2048}}


def get_inputs():
    shape = (batch_size, heads, seq_len, head_dim)
    return [torch.randn(shape), torch.randn(shape), torch.randn(shape)]


def get_init_inputs():
    return []
