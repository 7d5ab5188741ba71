"""The test suite's own machinery, on CPU: a module that needs an optional extra skips naming what is
missing (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import OPTIONAL_STACKS, third_party_imports

TESTS = Path(__file__).parent
ROOT = TESTS.parent


def pytest_in(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        timeout=600,
    )


# The serve tests skip by what they import.


def test_the_serve_tests_need_what_they_and_the_server_import() -> None:
    needed = third_party_imports([TESTS / "test_serve.py", ROOT / "bench" / "serve"])
    assert {"fastapi", "uvicorn", "httpx", "starlette.testclient", "psutil"} <= set(needed)
    assert not {"os", "json", "candidates", "result_compare"} & set(needed), "neither the standard library's nor the tests' own"
    assert not [n for n in needed if n.startswith("kernel_refinery")]
    assert set(OPTIONAL_STACKS) == {"test_serve.py"}


def test_a_module_missing_under_the_serve_stack_skips_the_serve_tests_naming_it(tmp_path: Path) -> None:
    """fastapi present but its opentelemetry missing (the GPU image once): test_serve.py is skipped, not
    an import error that stops the run, and the reason names the missing module."""
    (tmp_path / "no_otel.py").write_text('import sys\n\nsys.modules["opentelemetry"] = None  # import of it fails\n')
    done = pytest_in("--co", "-q", "-rs", "-p", "no_otel", "tests/test_serve.py", env={"PYTHONPATH": str(tmp_path)})
    assert done.returncode in (0, 5), done.stdout[-3000:] + done.stderr[-3000:]
    skipped = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == 1 and "test_serve.py" in skipped[0], done.stdout[-3000:]
    assert "no module 'opentelemetry' here (needed by fastapi)" in skipped[0] and "kernel-refinery[serve]" in skipped[0]
    assert "error" not in done.stdout.lower().split("short test summary")[-1]
    collected = pytest_in("--co", "-q", "tests/test_serve.py")
    assert collected.returncode == 0 and "test_serve.py::" in collected.stdout, "with the stack here, the tests are collected"
