import torch
import torch.nn as nn


class Model(nn.Module):
    """LayerNorm of (x + residual) over the last dimension."""

    def __init__(self, features: int):
        super().__init__()
        self.norm = nn.LayerNorm(features)
        with torch.no_grad():
            self.norm.weight.copy_(1.0 + 0.1 * torch.randn(features))
            self.norm.bias.copy_(0.1 * torch.randn(features))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.norm(x + residual)


batch_size = 24
seq_len = 256
features = 1024

REFINERY_SIZES = {"cuda": {"batch_size": 32, "seq_len": 4096, "features": 4096}}


def get_inputs():
    shape = (batch_size, seq_len, features)
    return [torch.randn(shape), torch.randn(shape)]


def get_init_inputs():
    return [features]
