from pathlib import Path

from langchain_core.messages import HumanMessage

from kernel_refinery.agent.chat.scripted import TASK_KEY, TURN_KEY, load_script


def ask(model, task: str, turn: int) -> str:
    return model.invoke([HumanMessage(content="x")], config={"metadata": {TURN_KEY: turn, TASK_KEY: task}}).content


def test_replies_by_task_and_turn(tmp_path: Path) -> None:
    script = tmp_path / "s.json"
    script.write_text('{"level1/a": ["a1"], "b": ["b1", "b2", "b3"]}')
    model = load_script(script)
    assert ask(model, "level1/a", 1) == "a1" and ask(model, "level1/a", 3) == "a1"
    # A task's own script length decides, not the first task's.
    assert [ask(model, "level1/b", t) for t in (1, 2, 3, 4)] == ["b1", "b2", "b3", "b3"]
    usage = model.invoke([HumanMessage(content="hello")]).usage_metadata
    assert usage is not None and usage["output_tokens"] >= 0
