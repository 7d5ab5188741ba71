import torch
import torch.nn as nn


class Model(nn.Module):
    """A chain of pointwise ops with per-channel parameters: five passes over memory in eager."""

    def __init__(self, channels: int, low: float, high: float):
        super().__init__()
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(channels, 1, 1))
        self.shift = nn.Parameter(0.1 * torch.randn(channels, 1, 1))
        self.low = low
        self.high = high

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * self.scale + self.shift
        y = torch.tanh(y)
        y = torch.clamp(y, self.low, self.high)
        return y * x


batch_size = 16
channels = 64
height = 64
width = 64
low = -0.5
high = 0.75

REFINERY_SIZES = {"cuda": {"batch_size": 64, "channels": 64, "height": 256, "width": 256}}


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels, low, high]
