"""What a person sees in the terminal: verdicts, turns and trajectory summaries (rich)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from kernel_refinery.core.verdict import EvalStatus, Verdict
from kernel_refinery.tools.results import EvalResult, TimingReport
from kernel_refinery.traces.terminal import badge

if TYPE_CHECKING:
    from kernel_refinery.agent.runner import TrajectoryResult
    from kernel_refinery.agent.state import Attempt
    from kernel_refinery.agent.strategies import StrategyResult

__all__ = ["print_result", "print_trajectory_end", "speedup_text", "turn_line"]


def speedup_text(timing: TimingReport) -> str:
    """`1.23x`, with the evaluator's 95% interval when the result carries one (older ones do not)."""
    interval = getattr(timing, "speedup_ci95", None)
    if interval:
        return f"{timing.speedup:.2f}x (95% interval {interval[0]:.3g}–{interval[1]:.3g}x)"
    return f"{timing.speedup:.2f}x"


def print_result(console: Console, name: str, result: EvalResult) -> None:
    """The verdict on one candidate (`refinery eval`), its steps' findings below."""
    console.print(f"[bold]{name}[/]: {badge(Verdict.of_result(result))}")
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_row("precision", result.judged_at())
    if result.compile is not None:
        hit = "cached" if result.compile.cache_hits and not result.compile.cache_misses else "built"
        table.add_row("compile", f"{result.compile.seconds:.1f} s ({hit})" if result.compile.ok else "failed")
    if result.correctness is not None:
        table.add_row("correctness", result.correctness.summary())
    if result.timing is not None:
        t = result.timing
        table.add_row("candidate", f"{t.candidate.median:.4f} ms median ({t.candidate.trials} trials, {t.candidate.clock})")
        table.add_row("reference", f"{t.reference.median:.4f} ms median")
        if t.reference_compiled is not None:
            table.add_row("torch.compile", f"{t.reference_compiled.median:.4f} ms median")
        elif t.compiled_error:
            table.add_row("torch.compile", f"no baseline: {t.compiled_error}")
        flag = " [yellow](re-verified)[/]" if t.suspicious else ""
        against = f" against {getattr(t, 'baseline', 'eager')}"
        table.add_row("speedup", f"[bold]{speedup_text(t)}[/]{against}{flag}")
        band = getattr(t, "noise_band", None)
        if band is not None:
            verdict = "[yellow]no difference from the reference[/]" if t.within_noise else "outside it"
            table.add_row("A/A band", f"{band[0]:.3g}–{band[1]:.3g}x (the reference against itself): {verdict}")
        if getattr(t, "baseline_fallback", None):
            table.add_row("baseline", f"[yellow]{t.baseline_fallback}[/]")
    if result.static is not None and result.static.warnings:
        table.add_row("warnings", "\n".join(result.static.warnings))
    console.print(table)
    if result.status not in (EvalStatus.CORRECT, None) and result.message:
        console.print(result.message, markup=False, highlight=False)
    if result.profile is not None:
        console.print(result.profile.table, markup=False, highlight=False)


def turn_line(attempt: Attempt, turns: int) -> Text:
    """One turn as it happens: the fixed-width part first, so at 80 columns only the detail wraps."""
    verdict = attempt.verdict
    detail = ""
    if attempt.result is not None:
        detail = attempt.result.headline().split(":", 1)[-1].strip()[:160]
        timing = attempt.result.timing
        interval = getattr(timing, "speedup_ci95", None) if timing is not None else None
        if interval:
            detail += f" [95% {interval[0]:.3g}–{interval[1]:.3g}x]"
    elif attempt.extract_error:
        detail = attempt.extract_error
    seconds = sum(attempt.phase_seconds.values())
    return Text.assemble(
        f"  turn {attempt.turn}/{turns}  ",
        (f"{verdict.value:<13}", verdict.style),
        (f" {seconds:4.0f} s {attempt.tokens.total:6d} tok  ", "dim"),
        detail,
    )


def print_trajectory_end(console: Console, result: TrajectoryResult | StrategyResult) -> None:
    best = result.best
    cost = f"{result.evals} evaluations, {result.tokens.total} tokens"
    if best is None:
        console.print(f"[bold]no correct kernel[/] in {result.turns} turns ({cost})")
    else:
        interval = getattr(best.result.timing, "speedup_ci95", None) if best.result is not None and best.result.timing else None
        shown = f"{best.speedup:.2f}x" + (f" (95% interval {interval[0]:.3g}–{interval[1]:.3g}x)" if interval else "")
        console.print(f"[bold green]best: turn {best.turn}, speedup {shown}[/] ({cost})")
    traces = getattr(result, "traces", (result.trace,))
    console.print("trace: " + ", ".join(str(p) for p in traces), highlight=False)
