"""`refinery reverify` on a scripted CPU experiment: it reproduces the recorded verdicts, flags a kernel
planted on disk to be wrong now, resumes from reverify.json, and re-checks one record by its id."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
from cli_runner import run_cli

from kernel_refinery.agent.chat.scripted import load_script
from kernel_refinery.bench.experiment import ExperimentConfig, prepare_run_dir, run_experiment
from kernel_refinery.bench.reverify import Measured, Recheck, read_reverify, record_id
from kernel_refinery.core.verdict import Verdict
from kernel_refinery.tools.processes.pool import EvaluatorPool
from kernel_refinery.traces.inspect import load_run, summarise
from kernel_refinery.traces.manifest import read_manifest, write_manifest
from kernel_refinery.traces.schema import TrajectoryId

SOLUTIONS = Path(__file__).parent / "fixtures" / "cpu_solutions"
RIGHT = "b[i] = a[i] > 0.f ? a[i] : 0.f;"
WRONG = "b[i] = a[i] > 0.f ? a[i] : 0.5f * a[i];"  # a leaky ReLU: wrong on every negative input


refinery = partial(run_cli, columns=120)


@pytest.fixture()
def run_dir(tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """One task, one variant, one turn: the correct OpenMP ReLU, as an experiment leaves it."""
    monkeypatch.setenv("REFINERY_CACHE_DIR", str(cache_dir))  # reverify builds in this machine's cache
    code = (SOLUTIONS / "1_relu.py").read_text()
    assert RIGHT in code
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"level1/1_relu": [f"My kernel:\n```python\n{code}```\n"]}))
    config = ExperimentConfig.model_validate(
        {
            "tasks": "1_relu",
            "variants": ["G"],
            "workers": 1,
            "concurrency": 1,
            "loop": {"turns": 1, "hardware_prompt": False},
            "llm": {"model": f"scripted:{script}"},
            "eval": {"trials": 5, "warmup": 1, "correctness_trials": 2, "time_compiled_reference": False, "cache_dir": str(cache_dir)},
        }
    )
    directory = tmp_path / "run"
    prepare_run_dir(directory, config)
    with EvaluatorPool(config.eval, workers=1) as pool:
        (record,) = run_experiment(config, directory, load_script(script), pool)
    assert record.best_status is Verdict.CORRECT, record
    return directory


def plant(run_dir: Path, old: str, new: str) -> None:
    """Change the kernel's code in its trace on disk, as a tampered or mis-copied trace would hold it."""
    (path,) = (run_dir / "traces").glob("*.jsonl")
    text = path.read_text()
    assert old in json.loads(text.splitlines()[0])["code"]
    path.write_text(text.replace(old.replace('"', '\\"'), new.replace('"', '\\"')))


def test_reverify_reproduces_then_flags_a_planted_flip(run_dir: Path) -> None:
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["eval"]["trials"] == 5 and [t["key"] for t in manifest["tasks"]] == ["level1/1_relu"]

    first = refinery("reverify", run_dir)
    assert first.exit_code == 0, first.output
    (trajectory,) = load_run(run_dir)
    best = summarise(trajectory).best
    assert best is not None
    the_id = record_id(best)
    # The verdict reproduces; the speedup of a kernel near 1x on a shared 2-core machine may cross a
    # fast_p threshold, so the speedup flags are checked on known numbers (test_what_a_recheck_flags).
    assert the_id in first.output and "verdict changed" not in first.output, first.output
    assert "1 kernel re-checked: 0 verdicts changed" in first.output
    saved = read_reverify(run_dir)
    (recheck,) = saved.rechecks
    assert recheck.recorded.verdict is Verdict.CORRECT and recheck.now.verdict is Verdict.CORRECT
    assert recheck.now.speedup is not None and recheck.now.interval is not None
    assert recheck.seed != 42, "fresh seeds, not the run's"
    # The same machine and settings; only the commit may have moved (others commit to this checkout meanwhile).
    assert saved.manifest is not None and {d.field for d in saved.measured_differently} <= {"source.commit", "source.dirty"}

    # Resumed: a kernel already in reverify.json is not judged again.
    again = refinery("reverify", run_dir)
    assert again.exit_code == 0 and "(1 already in reverify.json)" in again.output, again.output
    assert read_reverify(run_dir).rechecks == [recheck]

    # The kernel on disk is now wrong: a re-check by its id flags the flip and exits 1. The run's
    # manifest now holds another hash of the task file: that is flagged too, and warned about.
    plant(run_dir, RIGHT, WRONG)
    recorded = read_manifest(run_dir)
    assert recorded is not None
    write_manifest(run_dir, recorded.model_copy(update={"tasks": (recorded.tasks[0].model_copy(update={"sha256": "0" * 64}),)}))
    flipped = refinery("reverify", run_dir, "--record", the_id)
    assert flipped.exit_code == 1, flipped.output
    assert "verdict changed: correct → incorrect" in flipped.output, flipped.output
    assert "fast_p changed at p = 0" in flipped.output and "task file changed since the run" in flipped.output
    assert "warning: measured differently from the run" in flipped.output and "tasks.level1/1_relu" in flipped.output
    (now,) = read_reverify(run_dir).rechecks
    assert now.verdict_changed and now.now.verdict is Verdict.INCORRECT and now.fast_p_changed[0] == 0.0 and now.task_changed
    assert "incorrect" in now.headline


def test_reverify_with_another_timing_method_keeps_its_own_file(run_dir: Path) -> None:
    """`--timing host`: the run's kernels judged with that method (on CPU every method is the
    monotonic clock), the settings it ran with recorded, beside and not into reverify.json."""
    result = refinery("reverify", run_dir, "--timing", "host")
    assert result.exit_code == 0, result.output
    assert (run_dir / "reverify-timing-host.json").is_file() and not (run_dir / "reverify.json").exists()
    saved = read_reverify(run_dir, "host")
    (recheck,) = saved.rechecks
    assert recheck.now.verdict is Verdict.CORRECT
    assert saved.manifest is not None and saved.manifest.eval.timing == "judge"
    bad = refinery("reverify", run_dir, "--timing", "sundial")
    assert bad.exit_code == 2 and "--timing must be events, host or graph, not 'sundial'" in bad.output


def test_reverify_refuses_what_is_not_there(run_dir: Path) -> None:
    missing = refinery("reverify", run_dir, "--record", "level1__1_relu__G__s0:9")
    assert missing.exit_code == 2 and "no trace record 'level1__1_relu__G__s0:9'" in missing.stderr, missing.output
    assert "level1__1_relu__G__s0:1" in missing.stderr, "names an id that is there"
    other = refinery("reverify", run_dir, "--task", "gelu")
    assert other.exit_code == 2 and "tasks: level1/1_relu" in other.stderr, other.output
    assert not (run_dir / "reverify.json").exists()


def recheck(recorded: Measured, now: Measured) -> Recheck:
    return Recheck(
        record_id="level1__t__G__s0:1",
        trajectory=TrajectoryId(task="level1/t", variant="G"),
        turn=1,
        recorded=recorded,
        now=now,
        headline="",
        seed=1,
    )


def test_what_a_recheck_flags() -> None:
    fast = Measured(verdict=Verdict.CORRECT, speedup=1.2, interval=(1.1, 1.3))
    same = recheck(fast, Measured(verdict=Verdict.CORRECT, speedup=1.25, interval=(1.15, 1.35)))
    assert same.flags == () and not same.speedup_moved
    slower = recheck(fast, Measured(verdict=Verdict.CORRECT, speedup=0.9, interval=(0.85, 0.95)))
    assert slower.speedup_moved and slower.fast_p_changed == (1.0,)
    assert slower.flags == ("speedup interval moved", "fast_p changed at p = 1")
    fixed = recheck(Measured(verdict=Verdict.INCORRECT), fast)
    assert fixed.verdict_changed and fixed.fast_p_changed == (0.0, 0.5, 0.8, 1.0), "incorrect then, correct now: flagged too"
    unknown = recheck(Measured(verdict=Verdict.CORRECT, speedup=1.2), Measured(verdict=Verdict.CORRECT, speedup=3.0, interval=(2.9, 3.1)))
    assert not unknown.speedup_moved, "without the recorded interval, no claim on overlap"
    assert unknown.fast_p_changed == (1.5, 2.0)


def test_the_settings_a_recheck_runs_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernel_refinery.agent.config import RunConfig
    from kernel_refinery.bench.experiment import HeldPrecision
    from kernel_refinery.bench.reverify import eval_config_for, run_eval_config
    from kernel_refinery.core.errors import RunDirError

    with pytest.raises(RunDirError, match=r"config\.json is missing"):
        run_eval_config(tmp_path)
    # `refinery run` keeps a RunConfig: its evaluator settings, one worker.
    (tmp_path / "config.json").write_text(RunConfig(eval={"trials": 13, "precision": "bf16"}).model_dump_json())
    base, workers = run_eval_config(tmp_path)
    assert (base.trials, base.precision, workers) == (13, "bf16", 1)
    # A precision the run holds is judged at its recorded tolerance and TF32 policy, with the given
    # seed, this machine's cache, and every reference timed anew.
    monkeypatch.setenv("REFINERY_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "precisions.json").write_text(json.dumps({"fp16": HeldPrecision(tolerance=0.05, allow_tf32=True).model_dump()}))
    fp16 = eval_config_for(base, "fp16", tmp_path, seed=123)
    assert (fp16.precision, fp16.precision_tolerance.atol, fp16.allow_tf32, fp16.seed, fp16.trials) == ("fp16", 0.05, True, 123, 13)
    assert fp16.cache_dir == tmp_path / "cache" and fp16.remeasure_baselines
    (tmp_path / "config.json").write_text('{"neither": 1}')
    with pytest.raises(RunDirError, match="neither an experiment's nor a run's config"):
        run_eval_config(tmp_path)
