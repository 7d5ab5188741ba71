"""`refinery serve` as a child process of a benchmark: started with a fresh token on a free port,
waited for until /health answers, and stopped (terminated, then killed) however the block ends."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kernel_refinery.bench.serve.client import Client


@dataclass(frozen=True)
class RunningServer:
    url: str
    token: str
    process: subprocess.Popen[bytes]
    log_path: Path
    start_s: float
    """From launching the process to the first answer of /health."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_server(
    workers: int, queue_size: int, device: str = "cpu", env: dict[str, str] | None = None, start_timeout_s: float = 300.0
) -> Iterator[RunningServer]:
    """`refinery serve --device DEVICE --workers N --queue-size Q`, with `env` over this process's
    environment (e.g. REFINERY_CACHE_DIR for a cold build cache)."""
    token = secrets.token_urlsafe(16)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    refinery = str(Path(sys.executable).with_name("refinery"))
    cmd = [refinery, "serve", "--port", str(port), "--device", device, "--workers", str(workers), "--queue-size", str(queue_size)]
    log_path = Path(tempfile.mkdtemp(prefix="serve-bench-")) / "server.log"
    started = time.monotonic()
    child_env = {**os.environ, **(env or {}), "REFINERY_SERVE_TOKEN": token}
    with log_path.open("wb") as log:  # a file, not a pipe: a full pipe would stall the server's logging
        server = subprocess.Popen(cmd, env=child_env, stdout=log, stderr=subprocess.STDOUT)
    try:
        with Client(url, token, timeout_s=10) as probe:
            deadline = started + start_timeout_s
            while True:
                try:
                    probe.health()
                    break
                except Exception:  # noqa: BLE001 - not listening yet
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(f"refinery serve did not start; its log, {log_path}:\n{log_path.read_text()[-2000:]}") from None
                    time.sleep(0.5)
        yield RunningServer(url=url, token=token, process=server, log_path=log_path, start_s=time.monotonic() - started)
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
