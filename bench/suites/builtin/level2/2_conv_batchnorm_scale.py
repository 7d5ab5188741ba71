import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """3x3 convolution, batch normalisation with the batch's own statistics, then a scale."""

    def __init__(self, in_channels: int, out_channels: int, scale: float):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.bn_weight = nn.Parameter(1.0 + 0.1 * torch.randn(out_channels))
        self.bn_bias = nn.Parameter(0.1 * torch.randn(out_channels))
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        x = F.batch_norm(x, None, None, self.bn_weight, self.bn_bias, training=True, eps=1e-5)
        return x * self.scale


batch_size = 16
in_channels = 16
out_channels = 32
height = 64
width = 64
scale = 2.0

REFINERY_SIZES = {"cuda": {"batch_size": 64, "in_channels": 64, "out_channels": 128, "height": 256, "width": 256}}


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, scale]
