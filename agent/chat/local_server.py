"""The llama.cpp server process for an embedded model: start, health check, death watch, stop, log tail.

`LocalServer` runs llama-cpp-python's OpenAI-compatible server on 127.0.0.1 for the span of a `with`
block, on the GGUF that `kernel_refinery.agent.chat.local_weights` joined and verified; `serve_local` runs it in the
foreground for reuse across runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import structlog

from kernel_refinery.agent.chat.local_catalog import LocalServerError, ModelNotInstalled, get_model
from kernel_refinery.agent.chat.local_client import LOCAL_API_KEY, LocalChatOpenAI
from kernel_refinery.agent.chat.local_weights import default_cache_dir, ensure_model_file

log = structlog.get_logger()

N_CTX = 8192
PROMPT_CACHE_BYTES = 1 << 30
"""About 25 saved prompt states of the 1.5B model (28 KB of KV cache per token, ~1,500 tokens each)."""
_LOG_LIMIT = 8 * 1024 * 1024  # each start appends ~10 KB (the chat template); start afresh past this
# What `python -m llama_cpp.server` imports: llama-cpp-python and its [server] extra.
_SERVER_MODULES = ("llama_cpp", "fastapi", "uvicorn", "sse_starlette", "starlette_context", "pydantic_settings")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Run in the server's child before exec: the kernel sends it SIGKILL when the process that
    started it dies, even by SIGKILL, so a killed run leaves no server holding the cores (Linux;
    elsewhere `stop()` on the way out of the `with` is all there is). The server is started from
    the run's main thread, whose exit is what the kernel watches. Not SIGTERM: uvicorn then waits
    for the generation in flight, minutes of both cores, and the server keeps nothing worth saving."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# An http_proxy in the environment must not catch requests to our own loopback server.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _tail(path: Path, start: int, limit: int = 4000) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(start, path.stat().st_size - limit))
            return f.read().decode(errors="replace").strip()
    except OSError as e:
        return f"(log unreadable: {e})"


class LocalServer:
    """llama-cpp-python's OpenAI-compatible server on 127.0.0.1, for the span of a `with` block.

    The server runs in its own process group, so Ctrl-C reaches only this process, and leaving
    the block, normally or through any exception, stops the whole group.
    """

    def __init__(
        self,
        name: str = "local",
        *,
        port: int | None = None,
        threads: int | None = None,
        n_ctx: int = N_CTX,
        startup_timeout_s: float = 180.0,
        cache_dir: Path | None = None,
    ) -> None:
        self.name = name
        self.model = get_model(name)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.port = port
        self.threads = threads or _default_threads()
        self.n_ctx = n_ctx
        self.startup_timeout_s = startup_timeout_s
        self.log_path = self.cache_dir / f"server-{name}.log"
        self._log_start = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise LocalServerError("the local server is not started")
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def client(self, **kwargs: Any) -> LocalChatOpenAI:
        """A chat client for this server; kwargs go to ChatOpenAI (temperature, max_tokens, ...)."""
        return LocalChatOpenAI(model=self.name, base_url=self.base_url, api_key=LOCAL_API_KEY, **kwargs)

    def start(self) -> Self:
        if self._proc is not None:
            raise LocalServerError("the local server is already started")
        missing = [m for m in _SERVER_MODULES if importlib.util.find_spec(m) is None]
        if missing:
            raise ModelNotInstalled(
                f"llama-cpp-python[server] is not fully installed (missing {', '.join(missing)}), so the embedded "
                f"model cannot be served. Install it with: {self.model.install_hint}"
            )
        model_path = ensure_model_file(self.name, self.cache_dir)
        self.port = self.port or _free_port()
        cmd = [
            # llama_cpp.server, whose replies also count the prompt tokens read from the KV cache.
            sys.executable, "-m", "kernel_refinery.agent.chat.local_server_main",
            "--model", str(model_path), "--model_alias", self.name,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--n_ctx", str(self.n_ctx), "--n_threads", str(self.threads), "--n_threads_batch", str(self.threads),
            # The server's default keeps logits for every prompt token: an n_ctx x 152k float array, the
            # output layer run on the whole prompt, and a list copy of it per request. Only logprobs need it.
            "--logits_all", "false",
            # Every prompt of a run starts with the same system message, example and hardware block.
            # llama.cpp reuses the previous prompt's KV cache up to the first differing token; this RAM
            # cache also keeps earlier prompts' states, for trajectories that take turns at the server.
            "--cache", "true", "--cache_type", "ram", "--cache_size", str(PROMPT_CACHE_BYTES),
        ]  # fmt: skip
        started = time.monotonic()
        # Appending keeps the previous run's log; the error tail reads from where this run starts.
        with contextlib.suppress(FileNotFoundError):
            if self.log_path.stat().st_size > _LOG_LIMIT:
                self.log_path.unlink()
        with self.log_path.open("ab") as log_file:
            self._log_start = log_file.tell()
            log_file.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n".encode())
            log_file.flush()
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
            )
        log.info("local_server_start", model=self.name, pid=self._proc.pid, port=self.port, threads=self.threads)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        log.info("local_server_ready", model=self.name, url=self.base_url, seconds=round(time.monotonic() - started, 1))
        self._stopping.clear()
        threading.Thread(target=self._watch, args=(self._proc,), name="local-server-watch", daemon=True).start()
        return self

    def _watch(self, proc: subprocess.Popen[bytes]) -> None:
        """Say once, with the cause, when the server dies under a run: the client only sees connection errors."""
        code = proc.wait()
        if self._stopping.is_set():
            return
        cause = f"signal {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() else f"code {code}"
        log.error(
            "local_server_died",
            model=self.name,
            pid=proc.pid,
            cause=cause,
            log=str(self.log_path),
            hint="every model call now fails with a connection error; see the log's end. A SIGSEGV or SIGILL in "
            "llama.cpp usually means AMX kernels (llama.cpp issue 20824) or a build for another CPU: rebuild with "
            'CMAKE_ARGS=\'-DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8" -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8"\' '
            "pip install --no-cache-dir --force-reinstall llama-cpp-python",
            tail=_tail(self.log_path, self._log_start, limit=600),
        )

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            code = self._proc.poll()
            if code is not None:
                raise LocalServerError(
                    f"the llama.cpp server for {self.name!r} exited with code {code} before it was ready. "
                    f"Log {self.log_path}:\n{_tail(self.log_path, self._log_start)}"
                )
            try:
                with _NO_PROXY.open(f"{self.base_url}/models", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise LocalServerError(
                    f"the llama.cpp server for {self.name!r} was not ready after {self.startup_timeout_s:.0f} s "
                    f"(GET {self.base_url}/models). Log {self.log_path}:\n{_tail(self.log_path, self._log_start)}"
                )
            time.sleep(0.25)

    def wait(self) -> int:
        """Blocks until the server exits by itself; returns its exit code."""
        assert self._proc is not None
        return self._proc.wait()

    def stop(self, grace_s: float = 10.0) -> None:
        self._stopping.set()
        proc, self._proc = self._proc, None
        if proc is None:
            return
        # Signal the group rather than the pid: anything the server spawned goes with it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            log.warning("local_server_kill", pid=proc.pid, grace_s=grace_s)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # stragglers that ignored SIGTERM after the leader left
        log.info("local_server_stop", model=self.name, pid=proc.pid, code=proc.returncode)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def serve_local(name: str, port: int | None, threads: int | None) -> None:
    """Runs the embedded model's server in the foreground until Ctrl-C, for reuse across runs."""
    server = LocalServer(name, port=port, threads=threads)
    # SIGTERM and SIGHUP would end Python without unwinding and leave the server running: stop it as on Ctrl-C.
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with server:
            print(f"Serving {server.model.title} as model {name!r} (log: {server.log_path})")
            print(f"OpenAI-compatible base URL: {server.base_url}  (any API key works)")
            print("Press Ctrl-C to stop.", flush=True)
            code = server.wait()
    except KeyboardInterrupt:
        print("\nStopped the local server.")
        return
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    raise LocalServerError(
        f"the llama.cpp server exited by itself with code {code}. Log {server.log_path}:\n{_tail(server.log_path, server._log_start)}"
    )
