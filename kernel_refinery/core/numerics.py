"""The numerics a result is judged at: the precision, the tolerance and the TF32 policy.

`Precision` is the one table of precisions (its dtype and its place in a report); `Numerics` is the
one value that says how outputs were compared, and `Numerics.describe` the one way it is written
for people. Both serialize as the strings configs and results have always held ("fp32", ...).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict


class Precision(StrEnum):
    """Floating-point inputs, parameters and buffers of both models are cast to this dtype."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"

    @property
    def dtype_name(self) -> str:
        """torch's name of the dtype: float32, float16, bfloat16."""
        return _DTYPE_NAMES[self]

    @property
    def order(self) -> int:
        """Its place in reports: fp32, fp16, bf16."""
        return list(Precision).index(self)

    @property
    def reduced(self) -> bool:
        """Below fp32: the prompt names the dtype, since kernels must read and write it."""
        return self is not Precision.FP32


_DTYPE_NAMES = {Precision.FP32: "float32", Precision.FP16: "float16", Precision.BF16: "bfloat16"}


class Numerics(BaseModel):
    """How outputs are compared with the reference: at which precision, within which tolerance,
    with or without TF32. atol and rtol are None where a result does not record them (results
    from before the tolerance was recorded)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    precision: Precision = Precision.FP32
    atol: float | None = None
    rtol: float | None = None
    allow_tf32: bool = False

    @classmethod
    def recorded(cls, precision: str, tolerance: float | None, allow_tf32: bool) -> Numerics:
        """As results, records and manifests keep it: one number for atol = rtol."""
        return cls(precision=Precision(precision), atol=tolerance, rtol=tolerance, allow_tf32=allow_tf32)

    @property
    def tolerance(self) -> float | None:
        """The one number results, records and prompts keep: atol (equal to rtol unless
        `eval.tolerances` sets them apart)."""
        return self.atol

    def describe(self) -> str:
        """`fp16, atol = rtol = 0.01, TF32 off`: the one way numerics are written for people."""
        if self.atol is None or self.rtol is None:
            tolerance = "tolerance not recorded"
        elif self.atol == self.rtol:
            tolerance = f"atol = rtol = {self.atol:g}"
        else:
            tolerance = f"atol = {self.atol:g}, rtol = {self.rtol:g}"
        return f"{self.precision}, {tolerance}, TF32 {'allowed' if self.allow_tf32 else 'off'}"
