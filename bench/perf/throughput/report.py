"""The benchmark's figures as one JSON-able dict, and the tables printed from it.

The dict is what --out writes and what --combine reads back, so a side run in one command and
the other side in another can be shown side by side.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

SCHEMA = 1


def per_hour(count: int, wall_s: float | None) -> float | None:
    return 3600.0 * count / wall_s if wall_s else None


def ratio(report: dict[str, Any]) -> float | None:
    """Our candidates per hour over KernelBench's; None unless both sides ran."""
    ours, kb = report.get("ours"), report.get("kernelbench")
    if not ours or not kb or not ours.get("candidates_per_hour") or not kb.get("candidates_per_hour"):
        return None
    return float(ours["candidates_per_hour"]) / float(kb["candidates_per_hour"])


def combine(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report from several (e.g. `--side ours` and `--side kernelbench` run apart): each side
    from the last report that has it, the candidates listed in any of them."""
    merged: dict[str, Any] = {
        "schema": SCHEMA,
        "candidates": [],
        "ours": None,
        "kernelbench": None,
        "host": {},
        "combined_from": len(reports),
    }
    seen: set[str] = set()
    for report in reports:
        if report.get("schema") != SCHEMA:
            raise ValueError(f"a report of schema {report.get('schema')!r}; this benchmark reads schema {SCHEMA}")
        for cand in report.get("candidates", []):
            if cand["name"] not in seen:
                seen.add(cand["name"])
                merged["candidates"].append(cand)
        for side in ("ours", "kernelbench"):
            if report.get(side):
                merged[side] = report[side]
        merged["host"] = report.get("host") or merged["host"]
    merged["ratio"] = ratio(merged)
    return merged


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def _num(value: float | None, fmt: str = "{:.1f}") -> str:
    return "–" if value is None else fmt.format(value)


def throughput_table(report: dict[str, Any]) -> Table:
    host = report.get("host") or {}
    title = f"candidates per hour on one GPU ({host.get('gpu', 'GPU')}, {host.get('cpu_cores', '?')} CPU cores)"
    table = Table(title=title)
    for column in (
        "evaluator",
        "candidates",
        "wall s",
        "candidates / hour",
        "GPU busy (lock held)",
        "GPU util (NVML)",
        "NVML while compiling",
    ):
        table.add_column(column, justify="left" if column == "evaluator" else "right")
    ours = report.get("ours")
    if ours:
        gpu = ours.get("gpu") or {}
        table.add_row(
            f"ours: EvaluatorPool, {ours.get('workers')} workers",
            str(ours.get("count", len(ours.get("results", {})))),
            _num(ours.get("wall_s")),
            _num(ours.get("candidates_per_hour"), "{:.0f}"),
            _pct(ours.get("busy_fraction")),
            _pct(gpu.get("mean")),
            _pct((gpu.get("mean_by_label") or {}).get("compiling")),
        )
    kb = report.get("kernelbench")
    if kb:
        gpu = kb.get("gpu") or {}
        table.add_row(
            f"KernelBench: eval_from_generations, build_cache, {kb.get('cpu_workers')} CPU workers",
            str(kb.get("count", len(kb.get("results", {})))),
            _num(kb.get("wall_s")),
            _num(kb.get("candidates_per_hour"), "{:.0f}"),
            "–",
            _pct(gpu.get("mean")),
            _pct((gpu.get("mean_by_label") or {}).get("compile")),
        )
    value = report.get("ratio")
    if value is not None:
        table.add_row("[bold]ratio ours / KernelBench[/]", "", "", f"[bold]{value:.2f}x[/]", "", "", "")
    return table


def verdict_rows(report: dict[str, Any]) -> list[tuple[str, str, str, str, str, bool]]:
    """(candidate, task, expected, ours, KernelBench, disagreement) per candidate; a side that did
    not run shows "–" and is left out of the comparison."""
    ours = (report.get("ours") or {}).get("results", {})
    kb = (report.get("kernelbench") or {}).get("results", {})
    rows = []
    for cand in report.get("candidates", []):
        name = cand["name"]
        ours_v = ours[name]["verdict"] if name in ours else ("missing" if report.get("ours") else "–")
        kb_v = kb[name]["verdict"] if name in kb else ("missing" if report.get("kernelbench") else "–")
        shown = [v for v in (ours_v, kb_v) if v != "–"]
        flagged = any(v != cand["expected"] for v in shown) or len(set(shown)) > 1
        rows.append((name, cand["task"], cand["expected"], ours_v, kb_v, flagged))
    return rows


def verdict_table(report: dict[str, Any]) -> Table:
    table = Table(title="verdicts (! marks a disagreement between the evaluators or with the expected verdict)")
    for column in ("", "candidate", "task", "expected", "ours", "KernelBench"):
        table.add_column(column)
    for name, task, expected, ours_v, kb_v, flagged in verdict_rows(report):
        style = "bold red" if flagged else ""
        table.add_row("!" if flagged else "", name, task, expected, ours_v, kb_v, style=style)
    return table


def render(report: dict[str, Any], console: Console) -> None:
    console.print(throughput_table(report))
    console.print(verdict_table(report))
    flagged = sum(1 for row in verdict_rows(report) if row[5])
    ours = report.get("ours") or {}
    notes = []
    if ours:
        notes.append(
            f"ours: device lock held {_num(ours.get('busy_s'))} s of {_num(ours.get('wall_s'))} s, "
            f"{ours.get('worker_starts', '?')} worker starts"
        )
    kb = report.get("kernelbench") or {}
    if kb:
        notes.append(
            f"KernelBench: {_num(kb.get('compile_s'))} s compiling (build_cache), {_num(kb.get('eval_s'))} s evaluating on the GPU"
        )
        if kb.get("harness_errors"):
            notes.append(f"KernelBench stopped on {len(kb['harness_errors'])} candidate(s) and went on: {', '.join(kb['harness_errors'])}")
    notes.append(f"{flagged} of {len(report.get('candidates', []))} candidates flagged")
    for note in notes:
        console.print(note)
