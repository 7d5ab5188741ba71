"""A quiet host on CPU with the embedded model: an LLM call and an evaluation never overlap, since a
kernel timed while the model's server decodes on the same cores is timed against the server."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from langchain_core.messages import AIMessage
from pydantic import Field
from structlog.testing import capture_logs

from kernel_refinery.agent.chat.llm import TASK_KEY
from kernel_refinery.agent.chat.scripted import ScriptedChatModel
from kernel_refinery.agent.config import ModelSettings, needs_quiet_host
from kernel_refinery.agent.quiet import QuietHost
from kernel_refinery.bench.experiment import ExperimentConfig, run_experiment
from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.tools.processes.quiet import BuildGate
from kernel_refinery.tools.results import EvalResult, Stage

Interval = tuple[float, float]
# Different lengths per task, so three trajectories do not fall into step by themselves.
SECONDS = {"1_relu": 0.03, "2_gelu": 0.05, "4_softmax": 0.08}
REPLY = "```python\nclass ModelNew:\n    pass\n```\n"


class TimedModel(ScriptedChatModel):
    """The scripted model, noting when each call ran."""

    intervals: list[Interval] = Field(default_factory=list)

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
        started = time.monotonic()
        time.sleep(SECONDS[str(run_manager.metadata[TASK_KEY]).rsplit("/", 1)[-1]])
        reply = super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)
        self.intervals.append((started, time.monotonic()))
        return reply


class TimedEvaluator:
    """Compiles every candidate and finds it incorrect, noting when each evaluation ran."""

    def __init__(self) -> None:
        self.intervals: list[Interval] = []

    def run(self, task: TaskProgram, candidate: str, stages: Any) -> EvalResult:
        started = time.monotonic()
        time.sleep(SECONDS[task.name])
        self.intervals.append((started, time.monotonic()))
        return EvalResult(status=None if Stage.COMPILE in stages else EvalStatus.INCORRECT)

    def nsight(self, task: TaskProgram, candidate: str) -> EvalResult:
        raise AssertionError("no Nsight pass under G+E")


@pytest.fixture()
def logs() -> Iterator[list[dict[str, Any]]]:
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        with capture_logs() as events:
            yield events
    finally:
        structlog.configure(**saved)


def overlaps(a: list[Interval], b: list[Interval]) -> list[tuple[Interval, Interval]]:
    return [(x, y) for x in a for y in b if x[0] < y[1] and y[0] < x[1]]


def experiment(tmp_path: Path, model: str) -> tuple[TimedModel, TimedEvaluator]:
    config = ExperimentConfig(
        tasks="[124]_[rgs]*",
        variants=["G+E"],
        concurrency=3,
        workers=1,
        loop={"turns": 3, "target_speedup": 1e9, "hardware_prompt": False},
        llm=ModelSettings(model=model),
        eval=EvalConfig(device="cpu"),
    )
    chat = TimedModel(responses=[AIMessage(content=REPLY)], intervals=[])
    evaluator = TimedEvaluator()
    records = run_experiment(config, tmp_path, chat, evaluator)
    assert len(records) == 3 and all(r.turns == 3 for r in records)
    assert len(chat.intervals) == 9 and len(evaluator.intervals) == 18
    return chat, evaluator


def test_the_rule() -> None:
    cpu, cuda = EvalConfig(device="cpu"), EvalConfig(device="cuda")
    assert needs_quiet_host(ModelSettings(model="local"), cpu) and needs_quiet_host(ModelSettings(model="local-0.5b"), cpu)
    assert not needs_quiet_host(ModelSettings(model="local"), cuda), "a GPU timing does not share the model's cores"
    assert not needs_quiet_host(ModelSettings(model="gpt-4o"), cpu) and not needs_quiet_host(ModelSettings(model="scripted:x"), cpu)


def test_embedded_model_on_cpu_never_overlaps_an_evaluation(tmp_path: Path, logs: list[dict[str, Any]]) -> None:
    chat, evaluator = experiment(tmp_path / "quiet", "local")
    assert overlaps(chat.intervals, evaluator.intervals) == []
    assert [e["event"] for e in logs].count("quiet_host") == 1, "said once per experiment, not per trajectory"


def test_elsewhere_they_overlap(tmp_path: Path, logs: list[dict[str, Any]]) -> None:
    """The check above has teeth: without the quiet host the same experiment overlaps them."""
    chat, evaluator = experiment(tmp_path / "remote", "gpt-test")
    assert overlaps(chat.intervals, evaluator.intervals) != []
    assert "quiet_host" not in [e["event"] for e in logs]


def test_kinds_take_turns_in_arrival_order() -> None:
    host = QuietHost()
    order: list[str] = []
    first_in = threading.Event()
    release = threading.Event()

    def call(kind: str, name: str, hold: threading.Event | None = None) -> None:
        with host.llm_call() if kind == "llm" else host.evaluation():
            order.append(f"{name} in")
            if hold is not None:
                first_in.set()
                hold.wait(5)
            order.append(f"{name} out")

    first = threading.Thread(target=call, args=("llm", "llm1", release))
    first.start()
    assert first_in.wait(5)
    waiting_eval = threading.Thread(target=call, args=("evaluation", "eval"))
    waiting_eval.start()
    time.sleep(0.1)
    late_llm = threading.Thread(target=call, args=("llm", "llm2"))
    late_llm.start()
    time.sleep(0.1)
    assert order == ["llm1 in"], "the evaluation waits for the call; a later call waits behind the evaluation"
    release.set()
    for t in (first, waiting_eval, late_llm):
        t.join(5)
    assert order == ["llm1 in", "llm1 out", "eval in", "eval out", "llm2 in", "llm2 out"]
    together: list[str] = []
    both_in = threading.Barrier(2, timeout=5)

    def same_kind(name: str) -> None:
        with host.evaluation():
            both_in.wait()  # breaks after 5 s if evaluations excluded each other
            together.append(name)

    pair = [threading.Thread(target=same_kind, args=(n,)) for n in ("a", "b")]
    for t in pair:
        t.start()
    for t in pair:
        t.join(5)
    assert sorted(together) == ["a", "b"]


def test_another_run_s_quiet_window_waits_for_an_llm_call_and_a_call_for_a_window(tmp_path: Path) -> None:
    """Two runs on one machine share its build gate (real flocks): a judge's window of another run
    opens only once the embedded model's call has ended, and a call waits while a window is open."""
    host = QuietHost(gate=BuildGate(tmp_path))
    events: list[str] = []
    in_call, end_call = threading.Event(), threading.Event()

    def llm_call() -> None:
        with host.llm_call():
            events.append("call in")
            in_call.set()
            end_call.wait(5)
            events.append("call out")

    def window() -> None:
        with BuildGate(tmp_path).hold():  # another run's judge, opening its own lock files
            events.append("window")

    caller = threading.Thread(target=llm_call)
    caller.start()
    assert in_call.wait(5)
    judge = threading.Thread(target=window)
    judge.start()
    time.sleep(0.3)
    assert events == ["call in"], "the window waits while the model decodes"
    end_call.set()
    caller.join(5)
    judge.join(5)
    assert events == ["call in", "call out", "window"]

    held = BuildGate(tmp_path).hold()
    called = threading.Event()

    def later_call() -> None:
        with host.llm_call():
            called.set()

    later = threading.Thread(target=later_call)
    later.start()
    assert not called.wait(0.3), "no call starts while a window is open"
    held.close()
    assert called.wait(5), "the call starts once the window has closed"
    later.join(5)
