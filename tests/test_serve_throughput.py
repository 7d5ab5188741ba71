"""benchmarks/serve_throughput.py on CPU: the plumbing of the H200 comparison (the service under many
clients against the pool it fronts), with real C++ candidates from a manifest of its own."""

from __future__ import annotations

import json
from pathlib import Path

from candidates import FIXTURES, candidate

from benchmarks import serve_throughput


def _manifest(root: Path) -> Path:
    (root / "tasks" / "level1").mkdir(parents=True)
    (root / "tasks" / "level1" / "small_relu.py").write_text((FIXTURES / "small_relu_task.py").read_text())
    (root / "candidates").mkdir()
    kinds = {
        "right": ("return ext.scaled_relu(x, 1e-3)", "correct"),  # small_relu's reference is relu(x) * 1e-3
        "wrong": ("return ext.relu_fwd(x)", "incorrect"),
        "crash": ("return ext.crash(x)", "runtime_error"),  # a null-pointer write: SIGSEGV in its worker
    }
    lines = ['[[tasks]]\nkey = "level1/small_relu"\n']
    for name, (body, expected) in kinds.items():
        (root / "candidates" / f"{name}.py").write_text(candidate(body))
        lines.append(f'[[candidates]]\nfile = "candidates/{name}.py"\ntask = "level1/small_relu"\nexpected = "{expected}"\n')
    manifest = root / "manifest.toml"
    manifest.write_text("\n".join(lines))
    return manifest


def test_every_candidate_is_answered_once_through_the_service_as_the_pool_judges_it(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    argv = ["--device", "cpu", "--manifest", str(_manifest(tmp_path)), "--workers", "2", "--clients", "3", "--queue-size", "0"]
    assert serve_throughput.main([*argv, "--trials", "5", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["problems"] == []
    assert report["service_answers"] == {"right": ["correct"], "wrong": ["incorrect"], "crash": ["runtime_error"]}
    assert report["pool_verdicts"] == {"right": "correct", "wrong": "incorrect", "crash": "runtime_error"}
    service, pool = report["sides"]["service"], report["sides"]["pool"]
    assert service["as_expected"] == pool["as_expected"] == 3
    assert service["start_s"] > 0 and service["wall_s"] > 0 and pool["wall_s"] > 0
    assert report["ratio_service_over_pool"] == service["per_hour"] / pool["per_hour"]


def test_a_candidate_answered_twice_or_otherwise_than_by_the_pool_is_a_problem() -> None:
    problems = serve_throughput.disagreements(
        {"a": ["correct"], "b": [], "c": ["correct", "correct"], "d": ["incorrect"]}, {"a": "correct", "d": "correct"}
    )
    assert problems == [
        "b: 0 answers through the service (none)",
        "c: 2 answers through the service (correct, correct)",
        "d: incorrect through the service, correct through the pool",
    ]
