"""Search strategies on CPU with real C++ kernels: the beam's tree and seeding, exact budget caps,
and the per-strategy report from known outcomes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from candidates import candidate
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field

from kernel_refinery.agent.budget import Budget
from kernel_refinery.agent.chat.scripted import ScriptedChatModel
from kernel_refinery.agent.config import LoopSettings, ModelSettings, RunConfig, SearchSettings
from kernel_refinery.agent.context import RunContext
from kernel_refinery.agent.state import Attempt, TaskSpec
from kernel_refinery.agent.strategies import BeamNode, parse_ideas, run_strategy, select_seeds
from kernel_refinery.bench.experiment import TrajectoryRecord, TurnOutcome, read_result
from kernel_refinery.bench.report import best_by_evals, score, score_strategies
from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.evaluator import Evaluator
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.tools.results import EvalResult, Stage
from kernel_refinery.traces.html import render_report
from kernel_refinery.traces.inspect import load_run
from kernel_refinery.traces.schema import TrajectoryId
from kernel_refinery.traces.store import read_trace

RIGHT = candidate("return ext.relu_fwd(x)")
TWICE = candidate("return ext.relu_fwd(ext.relu_fwd(x))")  # correct, and slower
WRONG = candidate("return ext.leaky_wrong(x)")
IDEAS = "Ideas:\n1. plain relu\n2. leaky slope\n3. double relu\n"
KERNELS = {"plain relu": RIGHT, "leaky slope": WRONG, "double relu": TWICE}


class IdeaModel(ScriptedChatModel):
    """Answers an idea prompt with IDEAS and a kernel prompt with the kernel its idea names.

    Records how many tokens had been spent when each call started, to check the token cap.
    """

    kernels: dict[str, str] = Field(default_factory=dict)
    default: str = RIGHT
    spent: int = 0
    starts: list[int] = Field(default_factory=list)
    prompts: list[str] = Field(default_factory=list)

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
        prompt = str(messages[-1].content)
        self.starts.append(self.spent)
        self.prompts.append(prompt)
        if "optimisation ideas" in prompt:
            text = IDEAS
        else:
            code = next((c for idea, c in self.kernels.items() if f"idea: {idea}" in prompt), self.default)
            text = f"```python\n{code}```\n"
        prompt_tokens = sum(len(str(m.content)) for m in messages) // 4
        usage = {"input_tokens": prompt_tokens, "output_tokens": len(text) // 4, "total_tokens": prompt_tokens + len(text) // 4}
        self.spent += usage["total_tokens"]
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text, usage_metadata=usage))])


def idea_model(kernels: dict[str, str], default: str = RIGHT) -> IdeaModel:
    return IdeaModel(responses=[AIMessage(content="-")], kernels=kernels, default=default, starts=[], prompts=[])


class CountingEvaluator:
    """The real evaluator, counting candidates (calls that compile one) and all calls."""

    def __init__(self, inner: Evaluator):
        self.inner = inner
        self.candidates = 0
        self.calls = 0

    def run(self, task: TaskProgram, candidate: str, stages: Any) -> EvalResult:
        self.calls += 1
        self.candidates += Stage.COMPILE in stages
        return self.inner.run(task, candidate, stages)


@pytest.fixture(scope="module")
def evaluator(cpu_config: EvalConfig):
    with Evaluator(cpu_config) as ev:
        yield ev


def make_run(
    cpu_config: EvalConfig,
    relu_task: TaskProgram,
    tmp_path: Path,
    model: Any,
    evaluator: Any,
    strategy: str,
    turns: int = 5,
    target: float = 1e9,
    **search: Any,
) -> tuple[RunContext, TaskSpec, TrajectoryId]:
    """What run_strategy takes: the run's context, the task and the trajectory's id."""
    config = RunConfig(
        llm=ModelSettings(model="scripted"),
        loop=LoopSettings(variant="G+E", turns=turns, target_speedup=target, hardware_prompt=False),
        eval=cpu_config,
        strategy=strategy,
        search=SearchSettings(**search),
    )
    return (
        RunContext(config=config, model=model, evaluator=evaluator, run_dir=tmp_path, run_id="t"),
        TaskSpec(name=relu_task.name, source=relu_task.source, level=1),
        TrajectoryId(task="relu", variant="G+E"),
    )


def test_parse_ideas() -> None:
    assert parse_ideas(IDEAS, 3) == ["plain relu", "leaky slope", "double relu"]
    assert parse_ideas("- **vectorise** \n* unroll\n- vectorise", 5) == ["vectorise", "unroll"]
    assert parse_ideas("1. **Parallelise**: use OpenMP", 1) == ["Parallelise: use OpenMP"]
    assert parse_ideas("use AVX\n\nfuse loops\n", 1) == ["use AVX"]
    assert parse_ideas("", 3) == []


def _node(node_id: str, status: EvalStatus | None, speedup: float | None = None, code: str | None = "x") -> BeamNode:
    from kernel_refinery.tools.results import TimingReport, TimingStats

    result = None
    if status is not None:
        stats = TimingStats(median=1.0, mean=1.0, std=0.0, min=1.0, max=1.0, trials=1, clock="monotonic")
        timing = TimingReport(candidate=stats, reference=stats, speedup=speedup) if speedup is not None else None
        result = EvalResult(status=status, device="cpu", timing=timing)
    return BeamNode(node_id=node_id, parent_id=None, idea=None, attempt=Attempt(turn=1, code=code, result=result))


def test_seeds_are_the_best_so_far_correct_first() -> None:
    nodes = [
        _node("a", EvalStatus.COMPILE_ERROR),
        _node("b", EvalStatus.CORRECT, 0.5),
        _node("c", EvalStatus.INCORRECT),
        _node("d", EvalStatus.CORRECT, 2.0),
        _node("e", None, code=None),
    ]
    assert [n.node_id for n in select_seeds(nodes, 2)] == ["d", "b"]
    assert [n.node_id for n in select_seeds(nodes, 3)] == ["d", "b", "c"], "then the failure closest to correct"
    assert [n.node_id for n in select_seeds(nodes[:1] + nodes[2:3] + nodes[4:], 5)] == ["c", "a"], "no reply without code"


def test_beam_tree_and_seeding(cpu_config: EvalConfig, evaluator: Evaluator, relu_task: TaskProgram, tmp_path: Path) -> None:
    model = idea_model(KERNELS)
    counting = CountingEvaluator(evaluator)
    run = make_run(cpu_config, relu_task, tmp_path, model, counting, "beam", rounds=2, ideas=3, beam_width=2)
    result = run_strategy(*run)
    records = read_trace(result.trace)
    assert result.trace.name == "relu__GE__s0__beam.jsonl"
    by_id = {r.node_id: r for r in records}
    first = [r for r in records if r.turn == 1]
    second = [r for r in records if r.turn == 2]
    # Round 1: three ideas for the reference, one kernel each, no parent.
    assert [(r.node_id, r.parent_id, r.idea, r.status) for r in first] == [
        ("r1-00", None, "plain relu", "correct"),
        ("r1-01", None, "leaky slope", "incorrect"),
        ("r1-02", None, "double relu", "correct"),
    ]
    # Round 2 starts from the W = 2 best of round 1, fastest first: the wrong kernel seeds nothing.
    seeds = sorted(["r1-00", "r1-02"], key=lambda i: by_id[i].speedup or 0.0, reverse=True)
    assert [r.parent_id for r in second] == [seeds[0]] * 3 + [seeds[1]] * 3
    assert [r.node_id for r in second] == [f"r2-{i:02d}" for i in range(6)]
    assert [r.idea for r in second] == ["plain relu", "leaky slope", "double relu"] * 2
    # One idea call per seed (1 + 2), one kernel call per idea (3 + 6); every kernel evaluated once.
    idea_prompts = [p for p in model.prompts if "optimisation ideas" in p]
    assert len(idea_prompts) == 3 and len(model.prompts) == 12
    assert counting.candidates == 9 == result.evals == len(records)
    # Round 2's idea prompts show the seed's code and its verdict; kernel prompts carry the idea.
    assert "no custom kernel yet" in idea_prompts[0]
    assert "speedup" in idea_prompts[1] and "relu_fwd" in idea_prompts[1]
    assert any("Apply this optimisation idea: leaky slope" in p for p in model.prompts)
    assert result.best is not None and result.best.correct
    assert result.tokens.total == sum(r.tokens.total for r in records), "idea calls are charged to the trace too"
    # The HTML report draws the tree: round-2 kernels nest under their seed, with their ideas.
    html = render_report(load_run(tmp_path), title="beam")
    tree = html[html.index('<ul class="search-tree">') :]
    tree = tree[: tree.index("</figure>")]
    between = tree[tree.index(f"<b>{seeds[0]}</b>") : tree.index("<b>r2-00</b>")]
    assert "<ul>" in between and "</li>" not in between, "r2-00 is drawn inside its seed's item"
    assert tree.count("<li>") == 10 and 'class="idea">leaky slope<' in tree


@pytest.mark.parametrize(
    ("strategy", "search", "cap"),
    [
        ("refine", {}, 2),
        ("best-of-n", {"n": 3}, 4),
        ("beam", {"rounds": 3, "ideas": 3, "beam_width": 2}, 5),
    ],
)
def test_eval_budget_holds_exactly(
    strategy: str, search: dict, cap: int, cpu_config: EvalConfig, evaluator: Evaluator, relu_task: TaskProgram, tmp_path: Path
) -> None:
    model = idea_model({}, default=WRONG)  # wrong kernels: the cap, not the target, must stop the run
    counting = CountingEvaluator(evaluator)
    run = make_run(cpu_config, relu_task, tmp_path, model, counting, strategy, turns=3, budget_evals=cap, **search)
    result = run_strategy(*run)
    assert counting.candidates == cap == result.evals
    assert all(r.status == "incorrect" for path in result.traces for r in read_trace(path))
    if strategy == "best-of-n":
        assert [len(read_trace(p)) for p in result.traces] == [1, 1, 2], "each sample gets its share of what is left"


@pytest.mark.parametrize("strategy", ["refine", "beam"])
def test_token_budget_stops_before_a_call_past_it(
    strategy: str, cpu_config: EvalConfig, evaluator: Evaluator, relu_task: TaskProgram, tmp_path: Path
) -> None:
    model = idea_model({}, default=WRONG)
    cap = 4000
    run = make_run(cpu_config, relu_task, tmp_path, model, evaluator, strategy, turns=10, rounds=5, budget_tokens=cap)
    result = run_strategy(*run)
    assert all(start < cap for start in model.starts), "no call started past the cap"
    assert model.spent >= cap, "the cap, not the turns, stopped the run"
    assert result.tokens.total == model.spent


def test_shared_budget_counts_every_share() -> None:
    budget = Budget(max_evals=5)
    share = budget.share(2)
    assert share.max_evals == 2
    share.spend_eval()
    share.spend_eval()
    assert not share.can_generate() and budget.evals == 2 and budget.can_generate()
    with pytest.raises(RuntimeError, match="already spent"):
        share.spend_eval()


def _record(task: str, strategy: str, per_turn: list[tuple[str, float | None]], tokens: int = 100) -> TrajectoryRecord:
    speeds = [s for status, s in per_turn if status == "correct" and s is not None]
    return TrajectoryRecord(
        task=task,
        level=1,
        variant="G+E",
        sample=0,
        best_status="correct" if speeds else "incorrect",
        best_speedup=max(speeds) if speeds else None,
        best_turn=None,
        turns=len(per_turn),
        compiled=True,
        tokens=tokens,
        per_turn=tuple(TurnOutcome(status=status, speedup=s) for status, s in per_turn),
        strategy=strategy,
        evals=sum(1 for status, _ in per_turn if status != "no_code"),
    )


def test_report_per_strategy_from_known_outcomes() -> None:
    records = [
        _record("a", "refine", [("incorrect", None), ("correct", 0.5), ("correct", 1.2), ("correct", 1.1)]),
        _record("b", "refine", [("compile_error", None), ("incorrect", None), ("incorrect", None), ("incorrect", None)]),
        _record("a", "beam", [("correct", 2.0), ("incorrect", None), ("correct", 3.0), ("no_code", None), ("correct", 1.0)]),
        _record("b", "beam", [("correct", 0.8), ("correct", 1.5)], tokens=300),
    ]
    scores = {s.strategy: s for s in score_strategies(records)}
    assert sorted(scores) == ["beam", "refine"]
    assert scores["refine"].fast_p == {"0": 0.5, "0.5": 0.5, "0.8": 0.5, "1": 0.5, "1.5": 0.0, "2": 0.0}
    assert scores["beam"].fast_p == {"0": 1.0, "0.5": 1.0, "0.8": 1.0, "1": 1.0, "1.5": 0.5, "2": 0.5}
    assert scores["refine"].correct == 0.5 and scores["beam"].correct == 1.0
    assert scores["refine"].mean_evals == 4.0 and scores["beam"].mean_evals == 3.0
    assert scores["beam"].tokens == 400
    # Best speedup after e evaluations, averaged over tasks; a run that stopped keeps its best.
    assert scores["refine"].best_by_evals == pytest.approx([0.0, 0.25, 0.6, 0.6])
    assert scores["beam"].best_by_evals == pytest.approx([1.4, 1.75, 2.25, 2.25])
    assert best_by_evals([records[2]]) == [2.0, 2.0, 3.0, 3.0], "a reply without code costs no evaluation"
    # The level × variant table splits by strategy too.
    assert [(s.variant, s.strategy, s.fast_p["1"]) for s in score(records)] == [("G+E", "beam", 1.0), ("G+E", "refine", 0.5)]


def test_results_before_strategies_still_read() -> None:
    old = (
        '{"task":"level1/1_relu","level":1,"variant":"G+E","sample":0,"best_status":"correct","best_speedup":1.5,'
        '"best_turn":2,"turns":2,"compiled":true,"tokens":10,"per_turn":[["no_code",null],["correct",1.5]]}'
    )
    record = read_result(old)
    assert record.strategy == "refine" and record.evaluations == 1 and record.id == TrajectoryId(task="level1/1_relu", variant="G+E")


def test_experiment_compares_strategies_at_equal_cost(tmp_path: Path, cache_dir: Path) -> None:
    from kernel_refinery.agent.chat.scripted import ScriptedChatModel
    from kernel_refinery.bench.experiment import ExperimentConfig, read_results, run_experiment
    from kernel_refinery.bench.report import report
    from kernel_refinery.tools.processes.pool import EvaluatorPool

    solution = (Path(__file__).parent / "fixtures" / "cpu_solutions" / "1_relu_slow.py").read_text()
    model = ScriptedChatModel(responses=[AIMessage(content=f"1. use OpenMP\n2. unroll\n```python\n{solution}```\n")])
    config = ExperimentConfig(
        levels=[1],
        tasks="1_relu",
        variants=["G+E"],
        turns=3,
        target_speedup=1e9,
        hardware_prompt=False,
        workers=1,
        concurrency=3,
        strategies=["refine", "best-of-n", "beam"],
        search=SearchSettings(n=2, rounds=2, ideas=2, beam_width=1, budget_evals=2),
        llm=ModelSettings(model="scripted:x"),
        eval=EvalConfig(trials=5, warmup=1, correctness_trials=2, time_compiled_reference=False, cache_dir=cache_dir),
    )
    with EvaluatorPool(config.eval_config(), workers=1) as pool:
        run_experiment(config, tmp_path, model, pool)
    records = {r.strategy: r for r in read_results(tmp_path)}
    assert sorted(records) == ["beam", "best-of-n", "refine"]
    assert {s: (r.evals, r.best_status) for s, r in records.items()} == dict.fromkeys(records, (2, "correct"))
    assert sorted(p.name for p in (tmp_path / "traces").iterdir()) == [
        "level1__1_relu__GE__s0.jsonl",
        "level1__1_relu__GE__s0__beam.jsonl",
        "level1__1_relu__GE__s0__best-of-n.jsonl",
        "level1__1_relu__GE__s1__best-of-n.jsonl",
    ]
    report(tmp_path, plots=True)
    assert (tmp_path / "plots" / "best_by_evals.png").exists() and (tmp_path / "strategies.json").exists()
