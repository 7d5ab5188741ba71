"""A scripted OpenAI-compatible chat endpoint on 127.0.0.1 that injects transport faults.

The reply to a request is fixed by the task and turn named in its prompt ("named TASK:", "This is
attempt N of M."), so a run with faults and one without get the same replies. Before a reply,
a seeded draw may answer with a fault instead: 429 with Retry-After, 500, a connection reset,
a stall past the client's timeout, or a body cut short of its Content-Length. A request is never
faulted more than `max_consecutive` times in a row, so a client with more retries always gets
its reply.
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
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAULTS = ("http_429", "http_500", "reset", "stall", "truncated")

_TASK = re.compile(r"named (\S+?):\n")
_TURN = re.compile(r"This is attempt (\d+) of \d+\.")


@dataclass
class FaultPlan:
    """How often each transport fault is drawn; the draw is seeded."""

    seed: int = 0
    rate: float = 0.35
    kinds: tuple[str, ...] = FAULTS
    stall_s: float = 8.0
    retry_after_s: float = 1.0
    max_consecutive: int = 3


@dataclass
class ServerLog:
    """What the endpoint saw and did; read by the soak for its figures."""

    requests: int = 0
    served: int = 0
    faults: Counter = field(default_factory=Counter)
    retries: int = 0
    """Requests that repeated one whose previous try was faulted."""
    unknown: int = 0
    """Requests whose prompt named no scripted task (answered with a reply without code)."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    _pending: Counter = field(default_factory=Counter)


def prompt_of(body: dict) -> str:
    return "\n".join(str(m.get("content") or "") for m in body.get("messages", []))


def task_and_turn(prompt: str) -> tuple[str | None, int]:
    task = _TASK.search(prompt)
    turn = _TURN.search(prompt)
    return (task.group(1) if task else None), (int(turn.group(1)) if turn else 1)


def _completion(text: str, prompt_tokens: int) -> dict:
    return {
        "id": f"chatcmpl-{time.time_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "soak",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(text) // 4, "total_tokens": prompt_tokens + len(text) // 4},
    }


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        # A stalled reply's client has gone away; its broken pipe is expected.
        return


@contextmanager
def serve(script: dict[str, list[str]], plan: FaultPlan | None, log: ServerLog) -> Iterator[str]:
    """Run the endpoint; yields its base URL (".../v1"). No plan: no faults."""
    rng = random.Random(plan.seed if plan else 0)
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
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            prompt = prompt_of(body)
            key = hashlib.sha256(prompt.encode()).hexdigest()
            task, turn = task_and_turn(prompt)
            with log.lock:
                log.requests += 1
                if log._pending[key] > 0:
                    log.retries += 1
                kind = None
                if plan is not None and log._pending[key] < plan.max_consecutive and rng.random() < plan.rate:
                    injected = sum(log.faults.values())
                    # Every kind once first, in order, so even a short run meets each of them.
                    kind = plan.kinds[injected] if injected < len(plan.kinds) else rng.choice(plan.kinds)
                    log.faults[kind] += 1
                    log._pending[key] += 1
                else:
                    log._pending[key] = 0
            if kind == "http_429":
                error = json.dumps({"error": {"message": "injected rate limit", "type": "rate_limit"}}).encode()
                self._send(429, error, {"retry-after": f"{plan.retry_after_s:g}"})  # type: ignore[union-attr]
                return
            if kind == "http_500":
                error = json.dumps({"error": {"message": "injected server error", "type": "server_error"}}).encode()
                self._send(500, error)
                return
            if kind == "reset":
                self._drop(reset=True)
                return
            if kind == "stall":
                stop.wait(plan.stall_s)  # type: ignore[union-attr]
                self._drop(reset=False)
                return
            replies = script.get(task or "")
            if replies is None:
                with log.lock:
                    log.unknown += 1
                text = "I cannot help with that."
            else:
                text = replies[min(turn, len(replies)) - 1]
            payload = json.dumps(_completion(text, len(prompt) // 4)).encode()
            if kind == "truncated":
                cut = len(payload) // 2
                self._send(200, payload[:cut], declared=len(payload))
                self._drop(reset=False)
                return
            self._send(200, payload)
            with log.lock:
                log.served += 1

    server = _Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True, name="soak-endpoint")
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
