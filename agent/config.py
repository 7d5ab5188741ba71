"""One typed configuration for a refinement run: the model, the loop and the evaluator."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, model_validator

from kernel_refinery.core.strategy import Strategy
from kernel_refinery.tools.config import EvalConfig

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


def _parse_variant(value: object) -> object:
    return Variant.parse(value) if isinstance(value, str) else value


VariantSetting = Annotated[Variant, BeforeValidator(_parse_variant), PlainSerializer(str, return_type=str)]
"""A Variant read from its text ("G+E+P") and written back as that text, so configs and results keep the string."""


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
    reuse_replies: bool = Field(
        True,
        description="at temperature 0, a prompt already sent in this run gets the reply it got then, not a second "
        "greedy decode (turn 1's prompt is the same in every variant, so each variant starts from the same kernel)",
    )

    @property
    def embedded(self) -> bool:
        """Served by llama.cpp on this same machine: `local` or `local-<size>`."""
        return self.model == "local" or self.model.startswith("local-")


class LoopSettings(BaseModel):
    """The refinement loop."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    variant: VariantSetting = Variant.parse("G+E+P")
    turns: int = Field(10, ge=1)
    target_speedup: float = Field(1.0, description="stop at a correct kernel this fast (Attempt.reaches)")
    hardware_prompt: bool = True


class SearchSettings(BaseModel):
    """How a strategy schedules turns, and the budget that caps any strategy."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    n: int = Field(4, ge=1, description="best-of-n: independent trajectories")
    rounds: int = Field(3, ge=1, description="beam: rounds of idea proposal and expansion")
    ideas: int = Field(3, ge=1, description="beam: ideas (K) proposed for each seed kernel per round")
    beam_width: int = Field(2, ge=1, description="beam: the W best kernels that seed the next round")
    budget_evals: int | None = Field(None, ge=1, description="at most this many candidate evaluations")
    budget_tokens: int | None = Field(None, ge=1, description="no model call starts once this many tokens are spent")


def check_temperature(strategy: Strategy, search: SearchSettings, llm: ModelSettings, samples: int = 1) -> None:
    """Independent samples at temperature 0 are all the same, so best-of-n's trajectories and an
    experiment's samples need a temperature above 0 (a scripted model chooses its own replies)."""
    if llm.temperature > 0 or llm.model.startswith("scripted"):
        return
    if strategy == Strategy.BEST_OF_N and search.n > 1:
        raise ValueError(f"best-of-n with n = {search.n} needs temperature above 0 (--set llm.temperature=0.7)")
    if samples > 1:
        raise ValueError(
            f"samples = {samples} needs temperature above 0 (independent samples at temperature 0 are all the same); "
            "set llm.temperature, e.g. --set llm.temperature=0.7"
        )


def needs_quiet_host(llm: ModelSettings, eval: EvalConfig) -> bool:
    """Whether LLM calls and evaluations must take turns: the embedded model's server and a CPU
    evaluation share this machine's cores, so a kernel timed while the model decodes is timed
    against the server (agent/quiet.py)."""
    return eval.device == "cpu" and llm.embedded


class RunConfig(BaseModel):
    """One task's run: the model, the loop, the evaluator and the strategy with its budget."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    llm: ModelSettings = ModelSettings()
    loop: LoopSettings = LoopSettings()
    eval: EvalConfig = Field(default_factory=EvalConfig)
    strategy: Strategy = Strategy.REFINE
    search: SearchSettings = SearchSettings()

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        check_temperature(self.strategy, self.search, self.llm)
        return self
