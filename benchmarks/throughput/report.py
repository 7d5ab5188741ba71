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


SUMMED = ("count", "wall_s", "compile_s", "eval_s", "busy_s", "timing_s", "worker_starts")
"""Figures of a side that add up over parts run one after the other."""


def _merge_gpu(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any] | None:
    """Two NVML summaries as one: the series joined, the means taken again over every sample."""
    if not a or not b:
        return a or b
    series = [*a.get("series", []), *b.get("series", [])]
    labels = sorted({*(a.get("mean_by_label") or {}), *(b.get("mean_by_label") or {})})

    def mean(label: str | None) -> float | None:
        chosen = [s[1] for s in series if label is None or s[2] == label]
        return sum(chosen) / (100 * len(chosen)) if chosen else None

    return {
        "interval_s": a.get("interval_s"),
        "samples": len(series),
        "error": a.get("error") or b.get("error"),
        "mean": mean(None),
        "mean_by_label": {label: mean(label) for label in labels},
        "count_by_label": {label: sum(1 for s in series if s[2] == label) for label in labels},
        "series": series,
    }


def merge_side(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """One side run in parts (disjoint candidates, e.g. --candidates 'level1_*' then 'level2_*'):
    candidates, wall times and lock time added up, so the rate is that of the parts back to back."""
    overlap = set(a.get("results", {})) & set(b.get("results", {}))
    if overlap:
        raise ValueError(f"two parts of one side both evaluated {', '.join(sorted(overlap))}")
    merged = {**a, **b}
    for key in SUMMED:
        if key in a or key in b:
            merged[key] = (a.get(key) or 0) + (b.get(key) or 0)
    for key in ("results", "harness_errors", "compiled_in_cache"):
        if key in a or key in b:
            merged[key] = {**(a.get(key) or {}), **(b.get(key) or {})}
    merged["candidates_per_hour"] = per_hour(int(merged.get("count") or 0), merged.get("wall_s"))
    if merged.get("wall_s") and "busy_s" in merged:
        merged["busy_fraction"] = merged["busy_s"] / merged["wall_s"]
    merged["gpu"] = _merge_gpu(a.get("gpu"), b.get("gpu"))
    merged["parts"] = int(a.get("parts", 1)) + int(b.get("parts", 1))
    return merged


def combine(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report from several: a side run in one report and the other in another (each taken
    whole), or one side run in parts over disjoint candidates (added up, see merge_side); a side
    run again over the same candidates replaces the earlier one."""
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
            part = report.get(side)
            if not part:
                continue
            held = merged[side]
            disjoint = held is not None and not set(held.get("results", {})) & set(part.get("results", {}))
            merged[side] = merge_side(held, part) if disjoint else part
        merged["host"] = report.get("host") or merged["host"]
    merged["ratio"] = ratio(merged)
    return merged


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def _num(value: float | None, fmt: str = "{:.1f}") -> str:
    return "–" if value is None else fmt.format(value)


def _parts(side: dict[str, Any]) -> str:
    parts = int(side.get("parts", 1))
    return f" ({parts} parts run apart)" if parts > 1 else ""


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
            f"ours: EvaluatorPool, {ours.get('workers')} workers" + _parts(ours),
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
            f"KernelBench: eval_from_generations, build_cache, {kb.get('cpu_workers')} CPU workers" + _parts(kb),
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
        starts = ours.get("starts") or {}
        if starts:
            notes.append(
                f"ours: {starts.get('runner_starts')} runner starts, {starts.get('from_spares')} of them from spares, "
                f"{starts.get('runner_wait_s')} s waited for runners; {starts.get('judge_starts')} judge start(s); "
                f"the warm template {starts.get('template')}"
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
