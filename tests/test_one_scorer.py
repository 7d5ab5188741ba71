"""One trajectory key and one scorer, on a real run directory that holds two strategies (refine,
beam) and two precisions (fp32, bf16) of the same tasks.

`refinery report`, `report --compare` and the HTML report (`refinery traces html`) must give the same
fast_p for the same group, and `refinery traces show/diff/list` must pick each of the four
trajectories of one task by flags. The run is two scripted experiments on the CPU: the ReLU task's
second turn is a real C++ kernel (correct at fp32; at bf16 it reads the input as float and fails),
every other reply has no code, so the whole run spends two evaluations.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from kernel_refinery.agent.chat.scripted import ScriptedChatModel
from kernel_refinery.agent.config import ModelSettings, SearchSettings
from kernel_refinery.agent.state import Attempt, best_attempt
from kernel_refinery.agent.strategies import BeamNode, select_seeds
from kernel_refinery.bench.cli import app
from kernel_refinery.bench.compare import compare, resolve_sides
from kernel_refinery.bench.experiment import ExperimentConfig, TrajectoryRecord, read_results, run_experiment
from kernel_refinery.bench.report import GroupScores, report
from kernel_refinery.core.verdict import EvalStatus, Verdict, best
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.processes.pool import EvaluatorPool
from kernel_refinery.tools.results import EvalResult, TimingReport, TimingStats
from kernel_refinery.traces.html import render_report
from kernel_refinery.traces.inspect import TraceLookupError, Trajectory, find_trajectories, load_run, summarise
from kernel_refinery.traces.schema import TrajectoryId, TurnRecord

SOLUTIONS = Path(__file__).parent / "fixtures" / "cpu_solutions"
NO_CODE = "I would rather not write code."
RELU = "level1/1_relu"
KINDS = [("refine", "fp32"), ("refine", "bf16"), ("beam", "fp32"), ("beam", "bf16")]


def kernel_reply(name: str) -> str:
    return f"Here is the kernel.\n\n```python\n{(SOLUTIONS / name).read_text()}```\n"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """Tasks 1_relu and 2_gelu × refine and beam × fp32 and bf16, in one run directory."""
    root = tmp_path_factory.mktemp("one-scorer")
    # Refine's turn 2 writes the ReLU kernel; beam's one round (turn 1) gets no code, as does every GELU turn.
    model = ScriptedChatModel(responses=[], by_task={"1_relu": [NO_CODE, kernel_reply("1_relu.py")], "2_gelu": [NO_CODE]})
    for precision in ("fp32", "bf16"):
        config = ExperimentConfig(
            levels=[1],
            tasks="[12]_*",
            variants=["G+E"],
            strategies=["refine", "beam"],
            loop={"turns": 2, "target_speedup": 1e9, "hardware_prompt": False},
            search=SearchSettings(rounds=1, ideas=1, beam_width=1),
            llm=ModelSettings(model="scripted:x"),
            eval=EvalConfig(
                trials=5, warmup=1, correctness_trials=2, time_compiled_reference=False, cache_dir=cache_dir, precision=precision
            ),
            workers=1,
            concurrency=2,
        )
        with EvaluatorPool(config.eval, workers=1) as pool:
            run_experiment(config, root, model, pool)
    return root


def traces_cli(*args: str | Path) -> Result:
    return CliRunner().invoke(app, ["traces", *map(str, args)], env={"COLUMNS": "220"})


def records(run_dir: Path) -> list[TrajectoryRecord]:
    return read_results(run_dir)


def test_the_run_holds_four_trajectories_of_each_task(run_dir: Path) -> None:
    ids = sorted(r.id for r in records(run_dir))
    assert [(i.task, i.strategy, i.precision) for i in ids] == [
        (RELU, "beam", "bf16"),
        (RELU, "beam", "fp32"),
        (RELU, "refine", "bf16"),
        (RELU, "refine", "fp32"),
        ("level1/2_gelu", "beam", "bf16"),
        ("level1/2_gelu", "beam", "fp32"),
        ("level1/2_gelu", "refine", "bf16"),
        ("level1/2_gelu", "refine", "fp32"),
    ]
    by_id = {r.id: r for r in records(run_dir)}
    assert by_id[TrajectoryId(task=RELU, variant="G+E")].best_status is Verdict.CORRECT
    bf16 = by_id[TrajectoryId(task=RELU, variant="G+E", precision="bf16")]
    assert bf16.per_turn[1].status not in (Verdict.CORRECT, Verdict.NO_CODE), "the float kernel on bf16 input is judged"
    assert by_id[TrajectoryId(task=RELU, variant="G+E", strategy="beam")].best_status is Verdict.NO_CODE


def rates(group: GroupScores) -> dict[str, float | None]:
    return {name: e.value for name, e in group.estimates().items() if name != "geomean"}


def test_report_compare_and_html_give_the_same_fast_p(run_dir: Path, tmp_path: Path) -> None:
    groups = {(g.strategy, g.precision): g for g in report(run_dir, plots=False)}
    assert sorted(groups) == sorted(KINDS)
    # Only refine at fp32 got the ReLU right: 1 of 2 tasks; the other three groups none.
    assert {k: g.estimates()["fast_0"].value for k, g in groups.items()} == {
        ("refine", "fp32"): 0.5,
        ("refine", "bf16"): 0.0,
        ("beam", "fp32"): 0.0,
        ("beam", "bf16"): 0.0,
    }

    # The HTML report scores the traces as the report scores results.jsonl: one row per group.
    page = tmp_path / "report.html"
    made = traces_cli("html", run_dir, "-o", page)
    assert made.exit_code == 0, made.output
    rows = FastPRows()
    rows.feed(page.read_text())
    assert sorted(rows.values) == sorted(KINDS)
    for kind, group in groups.items():
        html = rows.values[kind]
        assert html.pop("tasks") == group.tasks == 2
        assert html == {name: pytest.approx(v) for name, v in rates(group).items() if name != "compiled"}, kind

    # --compare: a side's value is the mean over tasks of its pairs (the other strategy, or precision),
    # so with every task in every group it is the mean of the report's groups of that side.
    for a, b, side_of in (("fp32", "bf16", 1), ("refine", "beam", 0)):
        side_a, side_b, key, _ = resolve_sides(run_dir, a, b)
        comparison = {m.metric: m for m in compare(side_a, side_b, key, "").metrics}
        for name in rates(groups[("refine", "fp32")]):
            for side, label in ((comparison[name].a, a), (comparison[name].b, b)):
                mine = [rates(g)[name] or 0.0 for k, g in groups.items() if k[side_of] == label]
                assert side == pytest.approx(sum(mine) / len(mine)), (a, b, name, label)
    geomean = compare(*resolve_sides(run_dir, "fp32", "bf16")[:2], resolve_sides(run_dir, "fp32", "bf16")[2], "").metrics[-1]
    assert geomean.metric == "geomean" and geomean.a is None, "no task is correct on both sides"


class FastPRows(HTMLParser):
    """The fast_p table of the HTML report: per (strategy, precision), its tasks and each rate's value."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[tuple[str, str], dict[str, float | None]] = {}
        self._row: dict[str, float | None] | None = None
        self._cell = -1
        self._in_table = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "table":
            self._in_table = a.get("id") == "fast-p"
        elif tag == "tr" and self._in_table and "data-strategy" in a:
            self._row = self.values.setdefault((a["data-strategy"], a["data-precision"]), {})
            self._cell = -1
        elif tag == "td" and self._row is not None:
            self._cell += 1
            if a.get("class") == "fast-p-value":
                self._row[f"fast_{a['data-p']}"] = float(a["data-value"])
            elif a.get("class") == "general":
                self._row["general"] = None if a["data-value"] == "None" else float(a["data-value"])
            elif self._cell == 1:
                self._row["correct"] = float(a["data-value"])

    def handle_data(self, data: str) -> None:
        if self._row is not None and self._cell == 0 and "tasks" not in self._row and data.strip():
            self._row["tasks"] = int(data.split()[0])

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._row = None
        elif tag == "table":
            self._in_table = False


def test_traces_show_picks_each_trajectory_by_flags(run_dir: Path) -> None:
    for strategy, precision in KINDS:
        shown = traces_cli("show", run_dir, "1_relu", "--strategy", strategy, "--precision", precision, "--raw")
        assert shown.exit_code == 0, shown.output
        trajectories = {TurnRecord.model_validate_json(line).trajectory for line in shown.stdout.splitlines()}
        assert trajectories == {TrajectoryId(task=RELU, variant="G+E", strategy=strategy, precision=precision)}
    header = traces_cli("show", run_dir, "relu", "--strategy", "beam", "--precision", "bf16").output
    assert "level1/1_relu · G+E · sample 0 (beam, bf16)" in header
    diff = traces_cli("diff", run_dir, "1_relu", "--strategy", "refine", "--precision", "fp32", "--turns", "1", "2")
    assert diff.exit_code == 0 and "no_code → correct" in diff.output, diff.output


def test_an_ambiguous_task_lists_each_trajectory_with_the_flags_that_pick_it(run_dir: Path) -> None:
    ambiguous = traces_cli("show", run_dir, "1_relu")
    assert ambiguous.exit_code == 2
    message = " ".join(ambiguous.output.split())
    assert "task level1/1_relu has 4 trajectories" in message
    for strategy, precision in KINDS:
        # Only the flags that tell them apart: all four share the variant and sample.
        assert f"--strategy {strategy} --precision {precision}" in message
    assert "--variant" not in message and "--sample" not in message
    two = traces_cli("show", run_dir, "1_relu", "--precision", "bf16")
    assert two.exit_code == 2 and "has 2 trajectories" in two.output and "--strategy beam" in " ".join(two.output.split())
    missing = traces_cli("show", run_dir, "1_relu", "--strategy", "best-of-n")
    assert missing.exit_code == 2 and "no strategy 'best-of-n'; strategys: beam, refine" in " ".join(missing.output.split())


def test_traces_list_filters_by_strategy_and_precision(run_dir: Path) -> None:
    listed = traces_cli("list", run_dir, "--strategy", "beam", "--precision", "bf16")
    assert listed.exit_code == 0, listed.output
    rows = [line.split() for line in listed.output.splitlines() if line.strip().startswith("level1/")]
    assert [row[:3] for row in rows] == [["level1/1_relu", "(beam,", "bf16)"], ["level1/2_gelu", "(beam,", "bf16)"]]
    unknown = traces_cli("list", run_dir, "--precision", "fp16")
    assert unknown.exit_code == 2 and "precisions: bf16, fp32" in unknown.output


def test_a_bare_name_is_refused_only_when_the_flags_leave_two_tasks(run_dir: Path) -> None:
    found = load_run(run_dir)
    relu = next(t for t in found if t.id == TrajectoryId(task=RELU, variant="G+E"))
    elsewhere = TrajectoryId(task="level2/1_relu", variant="G")
    other = Trajectory(id=elsewhere, path=relu.path, records=tuple(r.model_copy(update={"trajectory": elsewhere}) for r in relu.records))
    (picked,) = find_trajectories([*found, other], "1_relu", variant="G+E", strategy="refine", precision="fp32")
    assert picked.id == relu.id, "only level1/1_relu ran G+E"
    with pytest.raises(TraceLookupError, match="ambiguous: level1/1_relu, level2/1_relu"):
        find_trajectories([*found, other], "1_relu", strategy="refine", precision="fp32")


def test_the_html_grid_has_a_column_per_strategy_and_precision(run_dir: Path) -> None:
    page = render_report(load_run(run_dir), title="one-scorer")
    cells = re.findall(r'<td class="cell[^"]*" data-variant="G\+E" data-strategy="(\w+)" data-precision="(\w+)"', page)
    assert cells == [(s, p) for s in ("beam", "refine") for p in ("bf16", "fp32")] * 2
    assert "G+E · refine · fp32" in page


STATS = TimingStats(median=1.0, mean=1.0, std=0.0, min=1.0, max=1.0, trials=3, clock="monotonic")


def judged(status: EvalStatus, speedup: float | None = None) -> EvalResult:
    timing = None if speedup is None else TimingReport(candidate=STATS, reference=STATS, speedup=speedup)
    return EvalResult(status=status, timing=timing)


def test_one_function_decides_best_for_attempts_seeds_and_trace_records() -> None:
    """Correct before not, then faster, then the failure that got furthest; the earliest among equals."""
    results = [
        (None, None),  # turn 1: no code
        ("x", judged(EvalStatus.COMPILE_ERROR)),
        ("x", judged(EvalStatus.INCORRECT)),
        ("x", judged(EvalStatus.INCORRECT)),
        ("x", judged(EvalStatus.CORRECT, 1.5)),
        ("x", judged(EvalStatus.CORRECT, 2.0)),
        ("x", judged(EvalStatus.CORRECT, 2.0)),
    ]
    attempts = [Attempt(turn=i + 1, code=code, result=result) for i, (code, result) in enumerate(results)]
    trace = tuple(
        TurnRecord(
            run_id="r",
            trajectory=TrajectoryId(task="t", variant="G"),
            turn=a.turn,
            model="m",
            messages=(),
            reply="",
            code=a.code,
            result=a.result,
            started_at="",
        )
        for a in attempts
    )
    nodes = [BeamNode(f"n{a.turn}", None, None, a) for a in attempts]
    assert best(attempts) is attempts[5] and best_attempt(attempts) is attempts[5]
    assert select_seeds(nodes, 2) == [nodes[5], nodes[6]]
    summary = summarise(Trajectory(id=TrajectoryId(task="t", variant="G"), path=Path("t.jsonl"), records=trace))
    assert summary.best is trace[5] and summary.record().best_turn == 6
    failing = attempts[:4]
    assert best(failing) is attempts[2], "without a correct one, the earliest that got furthest"
    assert best_attempt(failing) is None
    assert select_seeds(nodes[:4], 1) == [nodes[2]]
    assert summarise(Trajectory(id=TrajectoryId(task="t", variant="G"), path=Path("t.jsonl"), records=trace[:4])).best is trace[2]
    assert best([]) is None


def test_the_trajectory_id_is_one_ordered_hashable_key() -> None:
    refine = TrajectoryId(task="level1/1_relu", variant="G+E")
    beam_bf16 = TrajectoryId(task="level1/1_relu", variant="G+E", strategy="beam", precision="bf16")
    other_task = TrajectoryId(task="level1/2_gelu", variant="G")
    assert sorted([other_task, refine, beam_bf16]) == [beam_bf16, refine, other_task], "task, variant, sample, strategy, precision"
    assert beam_bf16.model_copy(update={"strategy": "refine"}) < refine and not refine > refine and refine <= refine
    assert len({refine, TrajectoryId(task="level1/1_relu", variant="G+E", sample=0), beam_bf16}) == 2
    assert beam_bf16.without("sample", "strategy") == ("level1/1_relu", "G+E", "bf16")
    with pytest.raises(ValueError, match="no field level"):
        refine.without("level")
    assert refine.label == "level1/1_relu · G+E · sample 0" and beam_bf16.label == "level1/1_relu · G+E · sample 0 (beam, bf16)"
    assert beam_bf16.flags == "--variant G+E --sample 0 --strategy beam --precision bf16"
    record = TrajectoryRecord(
        task="level1/1_relu", level=1, variant="G+E", sample=0, best_status=Verdict.NO_CODE, best_speedup=None, best_turn=None,
        turns=1, compiled=False, tokens=0, per_turn=(), strategy="beam", precision="bf16",
    )  # fmt: skip
    assert record.id == beam_bf16
