"""Every table `refinery` prints, rendered at 80 columns by a console that is not a terminal (a
file, a pipe, CI): every header and every value is there whole, nothing is cut to an ellipsis."""

from __future__ import annotations

import dataclasses
import io
import re
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from kernel_refinery.agent.state import Attempt
from kernel_refinery.bench.cli import app
from kernel_refinery.bench.compare import Side, compare, render
from kernel_refinery.bench.experiment import TrajectoryRecord, TurnOutcome
from kernel_refinery.bench.render import turn_line
from kernel_refinery.bench.report import render_at_k, render_by_evals, render_strategies, render_table, score, score_strategies
from kernel_refinery.core.numerics import Precision
from kernel_refinery.traces.inspect import load_run, summarise, summary_table
from kernel_refinery.traces.schema import TokenUsage
from kernel_refinery.traces.terminal import print_table

V0_RUN = Path(__file__).parent / "fixtures" / "traces_v0"
LONG_TASK = "level2/99_Conv3d_GroupNorm_Mean_Softmax_Dropout_Tanh_Sum_with_a_long_name"


def console80() -> Console:
    console = Console(file=io.StringIO(), width=80, record=True)
    assert not console.is_terminal, "the rendering under test is the non-TTY one"
    return console


def printed(table: Table, wide: bool = False) -> str:
    console = console80()
    print_table(console, table, wide=wide)
    return console.export_text()


def assert_whole(text: str, expected: list[str], width: int = 80) -> None:
    assert "…" not in text and "..." not in text, text
    assert max(len(line) for line in text.splitlines()) <= width, text
    for item in expected:
        assert item in text, f"{item!r} is cut or missing:\n{text}"


def headers(table: Table) -> list[str]:
    return [str(c.header) for c in table.columns]


def record(
    task: str, variant: str, status: str, speedup: float | None, sample: int = 0, strategy: str = "refine", tokens: int = 1000
) -> TrajectoryRecord:
    return TrajectoryRecord(
        task=task,
        level=1,
        variant=variant,
        sample=sample,
        best_status=status,
        best_speedup=speedup,
        best_turn=1,
        turns=2,
        compiled=status != "compile_error",
        tokens=tokens,
        per_turn=(TurnOutcome(status="compile_error"), TurnOutcome(status=status, speedup=speedup)),
        strategy=strategy,
        evals=2,
    )


KNOWN = [
    ("a", "correct", 2.5),
    ("b", "correct", 0.5),
    ("c", "incorrect", None),
    ("d", "compile_error", None),
]


def known_records(variants: tuple[str, ...] = ("G", "G+E+P+N"), samples: int = 1, strategy: str = "refine") -> list[TrajectoryRecord]:
    return [
        record(f"level1/{t}_{'x' * 30}", v, status, speed, sample=s, strategy=strategy, tokens=1_234_567)
        for v in variants
        for s in range(samples)
        for t, status, speed in KNOWN
    ]


def test_fast_p_table_fits_80_columns_with_its_intervals() -> None:
    scores = score(known_records())
    table = render_table(scores)
    text = printed(table)
    s = scores[0]
    e = s.intervals
    # fast_0 = 50% (a, b correct), fast_1 = 25% (a), fast_2 = 25%, compiled 75%, geomean √(2.5·0.5) = 1.12x.
    values = ["50%", "25%", "75%", "1.12x", "4", "4.9M", "G+E+P+N"]  # 4 × 1,234,567 tokens
    intervals = [f"{100 * e[k].low:.0f}–{100 * e[k].high:.0f}" for k in ("fast_0", "fast_1", "fast_2", "correct", "compiled")]  # type: ignore[operator]  # these estimates have intervals
    intervals.append(f"{e['geomean'].low:.2f}–{e['geomean'].high:.2f}")
    assert_whole(text, headers(table) + values + intervals)
    assert "95% interval" in text and "--wide" in text, "the caption says what the second line is"


def test_fast_p_table_with_strategies_and_samples_fits_80_columns() -> None:
    records = known_records(samples=3) + known_records(samples=3, strategy="best-of-n")
    scores = score(records)
    table = render_table(scores)
    text = printed(table)
    assert_whole(text, [*headers(table)[2:], "best-of-n", "refine", "G+E+P+N", "15M"])  # 12 × 1,234,567 tokens
    assert "variant" in text and "strategy" in text
    assert "its 3 samples" in text
    at_k = render_at_k(scores)
    assert at_k is not None
    assert_whole(printed(at_k), [*headers(at_k), "50%", "25%"])


def test_fast_p_table_with_two_precisions_fits_80_columns() -> None:
    """Precision is one more line of the variant's cell (compact), or a column of its own (wide)."""
    fp32 = known_records(samples=2) + known_records(samples=2, strategy="best-of-n")
    records = fp32 + [r.model_copy(update={"precision": Precision.BF16, "tolerance": 1e-2}) for r in fp32]
    scores = score(records)
    table = render_table(scores)
    text = printed(table)
    assert_whole(text, [*headers(table)[2:], "best-of-n", "refine", "G+E+P+N", "fp32", "bf16"])
    assert "precision" in text and "strategy" in text
    wide = render_table(scores, wide=True)
    assert "precision" in headers(wide)
    assert_whole(printed(wide, wide=True), [*headers(wide), "fp32", "bf16", "fast_1.5"], width=400)
    at_k = render_at_k(scores)
    assert at_k is not None
    assert_whole(printed(at_k), [*headers(at_k), "G+E+P+N bf16"])
    strategies = score_strategies(records)
    assert_whole(printed(render_strategies(strategies)), ["best-of-n bf16", "refine fp32"])
    assert_whole(printed(render_by_evals(strategies)), ["best-of-n bf16", "refine fp32"])


def test_wide_table_has_every_p_and_is_not_cut() -> None:
    scores = score(known_records())
    table = render_table(scores, wide=True)
    text = printed(table, wide=True)
    assert_whole(text, [*headers(table), "fast_0.5", "fast_1.5", "4938268"], width=400)
    assert re.search(r"50% \[\d+–\d+\]", text), text


def test_strategy_tables_fit_80_columns() -> None:
    records = [r for s in ("refine", "best-of-n", "beam") for r in known_records(variants=("G+E",), strategy=s)]
    strategies = score_strategies(records)
    table = render_strategies(strategies)
    assert_whole(printed(table), [*headers(table), "best-of-n", "beam", "2.0", "4.9M"])
    by_evals = render_by_evals(strategies)
    assert_whole(printed(by_evals), [*headers(by_evals), "0.00", "0.75"])


def test_compare_output_fits_80_columns() -> None:
    a = known_records(variants=("G",))
    b = [r.model_copy(update={"variant": "G+E"}) for r in a]
    console = console80()
    render(compare(Side(label="G", records=a), Side(label="G+E", records=b), lambda r: (r.task,), "task"), console)
    text = console.export_text()
    assert_whole(text, ["metric", "B − A", "95% interval", "fast_0", "fast_2", "compiled", "geomean", "includes 0", "[+0.0, +0.0]"])
    assert "no difference excludes zero" in text


def test_traces_list_folds_a_long_task_name_and_keeps_every_number() -> None:
    trajectories = load_run(V0_RUN)
    long = dataclasses.replace(trajectories[0], id=trajectories[0].id.model_copy(update={"task": LONG_TASK, "strategy": "best-of-n"}))
    summaries = [summarise(t) for t in [*trajectories, long]]
    table = summary_table(summaries)
    text = printed(table)
    assert_whole(text, [*headers(table), "1.25x", "G+E", "correct"])
    for s in summaries:
        assert str(s.tokens.total) in text and f"{s.best_turn}/{s.turns}" in text
    # The long name folds inside its column: the column's slices of the row's lines spell it out.
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(LONG_TASK[:10]))
    width = len(lines[first].split(" ")[0])
    spelled = "".join(line[:width].strip() for line in lines[first : first + 6]).replace(" ", "")
    assert spelled.startswith(LONG_TASK + "(best-of-n)"), spelled


def test_run_turn_lines_wrap_instead_of_cutting() -> None:
    console = console80()
    attempt = Attempt(
        turn=3,
        code=None,
        reply="no code here",
        extract_error="the reply had no ```python block " + "x" * 80,
        tokens=TokenUsage(prompt=1000, completion=234),
        phase_seconds={"generate": 12.0},
    )
    console.print(turn_line(attempt, 10))
    text = console.export_text()
    assert "turn 3/10" in text and "no_code" in text and "1234 tok" in text and "12 s" in text
    assert "x" * 40 in text.replace("\n", ""), "the detail wraps, whole"
    assert "…" not in text


@pytest.mark.parametrize(
    "args",
    [
        ["report", "{run}", "--no-plots"],
        ["report", "{run}", "--compare", "G", "G+E+P+N"],
        ["traces", "list", str(V0_RUN)],
        ["report", "{run}", "--no-plots", "--precisions"],
        ["report", "{run}", "--compare", "fp32", "bf16", "--precisions"],
    ],
)
def test_commands_print_whole_tables_to_a_pipe_at_80_columns(args: list[str], tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    records = known_records()
    if "--precisions" in args:  # a run directory holding an fp32 and a bf16 experiment
        args = [a for a in args if a != "--precisions"]
        records += [r.model_copy(update={"precision": Precision.BF16, "tolerance": 1e-2}) for r in records]
    (run / "results.jsonl").write_text("".join(r.model_dump_json() + "\n" for r in records))
    result = CliRunner().invoke(app, [a.format(run=run) for a in args], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "…" not in result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80, result.output


def test_a_turn_speedup_interval_shows_where_the_evaluator_gave_one() -> None:
    from kernel_refinery.traces.inspect import Trajectory, verdict_of

    trajectory = load_run(V0_RUN)[0]
    best = trajectory.records[-1]
    assert best.result is not None and best.result.timing is not None
    timing = best.result.timing.model_copy(update={"speedup_ci95": (1.19, 1.31)})
    record = best.model_copy(update={"result": best.result.model_copy(update={"timing": timing})})
    assert dict(verdict_of(record).details)["speedup"].startswith("1.25x (95% interval 1.19–1.31x)")
    with_interval = Trajectory(id=trajectory.id, path=trajectory.path, records=(*trajectory.records[:-1], record))
    table = summary_table([summarise(with_interval)], wide=True)
    assert_whole(printed(table, wide=True), [*headers(table), "1.19–1.31x"], width=200)
    assert "interval" not in dict(verdict_of(best).details)["speedup"], "older results have none and show none"


def test_traces_never_imports_bench() -> None:
    """The terminal views traces/ needs live in traces/terminal.py: imports run bench → traces only."""
    import ast

    for path in (Path(__file__).parent.parent / "traces").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            )
            assert not [n for n in names if n == "bench" or n.startswith("bench.")], f"{path.name} imports {names}"
