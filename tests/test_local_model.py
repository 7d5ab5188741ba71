"""The embedded model: joining its parts, the client fixes for llama.cpp's server, and the server itself.

The join tests install tiny fake part packages (a module plus a dist-info) on sys.path, so the
real lookup, version check and join run without the 1 GB model.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import socket
import uuid
from pathlib import Path

import psutil
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from agent import local_model
from agent.local_model import (
    CACHE_ENV,
    MODELS,
    EmbeddedModel,
    LocalChatOpenAI,
    LocalServer,
    LocalServerError,
    ModelCorrupt,
    ModelNotInstalled,
    ModelPart,
    ensure_model_file,
)

ROOT = Path(__file__).resolve().parents[1]


def fake_model(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    chunks: list[bytes],
    *,
    sha256: str | None = None,
    installed_version: str = "1.0",
) -> EmbeddedModel:
    """Registers an embedded model named "fake" whose parts are installed packages holding `chunks`."""
    site = tmp_path / "site"
    tag = uuid.uuid4().hex[:8]  # fresh module names: sys.modules outlives a test
    parts = []
    for i, data in enumerate(chunks, 1):
        module = f"fake_part_{tag}_{i}"
        chunk = tmp_path / "chunks" / f"part{i:02}.bin"
        chunk.parent.mkdir(parents=True, exist_ok=True)
        chunk.write_bytes(data)
        (site / module).mkdir(parents=True)
        (site / module / "__init__.py").write_text(f"def get_part_path():\n    return {str(chunk)!r}\n")
        info = site / f"{module}-{installed_version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: fake-part-{tag}-{i}\nVersion: {installed_version}\n"
        )
        parts.append(ModelPart(f"fake-part-{tag}-{i}", "1.0", module))
    monkeypatch.syspath_prepend(str(site))
    joined = b"".join(chunks)
    model = EmbeddedModel(
        name="fake",
        title="Fake model",
        file_name="fake.gguf",
        size=len(joined),
        sha256=sha256 or hashlib.sha256(joined).hexdigest(),
        extra="local",
        parts=tuple(parts),
    )
    monkeypatch.setitem(MODELS, "fake", model)
    # A tiny copy buffer so the parts stream through several reads, as the real 50 MB chunks do.
    monkeypatch.setattr(local_model, "_CHUNK", 7)
    return model


def leftovers(cache: Path) -> list[str]:
    """Files a failed join left in the cache, besides its lock file."""
    return [p.name for p in cache.iterdir() if not p.name.endswith(".lock")]


CHUNKS = [os.urandom(50), os.urandom(33), os.urandom(1)]


def test_join_and_verify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = fake_model(tmp_path, monkeypatch, CHUNKS)
    cache = tmp_path / "cache"

    path = ensure_model_file("fake", cache)

    assert path == cache / "fake.gguf"
    assert path.read_bytes() == b"".join(CHUNKS)
    marker = local_model._marker_path(path)
    assert marker.is_file() and model.sha256 in marker.read_text()
    assert not list(cache.glob("*.partial"))


def test_cache_dir_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_model(tmp_path, monkeypatch, CHUNKS)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "from-env"))

    assert ensure_model_file("fake") == tmp_path / "from-env" / "fake.gguf"


def test_marker_avoids_rehashing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_model(tmp_path, monkeypatch, CHUNKS)
    cache = tmp_path / "cache"
    path = ensure_model_file("fake", cache)
    hashed: list[Path] = []
    real_hash = local_model._sha256_file

    def counting_hash(p: Path) -> str:
        hashed.append(p)
        return real_hash(p)

    def no_join(*args: object) -> str:
        raise AssertionError("the cached file was joined again")

    monkeypatch.setattr(local_model, "_sha256_file", counting_hash)
    monkeypatch.setattr(local_model, "_join", no_join)
    assert ensure_model_file("fake", cache) == path
    assert hashed == []

    # A touched file no longer matches its marker: it is hashed once more, but not rejoined.
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert ensure_model_file("fake", cache) == path
    assert hashed == [path]
    assert ensure_model_file("fake", cache) == path
    assert hashed == [path]


def test_damaged_cached_file_is_rejoined(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_model(tmp_path, monkeypatch, CHUNKS)
    cache = tmp_path / "cache"
    path = ensure_model_file("fake", cache)
    path.write_bytes(b"\0" * path.stat().st_size)  # same size, new mtime: the marker no longer vouches

    assert ensure_model_file("fake", cache).read_bytes() == b"".join(CHUNKS)


def test_hash_mismatch_is_refused_and_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_model(tmp_path, monkeypatch, CHUNKS, sha256="0" * 64)
    cache = tmp_path / "cache"

    with pytest.raises(ModelCorrupt) as raised:
        ensure_model_file("fake", cache)

    message = str(raised.value)
    assert "sha256" in message and "0" * 64 in message
    assert hashlib.sha256(b"".join(CHUNKS)).hexdigest() in message
    assert "pip install --force-reinstall" in message and "kernel-refinery[local]" in message
    assert leftovers(cache) == []


def test_size_mismatch_is_refused_before_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = fake_model(tmp_path, monkeypatch, CHUNKS)
    monkeypatch.setitem(MODELS, "fake", EmbeddedModel(**{**model.__dict__, "size": model.size + 1}))
    cache = tmp_path / "cache"

    with pytest.raises(ModelCorrupt, match="size"):
        ensure_model_file("fake", cache)
    assert leftovers(cache) == []


def test_missing_part_package_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = fake_model(tmp_path, monkeypatch, CHUNKS)
    absent = ModelPart("refinery-absent-part-xyz", "1.0", "refinery_absent_part_xyz")
    monkeypatch.setitem(MODELS, "fake", EmbeddedModel(**{**model.__dict__, "parts": (*model.parts, absent)}))

    with pytest.raises(ModelNotInstalled) as raised:
        ensure_model_file("fake", tmp_path / "cache")

    assert "refinery-absent-part-xyz" in str(raised.value)
    assert "pip install 'kernel-refinery[local]'" in str(raised.value)


def test_part_at_another_version_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_model(tmp_path, monkeypatch, CHUNKS, installed_version="9.9")

    with pytest.raises(ModelNotInstalled, match=r"==9\.9 \(pinned 1\.0\)"):
        ensure_model_file("fake", tmp_path / "cache")


def test_unknown_model_lists_the_choices() -> None:
    with pytest.raises(local_model.LocalModelError, match="local-0.5b"):
        ensure_model_file("nope")


def test_extras_pin_exactly_the_described_parts() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name, model in MODELS.items():
        pinned = {r for r in extras[model.extra] if not r.startswith("llama-cpp-python")}
        assert pinned == {f"{p.distribution}=={p.version}" for p in model.parts}, name
        assert "llama-cpp-python[server]==0.3.36" in extras[model.extra]
    assert len(MODELS["local"].parts) == 22


def test_payload_sends_max_tokens_and_no_null_content() -> None:
    chat = LocalChatOpenAI(model="local", base_url="http://127.0.0.1:9/v1", api_key="x", max_tokens=64)
    # langchain-openai turns the empty content of a tool-calling assistant message into null.
    calling = AIMessage(content="", tool_calls=[{"name": "compile", "args": {"src": "x"}, "id": "call_1"}])
    history = [
        SystemMessage("You write kernels."),
        HumanMessage("Write a relu."),
        calling,
        ToolMessage("compiled", tool_call_id="call_1"),
    ]

    payload = chat._get_request_payload(history)

    assert payload["max_tokens"] == 64 and "max_completion_tokens" not in payload
    assistant = [m for m in payload["messages"] if m["role"] == "assistant"]
    assert assistant and all(m["content"] == "" for m in assistant)
    assert assistant[0]["tool_calls"][0]["function"]["name"] == "compile"
    assert payload["messages"][1] == {"role": "user", "content": "Write a relu."}

    per_call = chat._get_request_payload([HumanMessage("hi")], max_tokens=5)
    assert per_call["max_tokens"] == 5 and "max_completion_tokens" not in per_call


def _local_extra_missing() -> str | None:
    absent = [m for m in local_model._SERVER_MODULES if importlib.util.find_spec(m) is None]
    for part in MODELS["local"].parts:
        try:
            importlib.metadata.version(part.distribution)
        except importlib.metadata.PackageNotFoundError:
            absent.append(part.distribution)
    if absent:
        return f"the 'local' extra is not installed (missing {', '.join(absent[:3])}...): make setup installs it"
    return None


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.local_model
def test_server_that_dies_reports_its_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if any(importlib.util.find_spec(m) is None for m in local_model._SERVER_MODULES):
        pytest.skip("llama-cpp-python[server] is not installed (the 'local' extra): make setup installs it")
    fake_model(tmp_path, monkeypatch, [b"this is not a GGUF file"])  # joins and verifies, then fails to load

    with pytest.raises(LocalServerError, match="exited with code") as raised:
        LocalServer("fake", cache_dir=tmp_path / "cache", startup_timeout_s=60).start()

    assert "Log " in str(raised.value) and "llama_cpp.server" in str(raised.value)


def test_a_server_that_dies_mid_run_is_reported_with_its_signal(tmp_path: Path) -> None:
    import subprocess
    import sys

    from structlog.testing import capture_logs

    server = LocalServer("local", cache_dir=tmp_path)
    server.log_path.write_text("llama_decode: ...\n")
    proc = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"])
    with capture_logs() as logs:
        server._watch(proc)
    (event,) = [e for e in logs if e["event"] == "local_server_died"]
    assert event["cause"] == "signal SIGSEGV" and "llama_decode" in event["tail"] and "-mno-amx-int8" in event["hint"]

    server._stopping.set()  # a stop we asked for is not news
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    with capture_logs() as logs:
        server._watch(proc)
    assert [e for e in logs if e["event"] == "local_server_died"] == []


@pytest.mark.local_model
def test_real_model_smoke() -> None:
    if reason := _local_extra_missing():
        pytest.skip(reason)

    class Boom(Exception):
        pass

    server = LocalServer("local")
    # The block ends in an exception, to check that the server is stopped on errors too.
    with pytest.raises(Boom), server:
        pid, port = server.pid, server.port
        assert pid is not None and port is not None
        assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        chat = server.client(max_tokens=64, temperature=0)
        reply = chat.invoke("Write a Python function add(a, b) that returns a + b. Reply with code only.")
        assert isinstance(reply.content, str) and reply.content.strip()
        usage = reply.usage_metadata
        assert usage is not None and usage["input_tokens"] > 0 and 0 < usage["output_tokens"] <= 64
        raise Boom

    assert server.pid is None
    assert not psutil.pid_exists(pid), f"server pid {pid} still exists: {psutil.Process(pid).cmdline()}"
    assert not _port_open(port)


@pytest.mark.local_model
def test_one_agent_turn_with_the_embedded_model(cpu_config, tmp_path: Path) -> None:
    """One real turn of the refinement loop, the embedded model writing the kernel."""
    if reason := _local_extra_missing():
        pytest.skip(reason)
    from agent.config import LoopSettings, ModelSettings, RunConfig
    from agent.models import open_chat_model
    from agent.runner import run_trajectory
    from agent.state import TaskSpec
    from bench.tasks import builtin_suite_root, load_suite
    from tools.evaluator import Evaluator
    from traces.schema import TrajectoryId
    from traces.store import read_trace

    task = next(t for t in load_suite(builtin_suite_root(), levels=[1]) if t.name == "1_relu")
    settings = ModelSettings(model="local", max_tokens=512, temperature=0.0)
    config = RunConfig(llm=settings, loop=LoopSettings(variant="G+E", turns=1, hardware_prompt=False), eval=cpu_config)
    with open_chat_model(settings) as chat, Evaluator(cpu_config) as evaluator:
        result = run_trajectory(
            TaskSpec(name=task.name, source=task.source_for("cpu"), level=1), config, chat, evaluator, tmp_path,
            TrajectoryId(task=task.key, variant="G+E"), run_id="smoke",
        )
    (turn,) = read_trace(result.trace)
    assert turn.reply.strip(), "a reply arrived"
    assert turn.tokens.completion > 0
    if turn.code is None:
        assert turn.extract_error, "the missing code is reported, to be fed back"
    else:
        assert turn.result is not None and turn.result.status is not None, "the evaluator gave a verdict"
