"""Real C++ candidates for the CPU tests, built from one shared kernel source.

Every candidate passes the same source, name and flags to load_inline, so the compile cache
builds the extension once per test session and each candidate only differs in its Python.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
KERNELS = (FIXTURES / "cpu_kernels.cpp").read_text()
FUNCTIONS = ["relu_fwd", "scaled_relu", "leaky_wrong", "relu_inplace", "zeros", "touch", "crash", "spin", "hog"]

HEADER = f'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
{KERNELS}"""

ext = load_inline(
    name="refinery_test_kernels",
    cpp_sources=cpp_source,
    functions={FUNCTIONS!r},
    extra_cflags=["-O2", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
)
'''


def candidate(forward: str, init: str = "", prelude: str = "") -> str:
    """A candidate module whose ModelNew.forward(x) has the given body."""
    init_body = textwrap.indent(textwrap.dedent(init).strip() or "pass", " " * 8)
    forward_body = textwrap.indent(textwrap.dedent(forward).strip(), " " * 8)
    return (
        HEADER
        + textwrap.dedent(prelude)
        + f"""

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
{init_body}

    def forward(self, x):
{forward_body}
"""
    )


def task_source(name: str) -> str:
    return (FIXTURES / f"{name}.py").read_text()
