"""Dependencies point one way: bench → agent → tools/prompts/traces, and traces → tools.

Every import in the source packages is read with `ast` (also those inside functions and under
TYPE_CHECKING: a lazy import is still a dependency), so a wrong-way import fails here with its file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FORBIDDEN: dict[str, dict[str, str]] = {
    "tools": {
        "agent": "the evaluator knows nothing of the loop",
        "bench": "the evaluator knows nothing of experiments",
        "traces": "traces read the evaluator's results, not the other way",
        "langchain": "the evaluator runs without an LLM stack",
        "langgraph": "the evaluator runs without an LLM stack",
    },
    "traces": {
        "bench": "traces only read their schema; bench builds on traces",
        "agent": "traces only read their schema; the loop writes it",
    },
    "prompts": {"agent": "prompts are files the loop reads", "bench": "prompts are files the loop reads"},
    "agent": {"bench": "bench drives the loop, never the other way"},
}
"""Package -> {top-level module it must not import: why}. A prefix matches: "langchain" covers langchain_core."""


def _imported(node: ast.Import | ast.ImportFrom, package: tuple[str, ...]) -> list[str]:
    """The absolute module names an import statement names (relative ones resolved against `package`)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level == 0:
        return [node.module or ""]
    base = package[: len(package) - (node.level - 1)]
    return [".".join((*base, *([node.module] if node.module else [])))]


def wrong_way_imports(root: Path) -> list[str]:
    """`file:line: what` for every import against FORBIDDEN under `root`."""
    found = []
    for package, rules in FORBIDDEN.items():
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            parts = relative.with_suffix("").parts
            owner = parts if path.name == "__init__.py" else parts[:-1]
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(relative))
            for node in ast.walk(tree):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                for module in _imported(node, owner):
                    top = module.split(".")[0]
                    rule = next((name for name in rules if top == name or top.startswith(name)), None)
                    if rule is not None:
                        found.append(f"{relative}:{node.lineno}: {package}/ imports {module} ({rules[rule]})")
    return found


def test_imports_point_one_way() -> None:
    wrong = wrong_way_imports(ROOT)
    assert not wrong, "imports against the dependency direction:\n" + "\n".join(wrong)


def test_a_wrong_way_import_is_named_with_its_file_and_line(tmp_path: Path) -> None:
    for package in FORBIDDEN:
        (tmp_path / package).mkdir()
    (tmp_path / "tools" / "evaluator.py").write_text("import os\n\n\ndef f():\n    from langchain_core.messages import AIMessage\n")
    (tmp_path / "traces" / "sub").mkdir()
    (tmp_path / "traces" / "sub" / "view.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ...bench import render\n"
    )
    (tmp_path / "agent" / "nodes.py").write_text("from agent.state import Attempt\nimport bench.render as r\n")
    assert wrong_way_imports(tmp_path) == [
        "tools/evaluator.py:5: tools/ imports langchain_core.messages (the evaluator runs without an LLM stack)",
        "traces/sub/view.py:3: traces/ imports bench (traces only read their schema; bench builds on traces)",
        "agent/nodes.py:2: agent/ imports bench.render (bench drives the loop, never the other way)",
    ]
