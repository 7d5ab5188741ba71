"""A task's module-level constants, and its program with some of them set to other values.

KernelBench fixes a task's sizes and hyper-parameters in module-level constants (`batch_size = 16`,
`dim = 16384`, `kernel_size = (3, 5)`, `M = 1024 * 2`) that `get_inputs()` and `get_init_inputs()`
read. The shape and init variants of the correctness check (tools/steps/shape_variants.py) are the
same program with other values in those assignments: the text is edited where the parser places
each value, so constants derived from them (`groups = in_channels`, `bias_shape = (out_channels, 1, 1)`)
and any code of the task that reads them follow, as they would had the author written the other
value. The judge and the runner both make a variant's program from the task's text and the same
overrides; nothing here imports torch.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Value = int | float | tuple[int, ...]
"""A constant a variant may change: an int, a float, or a tuple of ints (a kernel size, an input shape)."""

Overrides = tuple[tuple[str, Value], ...]
"""Constants set to other values, by name, in the order the task assigns them."""


@dataclass(frozen=True)
class Constant:
    name: str
    value: Value
    line: int


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Div: operator.truediv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def _literal(node: ast.expr) -> Value | None:
    """The value of a number written with literals only (`16`, `1024 * 2`, `-1e-3`, `(3, 5)`), else None."""
    if isinstance(node, ast.Constant):
        value = node.value
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _literal(node.operand)
        if isinstance(inner, (int, float)):
            return -inner if isinstance(node.op, ast.USub) else inner
        return None
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _literal(node.left), _literal(node.right)
        if not isinstance(left, (int, float)) or not isinstance(right, (int, float)):
            return None
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            return None
        try:
            value = _BINARY[type(node.op)](left, right)
        except ArithmeticError:
            return None
        return value if isinstance(value, (int, float)) else None
    if isinstance(node, ast.Tuple) and node.elts:
        items = [_literal(e) for e in node.elts]
        if all(type(v) is int for v in items):
            return tuple(v for v in items if isinstance(v, int))
    return None


def _assignments(module: ast.Module) -> dict[str, list[ast.Assign | ast.AnnAssign]]:
    """Module-level statements that assign a plain name, by that name (chained `a = b = 1` under each)."""
    found: dict[str, list[ast.Assign | ast.AnnAssign]] = {}
    for node in module.body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        else:
            continue
        for target in targets:
            for name in ast.walk(target):
                if isinstance(name, ast.Name):
                    found.setdefault(name.id, []).append(node)
    return found


def literal_constants(source: str) -> dict[str, Constant]:
    """The module-level names assigned once, from literals only, in the order of the file.

    A name assigned more than once, or from anything but literals (`groups = in_channels`, a call),
    is not one: a variant cannot set it without changing what the file means."""
    module = ast.parse(source)
    found: dict[str, Constant] = {}
    for name, statements in _assignments(module).items():
        if len(statements) != 1 or name.startswith("_"):
            continue
        (statement,) = statements
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        if not all(isinstance(t, ast.Name) for t in targets) or statement.value is None:
            continue
        value = _literal(statement.value)
        if value is not None:
            found[name] = Constant(name, value, statement.lineno)
    return dict(sorted(found.items(), key=lambda item: item[1].line))


def with_constants(source: str, overrides: Mapping[str, Value] | Overrides) -> str:
    """The program with each named constant's assignment set to the given value; the rest of the
    text as it was. Raises ValueError for a name that `literal_constants` does not find."""
    values = dict(overrides)
    if not values:
        return source
    constants = literal_constants(source)
    unknown = sorted(set(values) - set(constants))
    if unknown:
        raise ValueError(f"the task assigns no literal constant {', '.join(unknown)}")
    module = ast.parse(source)
    data = source.encode()
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def span(node: ast.expr | ast.stmt) -> tuple[int, int]:
        assert node.end_lineno is not None and node.end_col_offset is not None
        return starts[node.lineno - 1] + node.col_offset, starts[node.end_lineno - 1] + node.end_col_offset

    edits: list[tuple[int, int, bytes]] = []
    seen: set[int] = set()
    for name in values:
        (statement,) = _assignments(module)[name]
        if id(statement) in seen:
            continue
        seen.add(id(statement))
        assert statement.value is not None
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        if len(targets) == 1:
            edits.append((*span(statement.value), repr(values[name]).encode()))
            continue
        # `height = width = 128` with one of them changed: one assignment each, on the same line.
        start, end = span(statement.value)
        original = data[start:end].decode()
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        text = "; ".join(f"{n} = {values[n]!r}" if n in values else f"{n} = {original}" for n in names)
        edits.append((*span(statement), text.encode()))
    for start, end, replacement in sorted(edits, reverse=True):
        data = data[:start] + replacement + data[end:]
    return data.decode()


def dependencies(source: str) -> dict[str, set[str]]:
    """For each module-level name, the names its assignments read (`groups = in_channels` gives
    {"groups": {"in_channels"}}): a function that reads `groups` depends on `in_channels` too."""
    found: dict[str, set[str]] = {}
    for name, statements in _assignments(ast.parse(source)).items():
        for statement in statements:
            if statement.value is not None:
                found.setdefault(name, set()).update(n.id for n in ast.walk(statement.value) if isinstance(n, ast.Name))
    return found
