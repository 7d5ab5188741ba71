import torch
import torch.nn as nn


class Model(nn.Module):
    """A GRU cell applied over a sequence, one Python step per time step.

    Returns the hidden state after the last step. Gate order in the stacked weights:
    reset, update, candidate.
    """

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.input_gates = nn.Linear(input_size, 3 * hidden_size)
        self.hidden_gates = nn.Linear(hidden_size, 3 * hidden_size)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        # x: (seq_len, batch, input_size); h: (batch, hidden_size)
        for step in range(x.size(0)):
            xr, xz, xn = self.input_gates(x[step]).chunk(3, dim=1)
            hr, hz, hn = self.hidden_gates(h).chunk(3, dim=1)
            reset = torch.sigmoid(xr + hr)
            update = torch.sigmoid(xz + hz)
            candidate = torch.tanh(xn + reset * hn)
            h = (1 - update) * candidate + update * h
        return h


seq_len = 16
batch_size = 32
input_size = 256
hidden_size = 512

REFINERY_SIZES = {"cuda": {"batch_size": 1024, "input_size": 512, "hidden_size": 1024}}


def get_inputs():
    return [torch.randn(seq_len, batch_size, input_size), torch.randn(batch_size, hidden_size)]


def get_init_inputs():
    return [input_size, hidden_size]
