"""One loader for `refinery run` and `refinery experiment`: a TOML file, then the flags given on top.

Flags override the file key by key, inside sections too (`--precision bf16` keeps the file's other
[eval] keys). A bad value is named as the user gave it: `--turns` when it came from a flag,
`loop.turns` (with the file) when it came from the file.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kernel_refinery.core.errors import ConfigError, InputFileError
from kernel_refinery.tools.config import EvalConfig

SECTIONS = ("llm", "loop", "eval", "search")

FLAT_KEYS = {"turns": "loop", "target_speedup": "loop", "hardware_prompt": "loop", "device": "eval", "backend": "eval"}
"""Keys that sat at the top level before the loop and evaluator settings were nested (TOML files
and experiment config.json written before): each moves into its section; the top level wins."""


def nest_flat_keys(data: Mapping[str, Any]) -> dict[str, Any]:
    """Older flat settings in the current layout (a no-op on the current layout)."""
    out = dict(data)
    if "eval" in out and out["eval"] is None:  # older experiments wrote `"eval": null` for the defaults
        del out["eval"]
    for key, section in FLAT_KEYS.items():
        if key not in out:
            continue
        value = out.pop(key)
        table = out.get(section, {})
        if isinstance(table, BaseModel):
            table = table.model_dump(exclude_unset=True)
        if isinstance(table, Mapping):
            out[section] = {**table, key: value}
    return out


def read_toml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(f"config file {path} is not UTF-8 text (byte {exc.start}); give a TOML file") from exc
    except OSError as exc:
        raise InputFileError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputFileError(f"config file {path} is not valid TOML: {exc}") from exc


def _set(tree: dict[str, Any], path: str, value: object) -> None:
    *sections, key = path.split(".")
    for section in sections:
        tree = tree.setdefault(section, {})
    tree[key] = value


def parse_overrides(items: Sequence[str]) -> dict[str, tuple[str, object]]:
    """`--set KEY=VALUE` items by config key, each with the flag as the user gave it. The value is
    read as TOML (5, 0.5, true, "text", [1, 2]); anything TOML does not read is taken as text."""
    out: dict[str, tuple[str, object]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part.isidentifier() for part in key.split(".")):
            raise ConfigError(f"--set {item!r}: give KEY=VALUE with a config key, e.g. --set loop.turns=5 or --set eval.trials=50")
        try:
            value: object = tomllib.loads(f"v = {raw.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw.strip()
        out[key] = (f"--set {key}", value)
    return out


M = TypeVar("M", bound=BaseModel)


def load_settings(model: type[M], path: Path | None, flags: Mapping[str, tuple[str, object]]) -> tuple[M, Path | None]:
    """The config from the TOML file at `path` (if any) with `flags` on top, and the file's run_dir.

    `flags` maps a dotted config key to the flag that set it and its value, for the flags given.
    """
    data = nest_flat_keys(read_toml(path)) if path is not None else {}
    source = f"--config {path}"
    run_dir = data.pop("run_dir", None)
    for section in SECTIONS:
        if not isinstance(data.get(section, {}), dict):
            raise ConfigError(f"{source}: {section} must be a table ([{section}]), not {data[section]!r}")
    for key, (_, value) in flags.items():
        _set(data, key, value)
    try:
        config = model.model_validate(data)
    except ValidationError as exc:
        named = {key: flag for key, (flag, _) in flags.items()}
        details = describe_validation(exc, named)
        from_file = path is not None and any(".".join(map(str, e["loc"])) not in named for e in exc.errors())
        raise ConfigError(f"{source}: {details}" if from_file else details) from exc
    return config, Path(run_dir) if run_dir else None


class EvalSettings(BaseModel):
    """What `refinery eval` reads of a run's or experiment's TOML file: its [eval] table."""

    model_config = ConfigDict(extra="ignore")
    eval: EvalConfig = Field(default_factory=EvalConfig)


def describe_validation(exc: ValidationError, flags: Mapping[str, str] | None = None) -> str:
    """A pydantic error in one line: each bad setting (as the --flag that set it, or its config key)
    and what is wrong with it."""
    flags = flags or {}
    parts = []
    for error in exc.errors():
        where = ".".join(str(x) for x in error["loc"])
        flag = flags.get(where)
        message = str(error["msg"]).removeprefix("Value error, ")
        value = error.get("input")
        if error["type"] == "extra_forbidden":
            message = "unknown setting (a typo, or a setting of another version)"
        if flag is not None and error["type"] in ("literal_error", "enum"):
            expected = str(error.get("ctx", {}).get("expected", "")).replace("'", "")
            parts.append(f"{flag} must be {expected}, not {value!r}")
            continue
        shown = (
            f" (got {value!r})"
            if error["type"] not in ("extra_forbidden", "value_error", "missing") and not isinstance(value, dict)
            else ""
        )
        where = flag or where
        parts.append(f"{where}: {message}{shown}" if where else message)
    return "; ".join(parts)
