"""Opening the chat model a run asks for: a remote endpoint, the embedded model, or a script."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from langchain_core.language_models import BaseChatModel

from kernel_refinery.agent.chat.llm import build_chat_model
from kernel_refinery.agent.config import ModelSettings

EMBEDDED = ("local", "local-0.5b")


@contextmanager
def open_chat_model(settings: ModelSettings, threads: int | None = None) -> Iterator[BaseChatModel]:
    """The model for the run's span; the embedded server is started and stopped around it.

    `--model local --set llm.base_url=URL` reuses a server from `refinery serve-local` instead of starting one.
    """
    if settings.model.startswith("scripted:"):
        from kernel_refinery.agent.chat.scripted import load_script

        yield load_script(Path(settings.model.removeprefix("scripted:")))
        return
    if settings.model in EMBEDDED:
        if settings.base_url is not None:
            yield build_chat_model(settings, base_url=settings.base_url)
            return
        from kernel_refinery.agent.chat.local_model import LocalServer

        with LocalServer(settings.model, threads=threads) as server:
            yield build_chat_model(settings, base_url=server.base_url)
        return
    yield build_chat_model(settings)
