"""The chat model: one ChatOpenAI code path for every endpoint, with retries that suit each error.

Rate limits, timeouts, dropped connections and 5xx are retried with exponential back-off and
jitter; authentication and request errors are not, and end the run with a message saying what
to fix.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import openai
import structlog
from langchain_core.caches import InMemoryCache
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import RunnableConfig
from pydantic import SecretStr
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from kernel_refinery.agent.config import ModelSettings
from kernel_refinery.core.errors import EndpointError
from kernel_refinery.traces.schema import TokenUsage

log = structlog.get_logger()

# Keys of the metadata each model call carries (in langchain's RunnableConfig): which turn and task
# it serves, and for a call other than a kernel's, what it is for. Callbacks and the scripted model read them.
TURN_KEY = "refinery_turn"
TASK_KEY = "refinery_task"
CALL_KEY = "refinery_call"

RETRYABLE = (
    openai.RateLimitError,
    openai.APITimeoutError,
    openai.APIConnectionError,
    openai.InternalServerError,
)
FATAL = (openai.AuthenticationError, openai.PermissionDeniedError, openai.BadRequestError, openai.NotFoundError)


class ModelCallError(EndpointError, RuntimeError):
    """The endpoint refused the request for a reason retrying cannot fix, or no key was given."""


class ModelUnreachable(ModelCallError):
    """Every attempt at a call failed with a retryable error (connection, timeout, rate limit, 5xx)."""

    def __init__(self, url: str, attempts: int, error: BaseException):
        self.url, self.attempts, self.error = url, attempts, error
        what = {
            openai.APITimeoutError: "timed out",
            openai.APIConnectionError: "could not be reached",
            openai.RateLimitError: "kept answering HTTP 429 (rate limit)",
            openai.InternalServerError: f"kept failing with HTTP {getattr(error, 'status_code', '5xx')}",
        }
        said = next((text for cls, text in what.items() if isinstance(error, cls)), f"failed ({type(error).__name__})")
        detail = getattr(error, "message", None) or str(error)
        advice = (
            "wait and retry, or lower the concurrency (--set concurrency=N)"
            if isinstance(error, openai.RateLimitError)
            else "check the endpoint (--set llm.base_url=URL) and that the server is running and reachable from here"
        )
        retries = attempts - 1
        super().__init__(
            f"the model endpoint {url} {said} ({type(error).__name__}: {detail}) after {attempts} attempt"
            f"{'s' if attempts != 1 else ''} ({retries} retr{'ies' if retries != 1 else 'y'} with back-off); {advice}"
        )


def endpoint_url(model: BaseChatModel, settings: ModelSettings) -> str:
    """The base URL a chat model calls (OpenAI's own when none was set)."""
    return str(getattr(model, "openai_api_base", None) or settings.base_url or "https://api.openai.com/v1")


@dataclass
class ChatReply:
    text: str
    tokens: TokenUsage
    retries: int


def api_key(settings: ModelSettings) -> SecretStr | None:
    value = os.environ.get(settings.api_key_env)
    return SecretStr(value) if value else None


def build_chat_model(settings: ModelSettings, base_url: str | None = None) -> BaseChatModel:
    """A ChatOpenAI for the endpoint; `base_url` overrides the settings (the embedded server)."""
    from langchain_openai import ChatOpenAI

    url = base_url or settings.base_url
    key = api_key(settings)
    if key is None and url is None:
        raise ModelCallError(
            f"no API key: set {settings.api_key_env} (or name another with --set llm.api_key_env=NAME), "
            "or use --set llm.base_url=URL for a local OpenAI-compatible server, or --model local for the embedded model"
        )
    cls = ChatOpenAI
    if base_url is not None:
        from kernel_refinery.agent.chat.local_model import LocalChatOpenAI

        cls = LocalChatOpenAI
    return cls(
        # A greedy decode of the same prompt is the same reply; reusing it saves a generation per variant
        # on turn 1 and removes llama.cpp's batch-order noise from the comparison between variants.
        cache=InMemoryCache() if settings.reuse_replies and settings.temperature == 0 else False,
        model=settings.model,
        base_url=url,
        api_key=key or SecretStr("not-needed"),
        temperature=settings.temperature,
        max_tokens=settings.max_tokens,
        timeout=settings.timeout_s,
        max_retries=0,  # tenacity owns retries, so each is logged and counted
    )


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    log.warning("llm_retry", attempt=state.attempt_number, error=type(exc).__name__, detail=str(exc)[:200])


def _retry_after_wait(fallback: wait_exponential_jitter):
    """Honour a server's Retry-After header when it gives one; back off exponentially otherwise."""

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        response = getattr(exc, "response", None)
        header = response.headers.get("retry-after") if response is not None else None
        if header:
            try:
                return min(float(header), 120.0)
            except ValueError:
                pass
        return fallback(state)

    return wait


def call_model(
    model: BaseChatModel, messages: Sequence[BaseMessage], settings: ModelSettings, config: RunnableConfig | None = None
) -> ChatReply:
    retrying = Retrying(
        retry=retry_if_exception_type(RETRYABLE),
        stop=stop_after_attempt(max(1, settings.retries)),
        wait=_retry_after_wait(wait_exponential_jitter(initial=1, max=60, jitter=2)),
        before_sleep=_log_retry,
        reraise=True,
    )
    try:
        for attempt in retrying:
            with attempt:
                message = model.invoke(list(messages), config=config)
    except RETRYABLE as exc:
        attempts = retrying.statistics.get("attempt_number", 1)
        raise ModelUnreachable(endpoint_url(model, settings), attempts, exc) from exc
    except FATAL as exc:
        status = getattr(exc, "status_code", "?")
        raise ModelCallError(
            f"the model endpoint {endpoint_url(model, settings)} refused the request (HTTP {status}, {type(exc).__name__}): "
            f"{exc.message if hasattr(exc, 'message') else exc}. "
            f"Check the model name ({settings.model}), the endpoint (llm.base_url) and the API key variable ({settings.api_key_env}); "
            "retrying will not help."
        ) from None
    assert isinstance(message, AIMessage)
    usage: Mapping[str, Any] = message.usage_metadata or {}
    cached = (usage.get("input_token_details") or {}).get("cache_read") or 0
    tokens = TokenUsage(prompt=int(usage.get("input_tokens", 0)), completion=int(usage.get("output_tokens", 0)), prompt_cached=int(cached))
    text = (
        message.content
        if isinstance(message.content, str)
        else "".join(part.get("text", "") if isinstance(part, dict) else str(part) for part in message.content)
    )
    return ChatReply(text=text, tokens=tokens, retries=retrying.statistics.get("attempt_number", 1) - 1)
