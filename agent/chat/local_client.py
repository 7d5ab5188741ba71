"""The chat client for llama-cpp-python's OpenAI-compatible server: ChatOpenAI with two request fixes.

The agent keeps one client path for every endpoint; only the request payload differs here.
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models import LanguageModelInput
from langchain_openai import ChatOpenAI

# The server accepts any key; ChatOpenAI refuses to start without one.
LOCAL_API_KEY = "local-no-key"


class LocalChatOpenAI(ChatOpenAI):
    """ChatOpenAI for llama-cpp-python's server, which differs from OpenAI in two request fields.

    - It ignores `max_completion_tokens` (generating up to n_ctx), so the limit goes as `max_tokens`.
    - An assistant message with `content: null` (langchain sends one with tool calls) is an HTTP 500.
    """

    def _get_request_payload(self, input_: LanguageModelInput, *, stop: list[str] | None = None, **kwargs: Any) -> dict[str, Any]:
        payload: dict[str, Any] = super()._get_request_payload(input_, stop=stop, **kwargs)
        if "max_completion_tokens" in payload:
            payload["max_tokens"] = payload.pop("max_completion_tokens")
        for message in payload.get("messages", []):
            if message.get("role") == "assistant" and message.get("content") is None:
                message["content"] = ""
        return payload
