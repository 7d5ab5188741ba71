"""A scripted OpenAI-compatible chat endpoint on 127.0.0.1 that injects transport faults.

The soak runs its experiments against it, and the tests of the real client path use it too.

Replies are a list, served in order (the last one repeats), or a dict from task to replies by
turn, both read from the prompt, so a run with faults and one without get the same replies. The
task is the name after "named"; prompts carry no turn number, so each scripted reply names its own
turn ("draft N", see `draft_tag`) and the next prompt quotes it back: the previous attempt's code,
or the start of a reply that had none. Before a reply, a `FaultPlan` may answer with a fault
instead: first the faults it lists for the first requests, then a seeded draw among 429 with
Retry-After, 500, a connection reset, a stall past the client's timeout, or a body cut short of
its Content-Length. A drawn fault never hits one request more than `max_consecutive` times in a
row, so a client with more retries always gets its reply.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAULTS = ("http_429", "http_500", "reset", "stall", "truncated")
"""What a draw picks from. `FaultPlan.first` also takes "http_NNN" for any status NNN."""

_TASK = re.compile(r"named (\S+?):\n")
_DRAFT = re.compile(r"\bdraft (\d+)\b")
_HTTP = re.compile(r"http_(\d{3})")
_ERROR_TYPE = {429: "rate_limit", 500: "server_error"}

Replies = list[str] | dict[str, list[str]]
"""In order of requests served, or by the task and turn that the prompt names."""


@dataclass
class FaultPlan:
    """Which requests get a fault instead of a reply."""

    first: tuple[str, ...] = ()
    """Faults for the first requests, one each, in order: e.g. ("http_429", "http_500")."""
    rate: float = 0.0
    """After those, each request draws a fault from `kinds` with this chance; the draw is seeded."""
    seed: int = 0
    kinds: tuple[str, ...] = FAULTS
    stall_s: float = 8.0
    retry_after_s: float = 1.0
    max_consecutive: int = 3


@dataclass
class ServerLog:
    """What the endpoint saw and did; read by the soak for its figures and by the tests."""

    requests: int = 0
    served: int = 0
    faults: Counter = field(default_factory=Counter)
    retries: int = 0
    """Requests that repeated one whose previous try was faulted."""
    unknown: int = 0
    """Requests whose prompt named no scripted task (answered with a reply without code)."""
    auth_headers: list[str] = field(default_factory=list)
    """Each request's Authorization header, in order."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    _pending: Counter = field(default_factory=Counter)
    _drawn: int = 0


def prompt_of(body: dict) -> str:
    return "\n".join(str(m.get("content") or "") for m in body.get("messages", []))


def draft_tag(turn: int) -> str:
    """The words by which a scripted reply names its turn; put them near its start."""
    return f"draft {turn}"


def task_and_turn(prompt: str) -> tuple[str | None, int]:
    """The task the prompt names, and the turn after the draft it quotes (1 when it quotes none)."""
    task = _TASK.search(prompt)
    # The task's source comes before the quoted attempt: only a tag after it counts.
    after = prompt[task.end() :] if task else prompt
    tags = _DRAFT.findall(after)
    return (task.group(1) if task else None), (int(tags[0]) + 1 if tags else 1)


def _completion(text: str, prompt_tokens: int) -> dict:
    return {
        "id": f"chatcmpl-{time.time_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "scripted",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(text) // 4, "total_tokens": prompt_tokens + len(text) // 4},
    }


def _fault(plan: FaultPlan, log: ServerLog, key: str, rng: random.Random) -> str | None:
    """The fault this request gets, if any; call with log.lock held."""
    if log.requests <= len(plan.first):
        kind = plan.first[log.requests - 1]
    elif log._pending[key] < plan.max_consecutive and rng.random() < plan.rate:
        # Every kind once first, in order, so even a short run meets each of them.
        kind = plan.kinds[log._drawn] if log._drawn < len(plan.kinds) else rng.choice(plan.kinds)
        log._drawn += 1
    else:
        return None
    log.faults[kind] += 1
    return kind


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        # A stalled reply's client has gone away; its broken pipe is expected.
        return


@contextmanager
def serve(replies: Replies, log: ServerLog, plan: FaultPlan | None = None) -> Iterator[str]:
    """Run the endpoint; yields its base URL (".../v1"). No plan: no faults."""
    faults = plan or FaultPlan()
    rng = random.Random(faults.seed)
    stop = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            return

        def _send(self, status: int, payload: bytes, headers: dict[str, str] | None = None, declared: int | None = None) -> None:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("content-length", str(declared if declared is not None else len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            self.wfile.flush()

        def _drop(self, reset: bool) -> None:
            if reset:
                # SO_LINGER 0: close sends a TCP RST instead of a FIN.
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            with suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

        def _reply_text(self, prompt: str) -> str:
            """Call with log.lock held."""
            if isinstance(replies, list):
                return replies[min(log.served, len(replies) - 1)]
            task, turn = task_and_turn(prompt)
            by_turn = replies.get(task or "")
            if by_turn is None:
                log.unknown += 1
                return "I cannot help with that."
            return by_turn[min(turn, len(by_turn)) - 1]

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            prompt = prompt_of(body)
            key = hashlib.sha256(prompt.encode()).hexdigest()
            with log.lock:
                log.requests += 1
                log.auth_headers.append(self.headers.get("authorization", ""))
                if log._pending[key] > 0:
                    log.retries += 1
                kind = _fault(faults, log, key, rng)
                log._pending[key] = 0 if kind is None else log._pending[key] + 1
                # A truncated body is cut from the reply the request would have had.
                text = self._reply_text(prompt) if kind in (None, "truncated") else ""
            if kind is not None and (status := _HTTP.fullmatch(kind)):
                code = int(status.group(1))
                error = {"error": {"message": f"injected HTTP {code}", "type": _ERROR_TYPE.get(code, "injected")}}
                self._send(code, json.dumps(error).encode(), {"retry-after": f"{faults.retry_after_s:g}"} if code == 429 else None)
                return
            if kind == "reset":
                self._drop(reset=True)
                return
            if kind == "stall":
                stop.wait(faults.stall_s)
                self._drop(reset=False)
                return
            payload = json.dumps(_completion(text, len(prompt) // 4)).encode()
            if kind == "truncated":
                self._send(200, payload[: len(payload) // 2], declared=len(payload))
                self._drop(reset=False)
                return
            self._send(200, payload)
            with log.lock:
                log.served += 1

    server = _Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True, name="fake-openai-endpoint")
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
