"""The refinement loop as an RL environment, independent of any RL library (issue 31).

An episode is one refinement trajectory on one task. The observation is the prompt the loop would
send for the turn (agent/prompting.py's PromptFrame, so the feedback variant G, G+E or G+E+P shapes
it exactly as in an experiment); the action is the model's reply as text. A step extracts the code
(agent/extract.py), runs the evaluator's stages in the loop's order (agent/nodes.py: static check and
compile, correctness, then timing and profile) and answers with the reward channels and the next
prompt, whose feedback is the loop's own (agent/prompting.turn_feedback).

    episode = RefineEpisode(task, evaluator, RunConfig(loop={"variant": "G+E", "turns": 3}))
    messages = episode.reset()
    while not episode.done:
        step = episode.step(policy(messages))
        messages = step.observation
    write_jsonl(path, episode.steps)

Reward channels (RewardChannels) stay separate in every step so a trainer can shape its own; the
scalar `reward` is RewardWeights.combine, documented there. A library binding (bench/rl/openenv.py)
wraps this module and adds nothing to the rules.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from kernel_refinery.agent.config import RunConfig
from kernel_refinery.agent.context import CandidateEvaluator
from kernel_refinery.agent.extract import extract_candidate
from kernel_refinery.agent.prompting import PromptFrame, turn_feedback
from kernel_refinery.agent.state import Attempt, TaskSpec
from kernel_refinery.bench.tasks import Task
from kernel_refinery.core.verdict import EvalStatus, Verdict
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.tools.results import EvalResult, Stage
from kernel_refinery.traces.schema import TraceMessage

# The loop's stage groups (agent/nodes.py compile_candidate, execute, profile): a failed group ends the evaluation.
_STAGE_GROUPS: tuple[tuple[Stage, ...], ...] = ((Stage.STATIC, Stage.COMPILE), (Stage.CORRECTNESS,), (Stage.TIMING, Stage.PROFILE))


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RewardChannels(Frozen):
    """What one reply earned, channel by channel; a trainer may weigh them as it likes."""

    compiled: bool
    """The code built (a guard's rejection or a missing code block is not compiled)."""
    correct: bool
    """Correct on every check and timed."""
    speedup: float | None
    """Reference time / candidate time, when correct; None otherwise."""
    hack: bool
    """A guard rejected the candidate (EvalStatus.REJECTED: the static check or a timing guard)."""
    general: bool | None = None
    """Correct, and correct on every shape and init variant of the task's constants that applies
    (CorrectnessReport.shapes): not specialised to the task's sizes. False for a candidate that
    failed its correctness check with the variants on; None where no correctness check ran or the
    variants were off (EvalConfig.shapes "off")."""

    @classmethod
    def of(cls, result: EvalResult | None, correct: bool, speedup: float | None) -> RewardChannels:
        status = result.status if result is not None else None
        shapes = result.correctness.shapes if result is not None and result.correctness is not None else None
        return cls(
            compiled=status is not None and status.compiled,
            correct=correct,
            speedup=speedup,
            hack=status is EvalStatus.REJECTED,
            general=(correct and shapes.general) if shapes is not None else None,
        )


class RewardWeights(Frozen):
    """How `combine` folds the channels into the scalar reward:

        reward = compiled·w_compiled + correct·w_correct + log2(speedup)·w_speedup (correct only) − hack·w_hack
                 + general·w_general

    log2 makes a 2× speedup and a 2× slowdown equal and opposite; a correct but slower kernel still
    earns more than an incorrect one while it is within a factor 2^(w_correct/w_speedup) of the
    reference (4× by default). A hack scores below every honest failure, a reply without code included.
    w_general is 0 by default, so the scalar is KernelBench's notion of correct; a trainer that wants
    kernels general across sizes raises it (or evaluates with eval.shapes = "require", where a kernel
    failing a variant is not correct at all)."""

    compiled: float = 0.1
    correct: float = 1.0
    speedup: float = 0.5
    hack: float = 1.0
    general: float = 0.0

    def combine(self, channels: RewardChannels) -> float:
        reward = self.compiled * channels.compiled + self.correct * channels.correct - self.hack * channels.hack
        reward += self.general * (channels.general is True)
        if channels.correct and channels.speedup is not None and channels.speedup > 0:
            reward += self.speedup * math.log2(channels.speedup)
        return reward


class Message(Frozen):
    role: str
    """system or human, as LangChain names them (the refinement loop's traces use the same)."""
    content: str


class StepRecord(Frozen):
    """One turn of an episode: what a trainer stores, and one line of the JSONL export."""

    episode_id: str
    task: str
    variant: str
    turn: int
    prompt: tuple[Message, ...]
    """The observation the reply answered."""
    reply: str
    code: str | None
    extract_error: str | None
    verdict: Verdict
    message: str = ""
    """The evaluator's message for a failure (a rejection's reasons, a compiler error's head)."""
    channels: RewardChannels
    reward: float
    done: bool
    feedback: str = ""
    """What the next prompt tells the model of this turn (empty in variant G when the code was evaluated)."""
    result: EvalResult | None = Field(default=None, exclude=True)
    """The full verdict, for a caller in-process; not exported (traces hold it)."""


class EpisodeError(RuntimeError):
    """The episode was driven out of order: a step before reset, or after it ended."""


def _messages(frame: PromptFrame, task: TaskSpec, turn: int, turns: int, previous: Attempt | None) -> tuple[Message, ...]:
    return tuple(Message(role=m.type, content=str(m.content)) for m in frame.turn(task, turn, turns, previous))


class RefineEpisode:
    """One task's refinement trajectory, one reply at a time. Not thread-safe: one episode per caller;
    the evaluator may be shared (tools/processes/pool.py's EvaluatorPool is)."""

    def __init__(
        self,
        task: Task,
        evaluator: CandidateEvaluator,
        config: RunConfig,
        hardware: str | None = None,
        weights: RewardWeights | None = None,
    ):
        self.spec = TaskSpec(name=task.name, source=task.source_for(config.eval.device), level=task.level)
        self.key = task.key
        self.evaluator = evaluator
        self.config = config
        self.frame = PromptFrame.of(config, hardware)
        self.weights = weights or RewardWeights()
        self.episode_id = ""
        self.attempts: list[Attempt] = []
        self.steps: list[StepRecord] = []
        self.observation: tuple[Message, ...] = ()
        self.done = True

    @property
    def turns(self) -> int:
        return self.config.loop.turns

    def reset(self, episode_id: str | None = None) -> tuple[Message, ...]:
        """Start again at turn 1: the first prompt, with no history."""
        self.episode_id = episode_id or uuid.uuid4().hex[:12]
        self.attempts, self.steps, self.done = [], [], False
        self.observation = _messages(self.frame, self.spec, 1, self.turns, None)
        return self.observation

    def _evaluate(self, code: str) -> EvalResult:
        program = TaskProgram(name=self.spec.name, source=self.spec.source)
        result: EvalResult | None = None
        for stages in _STAGE_GROUPS:
            found = self.evaluator.run(program, code, stages)
            result = found if result is None else result.merge(found)
            if result.status not in (None, EvalStatus.CORRECT):
                break
        assert result is not None
        if self.frame.variant.nsight and result.correct:
            result = result.merge(self.evaluator.nsight(program, code))
        return result

    def step(self, reply: str) -> StepRecord:
        """Judge one reply; `self.observation` is then the next prompt (empty once done)."""
        if self.done:
            raise EpisodeError("the episode has ended (or never started): call reset() first")
        turn = len(self.attempts) + 1
        found = extract_candidate(reply)
        result = self._evaluate(found.code) if found.code is not None else None
        attempt = Attempt(
            turn=turn,
            messages=tuple(TraceMessage(role=m.role, content=m.content) for m in self.observation),
            reply=reply,
            code=found.code,
            extract_error=found.problem,
            result=result,
        )
        self.attempts.append(attempt)
        channels = RewardChannels.of(result, attempt.correct, attempt.speedup)
        # The loop's decide node: stop at the target speedup or at the last turn.
        self.done = attempt.reaches(self.config.loop.target_speedup) or turn >= self.turns
        record = StepRecord(
            episode_id=self.episode_id,
            task=self.key,
            variant=str(self.frame.variant),
            turn=turn,
            prompt=self.observation,
            reply=reply,
            code=found.code,
            extract_error=found.problem,
            verdict=attempt.verdict,
            message=result.message if result is not None else (found.problem or ""),
            channels=channels,
            reward=self.weights.combine(channels),
            done=self.done,
            feedback=turn_feedback(attempt, self.frame.variant),
            result=result,
        )
        self.steps.append(record)
        self.observation = () if self.done else _messages(self.frame, self.spec, turn + 1, self.turns, attempt)
        return record


def run_episode(episode: RefineEpisode, policy: Iterable[str]) -> list[StepRecord]:
    """Reset, then step with each reply of `policy` until the episode ends (a scripted policy, or a
    sampler that yields replies); replies left over are not used."""
    episode.reset()
    for reply in policy:
        episode.step(reply)
        if episode.done:
            break
    return list(episode.steps)


def write_jsonl(path: Path, steps: Iterable[StepRecord]) -> int:
    """Append each step as one JSON line (prompt, reply, channels, reward, verdict); returns how many."""
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("a", encoding="utf-8") as out:
        for step in steps:
            out.write(step.model_dump_json() + "\n")
            count += 1
    return count


def read_jsonl(path: Path) -> Iterator[StepRecord]:
    """The steps of a JSONL export, in file order; a bad line names its number."""
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                yield StepRecord.model_validate(json.loads(line))
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not a step record of kernel_refinery.bench.rl.env ({exc})") from exc
