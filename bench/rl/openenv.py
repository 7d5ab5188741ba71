"""bench/rl/env.py as a Meta OpenEnv environment (`pip install 'kernel-refinery[rl]'`).

    from kernel_refinery.bench.rl.openenv import make_app
    app = make_app(RunConfig(loop={"variant": "G+E", "turns": 3}), evaluator, tasks)
    # uvicorn.run(app): an OpenEnv client connects to /ws; each connection is one session

A session's `reset` takes `task` (a task's key or name; else the seed picks one of `tasks`) and answers
the first prompt; each `step` takes a ReplyAction (the model's text) and answers the next prompt,
the scalar reward, and the reward channels in `channels`. The channels travel as a field of the
observation, not in `metadata`: OpenEnv's serializer leaves metadata out of what the client receives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

try:
    from fastapi import FastAPI
    from openenv.core.env_server.http_server import create_fastapi_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State
except ImportError as exc:  # the extra is optional: say how to get it, not which module was missing
    raise ImportError(f"kernel_refinery.bench.rl.openenv needs OpenEnv: pip install 'kernel-refinery[rl]' ({exc})") from exc
from pydantic import Field

from kernel_refinery.agent.config import RunConfig
from kernel_refinery.agent.context import CandidateEvaluator
from kernel_refinery.bench.rl.env import EpisodeError, Message, RefineEpisode, RewardWeights, StepRecord
from kernel_refinery.bench.tasks import Task


class ReplyAction(Action):
    """The model's whole reply to the last prompt; the code is extracted as the loop does."""

    reply: str = Field(description="the model's reply text, with the kernel in a ```python block")


class KernelObservation(Observation):
    """The next prompt, and what the last reply earned."""

    messages: list[dict[str, str]] = Field(default_factory=list, description="the next prompt (role, content); empty once done")
    task: str = ""
    turn: int = Field(0, description="the turn the last reply answered (0 after reset)")
    verdict: str | None = None
    channels: dict[str, Any] = Field(
        default_factory=dict, description="compiled, correct, speedup, hack (kernel_refinery.bench.rl.env.RewardChannels)"
    )
    feedback: str = Field("", description="what the next prompt tells the model about the last reply")
    message: str = ""


class KernelState(State):
    task: str = ""
    variant: str = ""
    turns: int = 0


def _messages(messages: Sequence[Message]) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in messages]


class KernelRefineryEnv(Environment[ReplyAction, KernelObservation, KernelState]):
    """One session's episodes over `tasks`. Sessions share nothing but the evaluator, so several may run
    at once where it is thread-safe (a pool's `run` is); make_app's max_sessions decides."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(
        self,
        config: RunConfig,
        evaluator: CandidateEvaluator,
        tasks: Sequence[Task],
        hardware: str | None = None,
        weights: RewardWeights | None = None,
    ):
        super().__init__()
        if not tasks:
            raise ValueError("KernelRefineryEnv needs at least one task (bench.load_suite or bench.load_task gives them)")
        self.config, self.evaluator, self.tasks = config, evaluator, list(tasks)
        self.hardware, self.weights = hardware, weights
        self.episode: RefineEpisode | None = None

    def _pick(self, task: str | None, seed: int | None) -> Task:
        if task is None:
            return self.tasks[(seed or 0) % len(self.tasks)]
        for candidate in self.tasks:
            if task in (candidate.key, candidate.name):
                return candidate
        raise ValueError(f"no task {task!r} in this environment; it has {', '.join(t.key for t in self.tasks)}")

    def reset(self, seed: int | None = None, episode_id: str | None = None, task: str | None = None, **kwargs: Any) -> KernelObservation:
        chosen = self._pick(task, seed)
        self.episode = RefineEpisode(chosen, self.evaluator, self.config, self.hardware, self.weights)
        prompt = self.episode.reset(episode_id)
        return KernelObservation(messages=_messages(prompt), task=chosen.key, done=False, reward=None)

    def step(self, action: ReplyAction, timeout_s: float | None = None, **kwargs: Any) -> KernelObservation:
        if self.episode is None:
            raise EpisodeError("step before reset: send a reset first (its `task` picks the task)")
        record: StepRecord = self.episode.step(action.reply)
        return KernelObservation(
            messages=_messages(self.episode.observation),
            task=record.task,
            turn=record.turn,
            verdict=record.verdict.value,
            channels=record.channels.model_dump(),
            feedback=record.feedback,
            message=record.message,
            done=record.done,
            reward=record.reward,
        )

    @property
    def state(self) -> KernelState:
        episode = self.episode
        if episode is None:
            return KernelState()
        return KernelState(
            episode_id=episode.episode_id,
            step_count=len(episode.steps),
            task=episode.key,
            variant=str(episode.frame.variant),
            turns=episode.turns,
        )


def make_app(
    config: RunConfig,
    evaluator: CandidateEvaluator,
    tasks: Sequence[Task],
    hardware: str | None = None,
    weights: RewardWeights | None = None,
    max_sessions: int = 1,
) -> FastAPI:
    """OpenEnv's FastAPI server for these tasks: /ws for sessions (reset, step, state), plus its HTTP
    routes. More than one session needs an evaluator that is safe across threads (tools/processes/pool.py's EvaluatorPool)."""

    def factory() -> KernelRefineryEnv:
        return KernelRefineryEnv(config, evaluator, tasks, hardware, weights)

    return create_fastapi_app(factory, ReplyAction, KernelObservation, max_concurrent_envs=max_sessions)
