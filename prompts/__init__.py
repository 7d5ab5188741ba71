"""Prompt templates (Jinja files beside this module) and the per-backend one-shot examples.

Templates render with StrictUndefined: a missing variable is an error, never silent text.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import jinja2

ROOT = Path(__file__).parent


@dataclass(frozen=True)
class Example:
    """A one-shot example: a reference program and a correct candidate for it (files in examples/)."""

    reference: str
    solution: str


@dataclass(frozen=True)
class BackendPrompt:
    name: str
    language: str
    device_phrase: str
    build_rule: str
    module_parts: str
    """What a complete answer holds, in words (the closing instruction of a later turn)."""
    examples: tuple[Example, ...]


@cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(ROOT),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
        autoescape=False,
    )


def render(template: str, **variables: object) -> str:
    """Render `prompts/<template>` (e.g. "task.j2", "feedback/incorrect.j2")."""
    text = _environment().get_template(template).render(**variables)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text.strip() + "\n"


@cache
def backend(name: str) -> BackendPrompt:
    table = tomllib.loads((ROOT / "backends.toml").read_text())
    if name not in table:
        raise KeyError(f"no prompt for backend {name!r}; prompts/backends.toml has {', '.join(sorted(table))}")
    entry = table[name]
    return BackendPrompt(
        name=name,
        language=entry["language"],
        device_phrase=entry["device_phrase"],
        build_rule=entry["build_rule"],
        module_parts=entry["module_parts"],
        examples=tuple(
            Example(reference=(ROOT / e["reference"]).read_text().strip(), solution=(ROOT / e["solution"]).read_text().strip())
            for e in entry["examples"]
        ),
    )


@cache
def _hints() -> tuple[tuple[re.Pattern[str], str], ...]:
    table = tomllib.loads((ROOT / "hints.toml").read_text())
    return tuple((re.compile(h["pattern"]), h["text"]) for h in table.get("hint", []))


def hints_for(text: str) -> list[str]:
    """The explanations in prompts/hints.toml whose pattern occurs in an error text."""
    return [hint for pattern, hint in _hints() if pattern.search(text)]
