"""`refinery serve` as a real server (a subprocess on a free port) with real C++ candidates that share
one build (tests/candidates.py): concurrent clients get what the API's evaluate gives, a full queue
answers 429, a bad token 401, bad and oversized bodies clear 4xx, a crashing candidate costs only
its own request, and a request past the time limit 504 — the server serving on after each."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil
import pytest
from candidates import FIXTURES, candidate
from result_compare import comparable
from starlette.testclient import TestClient
from typer.testing import CliRunner

from kernel_refinery.api import evaluate
from kernel_refinery.bench.cli import app
from kernel_refinery.bench.serve.bounded_queue import EvaluationJob, EvaluationQueue, QueueFull
from kernel_refinery.bench.serve.client import Client, ServiceError
from kernel_refinery.bench.serve.protocol import SERVER_FIELDS, RequestSettings
from kernel_refinery.bench.serve.server import ServeOptions, create_app
from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.tools.results import EvalResult

TOKEN = "test-token-7f3a"
SMALL_RELU = FIXTURES / "small_relu_task.py"
TASK_SOURCE = SMALL_RELU.read_text()
CORRECT = candidate("return ext.scaled_relu(x, 1e-3)")  # small_relu's reference is relu(x) * 1e-3
WRONG = candidate("return ext.relu_fwd(x)")
CRASH = candidate("return ext.crash(x)")  # a null-pointer write: SIGSEGV in its worker
SLEEPY = candidate("time.sleep(1.0)\nreturn ext.scaled_relu(x, 1e-3)", prelude="import time\n")
REJECTED = "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    pass\n"  # no custom kernel: refused before any worker
SETTINGS = {"trials": 5, "correctness_trials": 2, "time_compiled_reference": False}
MAX_BODY = 200_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_server(cache_dir: Path, *flags: str) -> Iterator[str]:
    """`refinery serve` with `flags` until the block ends; yields its URL once /health answers. On
    SIGTERM at the end it must shut down (closing its pool) and leave none of its worker and judge processes."""
    port = free_port()
    env = {**os.environ, "REFINERY_SERVE_TOKEN": TOKEN, "REFINERY_CACHE_DIR": str(cache_dir)}
    command = [sys.executable, "-c", "from kernel_refinery.bench.cli import app; app()", "serve", "--port", str(port), *flags]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:  # a file, not a pipe: nobody reads the log while the server runs
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)

        def output() -> str:
            log.seek(0)
            return log.read().decode(errors="replace")[-4000:]

        try:
            deadline = time.monotonic() + 120
            while True:
                assert server.poll() is None, f"the server exited: {output()}"
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "the server did not answer /health within 120 s"
                time.sleep(0.3)
            yield url
            children = psutil.Process(server.pid).children(recursive=True)
            server.terminate()
            # uvicorn shuts down, then raises the SIGTERM it caught again: the exit status is -15.
            assert server.wait(60) in (0, -signal.SIGTERM) and "serve_stopped" in output(), output()
            _, alive = psutil.wait_procs(children, timeout=10)
            assert not alive, f"processes left behind by the server: {alive}"
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()


@pytest.fixture(scope="module")
def url(cache_dir: Path) -> Iterator[str]:
    with running_server(cache_dir, "--workers", "2", "--queue-size", "2", "--max-request-bytes", str(MAX_BODY)) as address:
        yield address


@pytest.fixture()
def client(url: str) -> Iterator[Client]:
    with Client(url, TOKEN) as c:
        yield c


def status(result: EvalResult) -> str | None:
    return result.status.value if result.status is not None else None


def wait_for(client: Client, admitted: int) -> None:
    """Until the server holds `admitted` evaluations (running plus queued)."""
    deadline = time.monotonic() + 60
    while (m := client.metrics()).running + m.queue_depth < admitted:
        assert time.monotonic() < deadline, f"the server never held {admitted} evaluations: {m}"
        time.sleep(0.1)


def wait_for_idle(client: Client) -> None:
    deadline = time.monotonic() + 60
    while (m := client.metrics()).running + m.queue_depth > 0:
        assert time.monotonic() < deadline, f"the server stayed busy: {m}"
        time.sleep(0.2)


def test_health_is_open_and_everything_else_needs_the_token(url: str) -> None:
    health = httpx.get(f"{url}/health")
    assert health.status_code == 200 and health.json()["capacity"] == 4
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        answer = httpx.get(f"{url}/metrics", headers=headers)
        assert answer.status_code == 401 and answer.headers["WWW-Authenticate"] == "Bearer", answer.text
        assert "Authorization: Bearer <token>" in answer.json()["error"]
    with Client(url, "wrong") as intruder, pytest.raises(ServiceError) as refused:
        intruder.evaluate(TASK_SOURCE, CORRECT)
    assert refused.value.status == 401 and "wrong token" in refused.value.message


def test_concurrent_clients_get_what_evaluate_gives_and_a_crash_costs_only_its_request(url: str, cache_dir: Path) -> None:
    def one(code: str) -> EvalResult:
        with Client(url, TOKEN) as own:
            return own.evaluate(TASK_SOURCE, code, task_name="small_relu_task", **SETTINGS)

    with ThreadPoolExecutor(3) as clients:
        served = list(clients.map(one, [CRASH, CORRECT, WRONG]))
    assert [status(r) for r in served] == ["runtime_error", "correct", "incorrect"], [r.headline() for r in served]

    local = EvalConfig(device="cpu", cache_dir=cache_dir, trials=5, correctness_trials=2, time_compiled_reference=False)  # SETTINGS
    for code, result in zip([CORRECT, WRONG], served[1:], strict=True):
        assert comparable(result) == comparable(evaluate(SMALL_RELU, code, local))

    with Client(url, TOKEN) as c:
        assert c.health().status == "ok"
        metrics = c.metrics()
    assert {"correct", "incorrect", "runtime_error"} <= set(metrics.verdicts), metrics
    assert metrics.evaluations_per_minute >= 3 and metrics.failed == 0


def test_a_batch_and_a_builtin_task(client: Client) -> None:
    results = client.evaluate_batch([(TASK_SOURCE, WRONG), (TASK_SOURCE, REJECTED), (TASK_SOURCE, CORRECT)], **SETTINGS)
    assert [status(r) for r in results] == ["incorrect", "rejected", "correct"]
    assert status(client.evaluate_builtin("level1/1_relu", REJECTED)) == "rejected"
    with pytest.raises(ServiceError, match="no built-in task 'nope'") as unknown:
        client.evaluate_builtin("nope", REJECTED)
    assert unknown.value.status == 422
    with pytest.raises(ServiceError, match="more than this server ever admits") as too_many:
        client.evaluate_batch([(TASK_SOURCE, REJECTED)] * 5)
    assert too_many.value.status == 413


def test_a_full_queue_answers_429_and_the_admitted_finish(client: Client) -> None:
    """Capacity 4: two running, two queued; the fifth is refused at once, the four get verdicts."""
    slow = {**SETTINGS, "timeout_s": 3.0}
    with ThreadPoolExecutor(4) as clients:
        admitted = [clients.submit(client.evaluate, TASK_SOURCE, SLEEPY, **slow) for _ in range(4)]
        wait_for(client, 4)
        with pytest.raises(ServiceError, match="queue is full") as full:
            client.evaluate(TASK_SOURCE, REJECTED)
        assert full.value.status == 429
        verdicts = [status(f.result()) for f in admitted]
    assert verdicts == ["timeout"] * 4
    assert client.metrics().refused_full >= 1
    assert status(client.evaluate(TASK_SOURCE, REJECTED)) == "rejected", "admitted again once the queue emptied"


def test_malformed_and_oversized_requests_get_clear_4xx(url: str, client: Client) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}

    def post(body: bytes | Iterator[bytes], path: str = "/evaluate") -> httpx.Response:
        return httpx.post(f"{url}{path}", content=body, headers=headers, timeout=30)

    cases = {
        b"{not json": (422, "not a valid request"),
        b'{"task_name": "1_relu"}': (422, "code: Field required"),
        b'{"code": "x"}': (422, "give task_source"),
        b'{"task_name": "1_relu", "code": "x", "settings": {"cache_dir": "/"}}': (
            422,
            "settings.cache_dir: Extra inputs are not permitted",
        ),
        b'{"task_name": "1_relu", "code": "x", "settings": {"trials": 0}}': (422, "settings.trials"),
        b'{"task_source": "x = 1", "code": "x"}': (422, "is not a KernelBench task"),
        b'{"items": []}': (422, "items"),
    }
    for body, (code, phrase) in cases.items():
        path = "/evaluate/batch" if body.startswith(b'{"items"') else "/evaluate"
        answer = post(body, path)
        assert answer.status_code == code and phrase in answer.json()["error"], (body, answer.text)

    big = b'{"task_name": "1_relu", "code": "' + b"x" * MAX_BODY + b'"}'
    for body in (big, iter([big[:1000], big[1000:]])):  # by its Content-Length, and streamed without one
        answer = post(body)
        assert answer.status_code == 413 and f"limit of {MAX_BODY} bytes" in answer.json()["error"], answer.text
    assert httpx.get(f"{url}/nowhere").status_code == 404

    assert client.health().status == "ok"
    assert status(client.evaluate(TASK_SOURCE, REJECTED)) == "rejected", "the server serves on"


def test_a_request_past_the_time_limit_answers_504(cache_dir: Path) -> None:
    with (
        running_server(cache_dir, "--workers", "1", "--queue-size", "1", "--request-timeout-s", "4") as address,
        Client(address, TOKEN) as c,
    ):
        started = time.monotonic()
        with pytest.raises(ServiceError, match="limit of 4 s") as late:
            c.evaluate(TASK_SOURCE, SLEEPY, **SETTINGS)
        assert late.value.status == 504 and time.monotonic() - started < 15
        assert c.metrics().timed_out == 1
        wait_for_idle(c)  # the late evaluation still holds the one worker until its own (clamped) stage limit
        assert status(c.evaluate(TASK_SOURCE, REJECTED)) == "rejected", "the server serves on"


def test_every_evaluator_setting_is_a_requests_or_the_servers() -> None:
    """A new EvalConfig field fails here until it is put on one side (bench/serve/protocol.py)."""
    assert set(RequestSettings.model_fields) | SERVER_FIELDS == set(EvalConfig.model_fields)
    assert not set(RequestSettings.model_fields) & SERVER_FIELDS


def test_a_requests_settings_on_the_servers_within_its_time_limit(tmp_path: Path) -> None:
    server = EvalConfig(device="cpu", cache_dir=tmp_path, trials=50, timeout_s=600)
    config = RequestSettings(trials=5, precision="bf16", compile_timeout_s=10).applied_to(server, time_limit_s=60)
    assert (config.trials, config.precision, config.cache_dir, config.timeout_s, config.compile_timeout_s) == (5, "bf16", tmp_path, 60, 10)
    assert RequestSettings().applied_to(server) == server


def test_the_queue_admits_whole_requests_up_to_its_capacity_and_frees_cancelled_ones() -> None:
    """EvaluationQueue with a fake evaluate that blocks until released: no worker process starts."""
    release = threading.Event()
    task = TaskProgram(name="t", source="")
    config = EvalConfig(device="cpu")

    def fake_evaluate(_: TaskProgram, code: str, __: EvalConfig) -> EvalResult:
        release.wait(30)
        if code == "raise":
            raise RuntimeError("a broken worker")
        return EvalResult(status=EvalStatus.CORRECT if code == "ok" else EvalStatus.INCORRECT)

    queue = EvaluationQueue(fake_evaluate, workers=1, queue_size=2)
    try:
        running = queue.submit([EvaluationJob(task, "ok", config)])
        waiting = queue.submit([EvaluationJob(task, "wrong", config), EvaluationJob(task, "raise", config)])
        deadline = time.monotonic() + 10
        while queue.metrics().running < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert (queue.metrics().running, queue.metrics().queue_depth) == (1, 2)
        with pytest.raises(QueueFull, match="3 of 3 admitted, 1 asked for"):
            queue.submit([EvaluationJob(task, "ok", config)])
        assert waiting[1].cancel(), "a job that has not started can be dropped (its request timed out)"
        assert queue.metrics().queue_depth == 1
        (extra,) = queue.submit([EvaluationJob(task, "ok", config)])  # the cancelled job's place
        release.set()
        assert [f.result(10).status for f in (*running, waiting[0], extra)] == [
            EvalStatus.CORRECT,
            EvalStatus.INCORRECT,
            EvalStatus.CORRECT,
        ]
    finally:
        release.set()
        queue.close()
    metrics = queue.metrics()
    assert (metrics.running, metrics.queue_depth, metrics.refused_full) == (0, 0, 1)
    assert metrics.verdicts == {"correct": 2, "incorrect": 1} and metrics.evaluations_total == 3 and metrics.failed == 0

    failing = EvaluationQueue(fake_evaluate, workers=1, queue_size=0)
    try:
        (broken,) = failing.submit([EvaluationJob(task, "raise", config)])
        with pytest.raises(RuntimeError, match="broken worker"):
            broken.result(10)
    finally:
        failing.close()
    assert failing.metrics().failed == 1 and failing.metrics().verdicts == {}


def test_the_app_in_process_never_imports_the_candidate(cache_dir: Path) -> None:
    """create_app with the real pool, called through starlette's TestClient: the candidate is judged
    in a worker, and no module of this process defines its ModelNew afterwards."""
    options = ServeOptions(token=TOKEN, eval=EvalConfig(device="cpu", cache_dir=cache_dir), workers=1, queue_size=0)
    marked = CORRECT.replace("class ModelNew(", "SERVE_TEST_MARKER = 1\n\n\nclass ModelNew(")
    with TestClient(create_app(options)) as http:
        answer = http.post(
            "/evaluate",
            json={"task_source": TASK_SOURCE, "code": marked, "settings": SETTINGS},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert answer.status_code == 200, answer.text
        assert EvalResult.model_validate_json(answer.content).correct
    # The module's own names, not hasattr: torch.ops and torch.classes answer any attribute.
    assert not [name for name, module in list(sys.modules.items()) if "SERVE_TEST_MARKER" in getattr(module, "__dict__", {})]


def test_serve_without_a_token_is_a_user_error() -> None:
    result = CliRunner().invoke(app, ["serve", "--port", "1"], env={"REFINERY_SERVE_TOKEN": "", "REFINERY_DEBUG": ""})
    assert result.exit_code == 2 and "needs a token: give --token or set REFINERY_SERVE_TOKEN" in result.stderr, result.output
