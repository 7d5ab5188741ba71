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
class BackendPrompt:
    name: str
    language: str
    device_phrase: str
    build_rule: str
    example_reference: str
    example_solution: str


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
        example_reference=(ROOT / entry["example_reference"]).read_text().strip(),
        example_solution=(ROOT / entry["example_solution"]).read_text().strip(),
    )


@cache
def _hints() -> tuple[tuple[re.Pattern[str], str], ...]:
    table = tomllib.loads((ROOT / "hints.toml").read_text())
    return tuple((re.compile(h["pattern"]), h["text"]) for h in table.get("hint", []))


def hints_for(text: str) -> list[str]:
    """The explanations in prompts/hints.toml whose pattern occurs in an error text."""
    return [hint for pattern, hint in _hints() if pattern.search(text)]
