"""What a candidate's forward may return: plain tensors of its own memory.

A tensor subclass can compute when it is looked at, so the timed call does no work and the
comparison afterwards does it (a deferred, or lazy, output). An output that is an input, or a view
of one, or any tensor over an input's memory, costs nothing to "compute" and can pass where the
operator is the identity on the task's inputs. Both are rejected by name, on every checked call.
"""

from __future__ import annotations

from typing import Any

import torch

from kernel_refinery.tools.processes.programs import tensors_of


def _span(t: torch.Tensor) -> tuple[int, int] | None:
    """The byte range of the tensor's whole storage, or None for an empty one."""
    storage = t.untyped_storage()
    size = storage.nbytes()
    if size == 0:
        return None
    start = storage.data_ptr()
    return start, start + size


def output_problem(output: Any, inputs: list[Any]) -> str:
    """Why this forward's output is not acceptable, or "" when it is."""
    outs = tensors_of(output)
    many = len(outs) > 1
    input_spans = [(i, _span(t)) for i, t in enumerate(tensors_of(inputs))]
    for k, out in enumerate(outs):
        which = f"output {k}" if many else "the output"
        if type(out) is not torch.Tensor:
            return (
                f"{which} is a {type(out).__module__}.{type(out).__qualname__}, a subclass of torch.Tensor; "
                "forward must return plain tensors computed during the call (deferred or lazy outputs are not allowed)"
            )
        span = _span(out)
        if span is None or out.device.type == "meta":
            continue
        for i, in_span in input_spans:
            if in_span is not None and span[0] < in_span[1] and in_span[0] < span[1]:
                return (
                    f"{which} shares memory with input {i} (it is the input, a view of it, or a tensor over its "
                    "memory); write the result into a new tensor"
                )
    return ""
