"""`refinery traces`: list, show, diff and the HTML report, on traces of a real CPU run.

The run uses the scripted model with the shared C++ test kernels, so the kernels compile once
per session. The report is loaded in a real headless Chromium (Debian's package; CI installs it).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import struct
import subprocess
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest
from candidates import FIXTURES, candidate
from typer.testing import CliRunner, Result

from kernel_refinery.agent.chat.scripted import scripted_model
from kernel_refinery.agent.config import LoopSettings, ModelSettings, RunConfig
from kernel_refinery.agent.context import RunContext
from kernel_refinery.agent.runner import run_trajectory
from kernel_refinery.agent.state import TaskSpec
from kernel_refinery.bench.cli import app
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.evaluator import Evaluator
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.traces.html import highlight_code, render_report
from kernel_refinery.traces.inspect import (
    SortKey,
    TraceLookupError,
    Trajectory,
    feedback_of,
    find_trajectories,
    load_run,
    resolve_task,
    sort_summaries,
    summarise,
)
from kernel_refinery.traces.schema import SCHEMA_VERSION, TrajectoryId, TurnRecord, UnknownSchemaVersion, read_record
from kernel_refinery.traces.store import append_turn, read_trace, trace_path

BROKEN = candidate("return ext.relu_fwd(x)").replace(
    'cpp_source = r"""', 'cpp_source = r"""\nint broken_helper() { return undeclared_identifier; }', 1
)
WRONG = candidate("return ext.leaky_wrong(x)")
RIGHT = candidate("return ext.relu_fwd(x)")
V0_RUN = FIXTURES / "traces_v0"


def reply(code: str) -> str:
    return f"Here is the kernel.\n\n```python\n{code}```\n"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, cpu_config: EvalConfig, relu_task: TaskProgram, small_relu_task: TaskProgram) -> Path:
    """Three trajectories, two tasks, two variants: every turn is a real evaluation."""
    root = tmp_path_factory.mktemp("traces-run")
    plan = [
        (relu_task, "level1/relu", "G+E", [reply(BROKEN), reply(WRONG), reply(RIGHT)]),
        (relu_task, "level1/relu", "G+E+P", ["I would vectorise the loop with AVX-512.", reply(RIGHT)]),
        (small_relu_task, "level1/small_relu", "G+E", [reply(WRONG), reply(WRONG)]),
    ]
    for task, key, variant, replies in plan:
        # A worker per trajectory. It once worked around a bug, since fixed and tested in
        # test_evaluator_cpu::test_same_candidate_on_another_task_in_one_worker.
        with Evaluator(cpu_config) as evaluator:
            config = RunConfig(
                llm=ModelSettings(model="scripted"),
                # An unreachable target: every scripted reply is used.
                loop=LoopSettings(variant=variant, turns=len(replies), target_speedup=1e9, hardware_prompt=False),
                eval=cpu_config,
            )
            run_trajectory(
                RunContext(config=config, model=scripted_model(replies), evaluator=evaluator, run_dir=root, run_id="traces-test"),
                TaskSpec(name=task.name, source=task.source, level=1),
                TrajectoryId(task=key, variant=variant),
            )
    return root


def cli(*args: str | Path) -> Result:
    # Wide enough that rich wraps no table row or diff line.
    return CliRunner().invoke(app, ["traces", *map(str, args)], env={"COLUMNS": "220"})


def table_rows(output: str) -> list[list[str]]:
    return [line.split() for line in output.splitlines() if line.strip().startswith("level1/")]


def test_run_has_the_planned_trajectories(run_dir: Path) -> None:
    statuses = {(t.id.task, t.id.variant): [r.status for r in t.records] for t in load_run(run_dir)}
    assert statuses == {
        ("level1/relu", "G+E"): ["compile_error", "incorrect", "correct"],
        ("level1/relu", "G+E+P"): ["no_code", "correct"],
        ("level1/small_relu", "G+E"): ["incorrect", "incorrect"],
    }


def test_list_summarises_each_trajectory(run_dir: Path) -> None:
    result = cli("list", run_dir)
    assert result.exit_code == 0, result.output
    rows = table_rows(result.output)
    assert [row[:4] for row in rows] == [
        ["level1/relu", "G+E", "0", "correct"],
        ["level1/relu", "G+E+P", "0", "correct"],
        ["level1/small_relu", "G+E", "0", "incorrect"],
    ]
    relu = next(t for t in load_run(run_dir) if t.id.variant == "G+E")
    tokens = sum(r.tokens.total for r in relu.records)
    # speedup, best turn / turns, tokens of the best attempt
    assert rows[0][4].endswith("x") and rows[0][5:] == ["3/3", str(tokens)]
    assert rows[2][4:6] == ["-", "1/2"], "without a correct turn, the first of the furthest verdicts"


def test_list_filters_by_status_and_variant(run_dir: Path) -> None:
    incorrect = cli("list", run_dir, "--status", "incorrect")
    assert [row[:2] for row in table_rows(incorrect.output)] == [["level1/small_relu", "G+E"]]
    profiled = cli("list", run_dir, "--variant", "G+E+P")
    assert [row[:2] for row in table_rows(profiled.output)] == [["level1/relu", "G+E+P"]]
    nothing = cli("list", run_dir, "--status", "timeout")
    assert nothing.exit_code == 0 and "no trajectory matches" in nothing.output and "incorrect" in nothing.output


def test_list_errors_name_what_exists(run_dir: Path, tmp_path: Path) -> None:
    unknown_variant = cli("list", run_dir, "--variant", "G+E+P+N")
    assert unknown_variant.exit_code == 2
    assert "'G+E+P+N'" in unknown_variant.output and "variants: G+E, G+E+P" in unknown_variant.output
    unknown_status = cli("list", run_dir, "--status", "fast")
    assert unknown_status.exit_code == 2 and "compile_error" in unknown_status.output
    not_a_run = cli("list", tmp_path)
    assert not_a_run.exit_code == 2 and "no traces folder" in not_a_run.output


def test_list_sorts(run_dir: Path) -> None:
    by_turns = table_rows(cli("list", run_dir, "--sort", "turns").output)
    assert next(row[1] for row in by_turns) == "G+E" and by_turns[0][0] == "level1/relu"
    by_speedup = table_rows(cli("list", run_dir, "--sort", "speedup").output)
    speedups = [row[4] for row in by_speedup]
    assert speedups[-1] == "-", "a trajectory without a correct turn sorts last"
    assert [float(s.rstrip("x")) for s in speedups[:2]] == sorted((float(s.rstrip("x")) for s in speedups[:2]), reverse=True)
    summaries = [summarise(t) for t in load_run(run_dir)]
    by_tokens = sort_summaries(summaries, SortKey.TOKENS)
    assert [s.tokens.total for s in by_tokens] == sorted((s.tokens.total for s in summaries), reverse=True)


def test_show_one_turn(run_dir: Path) -> None:
    result = cli("show", run_dir, "relu", "--variant", "G+E", "--turn", "2")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "turn 2" in out and "turn 1 " not in out and "turn 3" not in out
    # The feedback the model saw was turn 1's compiler error; the code and verdict are turn 2's.
    assert "feedback the model saw" in out and "failed to compile" in out and "undeclared_identifier" in out
    assert "return ext.leaky_wrong(x)" in out
    assert "incorrect" in out and "expected 0 got" in out


def test_show_whole_trajectory_and_its_errors(run_dir: Path) -> None:
    result = cli("show", run_dir, "level1/relu", "--variant", "G+E+P")
    assert result.exit_code == 0, result.output
    assert "reply (no code)" in result.output and "vectorise the loop" in result.output
    assert "top operators by self CPU time" in result.output, "the profile table of the correct turn"
    ambiguous = cli("show", run_dir, "relu")
    assert ambiguous.exit_code == 2 and "G+E sample 0: --variant G+E; G+E+P sample 0: --variant G+E+P" in ambiguous.output
    missing = cli("show", run_dir, "gelu")
    assert missing.exit_code == 2 and "no task 'gelu'" in missing.output and "level1/relu, level1/small_relu" in missing.output
    no_turn = cli("show", run_dir, "small_relu", "--turn", "7")
    assert no_turn.exit_code == 2 and "no turn 7" in no_turn.output and "turns: 1, 2" in no_turn.output


def test_show_raw_prints_the_records(run_dir: Path) -> None:
    one = cli("show", run_dir, "relu", "--variant", "G+E", "--turn", "3", "--raw")
    assert one.exit_code == 0
    (line,) = one.stdout.splitlines()
    record = read_record(line)
    assert record.turn == 3 and record.status == "correct" and record.result is not None and record.result.timing is not None
    every = cli("show", run_dir, "small_relu", "--raw")
    assert [json.loads(line)["turn"] for line in every.stdout.splitlines()] == [1, 2]


def test_diff_shows_code_and_verdict_change(run_dir: Path) -> None:
    result = cli("diff", run_dir, "relu", "--variant", "G+E", "--turns", "2", "3")
    assert result.exit_code == 0, result.output
    lines = [line.rstrip() for line in result.output.splitlines()]
    assert "--- turn 2" in lines and "+++ turn 3" in lines
    assert "-        return ext.leaky_wrong(x)" in lines and "+        return ext.relu_fwd(x)" in lines
    assert any(line.startswith("status") and "incorrect → correct" in line for line in lines)
    speedup = next(line for line in lines if line.startswith("speedup"))
    assert "- → " in speedup and speedup.endswith("x")
    compile_fix = cli("diff", run_dir, "relu", "--variant", "G+E", "--turns", "1", "2").output
    assert "-int broken_helper() { return undeclared_identifier; }" in compile_fix
    assert "compile_error → incorrect" in compile_fix
    missing = cli("diff", run_dir, "relu", "--variant", "G+E", "--turns", "3", "9")
    assert missing.exit_code == 2 and "no turn 9" in missing.output and "turns: 1, 2, 3" in missing.output


def test_feedback_is_the_part_about_the_previous_attempt(run_dir: Path) -> None:
    (relu,) = find_trajectories(load_run(run_dir), "relu", variant="G+E")
    first, second, third = relu.records
    assert feedback_of(first) == ""
    assert feedback_of(second).startswith("Evaluation: it failed to compile.")
    assert "Write an improved ModelNew" not in feedback_of(second) and "import torch" not in feedback_of(second)
    assert feedback_of(third).startswith("Evaluation: it compiled and ran but gave wrong results.")


def test_bare_task_names_must_be_unambiguous(run_dir: Path) -> None:
    (relu,) = find_trajectories(load_run(run_dir), "relu", variant="G+E")
    other_level = Trajectory(
        id=TrajectoryId(task="level2/relu", variant="G+E"),
        path=relu.path,
        records=tuple(r.model_copy(update={"trajectory": TrajectoryId(task="level2/relu", variant="G+E")}) for r in relu.records),
    )
    assert resolve_task([relu, other_level], "level2/relu") == "level2/relu"
    with pytest.raises(TraceLookupError, match="ambiguous: level1/relu, level2/relu"):
        resolve_task([relu, other_level], "relu")


def test_a_bare_name_may_leave_out_the_task_number(run_dir: Path) -> None:
    (relu,) = find_trajectories(load_run(run_dir), "relu", variant="G+E")

    def named(task: str) -> Trajectory:
        return Trajectory(id=TrajectoryId(task=task, variant="G+E"), path=relu.path, records=relu.records)

    softmax, gelu, gelu_again = named("level1/4_softmax"), named("level1/2_gelu"), named("level2/7_gelu")
    assert resolve_task([softmax, gelu], "softmax") == "level1/4_softmax"
    assert resolve_task([softmax, gelu], "4_softmax") == "level1/4_softmax"
    with pytest.raises(TraceLookupError, match="ambiguous: level1/2_gelu, level2/7_gelu"):
        resolve_task([softmax, gelu, gelu_again], "gelu")
    with pytest.raises(TraceLookupError, match="no task 'max'"):
        resolve_task([softmax, gelu], "max")


def test_a_nan_output_survives_the_trace_round_trip(tmp_path: Path, cpu_config: EvalConfig, relu_task: TaskProgram) -> None:
    """A kernel that writes NaN gives a verdict whose diffs are NaN or inf. The trace must read back
    what was written: pydantic's default JSON wrote them as null, which the next append of the same
    trajectory (it reads the file first) refused, and that stopped a whole experiment."""
    with Evaluator(cpu_config) as evaluator:
        result = evaluator.evaluate(relu_task, candidate('return ext.scaled_relu(x, float("nan"))'))
    assert result.status == "incorrect" and result.correctness is not None
    assert math.isinf(result.correctness.max_abs_diff) and math.isnan(result.correctness.mismatches[0].actual)
    trajectory = TrajectoryId(task="level1/relu", variant="G+E")
    for turn in (1, 2):
        record = TurnRecord(
            run_id="nan", trajectory=trajectory, turn=turn, model="scripted", messages=(), reply="", result=result, started_at="now"
        )
        assert append_turn(tmp_path, record)
    line = trace_path(tmp_path, trajectory).read_text().splitlines()[0]
    assert '"max_abs_diff":"Infinity"' in line and '"actual":"NaN"' in line
    back = read_trace(trace_path(tmp_path, trajectory))
    assert [r.turn for r in back] == [1, 2]
    assert back[1].result is not None and back[1].result.correctness is not None
    assert math.isinf(back[1].result.correctness.max_abs_diff) and math.isnan(back[1].result.correctness.mismatches[0].actual)


def test_version_0_traces_are_migrated_on_read() -> None:
    records = read_trace(next((V0_RUN / "traces").glob("*.jsonl")))
    assert [r.schema_version for r in records] == [SCHEMA_VERSION, SCHEMA_VERSION]
    assert records[0].trajectory == TrajectoryId(task="level1/relu", variant="G+E", sample=0)
    assert (records[0].tokens.prompt, records[0].tokens.completion) == (410, 95)
    assert [r.status for r in records] == ["compile_error", "correct"] and records[1].speedup == 1.25
    listed = cli("list", V0_RUN)
    assert table_rows(listed.output) == [["level1/relu", "G+E", "0", "correct", "1.25x", "2/2", "1126"]]
    diff = cli("diff", V0_RUN, "relu", "--turns", "1", "2").output
    assert "compile_error → correct" in diff and "+ext = load_inline" in diff


def test_a_record_without_a_version_field_is_version_0() -> None:
    line = (V0_RUN / "traces" / "level1__relu__GE__s0.jsonl").read_text().splitlines()[0]
    raw = json.loads(line)
    del raw["schema_version"]
    assert read_record(json.dumps(raw)).trajectory.task == "level1/relu"


def test_unknown_versions_fail_naming_the_version(tmp_path: Path) -> None:
    line = (V0_RUN / "traces" / "level1__relu__GE__s0.jsonl").read_text().splitlines()[1]
    current = read_record(line).model_dump(mode="json")
    with pytest.raises(UnknownSchemaVersion, match=r"schema version 99 is newer.*upgrade kernel-refinery"):
        read_record(json.dumps({**current, "schema_version": 99}))
    with pytest.raises(UnknownSchemaVersion, match="schema version -3 is unknown"):
        read_record(json.dumps({**current, "schema_version": -3}))
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "future.jsonl").write_text(json.dumps({**current, "schema_version": 99}) + "\n")
    result = cli("list", tmp_path)
    assert result.exit_code == 2 and "future.jsonl:1" in result.output and "version 99" in result.output


class Dom(HTMLParser):
    """Every element's tag and attributes, in document order, plus the text under ids."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}))

    def having(self, tag: str | None = None, **attrs: str) -> list[dict[str, str]]:
        def matches(a: dict[str, str]) -> bool:
            for key, value in attrs.items():
                key = key.rstrip("_").replace("_", "-")
                if key == "class":
                    if value not in a.get("class", "").split():
                        return False
                elif a.get(key) != value:
                    return False
            return True

        return [a for t, a in self.elements if (tag is None or t == tag) and matches(a)]


def parse(html: str) -> Dom:
    dom = Dom()
    dom.feed(html)
    return dom


@pytest.fixture(scope="module")
def report(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("report") / "report.html"
    result = cli("html", run_dir, "-o", path)
    assert result.exit_code == 0, result.output
    return path


def test_report_is_self_contained(report: Path) -> None:
    html = report.read_text()
    dom = parse(html)
    assert not dom.having("link") and not [a for t, a in dom.elements if "src" in a], "nothing is fetched"
    assert all(a["href"].startswith("#") for t, a in dom.elements if "href" in a)
    assert "url(" not in html and "@import" not in html
    assert dom.having("style") and dom.having("script")


def test_report_content(report: Path, run_dir: Path) -> None:
    dom = parse(report.read_text())
    assert len(dom.having("tr", data_task="level1/relu")) == 1
    relu_cells = dom.having("td", class_="cell", data_variant="G+E")
    assert [c["data-status"] for c in relu_cells] == ["correct", "incorrect"]
    assert len(dom.having("td", class_="missing")) == 1, "small_relu was not run under G+E+P"
    # fast_p over each trajectory's best attempt, 2 tasks: relu is correct in both variants.
    fast0 = list(dom.having("td", class_="fast-p-value", data_p="0"))
    assert len(fast0) == 2
    turns = dom.having("details", class_="turn")
    assert [t["data-status"] for t in turns] == ["compile_error", "incorrect", "correct", "no_code", "correct", "incorrect", "incorrect"]
    assert all("data-node-id" in t and "data-parent-id" in t for t in turns), "ready for a search tree"
    assert len(dom.having("svg", class_="speedup-chart")) == 3
    assert dom.having("div", class_="hl"), "pygments highlighting"
    assert len(dom.having("section", class_="diff")) == 6, "one per turn with code"
    html = report.read_text()
    assert "Evaluation: it failed to compile." in html and "top operators by self CPU time" in html
    assert 'class="gd"' in html and 'class="gi"' in html, "diff lines are marked"


def test_highlighting_keeps_every_character_and_lexes_the_cpp() -> None:
    html = str(highlight_code(RIGHT))
    text = unescape(re.sub(r"<[^>]+>", "", re.sub(r'<span class="linenos">.*?</span>', "", html)))
    assert text.rstrip("\n") == RIGHT.rstrip("\n")
    assert '<span class="kt">float</span>' in html, "the kernel source inside the string is lexed as C++"


def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.skip("chromium is not installed (.ci/run installs Debian's chromium; locally: apt-get install -y chromium)")
    return path


def headless(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
    ]
    return subprocess.run([binary, *flags, *args], capture_output=True, timeout=180, check=False)


def test_report_renders_in_chromium(report: Path, tmp_path: Path) -> None:
    binary = chromium()
    dumped = headless(binary, tmp_path / "profile-dom", "--dump-dom", report.as_uri())
    assert dumped.returncode == 0, dumped.stderr.decode()[-2000:]
    dom = parse(dumped.stdout.decode())
    assert dom.having("body", data_js="ready"), "the inlined script ran"
    assert len(dom.having("table", id="overview-grid")) == 1
    assert len(dom.having("td", class_="cell")) == 4
    assert len(dom.having("table", id="fast-p")) == 1
    trajectories = dom.having("article", class_="trajectory")
    assert [(t["data-task"], t["data-variant"]) for t in trajectories] == [
        ("level1/relu", "G+E"),
        ("level1/relu", "G+E+P"),
        ("level1/small_relu", "G+E"),
    ]
    assert len(dom.having("details", class_="turn")) == 7
    assert dom.having("circle", class_="point")

    shot = tmp_path / "report.png"
    taken = headless(binary, tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1280,1600", report.as_uri())
    assert taken.returncode == 0, taken.stderr.decode()[-2000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (1280, 1600)
    assert len(png) > 50_000, "a blank page compresses to a few kB"


def test_report_of_version_0_traces(tmp_path: Path) -> None:
    html = render_report(load_run(V0_RUN), title="v0")
    dom = parse(html)
    assert [t["data-status"] for t in dom.having("details", class_="turn")] == ["compile_error", "correct"]
    assert "1.25x" in html


def test_report_shows_the_intervals_of_its_scores(report: Path) -> None:
    html = report.read_text()
    dom = parse(html)
    assert "95% interval" in html and "BCa bootstrap over tasks" in html
    # Scored as `refinery report` scores them: G+E ran 2 tasks and got relu right: 1 of 2, 0–100%,
    # an interval on the correct rate, the general rate (the relu kernel passed its shape variants)
    # and each fast_p; G+E+P ran relu only: one task, no interval.
    cells = dom.having("td", class_="fast-p-value", data_p="0")
    assert [c["data-value"] for c in cells] == ["0.5", "1.0"]
    rows = html[html.index('<table id="fast-p"') :]
    rows = rows[: rows.index("</table>")].split('<tr data-level="1" data-variant=')[1:]
    assert [row.count('class="ci"') for row in rows] == [8, 0]
    assert [c["data-value"] for c in dom.having("td", class_="general")] == ["0.5", "1.0"]
    assert "0–100%" in html
