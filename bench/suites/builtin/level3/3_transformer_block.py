import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """A pre-norm transformer block: causal multi-head self-attention, then a GELU MLP.

    Attention is written out (scores, mask, softmax, weighted sum) rather than calling
    F.scaled_dot_product_attention, so the reference is the plain eager computation.
    """

    def __init__(self, embed_dim: int, num_heads: int, mlp_ratio: int):
        super().__init__()
        assert embed_dim % num_heads == 0, "embed_dim must be a multiple of num_heads"
        self.num_heads = num_heads
        self.norm1 = nn.LayerNorm(embed_dim)
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.norm2 = nn.LayerNorm(embed_dim)
        self.fc1 = nn.Linear(embed_dim, mlp_ratio * embed_dim)
        self.fc2 = nn.Linear(mlp_ratio * embed_dim, embed_dim)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, embed = x.shape
        head_dim = embed // self.num_heads
        q, k, v = self.qkv(x).split(embed, dim=-1)
        q, k, v = (t.view(batch, seq, self.num_heads, head_dim).transpose(1, 2) for t in (q, k, v))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(head_dim)
        future = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        y = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, embed))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


batch_size = 2
seq_len = 256
embed_dim = 256
num_heads = 4
mlp_ratio = 4

REFINERY_SIZES = {"cuda": {"batch_size": 8, "seq_len": 1024, "embed_dim": 1024, "num_heads": 16}}


def get_inputs():
    return [torch.randn(batch_size, seq_len, embed_dim)]


def get_init_inputs():
    return [embed_dim, num_heads, mlp_ratio]
