"""A client of `refinery serve` (httpx):

client = Client("http://127.0.0.1:8000", token)
result = client.evaluate(task_source, code, trials=20)   # an EvalResult, as `refinery eval` gives
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

import httpx

from kernel_refinery.bench.serve.protocol import BatchRequest, BatchResponse, EvaluateRequest, Health, RequestSettings, ServerMetrics
from kernel_refinery.tools.results import EvalResult


class ServiceError(Exception):
    """The service answered with an error (4xx or 5xx); `status` is its HTTP status."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class Client:
    """Talks to one `refinery serve`; `timeout_s` bounds each call's wait (evaluations take a while)."""

    def __init__(self, url: str, token: str, timeout_s: float = 1900.0):
        self._http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def evaluate(self, task_source: str, code: str, task_name: str | None = None, **settings: Any) -> EvalResult:
        """One candidate against a task's program text; `settings` are RequestSettings fields (trials=20, precision="bf16", ...)."""
        request = EvaluateRequest(task_source=task_source, task_name=task_name, code=code, settings=RequestSettings(**settings))
        return EvalResult.model_validate_json(self._post("/evaluate", request.model_dump_json(exclude_none=True)))

    def evaluate_builtin(self, task_name: str, code: str, **settings: Any) -> EvalResult:
        """One candidate against a built-in task, e.g. `1_relu` or `level2/9_bias_tanh_clamp_chain`."""
        request = EvaluateRequest(task_name=task_name, code=code, settings=RequestSettings(**settings))
        return EvalResult.model_validate_json(self._post("/evaluate", request.model_dump_json(exclude_none=True)))

    def evaluate_batch(self, pairs: Sequence[tuple[str, str]], **settings: Any) -> list[EvalResult]:
        """(task source, code) pairs in one request, all admitted or none; results in their order."""
        common = RequestSettings(**settings)
        batch = BatchRequest(items=[EvaluateRequest(task_source=task, code=code, settings=common) for task, code in pairs])
        return BatchResponse.model_validate_json(self._post("/evaluate/batch", batch.model_dump_json(exclude_none=True))).results

    def health(self) -> Health:
        return Health.model_validate_json(self._checked(self._http.get("/health")))

    def metrics(self) -> ServerMetrics:
        return ServerMetrics.model_validate_json(self._checked(self._http.get("/metrics")))

    def _post(self, path: str, body: str) -> bytes:
        return self._checked(self._http.post(path, content=body, headers={"Content-Type": "application/json"}))

    @staticmethod
    def _checked(response: httpx.Response) -> bytes:
        if response.is_success:
            return response.content
        try:
            body = response.json()
        except ValueError:
            body = None
        message = str(body["error"]) if isinstance(body, dict) and "error" in body else response.text
        raise ServiceError(response.status_code, message)
