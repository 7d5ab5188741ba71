"""The refinement graph on CPU with scripted replies that are real C++ kernels."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from candidates import candidate

from kernel_refinery.agent.chat.llm import build_chat_model
from kernel_refinery.agent.chat.scripted import scripted_model
from kernel_refinery.agent.config import LoopSettings, ModelSettings, RunConfig
from kernel_refinery.agent.context import RunContext
from kernel_refinery.agent.graph import ROUTES, build_graph
from kernel_refinery.agent.nodes import AgentContext
from kernel_refinery.agent.runner import checkpoint_path, open_checkpointer, run_trajectory
from kernel_refinery.agent.state import Outcome, TaskSpec
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.evaluator import Evaluator
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.traces.schema import TrajectoryId
from kernel_refinery.traces.store import read_trace

BROKEN = candidate("return ext.relu_fwd(x)").replace(
    'cpp_source = r"""', 'cpp_source = r"""\nint broken_helper() { return undeclared_identifier; }', 1
)
WRONG = candidate("return ext.leaky_wrong(x)")
RIGHT = candidate("return ext.relu_fwd(x)")

UNDECLARED = ("was not declared", "use of undeclared identifier")
"""What GCC and clang say of an undeclared name."""


def reply(code: str, words: str = "Here is the kernel.") -> str:
    return f"{words}\n\n```python\n{code}```\n"


SCRIPT = [reply(BROKEN), reply(WRONG), reply(RIGHT)]


@pytest.fixture(scope="module")
def evaluator(cpu_config: EvalConfig):
    with Evaluator(cpu_config) as ev:
        yield ev


def make_config(cpu_config: EvalConfig, variant: str, turns: int = 5, target: float = 0.0) -> RunConfig:
    return RunConfig(
        llm=ModelSettings(model="scripted"),
        loop=LoopSettings(variant=variant, turns=turns, target_speedup=target, hardware_prompt=False),
        eval=cpu_config,
    )


def stream(
    config: RunConfig, replies: list[str], evaluator: Evaluator, relu_task: TaskProgram, run_dir: Path
) -> tuple[list[str], dict[str, Any]]:
    """Run the graph, returning the nodes in the order visited (the turn subgraph's, then decide) and the final state."""
    graph = build_graph()
    ctx = AgentContext(
        run=RunContext(config=config, model=scripted_model(replies), evaluator=evaluator, run_dir=run_dir, run_id="test"),
        trajectory=TrajectoryId(task="relu", variant=str(config.loop.variant)),
    )
    visited: list[str] = []
    task = TaskSpec(name=relu_task.name, source=relu_task.source, level=1)
    for _, update in graph.stream({"task": task}, {"recursion_limit": 100}, context=ctx, stream_mode="updates", subgraphs=True):
        visited.extend(name for name in update if name != "turn")
    records = read_trace(next((run_dir / "traces").glob("*.jsonl")))
    return visited, {"records": records}


def prompt_of(record: Any) -> str:
    return next(m.content for m in record.messages if m.role == "human")


def test_every_outcome_is_routed() -> None:
    routed = {outcome for table in ROUTES.values() for outcome in table}
    assert set(Outcome) == routed, "every outcome a node returns leads somewhere, and none is left over"


def test_compile_error_then_wrong_then_correct_under_G_E(
    cpu_config: EvalConfig, evaluator: Evaluator, relu_task: TaskProgram, tmp_path: Path
) -> None:
    visited, out = stream(make_config(cpu_config, "G+E"), SCRIPT, evaluator, relu_task, tmp_path)
    assert visited == [
        "generate",
        "extract",
        "compile",
        "record",
        "decide",
        "generate",
        "extract",
        "compile",
        "execute",
        "record",
        "decide",
        "generate",
        "extract",
        "compile",
        "execute",
        "profile",
        "record",
        "decide",
    ]
    first, second, third = out["records"]
    assert first.status == "compile_error" and second.status == "incorrect" and third.status == "correct"
    # The next prompt carries the actual compiler error, then the actual diff.
    # GCC says "was not declared", clang "use of undeclared identifier" (tools/steps/pch.py picks the compiler).
    assert "undeclared_identifier" in prompt_of(second) and any(said in prompt_of(second) for said in UNDECLARED)
    assert "failed to compile" in prompt_of(second)
    diff = second.result.correctness.mismatches[0]
    assert f"expected {diff.expected:.6g} got {diff.actual:.6g}" in prompt_of(third)
    assert "wrong results" in prompt_of(third)
    # Early stop at the target: 3 of 5 turns used.
    assert len(out["records"]) == 3
    assert third.result.timing is not None and third.tokens.total > 0


def test_G_carries_the_previous_code_but_no_evaluation(
    cpu_config: EvalConfig, evaluator: Evaluator, relu_task: TaskProgram, tmp_path: Path
) -> None:
    _, out = stream(make_config(cpu_config, "G"), SCRIPT, evaluator, relu_task, tmp_path)
    _, second, third = out["records"]
    assert "undeclared_identifier" in prompt_of(second), "the previous attempt's code is shown"
    assert not any(said in prompt_of(second) for said in UNDECLARED) and "failed to compile" not in prompt_of(second)
    assert "wrong results" not in prompt_of(third) and "expected 0 got" not in prompt_of(third)
    assert "leaky_wrong" in prompt_of(third)


def test_G_E_P_carries_the_profiler_table(cpu_config: EvalConfig, evaluator: Evaluator, relu_task: TaskProgram, tmp_path: Path) -> None:
    config = make_config(cpu_config, "G+E+P", turns=2, target=1e9)
    _, out = stream(config, [reply(RIGHT), reply(RIGHT)], evaluator, relu_task, tmp_path / "p")
    second = out["records"][1]
    assert "top operators by self CPU time" in prompt_of(second)
    assert "kernel::relu_fwd" in prompt_of(second)
    assert "speedup" in prompt_of(second)
    _, plain = stream(
        make_config(cpu_config, "G+E", turns=2, target=1e9), [reply(RIGHT), reply(RIGHT)], evaluator, relu_task, tmp_path / "e"
    )
    assert "top operators" not in prompt_of(plain["records"][1])
    assert "speedup" in prompt_of(plain["records"][1])


def test_budget_is_respected(cpu_config: EvalConfig, evaluator: Evaluator, relu_task: TaskProgram, tmp_path: Path) -> None:
    model = scripted_model([reply(WRONG)])
    config = make_config(cpu_config, "G+E", turns=2)
    result = run_trajectory(
        RunContext(config=config, model=model, evaluator=evaluator, run_dir=tmp_path, run_id="t"),
        TaskSpec(name="relu", source=relu_task.source),
        TrajectoryId(task="relu", variant="G+E"),
    )
    assert result.turns == 2 and result.best is None
    assert model.i == 0, "replies are chosen by turn, not by a call counter"
    assert len(read_trace(result.trace)) == 2


def test_reply_without_code_is_fed_back_and_counts(
    cpu_config: EvalConfig, evaluator: Evaluator, relu_task: TaskProgram, tmp_path: Path
) -> None:
    replies = ["I would use OpenMP and vectorise the loop.", reply(RIGHT)]
    visited, out = stream(make_config(cpu_config, "G+E", turns=3), replies, evaluator, relu_task, tmp_path)
    assert visited[:4] == ["generate", "extract", "record", "decide"]
    first, second = out["records"]
    assert first.status == "no_code" and first.turn == 1
    assert "no ```python code block" in prompt_of(second)
    assert "I would use OpenMP" in prompt_of(second)
    assert second.status == "correct"


class CrashOnce:
    """An evaluator that dies in the middle of one turn, as a killed process would."""

    def __init__(self, inner: Evaluator, crash_on_call: int):
        self.inner = inner
        self.calls = 0
        self.crash_on_call = crash_on_call

    def run(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == self.crash_on_call:
            raise KeyboardInterrupt("simulated kill in the middle of a turn")
        return self.inner.run(*args, **kwargs)


def test_interrupted_run_resumes_at_the_turn_in_flight(
    cpu_config: EvalConfig, evaluator: Evaluator, relu_task: TaskProgram, tmp_path: Path
) -> None:
    config = make_config(cpu_config, "G+E", turns=5)
    task = TaskSpec(name="relu", source=relu_task.source)
    trajectory = TrajectoryId(task="relu", variant="G+E")
    model = scripted_model(SCRIPT)
    # Calls: turn 1 compile; turn 2 compile, execute (crash here).
    crashing = CrashOnce(evaluator, crash_on_call=3)
    with pytest.raises(KeyboardInterrupt):
        run_trajectory(RunContext(config=config, model=model, evaluator=crashing, run_dir=tmp_path, run_id="r"), task, trajectory)  # type: ignore[arg-type]  # CrashOnce wraps an Evaluator without subclassing it
    assert [r.turn for r in read_trace(tmp_path / "traces" / f"{trajectory.slug}.jsonl")] == [1]

    prompts_seen: list[int] = []
    resumed_model = scripted_model(SCRIPT)
    original = resumed_model._generate

    def spy(messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any) -> Any:
        prompts_seen.append(run_manager.metadata["refinery_turn"])
        return original(messages, stop=stop, run_manager=run_manager, **kw)

    object.__setattr__(resumed_model, "_generate", spy)
    result = run_trajectory(
        RunContext(config=config, model=resumed_model, evaluator=evaluator, run_dir=tmp_path, run_id="r"), task, trajectory
    )
    # Turn 2 resumed at execute (its reply came from the checkpoint); only turn 3 was generated.
    assert prompts_seen == [3]
    records = read_trace(result.trace)
    assert [r.turn for r in records] == [1, 2, 3]
    assert [r.status for r in records] == ["compile_error", "incorrect", "correct"]
    assert result.best is not None and result.best.turn == 3


def test_parallel_trajectories_share_a_fresh_checkpoint_file(tmp_path: Path) -> None:
    # Switching a new file to WAL from several threads at once failed now and then (about one
    # run in twenty) with "database is locked": SQLite skips its busy timeout for that upgrade.
    for attempt in range(100):
        run_dir = tmp_path / str(attempt)
        start = threading.Barrier(8)
        errors: list[BaseException] = []

        def open_and_write(i: int) -> None:
            try:
                start.wait()  # noqa: B023 - the threads are joined within this iteration
                with closing(open_checkpointer(run_dir).conn) as conn:  # noqa: B023 - as above
                    conn.execute("CREATE TABLE IF NOT EXISTS marks (thread INTEGER)")
                    conn.execute("INSERT INTO marks VALUES (?)", (i,))
                    conn.commit()
            except sqlite3.Error as exc:
                errors.append(exc)  # noqa: B023 - as above

        threads = [threading.Thread(target=open_and_write, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [], f"attempt {attempt}: {errors[0]}"
        with closing(sqlite3.connect(checkpoint_path(run_dir))) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert conn.execute("SELECT count(*) FROM marks").fetchone()[0] == 8


def _cut_checkpoints_after(run_dir: Path, thread_id: str, node: str, turn: int) -> None:
    """Leave the checkpoint file as a kill would: `node` of `turn` ran and its writes were
    saved, but the checkpoint that applies them, and all after it, were never written."""
    with closing(sqlite3.connect(checkpoint_path(run_dir))) as conn:
        rows = conn.execute("SELECT checkpoint_id FROM checkpoints WHERE thread_id = ? ORDER BY checkpoint_id", (thread_id,)).fetchall()
        ids = [r[0] for r in rows]
        with_node = [
            cid
            for cid in ids
            if conn.execute(
                "SELECT count(*) FROM writes WHERE thread_id = ? AND checkpoint_id = ? AND channel = 'outcome' AND task_path LIKE ?",
                (thread_id, cid, f"%{node}%"),
            ).fetchone()[0]
        ]
        cut = with_node[turn - 1]
        later = ids[ids.index(cut) + 1 :]
        conn.executemany("DELETE FROM checkpoints WHERE thread_id = ? AND checkpoint_id = ?", [(thread_id, c) for c in later])
        conn.executemany("DELETE FROM writes WHERE thread_id = ? AND checkpoint_id = ?", [(thread_id, c) for c in later])
        conn.commit()


def test_kill_between_saved_writes_and_next_checkpoint_resumes(
    cpu_config: EvalConfig, evaluator: Evaluator, relu_task: TaskProgram, tmp_path: Path
) -> None:
    config = make_config(cpu_config, "G+E", turns=3)
    task = TaskSpec(name="relu", source=relu_task.source)
    trajectory = TrajectoryId(task="relu", variant="G+E")
    run_trajectory(
        RunContext(config=config, model=scripted_model(SCRIPT), evaluator=evaluator, run_dir=tmp_path, run_id="r"), task, trajectory
    )
    # Killed just after turn 1's decide: its trace line and its writes are saved, its checkpoint is not.
    _cut_checkpoints_after(tmp_path, trajectory.slug, "decide", turn=1)
    trace = tmp_path / "traces" / f"{trajectory.slug}.jsonl"
    trace.write_text(trace.read_text().split("\n", 1)[0] + "\n")
    saver = open_checkpointer(tmp_path)
    with closing(saver.conn):
        snapshot = build_graph(checkpointer=saver).get_state({"configurable": {"thread_id": trajectory.slug}})
    assert snapshot.next == () and snapshot.tasks, "the cut must leave LangGraph's 'no next node, task pending' state"

    result = run_trajectory(
        RunContext(config=config, model=scripted_model(SCRIPT), evaluator=evaluator, run_dir=tmp_path, run_id="r"), task, trajectory
    )
    records = read_trace(result.trace)
    assert [r.turn for r in records] == [1, 2, 3]
    assert [r.status for r in records] == ["compile_error", "incorrect", "correct"]
    assert result.turns == 3 and result.best is not None and result.best.turn == 3


def test_api_key_never_reaches_traces_or_logs(
    cpu_config: EvalConfig,
    evaluator: Evaluator,
    relu_task: TaskProgram,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks.soak.fake_server import FaultPlan, ServerLog, serve

    secret = "sk-refinery-test-0123456789abcdef"
    monkeypatch.setenv("REFINERY_TEST_KEY", secret)
    log = ServerLog()
    with serve([reply(RIGHT)], log, FaultPlan(first=("http_429", "http_500"), retry_after_s=0)) as url:
        settings = ModelSettings(model="gpt-test", base_url=url, api_key_env="REFINERY_TEST_KEY", retries=4)
        config = RunConfig(llm=settings, loop=LoopSettings(variant="G+E", turns=1, hardware_prompt=False), eval=cpu_config)
        result = run_trajectory(
            RunContext(config=config, model=build_chat_model(settings), evaluator=evaluator, run_dir=tmp_path, run_id="k"),
            TaskSpec(name="relu", source=relu_task.source),
            TrajectoryId(task="relu", variant="G+E"),
        )
    assert log.auth_headers[-1] == f"Bearer {secret}", "the key was used for the call"
    assert log.requests == 3, "429 and 500 were retried"
    assert result.best is not None
    everything = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert secret.encode() not in everything
    assert secret not in capsys.readouterr().out


def test_unfinished_checkpoint_of_the_older_flat_loop_starts_again(
    cpu_config: EvalConfig, evaluator: Evaluator, relu_task: TaskProgram, tmp_path: Path
) -> None:
    """Before the turn subgraph, generate, extract, compile... were the loop's own nodes: a run killed
    mid-turn then cannot resume inside today's turn, and must not read as finished either."""
    from langgraph.graph import START, StateGraph

    from kernel_refinery.agent.state import RefineState

    def old_generate(state: Any) -> dict[str, Any]:
        return {"turn": 1, "outcome": Outcome.CODE}

    def old_compile(state: Any) -> dict[str, Any]:
        raise KeyboardInterrupt("killed in the older loop's compile node")

    old = StateGraph(RefineState)
    old.add_node("generate", old_generate)
    old.add_node("compile", old_compile)
    old.add_edge(START, "generate")
    old.add_edge("generate", "compile")
    trajectory = TrajectoryId(task="relu", variant="G+E")
    saver = open_checkpointer(tmp_path)
    with closing(saver.conn), pytest.raises(KeyboardInterrupt):
        old.compile(checkpointer=saver).invoke(
            {"task": TaskSpec(name="relu", source=relu_task.source)}, {"configurable": {"thread_id": trajectory.slug}}
        )

    config = make_config(cpu_config, "G+E", turns=2, target=1e9)
    result = run_trajectory(
        RunContext(config=config, model=scripted_model(["no code today"]), evaluator=evaluator, run_dir=tmp_path, run_id="r"),
        TaskSpec(name="relu", source=relu_task.source),
        trajectory,
    )
    assert result.turns == 2 and [r.status for r in read_trace(result.trace)] == ["no_code", "no_code"]


@pytest.mark.parametrize(("temperature", "requests"), [(0.0, 1), (0.7, 2)])
def test_a_greedy_prompt_sent_twice_is_answered_once(temperature: float, requests: int) -> None:
    """At temperature 0 every variant's turn 1 is the same prompt: it reaches the endpoint once."""
    from langchain_core.messages import HumanMessage

    from benchmarks.soak.fake_server import ServerLog, serve
    from kernel_refinery.agent.chat.llm import call_model

    log = ServerLog()
    with serve(["first reply", "second reply"], log) as url:
        settings = ModelSettings(model="gpt-test", base_url=url, api_key_env="REFINERY_NO_KEY", temperature=temperature)
        model = build_chat_model(settings)
        replies = [call_model(model, [HumanMessage("write relu")], settings).text for _ in range(2)]
        other = call_model(model, [HumanMessage("write gelu")], settings).text
    assert log.requests == requests + 1
    assert replies == (["first reply"] * 2 if temperature == 0 else ["first reply", "second reply"])
    assert other != replies[0], "a different prompt is a new call"
