"""The benchmark's tasks and candidates (manifest.toml), and the static check of them (`--check`).

Only the standard library here: KernelBench's spawned processes import this package to unpickle
what they are sent, and should pay for no more than KernelBench's own imports.
"""

from __future__ import annotations

import ast
import fnmatch
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent
MANIFEST = ROOT / "manifest.toml"

EXPECTABLE = ("correct", "incorrect", "compile_error", "runtime_error")
"""Verdicts a candidate can be expected to get (timeout, rejected and harness_error can only happen)."""

VERDICTS = (*EXPECTABLE, "timeout", "rejected", "harness_error", "missing")
"""Every verdict either side reports, in the benchmark's words (see ours.verdict and kernelbench_driver.verdict)."""


@dataclass(frozen=True)
class Task:
    key: str
    """KernelBench's level folder and file name without .py, e.g. level1/40_LayerNorm."""
    path: Path

    @property
    def level(self) -> int:
        return int(self.key.split("/", 1)[0].removeprefix("level"))

    @property
    def source(self) -> str:
        return self.path.read_text()


@dataclass(frozen=True)
class Candidate:
    file: str
    """Path relative to the benchmark's folder, e.g. candidates/level1_40_layernorm_twopass.py."""
    task: Task
    expected: str
    path: Path

    @property
    def name(self) -> str:
        return Path(self.file).stem

    @property
    def source(self) -> str:
        return self.path.read_text()


def load(manifest: Path = MANIFEST) -> tuple[list[Task], list[Candidate]]:
    """The tasks and candidates in manifest order; raises ValueError on a malformed manifest."""
    data = tomllib.loads(manifest.read_text())
    base = manifest.parent
    tasks: dict[str, Task] = {}
    for entry in data.get("tasks", []):
        key = entry["key"]
        if key in tasks:
            raise ValueError(f"task {key} is listed twice")
        tasks[key] = Task(key=key, path=base / "tasks" / f"{key}.py")
    candidates: list[Candidate] = []
    for entry in data.get("candidates", []):
        file, key, expected = entry["file"], entry["task"], entry["expected"]
        if key not in tasks:
            raise ValueError(f"{file}: unknown task {key}")
        if expected not in EXPECTABLE:
            raise ValueError(f"{file}: expected verdict {expected!r} is not one of {', '.join(EXPECTABLE)}")
        candidates.append(Candidate(file=file, task=tasks[key], expected=expected, path=base / file))
    names = [c.name for c in candidates]
    if len(set(names)) != len(names):
        raise ValueError("two candidates share a file name")
    return list(tasks.values()), candidates


def select(candidates: list[Candidate], pattern: str | None) -> list[Candidate]:
    """Candidates whose file (relative path or bare name) matches the glob; all without one."""
    if not pattern:
        return list(candidates)
    return [c for c in candidates if fnmatch.fnmatch(c.file, pattern) or fnmatch.fnmatch(Path(c.file).name, pattern)]


def _defined(tree: ast.Module) -> tuple[set[str], set[str]]:
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    return classes, functions


def extension_names(tree: ast.Module) -> list[str]:
    """The `name=` of every load_inline call whose name is a string constant."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if called != "load_inline":
            continue
        for kw in node.keywords:
            if kw.arg == "name" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                found.append(kw.value.value)
    return found


def check(manifest: Path = MANIFEST) -> list[str]:
    """What is wrong with the manifest, its tasks and candidates; empty when nothing is.

    Each task must define Model, get_inputs and get_init_inputs; each candidate ModelNew and one
    load_inline with a constant name. The names must differ between candidates: KernelBench's
    compile workers build several candidates in one process, where torch renames a second build
    under a used name (name_v1), and the evaluation could then not find the cached one. None may
    contain "lock": KernelBench takes a compile error whose text says "lock" for a lock-file race
    and returns no result, which stops its batch evaluation.
    """
    try:
        tasks, candidates = load(manifest)
    except (OSError, ValueError, KeyError, tomllib.TOMLDecodeError) as exc:
        return [f"{manifest}: {type(exc).__name__}: {exc}"]
    problems: list[str] = []
    if not candidates:
        problems.append(f"{manifest}: no candidates")
    for task in tasks:
        try:
            tree = ast.parse(task.source, filename=str(task.path))
        except (OSError, SyntaxError) as exc:
            problems.append(f"task {task.key}: {type(exc).__name__}: {exc}")
            continue
        classes, functions = _defined(tree)
        missing = [n for n in ("Model",) if n not in classes] + [n for n in ("get_inputs", "get_init_inputs") if n not in functions]
        if missing:
            problems.append(f"task {task.key}: does not define {', '.join(missing)}")
        if not any(c.task.key == task.key for c in candidates):
            problems.append(f"task {task.key}: no candidate uses it")
    seen: dict[str, str] = {}
    for cand in candidates:
        try:
            tree = ast.parse(cand.source, filename=str(cand.path))
        except (OSError, SyntaxError) as exc:
            problems.append(f"{cand.file}: {type(exc).__name__}: {exc}")
            continue
        classes, _ = _defined(tree)
        if "ModelNew" not in classes:
            problems.append(f"{cand.file}: does not define ModelNew")
        names = extension_names(tree)
        if len(names) != 1:
            problems.append(f"{cand.file}: {len(names)} load_inline calls with a constant name; the benchmark wants one")
        for name in names:
            if "lock" in name.lower():
                problems.append(f"{cand.file}: extension name {name!r} contains 'lock'")
            if name in seen:
                problems.append(f"{cand.file}: extension name {name!r} is also used by {seen[name]}")
            seen[name] = cand.file
    return problems


@dataclass(frozen=True)
class Work:
    """One candidate as either evaluator receives it."""

    candidate: str
    """The candidate's name (its file stem)."""
    task: str
    task_source: str
    kernel_source: str
