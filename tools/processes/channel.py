"""Memory the judge and the candidate's process share, and the messages between them.

The judge owns every buffer: it writes each call's inputs into an input arena just before the
call, and the runner copies the candidate's outputs into an output arena right after it, where
the judge reads them at once. On CPU an arena is a memfd mapped by both processes (its file
descriptor passed over the socket); on CUDA one device allocation opened by the runner through
CUDA IPC. Either way an arena is mapped once per job, so a call costs no mapping.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler, recv_handle, send_handle
from typing import Any, Literal

import torch
import torch.multiprocessing

_ALIGN = 256


@dataclass(frozen=True)
class Spec:
    """A tensor's shape and dtype (its device is the arena's)."""

    shape: tuple[int, ...]
    dtype: str

    @classmethod
    def of(cls, tensor: torch.Tensor) -> Spec:
        return cls(tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))

    @property
    def torch_dtype(self) -> torch.dtype:
        dtype = getattr(torch, self.dtype)
        assert isinstance(dtype, torch.dtype)
        return dtype

    @property
    def nbytes(self) -> int:
        numel = 1
        for size in self.shape:
            numel *= size
        return numel * torch.empty((), dtype=self.torch_dtype).element_size()

    def describe(self) -> str:
        return f"{self.dtype}{list(self.shape)}"


def _layout(specs: tuple[Spec, ...]) -> tuple[list[int], int]:
    offsets, total = [], 0
    for spec in specs:
        offsets.append(total)
        total += -(-spec.nbytes // _ALIGN) * _ALIGN
    return offsets, max(total, _ALIGN)


def _views(base: torch.Tensor, specs: tuple[Spec, ...]) -> list[torch.Tensor]:
    offsets, _ = _layout(specs)
    return [base[off : off + s.nbytes].view(s.torch_dtype).view(s.shape) for off, s in zip(offsets, specs, strict=True)]


@dataclass(frozen=True)
class ArenaHandle:
    """What the runner needs to map an arena: CUDA's IPC handle pickled, or a file descriptor sent beside."""

    specs: tuple[Spec, ...]
    size: int
    cuda_ipc: bytes | None = None


class Arena:
    """Judge side: the owner of one shared buffer holding tensors of the given specs."""

    def __init__(self, specs: tuple[Spec, ...], device: torch.device):
        self.specs = specs
        self.device = device
        _, self.size = _layout(specs)
        self._fd: int | None = None
        self._map: mmap.mmap | None = None
        if device.type == "cuda":
            self._base = torch.empty(self.size, dtype=torch.uint8, device=device)
        else:
            self._fd = os.memfd_create("refinery-arena", os.MFD_CLOEXEC)
            os.ftruncate(self._fd, self.size)
            self._map = mmap.mmap(self._fd, self.size)
            self._base = torch.frombuffer(self._map, dtype=torch.uint8)
        self.tensors = _views(self._base, specs)

    def stacked(self, per_call: int) -> list[torch.Tensor]:
        """For an arena of one group of `per_call` outputs per call: output j of every call as one
        (calls, numel) view, so that the judge reads a batch's outputs in one operation each."""
        calls = len(self.specs) // per_call
        offsets, _ = _layout(self.specs)
        stride = offsets[per_call] - offsets[0] if calls > 1 else 0
        views = []
        for j, spec in enumerate(self.specs[:per_call]):
            typed = self._base.view(spec.torch_dtype)
            size = typed.element_size()
            numel = spec.nbytes // size
            views.append(torch.as_strided(typed, (calls, numel), (stride // size, 1), offsets[j] // size))
        return views

    def send(self, conn: Connection) -> None:
        """Hand the arena to the runner at the other end of `conn`."""
        if self.device.type == "cuda":
            conn.send(ArenaHandle(self.specs, self.size, bytes(ForkingPickler.dumps(self._base))))
        else:
            conn.send(ArenaHandle(self.specs, self.size))
            assert self._fd is not None
            send_handle(conn, self._fd, 0)

    def close(self) -> None:
        self.tensors = []
        del self._base
        if self._map is not None:
            with contextlib.suppress(BufferError):  # a view is still alive somewhere; the mapping goes with it
                self._map.close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def map_arena(handle: ArenaHandle, conn: Connection) -> list[torch.Tensor]:
    """Runner side: the arena's tensors, mapped from the handle (and, on CPU, the descriptor that follows it)."""
    if handle.cuda_ipc is not None:
        base = ForkingPickler.loads(handle.cuda_ipc)
    else:
        fd = recv_handle(conn)
        try:
            mapped = mmap.mmap(fd, handle.size)
        finally:
            os.close(fd)
        base = torch.frombuffer(mapped, dtype=torch.uint8)
    return _views(base, handle.specs)


# Arguments of a call: tensors go through the input arena, anything else by value.
SlotArg = tuple[str, Any]
"""("slot", index into the input arena) or ("value", a picklable value)."""


@dataclass(frozen=True)
class OutputMeta:
    """What the candidate returned, as the runner saw it: enough for the judge to say what is wrong."""

    kind: str
    """"tensor", or the type's name of anything else."""
    spec: Spec | None = None


# Judge -> runner requests. Each gets one reply.


Role = Literal["candidate", "reference", "compiled", "null"]
"""What a Build constructs: ModelNew (in the candidate's runner only), or, in the reference runner,
the task's Model, torch.compile of it, or the null model (no work, outputs of the given specs)."""


@dataclass(frozen=True)
class Build:
    """Construct a model from the init inputs of `seed` (ModelNew with the reference's weights); reply Built."""

    seed: int
    role: Role = "candidate"
    specs: tuple[Spec, ...] = ()
    """The null model's outputs."""
    overrides: tuple[tuple[str, Any], ...] = ()
    """The task's module-level constants set to other values first (a shape or init variant,
    tools/steps/task_constants.py): the runner builds from the task with these."""


@dataclass(frozen=True)
class LoadTask:
    """The reference runner only: load this task program at this precision; reply Built(-1)."""

    source: str
    dtype: str
    allow_tf32: bool = False


@dataclass(frozen=True)
class Call:
    """Run model `model` on the arena's inputs; copy its outputs into the output arena; reply Called."""

    model: int
    args: tuple[SlotArg, ...]
    record_ops: bool = False


@dataclass(frozen=True)
class Batch:
    """Timed by the judge: run model `model` once per argument set, one call after another, each
    call's outputs copied into its own group of the output arena (the arena holds one group per
    call); reply BatchDone. On CUDA the device is synchronized after each call; with `graph`, each
    call replays a CUDA graph of the model captured on the first batch."""

    model: int
    calls: tuple[tuple[SlotArg, ...], ...]
    graph: bool = False


@dataclass(frozen=True)
class Profile:
    model: int
    args: tuple[SlotArg, ...]
    rows: int


@dataclass(frozen=True)
class Share:
    """The kernel share of `model` over input sets 1.. of the arena groups (0 is the warm-up)."""

    model: int
    arg_sets: tuple[tuple[SlotArg, ...], ...]
    non_compute: frozenset[str]
    reference_ops: frozenset[str]


@dataclass(frozen=True)
class Inputs:
    """Switch the input arena to number `arena`; when `new`, its handle follows (then, on CPU, its descriptor)."""

    arena: int
    new: bool


@dataclass(frozen=True)
class Outputs:
    """The same for the output arena."""

    arena: int
    new: bool


@dataclass(frozen=True)
class End:
    """The judge is done with this runner for now."""


# Runner -> judge replies.


@dataclass(frozen=True)
class Failed:
    """Candidate code raised: its status name, the message, and whether the runner is now unusable."""

    status: str
    message: str
    fatal: bool = False
    state_changes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Built:
    model: int
    state_changes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Called:
    outputs: tuple[OutputMeta, ...]
    copied: bool
    """The outputs matched the output arena's specs and were copied into it."""
    kernel_calls: int
    """Calls into the candidate's compiled kernels during the call."""
    ops: tuple[str, ...] = ()
    problem: str = ""
    """Why the outputs are not acceptable (a subclass, memory shared with an input), or ""."""
    state_changes: tuple[str, ...] = ()


@dataclass(frozen=True)
class BatchDone:
    outputs: tuple[OutputMeta, ...]
    """What the first call whose outputs did not fit the arena returned (all of call 0's when all fit)."""
    copied: bool
    """Every call's outputs matched the output arena's specs and were copied into its group."""
    kernel_calls: int
    """Calls into the candidate's compiled kernels, over the whole batch."""
    problem: str = ""
    runner_ms: tuple[float, ...] = ()
    """The runner's own clock per call (CUDA events or the monotonic clock). A diagnostic, recorded
    and never used for a verdict: native code in this process can make it say anything."""
    state_changes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Profiled:
    report: Any


@dataclass(frozen=True)
class Shared:
    share: Any
