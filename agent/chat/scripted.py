"""A scripted chat model: langchain_core's fake chat model, answering by turn.

Replies are chosen by the turn number the generate node passes in the call's metadata, so a
resumed run gets the same reply for the same turn as an uninterrupted one. Used by the tests
and by `--model scripted:FILE` (a JSON list of replies, or a folder of reply files).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field

from kernel_refinery.agent.chat.llm import TASK_KEY, TURN_KEY


class ScriptedChatModel(FakeMessagesListChatModel):
    """Reply k for turn k (the last reply repeats past the end); also reports token usage.

    `by_task` gives a task its own replies (keyed by task name or suite key, e.g. "level1/1_relu").
    """

    by_task: dict[str, list[str]] = Field(default_factory=dict)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        metadata = (run_manager.metadata if run_manager is not None else None) or {}
        if TURN_KEY in metadata:
            index = int(metadata[TURN_KEY]) - 1
        else:
            index = self.i
            self.i += 1
        task = str(metadata.get(TASK_KEY, ""))
        script = self.by_task.get(task, self.by_task.get(task.rsplit("/", 1)[-1]))
        if script is None:
            script = [r.content if isinstance(r.content, str) else str(r.content) for r in self.responses]
        text = script[min(index, len(script) - 1)]
        prompt_chars = sum(len(str(m.content)) for m in messages)
        usage = {"input_tokens": prompt_chars // 4, "output_tokens": len(text) // 4, "total_tokens": (prompt_chars + len(text)) // 4}
        message = AIMessage(content=text, usage_metadata=usage)
        return ChatResult(generations=[ChatGeneration(message=message)])

    @property
    def _llm_type(self) -> str:
        return "scripted"


def scripted_model(replies: list[str]) -> ScriptedChatModel:
    return ScriptedChatModel(responses=[AIMessage(content=r) for r in replies])


def load_script(path: Path) -> ScriptedChatModel:
    """Replies from a JSON list of strings (every task), a JSON object {task: [replies]}, or the
    sorted files of a folder."""
    path = Path(path)
    if path.is_dir():
        replies = [p.read_text() for p in sorted(path.iterdir()) if p.is_file()]
    elif path.suffix == ".json":
        replies = json.loads(path.read_text())
        if isinstance(replies, dict):
            by_task = {str(k): list(v) for k, v in replies.items()}
            first = next(iter(by_task.values()), [])
            return ScriptedChatModel(responses=[AIMessage(content=r) for r in first or ["(no reply)"]], by_task=by_task)
    else:
        raise ValueError(f"scripted model {path}: give a .json list of replies or a folder of reply files")
    if not replies or not all(isinstance(r, str) for r in replies):
        raise ValueError(f"scripted model {path}: no replies found")
    return scripted_model(replies)
