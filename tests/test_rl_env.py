"""The evaluator as an RL environment (bench/rl/env.py, and its OpenEnv binding bench/rl/openenv.py):
scripted episodes on the built-in CPU task level1/1_relu with real C++ candidates that share one build
(tests/candidates.py), so the whole module compiles at most once."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import hacks
import pytest
from candidates import candidate

from kernel_refinery import load_task
from kernel_refinery.agent.config import RunConfig
from kernel_refinery.agent.prompting import PromptFrame
from kernel_refinery.bench.rl.env import (
    EpisodeError,
    Message,
    RefineEpisode,
    RewardChannels,
    RewardWeights,
    read_jsonl,
    run_episode,
    write_jsonl,
)
from kernel_refinery.core.verdict import Verdict
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.evaluator import Evaluator

RELU = load_task("level1/1_relu")
HACK = f"Deferred work:\n```python\n{hacks.lazy(candidate)}```"  # a tensor subclass: the static check rejects it
WRONG = f"```python\n{candidate('return ext.leaky_wrong(x)')}```"
FIXED = f"Fixed:\n```python\n{candidate('return ext.relu_fwd(x)')}```"
NO_CODE = "I would write a ReLU kernel with OpenMP."


@pytest.fixture(scope="module")
def settings(cache_dir: Path) -> EvalConfig:
    return EvalConfig(device="cpu", trials=5, warmup=1, correctness_trials=2, time_compiled_reference=False, cache_dir=cache_dir)


@pytest.fixture(scope="module")
def evaluator(settings: EvalConfig) -> Iterator[Evaluator]:
    with Evaluator(settings) as ev:
        yield ev


def run_config(settings: EvalConfig, variant: str, turns: int = 3) -> RunConfig:
    return RunConfig.model_validate({"loop": {"variant": variant, "turns": turns, "hardware_prompt": False}, "eval": settings})


def test_an_episode_gives_each_channel_the_hack_penalty_and_the_loops_feedback(
    settings: EvalConfig, evaluator: Evaluator, tmp_path: Path
) -> None:
    config = run_config(settings, "G+E")
    episode = RefineEpisode(RELU, evaluator, config)
    with pytest.raises(EpisodeError, match="call reset"):
        episode.step(FIXED)
    first = episode.reset("ep-1")
    loop_prompt = PromptFrame.of(config, None).turn(episode.spec, 1, 3, None)
    assert first == tuple(Message(role=m.type, content=str(m.content)) for m in loop_prompt), "the loop's own first prompt"

    hack = episode.step(HACK)
    assert hack.verdict is Verdict.REJECTED and "tensor subclass" in hack.message
    assert hack.channels == RewardChannels(compiled=False, correct=False, speedup=None, hack=True)
    assert hack.reward == pytest.approx(-1.0) and not hack.done
    assert hack.feedback and hack.feedback in episode.observation[-1].content, "the rejection is told in the next prompt"

    wrong = episode.step(WRONG)
    assert wrong.verdict is Verdict.INCORRECT and wrong.turn == 2
    assert wrong.channels == RewardChannels(compiled=True, correct=False, speedup=None, hack=False, general=False)
    assert wrong.reward == pytest.approx(0.1)
    assert "trial" in wrong.feedback and wrong.feedback in episode.observation[-1].content
    assert "ext.leaky_wrong(x)" in episode.observation[-1].content, "the next prompt shows the previous code"

    fixed = episode.step(FIXED)
    assert fixed.verdict is Verdict.CORRECT and fixed.done, "turn 3 of 3 ends the episode"
    speedup = fixed.channels.speedup
    assert fixed.channels.compiled and fixed.channels.correct and not fixed.channels.hack and speedup is not None and speedup > 0
    assert fixed.reward == pytest.approx(0.1 + 1.0 + 0.5 * math.log2(speedup))
    # A generic ReLU passes the task's shape variants: its own channel, weighed 0 unless a trainer asks.
    assert fixed.channels.general is True and hack.channels.general is None and wrong.channels.general is False
    assert RewardWeights(general=0.5).combine(fixed.channels) == pytest.approx(fixed.reward + 0.5)
    assert episode.observation == ()
    with pytest.raises(EpisodeError, match="has ended"):
        episode.step(FIXED)

    export = tmp_path / "episodes.jsonl"
    assert write_jsonl(export, episode.steps) == 3
    lines = [json.loads(line) for line in export.read_text().splitlines()]
    expected = [(1, "rejected", True), (2, "incorrect", False), (3, "correct", False)]
    assert [(d["turn"], d["verdict"], d["channels"]["hack"]) for d in lines] == expected
    assert {d["episode_id"] for d in lines} == {"ep-1"} and {d["variant"] for d in lines} == {"G+E"}
    assert lines[0]["prompt"][0]["role"] == "system" and lines[2]["reply"] == FIXED and "result" not in lines[0]
    assert list(read_jsonl(export)) == [s.model_copy(update={"result": None}) for s in episode.steps]
    export.write_text("{}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"episodes.jsonl:1: not a step record"):
        list(read_jsonl(export))


def test_variant_g_tells_form_problems_but_no_verdicts(settings: EvalConfig, evaluator: Evaluator) -> None:
    """No compile: a reply without code, then a rejected one; G shows the first's problem, not the second's verdict."""
    episode = RefineEpisode(RELU, evaluator, run_config(settings, "G", turns=2), weights=RewardWeights(hack=5.0))
    no_code, hack = run_episode(episode, [NO_CODE, HACK, FIXED])
    assert no_code.verdict is Verdict.NO_CODE and no_code.reward == 0.0 and no_code.channels.compiled is False
    assert "no ```python code block" in no_code.feedback
    assert hack.turn == 2 and hack.done and hack.reward == pytest.approx(-5.0) and hack.feedback == "", "G gives no evaluation feedback"
    assert len(episode.steps) == 2, "the reply after the last turn is not used"


def test_openenv_server_runs_an_episode_over_its_websocket(settings: EvalConfig, evaluator: Evaluator) -> None:
    pytest.importorskip("openenv", reason="the rl extra: pip install 'kernel-refinery[rl]'")
    from fastapi.testclient import TestClient

    from kernel_refinery.bench.rl.openenv import make_app

    app = make_app(run_config(settings, "G+E", turns=2), evaluator, [load_task("level1/2_gelu"), RELU])
    with TestClient(app) as client, client.websocket_connect("/ws") as ws:
        ws.send_json({"type": "step", "data": {"reply": FIXED}})
        refused = ws.receive_json()
        assert refused["type"] == "error" and "reset first" in json.dumps(refused)

        ws.send_json({"type": "reset", "data": {"task": "1_relu"}})
        reset = ws.receive_json()["data"]
        assert reset["observation"]["task"] == "level1/1_relu" and reset["done"] is False
        assert [m["role"] for m in reset["observation"]["messages"]] == ["system", "human"]

        ws.send_json({"type": "step", "data": {"reply": HACK}})
        hack = ws.receive_json()["data"]
        assert hack["reward"] == pytest.approx(-1.0) and hack["done"] is False
        assert hack["observation"]["channels"] == {"compiled": False, "correct": False, "speedup": None, "hack": True, "general": None}
        assert hack["observation"]["verdict"] == "rejected"
        assert hack["observation"]["feedback"] in hack["observation"]["messages"][-1]["content"]

        ws.send_json({"type": "step", "data": {"reply": FIXED}})
        fixed = ws.receive_json()["data"]
        assert fixed["done"] is True and fixed["observation"]["verdict"] == "correct"
        assert fixed["observation"]["channels"]["correct"] is True and fixed["observation"]["channels"]["speedup"] > 0
        assert fixed["observation"]["channels"]["general"] is True

        ws.send_json({"type": "state"})
        state = ws.receive_json()["data"]
        assert state["task"] == "level1/1_relu" and state["step_count"] == 2 and state["variant"] == "G+E"
