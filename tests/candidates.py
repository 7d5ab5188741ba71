"""Real C++ candidates for the CPU tests, built from one shared kernel source (the soak's, benchmarks/soak/kernels.cpp).

Every candidate passes the same source, name and flags to load_inline, so the compile cache
builds the extension once per test session and each candidate only differs in its Python.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from benchmarks.soak import KERNELS_CPP

FIXTURES = Path(__file__).parent / "fixtures"
KERNELS = KERNELS_CPP.read_text()
FUNCTIONS = ["relu_fwd", "scaled_relu", "leaky_wrong", "relu_inplace", "zeros", "touch", "crash", "spin", "hog", "copy_fwd", "relu_slow"]

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


CUDA_KERNELS = (FIXTURES / "cuda_kernels.cu").read_text()
CUDA_FUNCTIONS = ["relu_fwd", "leaky_wrong", "relu_inplace", "zeros", "touch", "crash", "side_stream_relu", "copy_fwd", "relu_slow"]
CUDA_DECLS = "\n".join(
    [line.rstrip(" {") + ";" for line in CUDA_KERNELS.splitlines() if line.startswith("torch::Tensor ") and line.endswith("{")]
    + ["void touch(torch::Tensor x);"]
)

CUDA_HEADER = f'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
{CUDA_KERNELS}"""

cpp_source = r"""
{CUDA_DECLS}
"""

ext = load_inline(
    name="refinery_test_cuda_kernels",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions={CUDA_FUNCTIONS!r},
    extra_cuda_cflags=["-O3"],
)
'''


def candidate(forward: str, init: str = "", prelude: str = "", header: str | None = None) -> str:
    """A candidate module whose ModelNew.forward(x) has the given body."""
    init_body = textwrap.indent(textwrap.dedent(init).strip() or "pass", " " * 8)
    forward_body = textwrap.indent(textwrap.dedent(forward).strip(), " " * 8)
    return (
        (HEADER if header is None else header)
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


def cuda_candidate(forward: str, init: str = "", prelude: str = "") -> str:
    return candidate(forward, init, prelude, header=CUDA_HEADER)


def task_source(name: str) -> str:
    return (FIXTURES / f"{name}.py").read_text()
