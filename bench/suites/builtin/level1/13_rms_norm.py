import torch
import torch.nn as nn


class Model(nn.Module):
    """RMS normalisation across the channels of an NCHW tensor, with a learned gain."""

    def __init__(self, channels: int, eps: float):
        super().__init__()
        self.gain = nn.Parameter(1.0 + 0.1 * torch.randn(channels, 1, 1))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.sqrt(torch.mean(x * x, dim=1, keepdim=True) + self.eps)
        return x / rms * self.gain


batch_size = 24
channels = 64
height = 64
width = 64
eps = 1e-6

REFINERY_SIZES = {"cuda": {"batch_size": 32, "channels": 64, "height": 512, "width": 512}}


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels, eps]
