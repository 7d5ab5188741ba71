"""The judge's handle on the candidate's process: build models there, call them on inputs the judge
writes, and read their outputs back, with what the runner saw on the way.

Nothing here trusts the runner beyond its outputs: whatever it reports (kernel calls, aten ops,
output problems, settings it saw changed, its own clock) can only make a verdict stricter, and the
outputs are compared, and the reported times checked against this process's clock, by the judge.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import torch

from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.processes.channel import (
    Arena,
    Batch,
    BatchDone,
    Build,
    Built,
    Call,
    Called,
    End,
    Failed,
    Inputs,
    LoadTask,
    OutputMeta,
    Outputs,
    Profile,
    Profiled,
    Role,
    Share,
    Shared,
    SlotArg,
    Spec,
)
from kernel_refinery.tools.processes.jobs import Rejected, StageFailed
from kernel_refinery.tools.results import KernelShare, ProfileReport


class RunnerGone(Exception):
    """The candidate's process closed its end (it died, or the parent killed it)."""


class NoKernel(Rejected):
    """A call ran none of the candidate's compiled kernels (on a shape variant: a PyTorch fallback)."""


def _state_rejection(changes: Sequence[str], when: str) -> Rejected:
    return Rejected(
        f"{when}, the candidate changed settings the evaluation pins: {'; '.join(changes)}; "
        "leave global settings (threads, backend flags, precision, torch's functions, the environment) as they are"
    )


@dataclass
class RunnerLink:
    """One job's connection to the runner; arenas are reused while their specs fit."""

    conn: Connection
    device: torch.device
    inputs: Arena | None = None
    outputs: Arena | None = None
    closed: bool = False
    seconds: dict[str, float] = field(default_factory=dict)
    """Time spent waiting on the runner, by request type (where a job's time goes)."""
    arenas: dict[str, list[Arena]] = field(default_factory=dict)
    """Every arena of this job by its role, numbered as the runner knows them."""

    def _gone(self, exc: BaseException) -> Exception:
        return RunnerGone(str(exc))

    def request(self, message: object) -> Any:
        started = time.perf_counter()
        try:
            self.conn.send(message)
            reply = self.conn.recv()
        except (EOFError, OSError, BrokenPipeError) as exc:
            raise self._gone(exc) from None
        kind = type(message).__name__
        self.seconds[kind] = self.seconds.get(kind, 0.0) + time.perf_counter() - started
        if isinstance(reply, Failed):
            if reply.state_changes:
                raise _state_rejection(reply.state_changes, "while running")
            raise StageFailed(EvalStatus(reply.status), reply.message, fatal=reply.fatal)
        return reply

    def build(
        self, seed: int, role: Role = "candidate", specs: tuple[Spec, ...] = (), overrides: tuple[tuple[str, Any], ...] = ()
    ) -> RemoteModel:
        reply = self.request(Build(seed, role, specs, overrides))
        assert isinstance(reply, Built)
        if reply.state_changes:
            raise _state_rejection(reply.state_changes, "in ModelNew's constructor")
        return RemoteModel(self, reply.model, candidate=role == "candidate")

    def build_candidate(self, seed: int, overrides: tuple[tuple[str, Any], ...] = ()) -> RemoteModel:
        """ModelNew, built in the candidate's runner (from the task with `overrides`: a shape or init variant)."""
        return self.build(seed, overrides=overrides)

    def load_task(self, source: str, dtype: str, allow_tf32: bool) -> None:
        """The reference runner: load the task program (once per task and precision)."""
        self.request(LoadTask(source, dtype, allow_tf32))

    def input_arena_for(self, args: Sequence[Any]) -> None:
        """Switch to the input arena of these arguments' specs (a message to the runner the first time)."""
        specs = tuple(Spec.of(a) for a in args if isinstance(a, torch.Tensor))
        if self.inputs is None or self.inputs.specs != specs:
            self._replace("inputs", specs)

    def place_inputs(self, args: Sequence[Any]) -> tuple[SlotArg, ...]:
        """Write the tensors of `args` into the input arena (a new one when their specs changed)."""
        self.input_arena_for(args)
        assert self.inputs is not None
        template: list[SlotArg] = []
        slot = 0
        with torch.no_grad():
            for arg in args:
                if isinstance(arg, torch.Tensor):
                    self.inputs.tensors[slot].copy_(arg)
                    template.append(("slot", slot))
                    slot += 1
                else:
                    template.append(("value", arg))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return tuple(template)

    def expect_outputs(self, specs: tuple[Spec, ...]) -> Arena:
        if self.outputs is None or self.outputs.specs != specs:
            self._replace("outputs", specs)
        assert self.outputs is not None
        return self.outputs

    def _replace(self, which: str, specs: tuple[Spec, ...]) -> None:
        """Switch to the arena of these specs, made (and mapped by the runner, one IPC open) only once per job."""
        known = self.arenas.setdefault(which, [])
        number = next((k for k, a in enumerate(known) if a.specs == specs), None)
        new = number is None
        if number is None:
            known.append(Arena(specs, self.device))
            number = len(known) - 1
        arena = known[number]
        setattr(self, which, arena)
        try:
            self.conn.send(Inputs(number, new) if which == "inputs" else Outputs(number, new))
            if new:
                arena.send(self.conn)
            self.conn.recv()
        except (EOFError, OSError, BrokenPipeError) as exc:
            raise self._gone(exc) from None

    def end(self) -> tuple[str, ...]:
        """Release the runner; returns the settings it saw changed since the last call (checked after each)."""
        if self.closed:
            return ()
        self.closed = True
        try:
            reply = self.request(End())
        except RunnerGone:
            return ()
        finally:
            for arena in (a for known in self.arenas.values() for a in known):
                arena.close()
            self.arenas.clear()
            self.inputs = self.outputs = None
        return tuple(getattr(reply, "state_changes", ()))


def _mismatch(metas: Sequence[OutputMeta], expected: Sequence[Spec]) -> str:
    if len(metas) != len(expected):
        return f"returned {len(metas)} tensors, expected {len(expected)}"
    for k, (meta, spec) in enumerate(zip(metas, expected, strict=True)):
        which = "output" if len(expected) == 1 else f"output {k}"
        if meta.kind != "tensor" or meta.spec is None:
            return f"{which} is a {meta.kind}, expected a tensor"
        if meta.spec.shape != spec.shape:
            return f"{which} has shape {meta.spec.shape}, expected {spec.shape}"
        if meta.spec.dtype != spec.dtype:
            return f"{which} has dtype torch.{meta.spec.dtype}, expected torch.{spec.dtype}"
    return ""


@dataclass
class RemoteCall:
    """One call's outcome as the judge holds it."""

    reply: Called
    mismatch: str
    """Why the outputs do not fit the reference's (count, shape, dtype), or "" when they were copied."""


@dataclass
class HandOver:
    """One timed batch as the judge saw it: its clock and what it read back."""

    reply: BatchDone
    wall_ms: float
    """The judge's clock, from before the batch's inputs were written to after its outputs were read."""
    read: Any
    """What `read` took of the output arena, inside the clock (None when the outputs did not fit it)."""
    mismatch: str
    """Why the outputs do not fit the reference's (count, shape, dtype), or ""."""


@dataclass
class RemoteModel:
    """A model living in a runner: ModelNew in the candidate's, or the reference (and the null
    model) in the judge's reference runner."""

    link: RunnerLink
    model: int
    candidate: bool = True
    """Each call must reach the candidate's own compiled kernels (not asked of the reference)."""

    def call(self, args: Sequence[Any], expected: tuple[Spec, ...], record_ops: bool = False) -> tuple[RemoteCall, list[torch.Tensor]]:
        """Run the model on `args`; its outputs live in the output arena until the next call.

        Raises Rejected for a hack the runner or the judge saw: settings changed, an input
        modified, an output that is not a plain tensor of its own memory, no kernel called."""
        template = self.link.place_inputs(args)
        arena = self.link.expect_outputs(expected)
        reply = self.link.request(Call(self.model, template, record_ops=record_ops))
        assert isinstance(reply, Called)
        if reply.state_changes:
            raise _state_rejection(reply.state_changes, "during a call")
        changed = self._inputs_changed(args)
        if changed:
            raise Rejected(changed)
        if reply.problem:
            raise Rejected(reply.problem)
        self._kernels(reply.kernel_calls, 1)
        mismatch = "" if reply.copied else (_mismatch(reply.outputs, expected) or "its outputs could not be read")
        return RemoteCall(reply, mismatch), (arena.tensors if reply.copied else [])

    def _kernels(self, calls: int, wanted: int) -> None:
        if self.candidate and calls < wanted:
            raise NoKernel("ModelNew.forward did not call any compiled kernel; the work must be done by a custom kernel")

    def hand_over(
        self,
        arg_sets: Sequence[Sequence[Any]],
        expected: tuple[Spec, ...],
        read: Callable[[Arena], Any],
        before_call: Callable[[], None] = lambda: None,
        graph: bool = False,
    ) -> HandOver:
        """A timed batch: the judge's clock starts before any of the calls' inputs is written, so
        nothing can start on them before it; it stops once `read` has taken the outputs back.

        The arenas are switched before the clock (a message, not part of a call). `before_call`
        runs inside the clock after the inputs are written (the judge's L2 flush on CUDA): the
        null model's batches pay it too, so it is part of the harness's cost, not the call's."""
        flat = [a for args in arg_sets for a in args]
        self.link.input_arena_for(flat)
        arena = self.link.expect_outputs(expected * len(arg_sets))
        started = time.perf_counter_ns()
        template = self.link.place_inputs(flat)
        before_call()
        groups, at = [], 0
        for args in arg_sets:
            groups.append(template[at : at + len(args)])
            at += len(args)
        reply = self.link.request(Batch(self.model, tuple(groups), graph))
        assert isinstance(reply, BatchDone)
        taken = read(arena) if reply.copied else None
        wall_ms = (time.perf_counter_ns() - started) / 1e6
        if reply.state_changes:
            raise _state_rejection(reply.state_changes, "during a call")
        if reply.problem:
            raise Rejected(reply.problem)
        self._kernels(reply.kernel_calls, len(arg_sets))
        mismatch = "" if reply.copied else (_mismatch(reply.outputs, expected) or "its outputs could not be read")
        return HandOver(reply, wall_ms, taken, mismatch)

    def _inputs_changed(self, args: Sequence[Any]) -> str:
        """The input arena against the judge's own copy: a candidate that wrote into its inputs."""
        arena = self.link.inputs
        if arena is None:
            return ""
        slot = 0
        for i, arg in enumerate(args):
            if not isinstance(arg, torch.Tensor):
                continue
            seen = arena.tensors[slot]
            slot += 1
            same = bool(torch.equal(arg, seen)) or bool(torch.equal(arg.nan_to_num(nan=0.5), seen.nan_to_num(nan=0.5)))
            if not same:
                return f"the candidate modified input {i} in place; inputs must be left unchanged"
        return ""

    def profile(self, args: Sequence[Any], rows: int) -> ProfileReport:
        reply = self.link.request(Profile(self.model, self.link.place_inputs(args), rows))
        assert isinstance(reply, Profiled)
        report = reply.report
        if not isinstance(report, ProfileReport):
            raise StageFailed(EvalStatus.RUNTIME_ERROR, "the candidate's process sent no profile")
        return report

    def kernel_share(self, arg_sets: Sequence[Sequence[Any]], non_compute: frozenset[str], reference_ops: set[str]) -> KernelShare:
        """Every set goes through the arena at once (one group per set)."""
        flat = [a for args in arg_sets for a in args]
        template = self.link.place_inputs(flat)
        groups, start = [], 0
        for args in arg_sets:
            groups.append(template[start : start + len(args)])
            start += len(args)
        reply = self.link.request(Share(self.model, tuple(groups), non_compute, frozenset(reference_ops)))
        assert isinstance(reply, Shared)
        share = reply.share
        if not isinstance(share, KernelShare):
            raise StageFailed(EvalStatus.RUNTIME_ERROR, "the candidate's process sent no kernel share")
        return share
