"""Pulling the candidate module out of a model's reply; a bad reply becomes feedback."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

_FENCE = re.compile(r"```[ \t]*(?P<lang>[\w+-]*)[ \t]*\n(?P<body>.*?)(?:```|\Z)", re.DOTALL)
# A small model, asked for a fix, sometimes answers with the task's reference program itself.
_REFERENCE_CLASS = re.compile(r"^class Model\b", re.MULTILINE)
REFERENCE_ECHO = "it repeated the reference `class Model` instead of writing `class ModelNew` that calls your own kernel"


@dataclass(frozen=True)
class Extraction:
    code: str | None
    problem: str | None


def extract_candidate(reply: str) -> Extraction:
    """The python block that defines ModelNew (the last one, when the model wrote several)."""
    blocks = [m["body"] for m in _FENCE.finditer(reply) if m["lang"].lower() in ("python", "py", "")]
    if not blocks:
        return Extraction(None, "it contained no ```python code block")
    with_model = [b for b in blocks if "ModelNew" in b]
    if not with_model:
        if any(_REFERENCE_CLASS.search(b) for b in blocks):
            return Extraction(None, REFERENCE_ECHO)
        return Extraction(None, "no code block defines class ModelNew")
    code = with_model[-1].strip() + "\n"
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return Extraction(None, f"the code block has a Python syntax error at line {exc.lineno}: {exc.msg}")
    if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body):
        return Extraction(None, "the code block does not define class ModelNew at module level")
    return Extraction(code, None)
