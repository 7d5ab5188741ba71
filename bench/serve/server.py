"""`refinery serve`: the evaluator as an HTTP service (FastAPI on uvicorn; the `serve` extra).

    POST /evaluate        EvaluateRequest -> EvalResult (the JSON of `refinery eval --json`)
    POST /evaluate/batch  BatchRequest -> BatchResponse
    GET  /health          Health (no token needed)
    GET  /metrics         ServerMetrics

Requests other than /health carry `Authorization: Bearer <token>` (401 otherwise). Evaluations go
through a bounded queue (bench/serve/bounded_queue.py) to the same EvaluatorPool that `refinery experiment`
uses: 429 when it is full, 413 for a body over the size limit (or a batch larger than the queue
ever admits), 504 past the per-request time limit, 422 for a body that is not a request. Candidate
code runs only in the pool's worker processes; this process reads it with `ast` (the static check)
and never imports it.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import lru_cache
from typing import Annotated

import structlog
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kernel_refinery.bench.serve.bounded_queue import EvaluationJob, EvaluationQueue, QueueFull
from kernel_refinery.bench.serve.protocol import BatchRequest, BatchResponse, ErrorBody, EvaluateRequest, Health, ServerMetrics
from kernel_refinery.bench.tasks import SuiteError, Task, builtin_suite_root, load_suite, task_from_source
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.tools.results import EvalResult

log = structlog.get_logger()

_BEARER = HTTPBearer(auto_error=False)
# At module level: FastAPI resolves a dependency's annotations in the module's globals.
BearerCredentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]


class ServeOptions(BaseModel):
    """How the service runs; `refinery serve` fills it from its flags."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    token: str = Field(min_length=1, description="the bearer token every request but /health must carry")
    eval: EvalConfig = Field(default_factory=EvalConfig)
    """The server's evaluator settings; a request may change those of RequestSettings."""
    workers: int = Field(1, ge=1, description="evaluations at once: the pool's workers")
    queue_size: int = Field(8, ge=0, description="evaluations that may wait for a worker; more are answered 429")
    max_request_bytes: int = Field(2_000_000, ge=1024, description="largest request body; larger ones are answered 413")
    request_timeout_s: float = Field(1800.0, gt=0, description="a request's answer within this, or 504; no stage limit above it")


Service = Callable[[ServeOptions], tuple[EvaluationQueue, Callable[[], None]]]
"""Builds the queue over a pool and gives the pool's close; create_app takes another in tests."""


def pool_service(options: ServeOptions) -> tuple[EvaluationQueue, Callable[[], None]]:
    from kernel_refinery.tools.processes.pool import EvaluatorPool

    pool = EvaluatorPool(options.eval, workers=options.workers)
    return EvaluationQueue(pool.evaluate, options.workers, options.queue_size, busy_fraction=pool.busy_fraction), pool.close


class BodyLimit:
    """ASGI middleware: 413 for a body over `limit` bytes, by its Content-Length or as it streams in.

    The body is read here in full (it is at most `limit` bytes) and handed on in one piece:
    FastAPI would turn an error raised while it reads into a 400."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = JSONResponse(
            ErrorBody(
                error=f"request body over this server's limit of {self.limit} bytes; send less code or raise --max-request-bytes"
            ).model_dump(),
            status_code=413,
        )
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await too_large(scope, receive, send)
            return
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.limit:
                await too_large(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        whole: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay() -> Message:
            return whole.pop() if whole else await receive()

        await self.app(scope, replay, send)


@lru_cache(maxsize=1)
def _builtin_tasks() -> dict[str, Task]:
    tasks = load_suite(builtin_suite_root())
    return {**{t.name: t for t in tasks}, **{t.key: t for t in tasks}}


def task_program(request: EvaluateRequest, device: str) -> TaskProgram:
    """The program the evaluator runs, as `refinery eval` makes it from a task file: sizes for the device."""
    if request.task_source is not None:
        task = task_from_source(request.task_source, name=request.task_name or "task")
    else:
        assert request.task_name is not None  # EvaluateRequest's validator
        found = _builtin_tasks().get(request.task_name)
        if found is None:
            raise SuiteError(f"no built-in task {request.task_name!r}; built-in tasks are e.g. 1_relu or level2/9_bias_tanh_clamp_chain")
        task = found
    return TaskProgram(name=task.name, source=task.source_for(device))


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(ErrorBody(error=message).model_dump(), status_code=status, headers=headers)


def _describe(exc: RequestValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        where = ".".join(str(p) for p in error.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return "not a valid request (" + "; ".join(parts) + "); GET /docs lists the fields"


def create_app(options: ServeOptions, service: Service = pool_service) -> FastAPI:
    """The service's app; its pool starts with the app's lifespan and closes with it."""
    state: dict[str, EvaluationQueue] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        queue, close_pool = service(options)
        state["queue"] = queue
        log.info("serve_ready", device=options.eval.device, workers=options.workers, capacity=queue.capacity)
        try:
            yield
        finally:
            queue.close()
            close_pool()
            log.info("serve_stopped")

    app = FastAPI(title="kernel-refinery evaluator", lifespan=lifespan)
    app.add_middleware(BodyLimit, limit=options.max_request_bytes)

    def authorized(credentials: BearerCredentials) -> None:
        given = credentials.credentials if credentials is not None else ""
        if not hmac.compare_digest(given.encode(), options.token.encode()):
            what = "a wrong token" if credentials is not None else "no token"
            raise HTTPException(401, f"{what}: send 'Authorization: Bearer <token>', the token the server was started with")

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        return _error(exc.status_code, str(exc.detail), headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(422, _describe(exc))

    async def judged(jobs: list[EvaluationJob]) -> list[EvalResult]:
        queue = state["queue"]
        if len(jobs) > queue.capacity:
            raise HTTPException(413, f"a batch of {len(jobs)} is more than this server ever admits at once ({queue.capacity}); split it")
        try:
            futures = queue.submit(jobs)
        except QueueFull as exc:
            raise HTTPException(429, str(exc)) from None
        waiting = [asyncio.wrap_future(f) for f in futures]
        try:
            # Cancelling a wrapped future cancels its job when it has not started yet.
            return list(await asyncio.wait_for(asyncio.gather(*waiting), timeout=options.request_timeout_s))
        except TimeoutError:
            queue.note_timed_out()
            raise HTTPException(
                504, f"no verdict within this server's limit of {options.request_timeout_s:g} s per request; retry when it is less busy"
            ) from None
        except Exception as exc:  # a bug or a broken worker, not a verdict on the candidate
            log.exception("serve_request_failed")
            raise HTTPException(500, f"the evaluation failed in the server ({type(exc).__name__}: {exc}); see the server's log") from exc

    def job_of(request: EvaluateRequest) -> EvaluationJob:
        try:
            task = task_program(request, options.eval.device)
            config = request.settings.applied_to(options.eval, time_limit_s=options.request_timeout_s)
        except (SuiteError, ValueError) as exc:
            raise HTTPException(422, str(exc)) from None
        return EvaluationJob(task=task, candidate=request.code, config=config)

    @app.get("/health")
    def health() -> Health:
        return Health(device=options.eval.device, workers=options.workers, capacity=options.workers + options.queue_size)

    @app.get("/metrics", dependencies=[Depends(authorized)])
    def metrics() -> ServerMetrics:
        return state["queue"].metrics()

    # Answers are the models' own JSON (as `refinery eval --json` writes it: NaN as "NaN", not null).
    @app.post("/evaluate", dependencies=[Depends(authorized)], response_model=EvalResult)
    async def evaluate(request: EvaluateRequest) -> Response:
        (result,) = await judged([job_of(request)])
        return Response(result.model_dump_json(), media_type="application/json")

    @app.post("/evaluate/batch", dependencies=[Depends(authorized)], response_model=BatchResponse)
    async def evaluate_batch(request: BatchRequest) -> Response:
        results = await judged([job_of(item) for item in request.items])
        return Response(BatchResponse(results=results).model_dump_json(), media_type="application/json")

    return app


def run_server(options: ServeOptions, host: str, port: int) -> None:
    """Serve in the foreground until interrupted."""
    import uvicorn

    log.info("serve_starting", url=f"http://{host}:{port}", device=options.eval.device, workers=options.workers)
    uvicorn.run(create_app(options), host=host, port=port, log_level="warning")
