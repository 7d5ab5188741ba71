import torch
import torch.nn as nn


class Model(nn.Module):
    """Sums a 3-D tensor over one dimension, keeping it with size 1."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim, keepdim=True)


batch_size = 32
rows = 1024
cols = 1024
reduce_dim = 1

REFINERY_SIZES = {"cuda": {"batch_size": 128, "rows": 4096, "cols": 3072}}


def get_inputs():
    return [torch.rand(batch_size, rows, cols)]


def get_init_inputs():
    return [reduce_dim]
