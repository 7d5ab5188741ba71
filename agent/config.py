"""One typed configuration for a refinement run: the model, the loop and the evaluator."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tools.config import EvalConfig

FEEDBACK_PARTS = ("E", "P", "N")


class Variant(BaseModel):
    """A feedback variant such as G, G+E, G+E+P or G+E+P+N; parts compose."""

    model_config = ConfigDict(frozen=True)
    parts: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, text: str) -> Variant:
        names = [p.strip().upper() for p in text.split("+") if p.strip()]
        if not names or names[0] != "G":
            raise ValueError(f"variant {text!r} must start with G (e.g. G, G+E, G+E+P)")
        unknown = [p for p in names[1:] if p not in FEEDBACK_PARTS]
        if unknown:
            raise ValueError(f"variant {text!r}: unknown part {unknown[0]!r}; parts are {', '.join(FEEDBACK_PARTS)}")
        parts = frozenset(names[1:])
        if ("P" in parts or "N" in parts) and "E" not in parts:
            raise ValueError(f"variant {text!r}: profiler feedback builds on execution feedback (use G+E+P)")
        return cls(parts=parts)

    @property
    def execution(self) -> bool:
        return "E" in self.parts

    @property
    def profiler(self) -> bool:
        return "P" in self.parts

    @property
    def nsight(self) -> bool:
        return "N" in self.parts

    def __str__(self) -> str:
        return "+".join(["G", *[p for p in FEEDBACK_PARTS if p in self.parts]])


class ModelSettings(BaseModel):
    """Which chat model writes the kernels, and how it is called."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    model: str = Field("local", description="model name, 'local' / 'local-0.5b' (embedded), or 'scripted:FILE'")
    base_url: str | None = Field(None, description="OpenAI-compatible endpoint; None: OpenAI, or the embedded server")
    api_key_env: str = Field("OPENAI_API_KEY", description="the environment variable holding the key (never the key)")
    temperature: float = 0.0
    max_tokens: int = 4096
    timeout_s: float = 600.0
    retries: int = Field(6, description="attempts on rate limits, timeouts and 5xx")


class LoopSettings(BaseModel):
    """The refinement loop."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    variant: str = "G+E+P"
    turns: int = Field(10, ge=1)
    target_speedup: float = 1.0
    hardware_prompt: bool = True

    @field_validator("variant")
    @classmethod
    def _valid_variant(cls, value: str) -> str:
        return str(Variant.parse(value))

    @property
    def parsed_variant(self) -> Variant:
        return Variant.parse(self.variant)


class RunConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    llm: ModelSettings = ModelSettings()
    loop: LoopSettings = LoopSettings()
    eval: EvalConfig = EvalConfig()
    strategy: Literal["refine"] = "refine"
