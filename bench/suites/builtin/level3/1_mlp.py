import torch
import torch.nn as nn


class Model(nn.Module):
    """A multilayer perceptron: Linear and ReLU for each hidden layer, then a Linear output."""

    def __init__(self, in_features: int, hidden_sizes: list[int], out_features: int):
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, out_features))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


batch_size = 256
in_features = 1024
hidden_sizes = [1024, 1024]
out_features = 256

REFINERY_SIZES = {
    "cuda": {"batch_size": 2048, "in_features": 4096, "hidden_sizes": [4096, 4096], "out_features": 1024}
}


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, hidden_sizes, out_features]
