"""Shape and init variants (tools/steps/shape_variants.py): real C++ candidates through the real
Evaluator, on tasks whose sizes come from module-level constants; and the pieces beneath them."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from candidates import FIXTURES, task_source
from rich.console import Console

from kernel_refinery.agent.chat.scripted import ScriptedChatModel
from kernel_refinery.agent.config import ModelSettings, Variant
from kernel_refinery.agent.prompting import evaluation_feedback
from kernel_refinery.bench.experiment import ExperimentConfig, run_experiment
from kernel_refinery.bench.report import report
from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.evaluator import Evaluator
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.tools.processes.pool import EvaluatorPool
from kernel_refinery.tools.processes.programs import Program, import_source
from kernel_refinery.tools.results import EvalResult, ShapeVariantsReport, Stage
from kernel_refinery.tools.steps.degenerate import SAMPLE, Degenerate, SpreadProbe, _sample, combine
from kernel_refinery.tools.steps.shape_variants import derive, repair
from kernel_refinery.tools.steps.task_constants import literal_constants, with_constants

KERNELS = (FIXTURES / "shape_kernels.cpp").read_text()
FUNCTIONS = ["softmax_rows", "softmax_rows_1024", "softmax_rows_by8", "group_sum", "zeros_column"]
UP_TO_CORRECTNESS = (Stage.STATIC, Stage.COMPILE, Stage.CORRECTNESS)


def shape_candidate(forward: str, init_args: str = "", init: str = "pass", methods: str = "") -> str:
    """A candidate whose ModelNew(init_args).forward(x) returns `forward`, on the shape kernels."""
    return f'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
{KERNELS}"""

ext = load_inline(name="refinery_test_shape_kernels", cpp_sources=cpp_source, functions={FUNCTIONS!r}, extra_cflags=["-O2"])


class ModelNew(nn.Module):
    def __init__(self{init_args}):
        super().__init__()
{textwrap.indent(init, " " * 8)}

    def forward(self, x):
        return {forward}
{textwrap.indent(textwrap.dedent(methods), " " * 4)}'''


@pytest.fixture(scope="module")
def row_softmax() -> TaskProgram:
    return TaskProgram(name="row_softmax", source=task_source("row_softmax_task"))


@pytest.fixture(scope="module")
def evaluator(cpu_config: EvalConfig) -> Iterator[Evaluator]:
    with Evaluator(cpu_config.model_copy(update={"shapes": "report"})) as ev:
        yield ev


def shapes_of(result: EvalResult) -> ShapeVariantsReport:
    assert result.correctness is not None and result.correctness.shapes is not None, result.message
    return result.correctness.shapes


def test_a_kernel_hard_coding_the_column_count_passes_its_shapes_and_fails_a_variant(
    evaluator: Evaluator, row_softmax: TaskProgram
) -> None:
    fixed = shape_candidate("ext.softmax_rows_1024(x)")
    result = evaluator.run(row_softmax, fixed, UP_TO_CORRECTNESS)
    # "report": KernelBench's verdict stands (its trials ran at 16 x 1024, where the kernel is right) ...
    assert result.status is EvalStatus.CORRECT, result.message
    shapes = shapes_of(result)
    assert shapes.mode == "report" and not shapes.general
    failure = shapes.failure
    assert failure is not None and failure.status == "wrong"
    # ... but the larger variant's columns are not 1024, and the diff says where.
    assert failure.name == "larger" and failure.overrides == {"dim": 1153}
    assert "values outside atol" in failure.reason and failure.mismatches and failure.max_abs_diff > 1e-3
    assert shapes.constants["dim"] == 1024
    assert [v.status for v in shapes.variants[1:]] == ["not_run"] * (len(shapes.variants) - 1)

    # "require": the same kernel is incorrect, the variant and its diff named, in G+E's feedback too.
    strict = evaluator.with_config(evaluator.config.model_copy(update={"shapes": "require"}))  # a view: closed with the original
    required = strict.run(row_softmax, fixed, UP_TO_CORRECTNESS)
    assert required.status is EvalStatus.INCORRECT
    assert "shape variant larger (dim=1153)" in required.message and "its own: dim=1024" in required.message
    assert "values outside atol" in required.message
    feedback = evaluation_feedback(required, Variant.parse("G+E"))
    assert "larger (dim=1153)" in feedback and "gave wrong results" in feedback


def test_a_kernel_without_a_tail_loop_fails_at_an_odd_size(evaluator: Evaluator, row_softmax: TaskProgram) -> None:
    result = evaluator.run(row_softmax, shape_candidate("ext.softmax_rows_by8(x)"), UP_TO_CORRECTNESS)
    assert result.status is EvalStatus.CORRECT, result.message  # 1024 columns: 8 divides them
    failure = shapes_of(result).failure
    assert failure is not None and failure.status == "wrong", shapes_of(result)
    dim = failure.overrides["dim"]
    assert isinstance(dim, int) and dim % 8 != 0
    assert "values outside atol" in failure.reason and failure.mismatches


def test_an_honest_generic_kernel_passes_every_variant(evaluator: Evaluator, row_softmax: TaskProgram) -> None:
    result = evaluator.run(row_softmax, shape_candidate("ext.softmax_rows(x)"), UP_TO_CORRECTNESS)
    assert result.status is EvalStatus.CORRECT, result.message
    shapes = shapes_of(result)
    assert shapes.general and shapes.failure is None
    assert [(v.name, v.status) for v in shapes.variants] == [("larger", "passed"), ("odd", "passed"), ("small", "passed")]
    assert shapes.variants[2].overrides == {"batch_size": 1, "dim": 127}
    assert result.correctness is not None and "passed 3 shape/init variants" in result.correctness.summary()
    assert result.correctness.degenerate == "", "softmax of random rows varies"


def test_a_kernel_refusing_other_sizes_crashed_and_a_pytorch_fallback_is_named(evaluator: Evaluator, row_softmax: TaskProgram) -> None:
    refuse = """
        def checked(self, x):
            if x.shape[1] != 1024:
                raise ValueError("this kernel takes rows of 1024 columns")
            return ext.softmax_rows_1024(x)
    """
    result = evaluator.run(row_softmax, shape_candidate("self.checked(x)", methods=refuse), UP_TO_CORRECTNESS)
    failure = shapes_of(result).failure
    assert result.status is EvalStatus.CORRECT and failure is not None, result.message
    assert failure.status == "crashed" and "ValueError: this kernel takes rows of 1024 columns" in failure.reason, failure

    fallback = shape_candidate("ext.softmax_rows_1024(x) if x.shape[1] == 1024 else x.softmax(dim=1)")
    result = evaluator.run(row_softmax, fallback, UP_TO_CORRECTNESS)
    failure = shapes_of(result).failure
    assert result.status is EvalStatus.CORRECT and failure is not None, result.message
    assert failure.status == "fallback" and "PyTorch fallback" in failure.reason, failure
    strict = evaluator.with_config(evaluator.config.model_copy(update={"shapes": "require"}))
    required = strict.run(row_softmax, fallback, UP_TO_CORRECTNESS)
    assert required.status is EvalStatus.REJECTED and "shape variant larger (dim=1153)" in required.message


def test_sizes_that_must_divide_each_other_get_only_valid_variants(evaluator: Evaluator) -> None:
    task = TaskProgram(name="group_sum", source=task_source("group_sum_task"))
    honest = shape_candidate("ext.group_sum(x, self.groups)", init_args=", groups", init="self.groups = groups")
    result = evaluator.run(task, honest, UP_TO_CORRECTNESS)
    assert result.status is EvalStatus.CORRECT, result.message
    shapes = shapes_of(result)
    own = {name: c.value for name, c in literal_constants(task.source).items()}
    for variant in shapes.variants:
        values = {**own, **variant.overrides}
        channels, groups = values["channels"], values["groups"]
        assert isinstance(channels, int) and isinstance(groups, int)
        assert channels % groups == 0, variant
        assert variant.status == "passed", variant
    # Channels and groups did change, each in some variant, and the init variant built ModelNew(5).
    assert {v.name for v in shapes.variants} == {"larger", "odd", "small", "init"}
    assert any("channels" in v.overrides for v in shapes.variants)
    init = next(v for v in shapes.variants if v.name == "init")
    assert init.kind == "init" and init.overrides["groups"] == 5


def test_off_runs_no_variant_and_no_probe(cpu_config: EvalConfig, row_softmax: TaskProgram) -> None:
    with Evaluator(cpu_config.model_copy(update={"shapes": "off"})) as ev:
        result = ev.run(row_softmax, shape_candidate("ext.softmax_rows_1024(x)"), UP_TO_CORRECTNESS)
    assert result.status is EvalStatus.CORRECT
    assert result.correctness is not None and result.correctness.shapes is None and result.correctness.degenerate is None


def test_a_scripted_experiment_shows_the_general_share_and_marks_a_degenerate_task(cache_dir: Path, tmp_path: Path) -> None:
    """Three tasks, one turn each: a kernel specialised to its task's columns, a generic one, and a
    column of zeros for a task whose reference gives nothing else. All three are correct."""
    level = tmp_path / "suite" / "level1"
    level.mkdir(parents=True)
    for name, fixture in (("1_row_softmax", "row_softmax_task"), ("2_group_sum", "group_sum_task"), ("3_max_minus_mean", "constant_task")):
        (level / f"{name}.py").write_text(task_source(fixture))

    def reply(code: str) -> str:
        return f"Here is my kernel.\n\n```python\n{code}```\n"

    model = ScriptedChatModel(
        responses=[],
        by_task={
            "1_row_softmax": [reply(shape_candidate("ext.softmax_rows_1024(x)"))],
            "2_group_sum": [reply(shape_candidate("ext.group_sum(x, self.groups)", init_args=", groups", init="self.groups = groups"))],
            "3_max_minus_mean": [reply(shape_candidate("ext.zeros_column(x)", init_args=", in_features, out_features"))],
        },
    )
    config = ExperimentConfig(
        suite=str(level.parent),
        levels=[1],
        variants=["G+E"],
        loop={"turns": 1, "target_speedup": 1e9, "hardware_prompt": False},
        llm=ModelSettings(model="scripted:x"),
        eval=EvalConfig(trials=5, warmup=1, correctness_trials=2, time_compiled_reference=False, cache_dir=cache_dir),
        workers=1,
        concurrency=1,
    )
    run_dir = tmp_path / "run"
    with EvaluatorPool(config.eval, workers=1) as pool:
        records = {r.task: r for r in run_experiment(config, run_dir, model, pool)}
    assert {t: (r.best_status, r.best_general) for t, r in records.items()} == {
        "level1/1_row_softmax": ("correct", False),
        "level1/2_group_sum": ("correct", True),
        "level1/3_max_minus_mean": ("correct", True),
    }
    degenerate = records["level1/3_max_minus_mean"].degenerate
    assert degenerate is not None and degenerate.startswith("all zeros: every output value is 0 on 2 random inputs, for each of 2 trials")
    assert records["level1/1_row_softmax"].degenerate == ""

    console = Console(width=80, record=True, color_system=None)
    (group,) = report(run_dir, console=console, plots=False)
    assert group.correct == 1.0 and group.general == pytest.approx(2 / 3)
    assert group.degenerate_tasks == ["level1/3_max_minus_mean"]
    text = console.export_text()
    header = next(line for line in text.splitlines() if "fast_0" in line)
    assert header.split() == ["level", "variant", "tasks", "fast_0", "fast_1", "fast_2", "correct", "general", "geomean", "tokens"]
    row = next(line for line in text.splitlines() if line.startswith("1 ") and "G+E" in line).split()
    assert row[2:3] == ["3"] and row[6:8] == ["100%", "67%"], row
    assert "*: degenerate tasks" in text and "level1/3_max_minus_mean" in text
    saved = json.loads((run_dir / "report.json").read_text())["groups"][0]
    assert saved["general"] == pytest.approx(2 / 3) and saved["correct"] == 1.0
    assert saved["degenerate_tasks"] == ["level1/3_max_minus_mean"]


# --- the pieces, in this process ------------------------------------------------------------------

SOURCE = """import torch
batch_size = 16
height = width = 128  # chained
kernel_size = (3, 5)
M = 1024 * 2
groups = batch_size  # derived: follows batch_size
eps = 1e-5
flag = True


def get_inputs():
    return [torch.rand(batch_size, M)]
"""


def test_constants_are_read_and_set_in_the_text() -> None:
    found = {name: c.value for name, c in literal_constants(SOURCE).items()}
    assert found == {"batch_size": 16, "height": 128, "width": 128, "kernel_size": (3, 5), "M": 2048, "eps": 1e-5}
    changed = with_constants(SOURCE, (("batch_size", 3), ("width", 127), ("kernel_size", (4, 6)), ("M", 1000)))
    namespace: dict[str, object] = {}
    exec(compile(changed, "<variant>", "exec"), namespace)  # noqa: S102 - the test's own program
    assert [namespace[n] for n in ("batch_size", "height", "width", "kernel_size", "M", "groups")] == [3, 128, 127, (4, 6), 1000, 3]
    assert "# chained" in changed, "the rest of the text as it was"
    with pytest.raises(ValueError, match="no literal constant groups"):
        with_constants(SOURCE, (("groups", 2),))


def test_repair_keeps_a_divisor_dividing_its_dividend() -> None:
    own = {"batch_size": 8, "channels": 64, "groups": 4}
    assert dict(repair((("channels", 73),), own))["channels"] % 4 == 0
    # Equal in the task, equal in the variant (a loss's predictions and its targets).
    assert dict(repair((("input_shape", (36865,)),), {"batch_size": 32768, "input_shape": (32768,)})) == {
        "input_shape": (36865,),
        "batch_size": 36865,
    }


def test_derive_uses_only_what_the_reference_accepts(tmp_path: Path) -> None:
    source = task_source("group_sum_task")
    program = Program(import_source(source, "task", tmp_path), None, torch.device("cpu"), task_source=source)
    plans = {plan.name: plan for plan in derive(program).plans}
    assert set(plans) == {"larger", "odd", "small", "init"}
    for plan in plans.values():
        values = {"channels": 64, "groups": 4, **dict(plan.overrides)}
        assert not plan.skip and values["channels"] % values["groups"] == 0, plan
    assert dict(plans["odd"].overrides)["length"] == 31, "a size with no constraint stays odd"


def test_degenerate_outputs_are_named() -> None:
    def verdict(f: Callable[[torch.Tensor], torch.Tensor], sets: int = 4) -> str | None:
        probe = SpreadProbe(1e-4, 1e-4)
        for k in range(sets):
            torch.manual_seed(k)
            probe.add([f(torch.randn(8, 16))])
        found = probe.verdict()
        return found.kind if found is not None else None

    assert verdict(lambda x: torch.relu(x - 100)) == "zeros"
    assert verdict(lambda x: torch.softmax(x[:, :1], dim=1)) == "constant"
    assert verdict(lambda x: torch.ones(8, 16) + 1e-7 * x) == "constant"
    assert verdict(lambda x: torch.arange(16.0).expand(8, 16) + 1e-7 * x) == "input_independent"
    assert verdict(torch.relu) is None
    assert verdict(lambda x: x.sum()) is None, "a loss is one value, but not the same one"
    assert verdict(lambda x: x.mean(dim=1, keepdim=True).expand(8, 16)) is None, "constant per input, not across inputs"
    # A large output is compared at sampled positions first, the last element among them.
    large = torch.arange(2**24 + 3, dtype=torch.int32)
    sample = _sample(large)
    assert sample.numel() == SAMPLE and int(sample[-1]) == large.numel() - 1
    # Several models (the trials' fresh weights): degenerate only if each is, of the weakest kind shown.
    zeros, constant = Degenerate("zeros", "z"), Degenerate("constant", "c")
    assert combine([zeros, constant], "trials") == Degenerate("constant", "c, for each of 2 trials")
    assert combine([zeros, None], "trials") is None and combine([], "trials") is None
