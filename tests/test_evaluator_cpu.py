"""The evaluator on real C++ candidates: real compiler, real worker processes, no mocks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from candidates import candidate

from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.evaluator import Evaluator
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.tools.results import Stage

CORRECT = "return ext.relu_fwd(x)"


@pytest.fixture(scope="module")
def evaluator(cpu_config: EvalConfig) -> Iterator[Evaluator]:
    with Evaluator(cpu_config) as ev:
        yield ev


def test_correct_kernel_is_timed_profiled_and_compared_to_compiled_reference(cpu_config: EvalConfig, relu_task: TaskProgram) -> None:
    config = cpu_config.model_copy(update={"time_compiled_reference": True})
    with Evaluator(config) as ev:
        result = ev.evaluate(relu_task, candidate(CORRECT))
    assert result.status is EvalStatus.CORRECT, result.message
    assert result.correctness is not None and result.correctness.passed
    assert result.correctness.trials == 5
    assert result.correctness.max_abs_diff == 0.0
    timing = result.timing
    assert timing is not None
    assert timing.candidate.trials == 10 and timing.reference.trials == 10
    assert timing.candidate.clock == "judge" and timing.timed_by == "judge"
    assert timing.candidate.min <= timing.candidate.median <= timing.candidate.max
    assert timing.speedup == pytest.approx(timing.reference.median / timing.candidate.median)
    assert timing.reference_compiled is not None and timing.speedup_vs_compiled is not None
    assert result.profile is not None and "kernel::relu_fwd" in result.profile.table
    assert set(result.stage_seconds) >= {"static", "compile", "correctness", "timing", "profile"}


def test_compile_error_names_the_candidate_line(evaluator: Evaluator, relu_task: TaskProgram) -> None:
    source = candidate(CORRECT).replace('cpp_source = r"""', 'cpp_source = r"""\nint broken() { return undeclared_name; }', 1)
    bad_line = next(i for i, line in enumerate(source.splitlines(), 1) if "undeclared_name" in line)
    result = evaluator.evaluate(relu_task, source)
    assert result.status is EvalStatus.COMPILE_ERROR
    assert f"line {bad_line} of the candidate" in result.message
    assert "undeclared_name" in result.message
    assert "was not declared" in result.message or "use of undeclared identifier" in result.message, "GCC's words or clang's"
    assert result.compile is not None and not result.compile.ok
    # Trimmed to the errors: not the whole ninja log.
    assert "ninja" not in result.message and len(result.message) < 3000


def test_wrong_result_reports_where_it_differs(evaluator: Evaluator, relu_task: TaskProgram) -> None:
    result = evaluator.evaluate(relu_task, candidate("return ext.leaky_wrong(x)"))
    assert result.status is EvalStatus.INCORRECT
    report = result.correctness
    assert report is not None and not report.passed
    assert report.failed_trial == 0
    assert report.max_abs_diff > 1.0 and report.mean_abs_diff > 0
    assert report.mismatches, "a few indices with expected and actual values"
    first = report.mismatches[0]
    assert first.expected == 0.0 and first.actual < 0
    assert "expected 0 got -" in result.message
    assert result.timing is None, "an incorrect kernel is never timed"


def test_cache_hit_skips_the_compiler(cpu_config: EvalConfig, relu_task: TaskProgram) -> None:
    source = candidate(CORRECT)
    with Evaluator(cpu_config) as first:
        warm = first.run(relu_task, source, (Stage.COMPILE,))
    assert warm.status is None
    # One build per compiler: tests/test_clang.py may have built the same kernels with the other one.
    built = list(Path(cpu_config.cache_dir, "extensions").glob("refinery_test_kernels_*/*.so"))
    assert built
    mtimes = [path.stat().st_mtime_ns for path in built]
    with Evaluator(cpu_config) as second:  # a fresh worker process
        again = second.run(relu_task, source, (Stage.COMPILE,))
    assert again.compile is not None
    assert again.compile.cache_hits == 1 and again.compile.cache_misses == 0
    assert [path.stat().st_mtime_ns for path in built] == mtimes, "the extension was rebuilt"
    assert again.compile.seconds < 10


def test_hang_times_out_and_worker_is_replaced(cpu_config: EvalConfig, relu_task: TaskProgram) -> None:
    with Evaluator(cpu_config.model_copy(update={"timeout_s": 20.0})) as ev:
        hung = ev.evaluate(relu_task, candidate("return ext.spin(x)"))
        assert hung.status is EvalStatus.TIMEOUT
        assert "20 s" in hung.message
        # The honest one on the replaced worker, under the default limit: its correctness, timing and
        # profile took 9 s here and over 20 s on a loaded CI VM (a timeout there, not a hang).
        after = ev.with_config(cpu_config).evaluate(relu_task, candidate(CORRECT))
        assert after.status is EvalStatus.CORRECT, after.message
        assert ev.worker.starts == 2


def test_segfault_is_a_runtime_error_not_a_crash(evaluator: Evaluator, relu_task: TaskProgram) -> None:
    result = evaluator.evaluate(relu_task, candidate("return ext.crash(x)"))
    assert result.status is EvalStatus.RUNTIME_ERROR
    assert "SIGSEGV" in result.message
    crashed = evaluator.worker.pid
    assert evaluator.evaluate(relu_task, candidate(CORRECT)).status is EvalStatus.CORRECT
    assert evaluator.worker.pid != crashed and evaluator.judge.starts == 1, "a fresh runner; the judge lived on"


def test_out_of_memory(cpu_config: EvalConfig, relu_task: TaskProgram) -> None:
    with Evaluator(cpu_config.model_copy(update={"memory_limit_gb": 1.5})) as ev:
        result = ev.evaluate(relu_task, candidate("return ext.hog(x)"))
        assert result.status is EvalStatus.OOM, result.message
        assert ev.evaluate(relu_task, candidate(CORRECT)).status is EvalStatus.CORRECT


def test_worker_environment_has_no_secrets(cpu_config: EvalConfig, relu_task: TaskProgram, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-must-not-leak")
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-must-not-leak")
    # The static check forbids reading the environment, so look from the worker's side directly.
    spy = candidate(
        CORRECT,
        prelude="""
import os as _os
LEAKED = {k: v for k, v in _os.environ.items() if 'leak' in v}
assert not LEAKED, LEAKED
""",
    )
    with Evaluator(cpu_config) as ev:
        result = ev.run(relu_task, spy, (Stage.COMPILE, Stage.CORRECTNESS))
    assert result.status is EvalStatus.CORRECT, result.message


class TestHacks:
    """Every known reward hack fails, whichever guard catches it."""

    def test_returning_uninitialised_memory_fails(self, evaluator: Evaluator, relu_task: TaskProgram) -> None:
        result = evaluator.evaluate(relu_task, candidate("ext.touch(x)\nreturn torch.empty_like(x)"))
        assert result.status is EvalStatus.INCORRECT

    def test_input_mutation_is_rejected(self, evaluator: Evaluator, relu_task: TaskProgram) -> None:
        result = evaluator.evaluate(relu_task, candidate("return ext.relu_inplace(x)"))
        assert result.status is EvalStatus.REJECTED
        assert "modified input 0" in result.message

    def test_output_cached_across_calls_fails(self, evaluator: Evaluator, relu_task: TaskProgram) -> None:
        cached = candidate("if self.cached is None:\n    self.cached = ext.relu_fwd(x)\nreturn self.cached", init="self.cached = None")
        result = evaluator.evaluate(relu_task, cached)
        assert result.status in (EvalStatus.INCORRECT, EvalStatus.REJECTED)
        assert result.timing is None

    def test_module_level_cache_fails(self, evaluator: Evaluator, relu_task: TaskProgram) -> None:
        cached = candidate(
            "ext.touch(x)\nif not _CACHE:\n    _CACHE.append(ext.relu_fwd(x))\nreturn _CACHE[0]",
            prelude="_CACHE = []\n",
        )
        result = evaluator.evaluate(relu_task, cached)
        assert result.status is EvalStatus.INCORRECT
        assert "trial 1" in result.message or "second call" in result.message

    def test_all_zero_output_fails_where_atol_would_pass(self, evaluator: Evaluator, small_relu_task: TaskProgram) -> None:
        result = evaluator.evaluate(small_relu_task, candidate("return ext.zeros(x)"))
        assert result.status is EvalStatus.INCORRECT
        assert "all zeros" in result.message
        assert result.correctness is not None and result.correctness.max_abs_diff < 0.01

    def test_precision_downcast_beyond_tolerance_fails(self, evaluator: Evaluator, relu_task: TaskProgram) -> None:
        result = evaluator.evaluate(relu_task, candidate("return ext.relu_fwd(x.to(torch.float8_e4m3fn).to(torch.float32))"))
        assert result.status is EvalStatus.INCORRECT

    def test_wrong_dtype_fails(self, evaluator: Evaluator, relu_task: TaskProgram) -> None:
        result = evaluator.evaluate(relu_task, candidate("return ext.relu_fwd(x).half()"))
        assert result.status is EvalStatus.INCORRECT
        assert "dtype" in result.message

    def test_try_except_fallback_is_rejected(self, evaluator: Evaluator, relu_task: TaskProgram) -> None:
        result = evaluator.evaluate(relu_task, candidate("try:\n    return ext.relu_fwd(x)\nexcept Exception:\n    return torch.relu(x)"))
        assert result.status is EvalStatus.REJECTED

    def test_forward_that_just_calls_the_torch_op_is_rejected(self, evaluator: Evaluator, relu_task: TaskProgram) -> None:
        result = evaluator.evaluate(relu_task, candidate("return torch.relu(x)"))
        assert result.status is EvalStatus.REJECTED

    def test_decoy_kernel_around_the_torch_op_is_rejected_at_run_time(self, evaluator: Evaluator, relu_task: TaskProgram) -> None:
        result = evaluator.evaluate(relu_task, candidate("ext.touch(x)\nreturn torch.relu(x)"))
        assert result.status is EvalStatus.REJECTED
        assert "aten::relu" in result.message

    def test_forward_skipping_the_kernel_is_caught_at_run_time(self, evaluator: Evaluator, relu_task: TaskProgram) -> None:
        # Past the static check (stages without STATIC), the worker still counts kernel calls.
        result = evaluator.run(relu_task, candidate("return x.clamp_min(0)"), (Stage.COMPILE, Stage.CORRECTNESS))
        assert result.status is EvalStatus.REJECTED
        assert "did not call any compiled kernel" in result.message

    def test_patched_timer_is_rejected(self, evaluator: Evaluator, relu_task: TaskProgram) -> None:
        patched = candidate(CORRECT, prelude="import time\ntime.perf_counter_ns = lambda: 0\n")
        assert evaluator.evaluate(relu_task, patched).status is EvalStatus.REJECTED
        # And at run time, when the static check is skipped.
        result = evaluator.run(relu_task, patched, (Stage.COMPILE, Stage.CORRECTNESS))
        assert result.status is EvalStatus.REJECTED
        assert "time.perf_counter_ns" in result.message

    def test_threads_and_subprocesses_are_rejected(self, evaluator: Evaluator, relu_task: TaskProgram) -> None:
        for prelude in ("import threading\n", "import subprocess\n"):
            result = evaluator.evaluate(relu_task, candidate(CORRECT, prelude=prelude))
            assert result.status is EvalStatus.REJECTED, prelude


def test_same_candidate_on_another_task_in_one_worker(evaluator: Evaluator, relu_task: TaskProgram, small_relu_task: TaskProgram) -> None:
    # The imported module is reused; its kernel calls must still be seen for the second task.
    source = candidate("return ext.leaky_wrong(x)")
    assert evaluator.evaluate(relu_task, source).status is EvalStatus.INCORRECT
    assert evaluator.evaluate(small_relu_task, source).status is EvalStatus.INCORRECT


def test_worker_killed_from_outside_is_retried_not_blamed(cpu_config: EvalConfig, relu_task: TaskProgram) -> None:
    import os
    import signal
    import threading
    import time

    with Evaluator(cpu_config.model_copy(update={"trials": 400})) as ev:
        ev.run(relu_task, candidate(CORRECT), (Stage.COMPILE,))
        victim = ev.worker.pid

        def kill_soon() -> None:
            time.sleep(1.0)
            os.kill(victim, signal.SIGKILL)

        threading.Thread(target=kill_soon, daemon=True).start()
        result = ev.run(relu_task, candidate(CORRECT), (Stage.CORRECTNESS, Stage.TIMING))
        assert ev.worker.pid != victim and ev.worker.retries == 1
    assert result.status is EvalStatus.CORRECT, result.message
