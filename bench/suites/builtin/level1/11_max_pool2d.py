import torch
import torch.nn as nn


class Model(nn.Module):
    """3x3 max pooling with stride 2 and padding 1, NCHW."""

    def __init__(self, kernel_size: int, stride: int, padding: int):
        super().__init__()
        self.pool = nn.MaxPool2d(kernel_size, stride=stride, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


batch_size = 8
channels = 16
height = 128
width = 128
kernel_size = 3
stride = 2
padding = 1

REFINERY_SIZES = {"cuda": {"batch_size": 64, "channels": 64, "height": 512, "width": 512}}


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [kernel_size, stride, padding]
