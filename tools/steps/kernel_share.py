"""How much of a candidate's forward its own kernels do, from one profiled run.

The wrapper check catches a forward that runs the reference's own operators. A forward that calls
a decoy kernel and then does the work with *other* PyTorch operators (`torch.clamp` for a ReLU)
passes it; its kernel share does not. Compute time is split three ways, per profiled event, by the
nearest enclosing range that says whose it is:
- custom: inside a `kernel::` range (a built extension's function) or a `triton::` launch, whatever
  runs inside (an extension may call ATen itself; the wrapper check judges that);
- library: PyTorch matmul and convolution operators called from Python (cuBLAS, cuDNN, MKL);
- aten: every other PyTorch compute operator called from Python.
Allocation, copies and views count for nobody. On CUDA the time is the kernels' device time; on
CPU the operators' own CPU time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kernel_refinery.tools.results import KernelShare
from kernel_refinery.tools.steps.profiling import profiled_calls

CUSTOM_PREFIXES = ("kernel::", "triton::")
LIBRARY_OPS = frozenset(
    {
        "mm",
        "bmm",
        "addmm",
        "addbmm",
        "baddbmm",
        "matmul",
        "linear",
        "mv",
        "addmv",
        "dot",
        "vdot",
        "einsum",
        "tensordot",
        "_scaled_mm",
        "convolution",
        "_convolution",
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "cudnn_convolution",
        "mkldnn_convolution",
        "_mkldnn_convolution",
        "cudnn_convolution_transpose",
        "_convolution_mode",
        "_nnpack_spatial_convolution",
        "_slow_conv2d_forward",
        "slow_conv3d_forward",
        "slow_conv_transpose2d",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "scaled_dot_product_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    }
)


def _owner(event: Any, non_compute: frozenset[str]) -> str:
    """custom, library, aten or none: the nearest enclosing range that claims the event."""
    node = event
    while node is not None:
        if node.name.startswith(CUSTOM_PREFIXES):
            return "custom"
        node = node.cpu_parent
    node = event
    while node is not None:
        if node.name.startswith("aten::"):
            op = node.name.removeprefix("aten::")
            if op in non_compute:
                return "none"
            return "library" if op in LIBRARY_OPS else "aten"
        node = node.cpu_parent
    return "none"


def split_events(events: list[Any], cuda: bool, non_compute: frozenset[str]) -> dict[str, float]:
    """Microseconds per owner over CPU-side events (device kernels hang on the op that launched them)."""
    totals = {"custom": 0.0, "library": 0.0, "aten": 0.0, "none": 0.0}
    for event in events:
        if event.device_type != torch.autograd.DeviceType.CPU or event.is_async:
            continue
        own = event.self_device_time_total if cuda else event.self_cpu_time_total
        if own > 0:
            totals[_owner(event, non_compute)] += float(own)
    return totals


def measure_kernel_share(
    fn: Callable[..., Any],
    arg_sets: list[list[Any]],
    device: torch.device,
    non_compute: frozenset[str],
    reference_ops: set[str],
) -> KernelShare:
    """Profile one call per argument set after the first (an unprofiled warm-up) and split their
    compute time. Each set should hold fresh values: a memo must not make the share."""
    cuda = device.type == "cuda"
    warm, *arg_sets = arg_sets
    iterations = len(arg_sets)
    prof = profiled_calls(fn, warm, arg_sets, device)
    totals = split_events(list(prof.events()), cuda, non_compute)
    custom, library, aten = (totals[k] / 1000 / iterations for k in ("custom", "library", "aten"))
    everything = custom + library + aten
    # Fusing around a GEMM kept in PyTorch is fair only where the reference has more than GEMMs.
    library_is_fair = bool(reference_ops - LIBRARY_OPS) and bool(reference_ops & LIBRARY_OPS)
    judged_total = custom + aten + (0.0 if library_is_fair else library)
    return KernelShare(
        custom_ms=custom,
        aten_ms=aten,
        library_ms=library,
        share=custom / everything if everything > 0 else 1.0,
        judged_share=custom / judged_total if judged_total > 0 else 1.0,
    )
