"""What a CUDA fault and an out-of-memory look like in an error's text (torch-free, for both sides
of the pipe: the worker classifies exceptions, the parent classifies a worker's last words)."""

from __future__ import annotations

CUDA_FAULT_MARKERS = (
    "illegal memory access",
    "CUDA error",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
    "CUBLAS_STATUS_EXECUTION_FAILED",
    "an illegal instruction",
    "CUDA driver error",
    "cudaErrorIllegalAddress",
    "AcceleratorError",
)
OOM_MARKERS = ("out of memory", "can't allocate memory", "std::bad_alloc", "Cannot allocate memory")


def cuda_fault_in(text: str) -> str:
    """The first line of `text` that names a CUDA fault, or ""."""
    for line in text.splitlines():
        if any(marker in line for marker in CUDA_FAULT_MARKERS):
            return line.strip()
    return ""
