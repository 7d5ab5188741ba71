import torch
import torch.nn as nn


class Model(nn.Module):
    """3x3 convolution, ReLU, then 2x2 max pooling with stride 2."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(torch.relu(self.conv(x)))


batch_size = 16
in_channels = 16
out_channels = 32
height = 64
width = 64

REFINERY_SIZES = {"cuda": {"batch_size": 64, "in_channels": 64, "out_channels": 128, "height": 256, "width": 256}}


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
