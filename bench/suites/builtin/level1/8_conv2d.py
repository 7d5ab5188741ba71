import torch
import torch.nn as nn


class Model(nn.Module):
    """A 3x3 convolution with padding 1 and a bias, NCHW."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


batch_size = 8
in_channels = 32
out_channels = 64
height = 64
width = 64
kernel_size = 3

REFINERY_SIZES = {"cuda": {"batch_size": 128, "in_channels": 128, "out_channels": 128, "height": 128, "width": 128}}


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
