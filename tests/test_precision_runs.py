"""Precision outside the evaluator: the --precision flag, --set eval.tolerance and eval.allow_tf32 and the TOML
keys into EvalConfig; the precision in results.jsonl, traces and their names; one run directory with
an fp32 and a bf16 experiment side by side (resumable, each precision keeping its tolerance); the
report grouping precisions with their tolerance and TF32 policy; the prompt naming the dtype."""

from __future__ import annotations

import io
import json
from functools import partial
from pathlib import Path

import pytest
from cli_runner import run_cli
from rich.console import Console
from typer.testing import Result

from kernel_refinery.agent.chat.models import open_chat_model
from kernel_refinery.agent.config import Variant
from kernel_refinery.agent.prompting import build_messages, idea_messages
from kernel_refinery.agent.state import TaskSpec
from kernel_refinery.bench.compare import compare, resolve_sides
from kernel_refinery.bench.experiment import (
    ExperimentConfig,
    TrajectoryRecord,
    TurnOutcome,
    prepare_run_dir,
    read_precisions,
    read_results,
    run_experiment,
)
from kernel_refinery.bench.render import print_result
from kernel_refinery.bench.report import render_table, report, score
from kernel_refinery.core.errors import RunDirError
from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.results import EvalResult
from kernel_refinery.traces.inspect import TraceLookupError, load_run, one_trajectory
from kernel_refinery.traces.schema import TrajectoryId
from kernel_refinery.traces.store import trace_path

ROOT = Path(__file__).parent.parent
RELU = ROOT / "bench" / "suites" / "builtin" / "level1" / "1_relu.py"
SOLUTION = Path(__file__).parent / "fixtures" / "cpu_solutions" / "1_relu.py"


refinery = partial(run_cli, columns=80)


def one_line_error(result: Result, *phrases: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for phrase in phrases:
        assert phrase in lines[0], f"{phrase!r} not in {lines[0]!r}"


class Captured(Exception):
    """Raised by the stand-ins below once they have the config the command built."""


@pytest.fixture()
def captured(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """`eval` and `run` stop at the evaluator, `experiment` at launch, keeping the config they got."""
    seen: dict[str, object] = {}

    class StopAtEvaluator:
        def __init__(self, config: EvalConfig, *args: object, **kwargs: object) -> None:
            seen["eval"] = config
            raise Captured

    def stop_at_launch(config: ExperimentConfig, run_dir: Path, *args: object, **kwargs: object) -> None:
        seen["experiment"] = config
        seen["run_dir"] = run_dir
        raise Captured

    import kernel_refinery.bench.launch
    import kernel_refinery.tools.evaluator

    monkeypatch.setattr(kernel_refinery.tools.evaluator, "Evaluator", StopAtEvaluator)
    monkeypatch.setattr(kernel_refinery.bench.launch, "launch", stop_at_launch)
    return seen


def test_eval_flags_set_the_evaluator_config(captured: dict[str, object]) -> None:
    result = refinery("eval", RELU, SOLUTION, "--precision", "fp16", "--set", "eval.tolerance=2e-2", "--set", "eval.allow_tf32=true")
    assert isinstance(result.exception, Captured), result.output
    config = captured["eval"]
    assert isinstance(config, EvalConfig)
    assert (config.precision, config.tolerance, config.allow_tf32) == ("fp16", 0.02, True)
    assert config.precision_tolerance.atol == 0.02 and config.dtype_name == "float16"
    result = refinery("eval", RELU, SOLUTION)
    config = captured["eval"]
    assert isinstance(config, EvalConfig)
    assert (config.precision, config.tolerance, config.allow_tf32, config.precision_tolerance.atol) == ("fp32", None, False, 1e-4)


def test_run_flags_set_the_evaluator_config(captured: dict[str, object], tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(["no code"]))
    run_dir = tmp_path / "run"
    result = refinery(
        "run", "--task", RELU, "--model", f"scripted:{script}", "--run-dir", run_dir, "--precision", "bf16", "--set", "eval.tolerance=0.05"
    )
    assert isinstance(result.exception, Captured), result.output
    config = captured["eval"]
    assert isinstance(config, EvalConfig)
    assert (config.precision, config.tolerance, config.allow_tf32) == ("bf16", 0.05, False)
    assert "bf16, atol = rtol = 0.05" in result.output, "the run's header line says what it is judged at"
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["eval"]["precision"] == "bf16" and saved["eval"]["tolerance"] == 0.05


def test_experiment_flags_and_toml_keys_set_the_evaluator_config(captured: dict[str, object], tmp_path: Path) -> None:
    toml = tmp_path / "experiment.toml"
    toml.write_text('variants = ["G"]\n[eval]\ntrials = 7\nprecision = "bf16"\ntolerance = 0.03\nallow_tf32 = true\n')
    result = refinery("experiment", "--config", toml)
    assert isinstance(result.exception, Captured), result.output
    config = captured["experiment"]
    assert isinstance(config, ExperimentConfig)
    ev = config.eval_config()
    assert (ev.precision, ev.tolerance, ev.allow_tf32, ev.trials) == ("bf16", 0.03, True, 7)
    # Flags win over the file, and leave its other [eval] keys alone.
    result = refinery("experiment", "--config", toml, "--precision", "fp16", "--set", "eval.tolerance=1e-3")
    config = captured["experiment"]
    assert isinstance(config, ExperimentConfig)
    ev = config.eval_config()
    assert (ev.precision, ev.tolerance, ev.allow_tf32, ev.trials) == ("fp16", 1e-3, True, 7)
    # Flags alone.
    result = refinery("experiment", "--precision", "bf16", "--set", "eval.allow_tf32=true")
    config = captured["experiment"]
    assert isinstance(config, ExperimentConfig)
    ev = config.eval_config()
    assert (ev.precision, ev.tolerance, ev.allow_tf32) == ("bf16", None, True)


def test_bad_precision_values_are_one_line_user_errors(captured: dict[str, object], tmp_path: Path) -> None:
    one_line_error(refinery("eval", RELU, SOLUTION, "--precision", "fp64"), "--precision must be fp32, fp16 or bf16", "'fp64'")
    one_line_error(refinery("run", "--task", RELU, "--precision", "half"), "--precision", "'half'")
    one_line_error(refinery("experiment", "--precision", "FP16"), "--precision", "'FP16'")
    for bad in ("-1", "0", "abc", "inf", "nan"):
        one_line_error(refinery("eval", RELU, SOLUTION, "--set", f"eval.tolerance={bad}"), "--set eval.tolerance")
    one_line_error(refinery("experiment", "--set", "eval.tolerance=0"), "--set eval.tolerance", "greater than 0")
    toml = tmp_path / "bad.toml"
    toml.write_text('[eval]\nprecision = "fp64"\n')
    one_line_error(refinery("experiment", "--config", toml), "eval.precision", "'fp32', 'fp16' or 'bf16'", "'fp64'")
    toml.write_text("[eval]\ntolerance = -0.1\n")
    one_line_error(refinery("experiment", "--config", toml), "eval.tolerance", "greater than 0")
    assert "eval" not in captured and "experiment" not in captured, "nothing started"


def test_eval_output_prints_precision_and_tolerance() -> None:
    console = Console(file=io.StringIO(), width=80, record=True)
    print_result(console, "relu", EvalResult(status=EvalStatus.COMPILE_ERROR, precision="fp16", tolerance=0.01, allow_tf32=False))
    text = console.export_text()
    assert "precision" in text and "fp16, atol = rtol = 0.01, TF32 off" in text, text


def test_prompt_names_the_dtype_only_at_reduced_precision() -> None:
    task = TaskSpec(name="relu", source=RELU.read_text(), level=1)
    args = {
        "task": task,
        "backend": "cpp",
        "variant": Variant.parse("G"),
        "turn": 1,
        "turns": 1,
        "previous": None,
        "hardware": None,
        "tolerance": 1e-2,
    }
    bf16 = build_messages(**args, precision="bf16")[1].content  # type: ignore[arg-type]  # **args: a dict of mixed value types
    assert "cast to bfloat16 (torch.bfloat16)" in bf16 and "read and write bfloat16 tensors" in bf16, bf16
    fp16 = build_messages(**args, precision="fp16")[1].content  # type: ignore[arg-type]  # **args: a dict of mixed value types
    assert "cast to float16" in fp16 and "bfloat16" not in fp16
    fp32 = build_messages(**args)[1].content  # type: ignore[arg-type]  # **args: a dict of mixed value types
    assert "cast to" not in fp32 and "float16" not in fp32
    ideas = {
        "task": task,
        "backend": "cpp",
        "variant": Variant.parse("G"),
        "parent": None,
        "tried": [],
        "count": 3,
        "hardware": None,
        "tolerance": 1e-2,
    }
    idea_bf16 = idea_messages(**ideas, precision="bf16")[1].content  # type: ignore[arg-type]  # **ideas: a dict of mixed value types
    assert "cast to bfloat16 (torch.bfloat16)" in idea_bf16, idea_bf16
    assert "cast to" not in idea_messages(**ideas)[1].content  # type: ignore[arg-type]  # **ideas: a dict of mixed value types


def record(
    task: str, status: str, speedup: float | None, precision: str, tolerance: float | None, variant: str = "G+E"
) -> TrajectoryRecord:
    return TrajectoryRecord(
        task=task,
        level=1,
        variant=variant,
        sample=0,
        best_status=status,
        best_speedup=speedup,
        best_turn=1 if speedup else None,
        turns=1,
        compiled=status != "compile_error",
        tokens=100,
        per_turn=(TurnOutcome(status=status, speedup=speedup),),
        evals=1,
        precision=precision,
        tolerance=tolerance,
    )


def two_precisions() -> list[TrajectoryRecord]:
    fp32 = [("a", "correct", 1.5), ("b", "correct", 0.5), ("c", "incorrect", None), ("d", "compile_error", None)]
    bf16 = [("a", "correct", 3.0), ("b", "correct", 2.5), ("c", "correct", 1.2), ("d", "incorrect", None)]
    return [record(f"level1/{t}", s, x, "fp32", 1e-4) for t, s, x in fp32] + [record(f"level1/{t}", s, x, "bf16", 1e-2) for t, s, x in bf16]


def test_older_records_read_as_fp32_with_unknown_tolerance(tmp_path: Path) -> None:
    old = {
        "task": "level1/a",
        "level": 1,
        "variant": "G",
        "sample": 0,
        "best_status": "correct",
        "best_speedup": 1.2,
        "best_turn": 1,
        "turns": 1,
        "compiled": True,
        "tokens": 10,
        "per_turn": [["correct", 1.2]],
    }
    (tmp_path / "results.jsonl").write_text(json.dumps(old) + "\n")
    (r,) = read_results(tmp_path)
    assert (r.precision, r.tolerance, r.allow_tf32, r.strategy) == ("fp32", None, False, "refine")
    assert TrajectoryId(task="level1/a", variant="G").slug == "level1__a__G__s0", "fp32 traces keep their old names"
    console = Console(file=io.StringIO(), width=80, record=True)
    report(tmp_path, console=console, plots=False)
    assert "precision fp32, tolerance not recorded" in console.export_text()


def test_report_groups_two_precisions(tmp_path: Path) -> None:
    records = two_precisions()
    (tmp_path / "results.jsonl").write_text("".join(r.model_dump_json() + "\n" for r in records))
    console = Console(file=io.StringIO(), width=80, record=True)
    scores = report(tmp_path, console=console, plots=False)
    by_precision = {s.precision: s for s in scores}
    assert [s.precision for s in scores] == ["fp32", "bf16"] and len(scores) == 2, "one group per precision, fp32 first"
    assert by_precision["fp32"].fast_p["1"] == 0.25 and by_precision["bf16"].fast_p["1"] == 0.75
    assert by_precision["fp32"].correct == 0.5 and by_precision["bf16"].correct == 0.75
    assert (by_precision["fp32"].tolerance, by_precision["bf16"].tolerance) == (1e-4, 1e-2)
    text = console.export_text()
    assert "precision fp32, atol = rtol = 0.0001, TF32 off" in text, text
    assert "precision bf16, atol = rtol = 0.01, TF32 off" in text, text
    assert max(len(line) for line in text.splitlines()) <= 80 and "…" not in text, text
    table_lines = text.split("fast_p by level", 1)[1].splitlines()
    assert any(line.strip().startswith("bf16") or " bf16" in line for line in table_lines), text
    saved = json.loads((tmp_path / "report.json").read_text())["groups"]
    assert {(g["precision"], g["tolerance"], g["allow_tf32"]) for g in saved} == {("fp32", 1e-4, False), ("bf16", 1e-2, False)}
    # One precision alone: no precision line in the table's cells, the header still says it.
    single = render_table(score([r for r in records if r.precision == "fp32"]))
    assert "precision" not in str(single.columns[1].header)


def test_compare_two_precisions_of_one_run(tmp_path: Path) -> None:
    (tmp_path / "results.jsonl").write_text("".join(r.model_dump_json() + "\n" for r in two_precisions()))
    a, b, key, paired_on = resolve_sides(tmp_path, "fp32", "bf16")
    c = compare(a, b, key, paired_on)
    assert (c.a, c.b, c.tasks, c.pairs) == ("fp32", "bf16", 4, 4)
    fast1 = next(m for m in c.metrics if m.metric == "fast_1")
    assert (fast1.a, fast1.b) == (0.25, 0.75)
    # Variants of a run holding two precisions pair within a precision, never across.
    _, _, key, paired_on = resolve_sides(tmp_path, "G+E", "G+E")
    assert "precision" in paired_on and key(two_precisions()[0]) != key(two_precisions()[4])


def test_two_precisions_share_a_run_directory(tmp_path: Path) -> None:
    """Two real (scripted, code-free: nothing compiles) experiments, fp32 then bf16, in one directory."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps(["I would rather not write code."]))
    run_dir = tmp_path / "run"

    def experiment(**eval_settings: object) -> ExperimentConfig:
        return ExperimentConfig.model_validate(
            {
                "tasks": "1_relu",
                "variants": ["G"],
                "turns": 1,
                "hardware_prompt": False,
                "concurrency": 1,
                "llm": {"model": f"scripted:{script}"},
                "eval": eval_settings or None,
            }
        )

    def run(config: ExperimentConfig) -> list[TrajectoryRecord]:
        prepare_run_dir(run_dir, config)
        with open_chat_model(config.llm) as chat:
            return run_experiment(config, run_dir, chat, evaluator=object())

    (fp32,) = run(experiment())
    (bf16,) = run(experiment(precision="bf16"))
    assert (fp32.precision, fp32.tolerance, fp32.allow_tf32) == ("fp32", 1e-4, False)
    assert (bf16.precision, bf16.tolerance, bf16.allow_tf32) == ("bf16", 1e-2, False)
    assert fp32.id.without("precision") == bf16.id.without("precision") and fp32.id != bf16.id
    on_disk = {(r.precision, r.tolerance) for r in read_results(run_dir)}
    assert on_disk == {("fp32", 1e-4), ("bf16", 1e-2)}
    lines = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert [(x["precision"], x["tolerance"], x["allow_tf32"]) for x in lines] == [("fp32", 1e-4, False), ("bf16", 1e-2, False)]
    # Each has its own trace (and checkpoint thread), and the bf16 prompt named the dtype.
    fp32_trace = trace_path(run_dir, TrajectoryId(task="level1/1_relu", variant="G"))
    bf16_trace = trace_path(run_dir, TrajectoryId(task="level1/1_relu", variant="G", precision="bf16"))
    assert fp32_trace.name == "level1__1_relu__G__s0.jsonl" and bf16_trace.name == "level1__1_relu__G__s0__bf16.jsonl"
    trajectories = load_run(run_dir)
    bf16_run = one_trajectory(trajectories, "1_relu", precision="bf16")
    assert bf16_run.path == bf16_trace and "(bf16)" in bf16_run.label
    assert "cast to bfloat16" in bf16_run.records[0].messages[1].content
    assert "cast to" not in one_trajectory(trajectories, "1_relu", precision="fp32").records[0].messages[1].content
    with pytest.raises(TraceLookupError, match="--precision"):
        one_trajectory(trajectories, "1_relu")
    # Resuming either precision runs nothing again; its records stay its own.
    assert run(experiment(precision="bf16")) == [bf16] and run(experiment()) == [fp32]
    assert len(read_results(run_dir)) == 2
    assert {p: n.tolerance for p, n in read_precisions(run_dir).items()} == {"fp32": 1e-4, "bf16": 1e-2}
    # A precision the directory holds keeps its tolerance and TF32 policy; other settings stay refused.
    with pytest.raises(RunDirError, match=r"trajectories judged at bf16, atol = rtol = 0.01, TF32 off"):
        prepare_run_dir(run_dir, experiment(precision="bf16", tolerance=0.05))
    with pytest.raises(RunDirError, match="TF32 allowed"):
        prepare_run_dir(run_dir, experiment(allow_tf32=True))
    with pytest.raises(RunDirError, match=r"differing: loop.turns"):
        bf16_config = experiment(precision="bf16")
        prepare_run_dir(run_dir, bf16_config.model_copy(update={"loop": bf16_config.loop.model_copy(update={"turns": 2})}))
    # And the report shows both, side by side.
    console = Console(file=io.StringIO(), width=80, record=True)
    scores = report(run_dir, console=console, plots=False)
    assert [s.precision for s in scores] == ["fp32", "bf16"]


def test_every_setting_is_reachable_through_set(captured: dict[str, object]) -> None:
    """A new setting is one field on a config model: `--set KEY=VALUE` reaches every field of the
    experiment's settings, by the dotted key its TOML file uses, with no flag to add."""
    from pydantic import BaseModel

    def leaves(model: type[BaseModel], prefix: str = "") -> list[tuple[str, object]]:
        out: list[tuple[str, object]] = []
        instance = model()
        for name, field in model.model_fields.items():
            value = getattr(instance, name)
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                out += leaves(annotation, f"{prefix}{name}.")
            elif isinstance(value, (bool, int, float, str)) and not isinstance(value, Path):
                out.append((f"{prefix}{name}", value))
        return out

    # An experiment names its variants in `variants`: the single-run key is refused, by name.
    refused = {"loop.variant"}
    settable = [(k, v) for k, v in leaves(ExperimentConfig) if k not in refused]
    assert len(settable) > 40 and {"loop.turns", "llm.model", "eval.trials", "eval.guards.checked_timed_calls"} <= {k for k, _ in settable}
    for key, value in settable:
        shown = json.dumps(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else repr(value)
        result = refinery("experiment", "--set", f"{key}={shown}")
        assert isinstance(result.exception, Captured), f"--set {key}={shown}: {result.output}"
        config = captured["experiment"]
        assert isinstance(config, ExperimentConfig)
        *sections, last = key.split(".")
        node: object = config
        for section in sections:
            node = getattr(node, section)
        assert isinstance(node, BaseModel) and last in node.model_fields_set, f"--set {key} did not set it"
    one_line_error(refinery("experiment", "--set", "loop.turnz=3"), "--set loop.turnz", "unknown setting")
    one_line_error(refinery("experiment", "--set", "turns"), "--set 'turns'", "KEY=VALUE")
