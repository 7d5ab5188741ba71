"""What the aten dispatcher shows of a forward: which compute operators it reached.

Shared by the judge (the reference's operators) and the runner (the candidate's): a candidate that
runs every compute operator of the reference is only wrapping PyTorch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# aten ops that move, view or allocate data; everything else counts as compute.
NON_COMPUTE = {
    "empty",
    "empty_like",
    "empty_strided",
    "new_empty",
    "new_empty_strided",
    "zeros",
    "zeros_like",
    "ones",
    "ones_like",
    "full",
    "full_like",
    "new_zeros",
    "new_ones",
    "new_full",
    "fill",
    "fill_",
    "zero_",
    "view",
    "_unsafe_view",
    "reshape",
    "_reshape_alias",
    "contiguous",
    "clone",
    "copy_",
    "copy",
    "_to_copy",
    "to",
    "t",
    "transpose",
    "permute",
    "expand",
    "as_strided",
    "detach",
    "alias",
    "select",
    "slice",
    "unsqueeze",
    "squeeze",
    "unbind",
    "split",
    "split_with_sizes",
    "chunk",
    "narrow",
    "flatten",
    "unflatten",
    "lift_fresh",
    "resize_",
    "set_",
    "is_nonzero",
    "item",
    "_local_scalar_dense",
    "arange",
    "rand",
    "randn",
    "normal_",
    "uniform_",
    "random_",
    "randint",
    "bernoulli_",
    "stride",
    "size",
    "numel",
    "dim",
    "sym_size",
    "sym_stride",
    "sym_numel",
    "_has_compatible_shallow_copy_type",
    "record_stream",
    "cat",
    "stack",
    "index_select",
    "_reshape_copy",
    "view_as",
    "expand_as",
    "repeat",
    "result_type",
    "scalar_tensor",
}


class OpRecorder(TorchDispatchMode):
    """Records the aten compute ops reached, also from inside C++ extensions."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func._schema.name.split("::")[-1]
        if name not in NON_COMPUTE:
            self.ops.add(name)
        return func(*args, **(kwargs or {}))


def synchronize(device: torch.device) -> None:
    # Device-wide: covers work left on any stream.
    if device.type == "cuda":
        torch.cuda.synchronize(device)
