"""Does a task measure anything? A reference whose outputs, on several random inputs, are all zeros,
one constant, or the same on every input within the tolerance is degenerate: a kernel that writes
that constant (or what it saw once) passes its correctness check without computing the operator.

KernelBench has such tasks (a max over a dimension kept at size 1 and then its mean subtracted
gives zeros; a softmax over a dimension of size 1 gives ones). The correctness check refuses a
constant output where the reference varies; it cannot help where the reference itself does not.
`refinery suite check` (bench/suite_check/child.py) and the judge (tools/steps/correctness.py)
both run one reference on `PROBE_INPUTS` input sets and judge the outputs here, with the same
tolerance a candidate is held to: each criterion is "a candidate this trivial would pass".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from kernel_refinery.tools.processes.programs import tensors_of

PROBE_INPUTS = 4
"""Input sets a reference is run on to judge whether its outputs vary."""

Kind = Literal["zeros", "constant", "input_independent"]

KIND_TEXT: dict[str, str] = {
    "zeros": "all zeros",
    "constant": "one constant",
    "input_independent": "the same on every input",
}


@dataclass(frozen=True)
class Degenerate:
    kind: Kind
    detail: str
    """One line: what the outputs were, e.g. `every output is 0 on 4 random inputs`."""

    def describe(self) -> str:
        return f"{KIND_TEXT[self.kind]}: {self.detail}"


def _float(t: torch.Tensor) -> torch.Tensor:
    """Floating values as float32 (float64 kept): the tolerance is far above float32's rounding."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def _within(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float) -> bool:
    """`actual` passes an elementwise check against `expected` (NaN matching NaN)."""
    if not expected.is_floating_point():
        return bool(torch.equal(actual, expected))
    a, e = _float(actual), _float(expected)
    close = (a - e).abs() <= atol + rtol * e.abs()
    return bool((close | (a.isnan() & e.isnan()) | (a == e)).all())


SAMPLE = 4096
"""Positions compared first, spread over an output: a reference that varies shows it there, and
the full comparison (several passes over a large output) runs only for one that may not."""


def _near(t: torch.Tensor, value: float, atol: float, rtol: float) -> bool:
    """Every element of t is within tolerance of `value`: writing `value` everywhere would pass."""
    if not t.is_floating_point():
        return bool((t == int(value)).all())
    f = _float(t)
    return bool(((f - value).abs() <= atol + rtol * f.abs()).all())


def _range(t: torch.Tensor) -> tuple[float, float]:
    """(lowest, highest) value in one pass; NaN where t holds one."""
    low, high = torch.aminmax(t.to(torch.uint8) if t.dtype == torch.bool else t)
    return float(low), float(high)


def _passes_as(value: float, low: float, high: float, atol: float, rtol: float) -> bool:
    """`value` written everywhere could pass for both ends of [low, high] (`_near` then checks every element)."""
    return all(abs(v - value) <= atol + rtol * abs(v) for v in (low, high))


def _sample(t: torch.Tensor) -> torch.Tensor:
    flat = t.reshape(-1)
    if flat.numel() <= SAMPLE:
        return flat
    # Integer steps: float32's linspace rounds an index past 2**24 elements, and can run off the end.
    return flat[torch.arange(SAMPLE, device=t.device) * (flat.numel() - 1) // (SAMPLE - 1)]


class SpreadProbe:
    """Outputs of one model on input set after input set, reduced as they come: only the first
    set's outputs are kept (to compare the later ones with). Cheap where the reference varies: one
    pass per output for its range, and a comparison of SAMPLE positions; the full passes run only
    for outputs that may be degenerate."""

    def __init__(self, atol: float, rtol: float):
        self.atol, self.rtol = atol, rtol
        self.first: list[torch.Tensor] | None = None
        self.sets = 0
        self.all_zero = True
        self.constants: list[float | None] = []
        self.same = True
        self.max_change = 0.0

    def _constant(self, t: torch.Tensor, value: float | None = None) -> float | None:
        """The value every element of t could be written as (`value`, where given), else None."""
        if t.numel() == 0:
            return None
        low, high = _range(t)
        if not all(math.isfinite(v) for v in (low, high)):
            return None
        value = (low + high) / 2 if value is None else value
        if not _passes_as(value, low, high, self.atol, self.rtol):
            return None
        return value if _near(t, value, self.atol, self.rtol) else None

    def add(self, outputs: Sequence[torch.Tensor]) -> None:
        outputs = [o.detach() for o in outputs]
        self.sets += 1
        self.all_zero = self.all_zero and all(o.numel() == 0 or _range(o) == (0.0, 0.0) for o in outputs)
        if self.first is None:
            self.first = outputs
            # A one-element output (a loss) is constant by itself: only larger ones can show it.
            self.constants = [self._constant(o) for o in outputs if o.numel() > 1]
            return
        if len(outputs) != len(self.first) or any(o.shape != f.shape for o, f in zip(outputs, self.first, strict=True)):
            self.same = False
            self.constants = [None]
            return
        larger = [o for o in outputs if o.numel() > 1]
        # The same constant on this set too: a kernel writing that literal would pass here as well.
        kept = zip(self.constants, larger, strict=True)
        self.constants = [c if c is not None and self._constant(o, c) is not None else None for c, o in kept]
        if not self.same:
            return
        # The first set's outputs, written as the answer to this set: would they pass? Sampled first.
        pairs = list(zip(outputs, self.first, strict=True))
        if not all(_within(_sample(first), _sample(now), self.atol, self.rtol) for now, first in pairs):
            self.same = False
            return
        for now, first in pairs:
            if first.is_floating_point() and first.numel():
                change = (_float(now) - _float(first)).abs().nan_to_num(nan=0.0).max()
                self.max_change = max(self.max_change, float(change))
            if not _within(first, now, self.atol, self.rtol):
                self.same = False

    @property
    def varies(self) -> bool:
        """Two sets seen and nothing degenerate in them: no later set can change the verdict."""
        return self.sets >= 2 and self.verdict() is None

    def verdict(self) -> Degenerate | None:
        if self.first is None or self.sets < 2:
            return None
        where = f"on {self.sets} random inputs"
        if self.all_zero:
            return Degenerate("zeros", f"every output value is 0 {where}")
        if self.constants and all(c is not None for c in self.constants):
            shown = ", ".join(f"{c:.4g}" for c in self.constants if c is not None)
            return Degenerate("constant", f"each output is the one value {shown} (within atol={self.atol:g}, rtol={self.rtol:g}) {where}")
        if self.same:
            return Degenerate(
                "input_independent",
                f"the outputs of the first input set pass as those of every other {where} "
                f"(largest change {self.max_change:.3g}, within atol={self.atol:g}, rtol={self.rtol:g})",
            )
        return None


ORDER: tuple[Kind, ...] = ("zeros", "constant", "input_independent")


def combine(verdicts: Sequence[Degenerate | None], models: str) -> Degenerate | None:
    """One verdict from several models' (fresh weights each): degenerate only where every one is,
    of the weakest kind any of them shows (zeros, then one constant, then the same on every input)."""
    if not verdicts or any(v is None for v in verdicts):
        return None
    found = [v for v in verdicts if v is not None]
    kind = max((v.kind for v in found), key=ORDER.index)
    first = next(v for v in found if v.kind == kind)
    return Degenerate(kind, f"{first.detail}, for each of {len(found)} {models}")


def probe(model: Callable[..., Any], input_sets: Iterable[Sequence[Any]], atol: float, rtol: float) -> Degenerate | None:
    """Call `model` on each input set (drawn lazily, one alive at a time) and judge its outputs."""
    spread = SpreadProbe(atol, rtol)
    with torch.no_grad():
        for inputs in input_sets:
            spread.add(tensors_of(model(*inputs)))
    return spread.verdict()
