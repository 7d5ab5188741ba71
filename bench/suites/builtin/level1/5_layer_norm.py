import torch
import torch.nn as nn


class Model(nn.Module):
    """LayerNorm over the last dimension, with a learned scale and shift."""

    def __init__(self, features: int):
        super().__init__()
        self.norm = nn.LayerNorm(features)
        # Not the identity defaults, so a kernel that skips the affine step is caught.
        with torch.no_grad():
            self.norm.weight.copy_(1.0 + 0.1 * torch.randn(features))
            self.norm.bias.copy_(0.1 * torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


batch_size = 32
seq_len = 256
features = 1024

REFINERY_SIZES = {"cuda": {"batch_size": 64, "seq_len": 4096, "features": 4096}}


def get_inputs():
    return [torch.randn(batch_size, seq_len, features)]


def get_init_inputs():
    return [features]
