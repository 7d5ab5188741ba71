"""The rooms and their doors: dependencies point one way, bench → agent → tools/prompts/traces →
core, and every first-party import goes through the one namespace, kernel_refinery.*.

Every import in the source packages is read with `ast` (also those inside functions and under
TYPE_CHECKING: a lazy import is still a dependency), so a wrong-way import fails here with its file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

ROOMS = {"core": "kernel_refinery/core", "tools": "tools", "traces": "traces", "prompts": "prompts", "agent": "agent", "bench": "bench"}
"""Each room of the namespace and its folder in the repository (kernel_refinery/<room> links to it)."""

FORBIDDEN: dict[str, dict[str, str]] = {
    "core": {
        "kernel_refinery.": "core is the shared vocabulary: it imports nothing else of the project",
        "torch": "core is the vocabulary, torch-free, for both sides of every process",
    },
    "tools": {
        "kernel_refinery.agent": "the evaluator knows nothing of the loop",
        "kernel_refinery.bench": "the evaluator knows nothing of experiments",
        "kernel_refinery.traces": "traces read the evaluator's results, not the other way",
        "langchain": "the evaluator runs without an LLM stack",
        "langgraph": "the evaluator runs without an LLM stack",
    },
    "traces": {
        "kernel_refinery.bench": "traces only read their schema; bench builds on traces",
        "kernel_refinery.agent": "traces only read their schema; the loop writes it",
    },
    "prompts": {
        "kernel_refinery.agent": "prompts are files the loop reads",
        "kernel_refinery.bench": "prompts are files the loop reads",
    },
    "agent": {"kernel_refinery.bench": "bench drives the loop, never the other way"},
}
"""Room -> {module prefix it must not import: why}. "langchain" covers langchain_core; "kernel_refinery."
everything of the project but the room itself."""

EVERYWHERE = {
    **{
        name: "first-party code imports through the namespace: kernel_refinery." + name
        for name in ("agent", "tools", "bench", "traces", "prompts", "core")
    },
    "benchmarks": "benchmarks are developer tooling, outside the wheel",
}
"""Top-level names no room imports: the bare folders, and the benchmarks that the wheel leaves out."""


def _imported(node: ast.Import | ast.ImportFrom, package: tuple[str, ...]) -> list[str]:
    """The absolute module names an import statement names (relative ones resolved against `package`)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level == 0:
        return [node.module or ""]
    base = package[: len(package) - (node.level - 1)]
    return [".".join((*base, *([node.module] if node.module else [])))]


def _breaks(module: str, room: str, rules: dict[str, str]) -> str | None:
    """The rule `module` breaks in `room`, if any: a prefix match on the dotted name."""
    if module == f"kernel_refinery.{room}" or module.startswith(f"kernel_refinery.{room}."):
        return None
    return next((prefix for prefix in rules if module == prefix.rstrip(".") or module.startswith(prefix)), None)


def wrong_way_imports(root: Path) -> list[str]:
    """`file:line: what` for every import against FORBIDDEN or EVERYWHERE under `root`."""
    found = []
    for room, folder in ROOMS.items():
        rules = {**FORBIDDEN.get(room, {}), **{f"{name}.": why for name, why in EVERYWHERE.items()}, **EVERYWHERE}
        for path in sorted((root / folder).rglob("*.py")):
            relative = path.relative_to(root)
            parts = ("kernel_refinery", room, *path.relative_to(root / folder).with_suffix("").parts)
            owner = parts if path.name == "__init__.py" else parts[:-1]
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(relative))
            for node in ast.walk(tree):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                for module in _imported(node, owner):
                    rule = _breaks(module, room, rules)
                    if rule is not None:
                        found.append(f"{relative}:{node.lineno}: {room}/ imports {module} ({rules[rule]})")
    return found


def test_imports_point_one_way() -> None:
    wrong = wrong_way_imports(ROOT)
    assert not wrong, "imports against the dependency direction:\n" + "\n".join(wrong)


def test_a_wrong_way_import_is_named_with_its_file_and_line(tmp_path: Path) -> None:
    for folder in ROOMS.values():
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "tools" / "evaluator.py").write_text("import os\n\n\ndef f():\n    from langchain_core.messages import AIMessage\n")
    (tmp_path / "traces" / "sub").mkdir()
    (tmp_path / "traces" / "sub" / "view.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ...bench import render\n"
    )
    (tmp_path / "agent" / "nodes.py").write_text(
        "from kernel_refinery.agent.state import Attempt\nimport kernel_refinery.bench.render as r\n"
    )
    (tmp_path / "kernel_refinery" / "core" / "verdict.py").write_text("from kernel_refinery.tools.results import EvalStatus\n")
    (tmp_path / "bench" / "cli.py").write_text(
        "import tools.timing\nfrom benchmarks import eval\nfrom kernel_refinery.core import errors\n"
    )
    assert wrong_way_imports(tmp_path) == [
        "kernel_refinery/core/verdict.py:1: core/ imports kernel_refinery.tools.results (core is the shared vocabulary: "
        "it imports nothing else of the project)",
        "tools/evaluator.py:5: tools/ imports langchain_core.messages (the evaluator runs without an LLM stack)",
        "traces/sub/view.py:3: traces/ imports kernel_refinery.bench (traces only read their schema; bench builds on traces)",
        "agent/nodes.py:2: agent/ imports kernel_refinery.bench.render (bench drives the loop, never the other way)",
        "bench/cli.py:1: bench/ imports tools.timing (first-party code imports through the namespace: kernel_refinery.tools)",
        "bench/cli.py:2: bench/ imports benchmarks (benchmarks are developer tooling, outside the wheel)",
    ]
