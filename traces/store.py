"""Writing and reading trajectory traces in a run directory (RUN_DIR/traces/*.jsonl)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from kernel_refinery.traces.schema import TrajectoryId, TurnRecord, read_record


def traces_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "traces"


def trace_path(run_dir: Path, trajectory: TrajectoryId) -> Path:
    return traces_dir(run_dir) / f"{trajectory.slug}.jsonl"


def _record_key(record: TurnRecord) -> tuple[int, str | None]:
    return (record.turn, record.node_id)


def append_turn(run_dir: Path, record: TurnRecord) -> bool:
    """Append a turn unless that turn is already there (a resumed run replays its last step).

    Returns whether the record was written. Each line is flushed and fsynced: a kill leaves
    whole lines only.
    """
    path = trace_path(run_dir, record.trajectory)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and any(_record_key(r) == _record_key(record) for r in read_trace(path)):
        return False
    line = record.model_dump_json() + "\n"
    with path.open("a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())
    return True


def read_trace(path: Path) -> list[TurnRecord]:
    """The turns of one trajectory, in order; a torn last line (a killed writer) is skipped."""
    records: dict[tuple[int, str | None], TurnRecord] = {}
    # Split on newlines only: str.splitlines() also splits on U+0085, U+2028 and other separators
    # that JSON leaves unescaped inside strings, so a reply holding one tore its line in two.
    lines = Path(path).read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = read_record(line)
        except json.JSONDecodeError:
            if number == len(lines):
                continue
            raise
        except ValueError as exc:
            if number == len(lines) and "EOF" in str(exc):
                continue
            raise ValueError(f"{path}:{number}: {exc}") from exc
        records[_record_key(record)] = record
    return sorted(records.values(), key=lambda r: (r.turn, r.node_id or ""))


def iter_trajectories(run_dir: Path) -> Iterator[tuple[Path, list[TurnRecord]]]:
    for path in sorted(traces_dir(run_dir).glob("*.jsonl")):
        yield path, read_trace(path)
