import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """A residual block: (conv3x3, batch norm, ReLU) twice, the input added before the last ReLU.

    Batch norm uses the statistics of the batch itself, so the output does not depend
    on train or eval mode.
    """

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1_weight = nn.Parameter(1.0 + 0.1 * torch.randn(channels))
        self.bn1_bias = nn.Parameter(0.1 * torch.randn(channels))
        self.bn2_weight = nn.Parameter(1.0 + 0.1 * torch.randn(channels))
        self.bn2_bias = nn.Parameter(0.1 * torch.randn(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.batch_norm(self.conv1(x), None, None, self.bn1_weight, self.bn1_bias, training=True)
        y = torch.relu(y)
        y = F.batch_norm(self.conv2(y), None, None, self.bn2_weight, self.bn2_bias, training=True)
        return torch.relu(y + x)


batch_size = 24
channels = 32
height = 32
width = 32

REFINERY_SIZES = {"cuda": {"batch_size": 64, "channels": 128, "height": 128, "width": 128}}


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels]
