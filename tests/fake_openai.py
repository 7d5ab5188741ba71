"""A scripted OpenAI-compatible chat endpoint on 127.0.0.1, for tests of the real client path."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Script:
    replies: list[str]
    faults: list[int] = field(default_factory=list)
    """HTTP statuses to answer with, in order, before serving replies (e.g. 429, 500)."""
    requests: list[dict] = field(default_factory=list)
    auth_headers: list[str] = field(default_factory=list)
    served: int = 0


def _completion(text: str, prompt_tokens: int) -> dict:
    return {
        "id": f"chatcmpl-{time.time_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "scripted",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(text) // 4, "total_tokens": prompt_tokens + len(text) // 4},
    }


@contextmanager
def serve(script: Script) -> Iterator[str]:
    """Run the endpoint; yields its base URL (".../v1")."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            return

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            script.requests.append(body)
            script.auth_headers.append(self.headers.get("authorization", ""))
            if script.faults:
                status = script.faults.pop(0)
                payload = json.dumps({"error": {"message": f"injected {status}", "type": "test"}}).encode()
                self.send_response(status)
                if status == 429:
                    self.send_header("retry-after", "0")
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            text = script.replies[min(script.served, len(script.replies) - 1)]
            script.served += 1
            prompt_chars = sum(len(str(m.get("content") or "")) for m in body.get("messages", []))
            payload = json.dumps(_completion(text, prompt_chars // 4)).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
