"""Benchmark tasks: KernelBench-format programs in `levelN/` folders of a suite.

A task file is a plain KernelBench program: `class Model`, `get_inputs()`, `get_init_inputs()`
and module-level size constants. Our built-in files are sized for a CPU run and may add one
dict literal, `REFINERY_SIZES = {"cuda": {"batch_size": 4096}}`, that `Task.source_for`
substitutes for those constants on that device. Files without it, such as a KernelBench
checkout, are used exactly as written.
"""

from __future__ import annotations

import ast
import fnmatch
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

SIZES_NAME = "REFINERY_SIZES"
DEFAULT_LEVELS = (1, 2, 3, 4)
REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")

_LEADING_NUMBER = re.compile(r"^(\d+)")
_GLOB_CHARS = frozenset("*?[")


class SuiteError(ValueError):
    """A suite folder or task file that cannot be used as given."""


class Task(BaseModel):
    """One program of a suite, kept as its raw text."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """The file's stem, e.g. `19_ReLU`."""
    level: int = Field(ge=1)
    path: Path
    source: str
    """The file's text as read, with the CPU sizes and any REFINERY_SIZES statement."""

    @property
    def key(self) -> str:
        return f"level{self.level}/{self.name}"

    @property
    def sizes(self) -> dict[str, dict[str, Any]]:
        """REFINERY_SIZES of the file, by device; empty for a file without it."""
        _, sizes = _declared_sizes(_parse(self.source, self.path), self.path)
        return sizes

    def source_for(self, device: str) -> str:
        """The program to run on `device`: its sizes substituted, REFINERY_SIZES removed."""
        return render_source(self.source, device, origin=self.path)


def render_source(source: str, device: str, origin: str | Path = "<task>") -> str:
    """Rewrite the module-level constants named in REFINERY_SIZES[device] and drop that dict.

    A device without an entry keeps the constants as written (the CPU size of our files).
    Edits are made on the text, at the spans the parser reports, so comments and layout of
    the rest of the file survive.
    """
    module = _parse(source, origin)
    statement, sizes = _declared_sizes(module, origin)
    if statement is None:
        return source
    assigned = _module_assignments(module)
    _check_names(sizes, assigned, origin)

    data = source.encode()
    starts = _line_starts(data)
    edits: list[tuple[int, int, bytes]] = []
    for name, value in sizes.get(device, {}).items():
        for node in assigned[name]:
            start, end = _span(node.value, starts)
            edits.append((start, end, repr(value).encode()))
    edits.append(_removal(statement, data, starts))

    # Applied back to front so the earlier spans keep their offsets.
    for start, end, text in sorted(edits, reverse=True):
        data = data[:start] + text + data[end:]
    rendered = data.decode()
    _parse(rendered, f"{origin} (rendered for {device})")
    return rendered


def load_task_file(path: Path, level: int) -> Task:
    """Read one task file and check it is a KernelBench program with valid REFINERY_SIZES."""
    path = Path(path)
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SuiteError(f"cannot read task file {path}: {exc}") from exc
    return task_from_source(source, name=path.stem, level=level, path=path)


def task_from_source(source: str, name: str, level: int = 1, path: Path | None = None) -> Task:
    """A task from its program text (a file's, or one sent to `refinery serve`), with the checks
    of `load_task_file`; `path` names it in errors and defaults to `<name>`."""
    path = Path(path) if path is not None else Path(f"<{name}>")
    module = _parse(source, path)
    missing = [required for required in REQUIRED_NAMES if required not in _module_definitions(module)]
    if missing:
        raise SuiteError(
            f"{path} is not a KernelBench task: it has no module-level {', '.join(missing)}; "
            "a task defines class Model, get_inputs() and get_init_inputs() "
            "(rename it with a leading '_' to keep it out of the suite)"
        )
    statement, sizes = _declared_sizes(module, path)
    if statement is not None:
        _check_names(sizes, _module_assignments(module), path)
    return Task(name=name, level=level, path=path, source=source)


def load_suite(
    root: Path,
    levels: Iterable[int] | None = None,
    name_filter: str | None = None,
) -> list[Task]:
    """Tasks of `root/level1` ... `root/level4`, in level order, then by the file's leading number.

    `levels` picks levels (each must have its folder); by default every level folder present
    among 1-4 is read. `name_filter` keeps names containing it (case-insensitive), or matching
    it as a glob when it has `*`, `?` or `[`. A filter that matches nothing gives an empty list.
    """
    root = check_suite_root(Path(root))
    tasks: list[Task] = []
    for level in chosen_levels(root, levels):
        files = [p for p in (root / f"level{level}").glob("*.py") if p.is_file() and not p.name.startswith("_")]
        for path in sorted(files, key=_file_order):
            if name_filter is None or matches(path.stem, name_filter):
                tasks.append(load_task_file(path, level))
    return tasks


def chosen_levels(root: Path, levels: Iterable[int] | None) -> list[int]:
    """The levels to read: those asked for, each with its folder, or every level folder among 1-4."""
    if levels is None:
        return [level for level in DEFAULT_LEVELS if (root / f"level{level}").is_dir()]
    chosen = sorted(set(levels))
    absent = [level for level in chosen if not (root / f"level{level}").is_dir()]
    if absent:
        raise SuiteError(f"suite {root} has no folder for level {', '.join(map(str, absent))}; it has {', '.join(_level_folders(root))}")
    return chosen


def matches(name: str, name_filter: str) -> bool:
    """Case-insensitive: a glob when the filter has glob characters, else a substring."""
    name, pattern = name.lower(), name_filter.lower()
    if _GLOB_CHARS & set(pattern):
        return fnmatch.fnmatchcase(name, pattern)
    return pattern in name


def builtin_suite_root() -> Path:
    return Path(__file__).resolve().parent / "suites" / "builtin"


def resolve_suite(spec: str) -> Path:
    """`builtin`, or the path of a folder holding `level1/`, `level2/`, ... folders."""
    if spec == "builtin":
        return builtin_suite_root()
    return check_suite_root(Path(spec).expanduser())


def check_suite_root(root: Path) -> Path:
    expected = (
        "a suite is 'builtin' or a folder with level1/, level2/, ... subfolders of task files, "
        "e.g. the KernelBench/ folder inside a KernelBench checkout"
    )
    if not root.exists():
        raise SuiteError(f"suite path {root} does not exist; {expected}")
    if not root.is_dir():
        raise SuiteError(f"suite path {root} is a file, not a folder; {expected}")
    if not _level_folders(root):
        hint = ""
        nested = root / "KernelBench"
        if nested.is_dir() and _level_folders(nested):
            hint = f" (the repository root was given: use {nested})"
        raise SuiteError(f"suite path {root} has no levelN folder{hint}; {expected}")
    return root


def _level_folders(root: Path) -> list[str]:
    found = [p for p in root.iterdir() if p.is_dir() and re.fullmatch(r"level\d+", p.name)]
    return [p.name for p in sorted(found, key=lambda p: int(p.name[5:]))]


def _file_order(path: Path) -> tuple[int, int, str]:
    # Numbered files first, by number (so 2_ comes before 10_); others after, by name.
    found = _LEADING_NUMBER.match(path.stem)
    return (0, int(found.group(1)), path.stem) if found else (1, 0, path.stem)


def _parse(source: str, origin: str | Path) -> ast.Module:
    try:
        return ast.parse(source, filename=str(origin))
    except SyntaxError as exc:
        raise SuiteError(f"{origin} is not valid Python (line {exc.lineno}: {exc.msg})") from exc


def _module_definitions(module: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in module.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _module_assignments(module: ast.Module) -> dict[str, list[ast.Assign]]:
    """Plain `name = value` statements at module level, by name, except REFINERY_SIZES."""
    found: dict[str, list[ast.Assign]] = {}
    for node in module.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name != SIZES_NAME:
                found.setdefault(name, []).append(node)
    return found


def _declared_sizes(module: ast.Module, origin: str | Path) -> tuple[ast.stmt | None, dict[str, dict[str, Any]]]:
    statements = [
        node
        for node in module.body
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and any(isinstance(t, ast.Name) and t.id == SIZES_NAME for t in _targets(node))
    ]
    if not statements:
        return None, {}
    if len(statements) > 1:
        lines = ", ".join(str(s.lineno) for s in statements)
        raise SuiteError(f"{origin}: {SIZES_NAME} is assigned more than once (lines {lines}); keep one")
    statement = statements[0]
    usage = f'write it as {SIZES_NAME} = {{"cuda": {{"batch_size": 4096}}}} (device -> constant -> literal value)'
    if len(_targets(statement)) != 1 or statement.value is None:
        raise SuiteError(f"{origin}, line {statement.lineno}: {usage}")
    try:
        sizes = ast.literal_eval(statement.value)
    except (ValueError, TypeError) as exc:
        raise SuiteError(f"{origin}, line {statement.lineno}: {SIZES_NAME} must be a literal ({exc}); {usage}") from exc
    if not isinstance(sizes, dict) or not all(
        isinstance(device, str) and isinstance(values, dict) and all(isinstance(n, str) for n in values) for device, values in sizes.items()
    ):
        raise SuiteError(f"{origin}, line {statement.lineno}: {SIZES_NAME} has the wrong shape; {usage}")
    return statement, sizes


def _targets(node: ast.Assign | ast.AnnAssign) -> list[ast.expr]:
    return list(node.targets) if isinstance(node, ast.Assign) else [node.target]


def _check_names(sizes: dict[str, dict[str, Any]], assigned: dict[str, list[ast.Assign]], origin: str | Path) -> None:
    for device, values in sizes.items():
        unknown = sorted(set(values) - set(assigned))
        if unknown:
            raise SuiteError(
                f"{origin}: {SIZES_NAME}[{device!r}] sets {', '.join(unknown)}, which the file does not "
                f"assign at module level as `name = value`; fix the name or add the assignment "
                f"(module-level constants: {', '.join(sorted(assigned)) or 'none'})"
            )


def _line_starts(data: bytes) -> list[int]:
    # ast columns are UTF-8 byte offsets; bytes.splitlines breaks lines where the tokenizer does.
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def _span(node: ast.expr | ast.stmt, starts: list[int]) -> tuple[int, int]:
    assert node.end_lineno is not None and node.end_col_offset is not None
    return starts[node.lineno - 1] + node.col_offset, starts[node.end_lineno - 1] + node.end_col_offset


def _removal(statement: ast.stmt, data: bytes, starts: list[int]) -> tuple[int, int, bytes]:
    """The edit that deletes the statement: whole lines when it has them to itself."""
    start, end = _span(statement, starts)
    line_start = starts[statement.lineno - 1]
    assert statement.end_lineno is not None
    line_end = starts[statement.end_lineno]
    before = data[line_start:start]
    after = data[end:line_end].strip()
    if before.strip() or (after and not after.startswith(b"#")):
        # Shares a line with other statements (`a = 1; REFINERY_SIZES = ...`): keep it valid.
        return start, end, b"pass"
    # Drop one of the blank lines around it so the file does not gain a double gap.
    prev_blank = statement.lineno >= 2 and not data[starts[statement.lineno - 2] : line_start].strip()
    next_index = statement.end_lineno
    if prev_blank and next_index + 1 < len(starts) and not data[line_end : starts[next_index + 1]].strip():
        line_end = starts[next_index + 1]
    return line_start, line_end, b""
