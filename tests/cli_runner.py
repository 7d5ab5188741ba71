"""`refinery` invoked in-process, as the CLI tests drive it: every argument as text, a fixed terminal
width (rich wraps by it, so a test's expected text depends on it), user errors as one line."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner, Result

from kernel_refinery.bench.cli import app


def run_cli(*args: str | Path, columns: int = 80, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": str(columns), "REFINERY_DEBUG": "", **(env or {})})
