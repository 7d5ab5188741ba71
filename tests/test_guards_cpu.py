"""The guards against stale, aliased, deferred and decoy outputs, on real C++ candidates.

Each test names the guard that fired by its message, not only the status.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import hacks
import pytest
import torch
from candidates import candidate, task_source

from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.config import EvalConfig, Guards
from kernel_refinery.tools.evaluator import Evaluator
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.tools.results import Stage
from kernel_refinery.tools.steps.timing_stage import MIX_POOL, mixed_inputs

CORRECT = "return ext.relu_fwd(x)"
RUNTIME_ONLY = (Stage.COMPILE, Stage.CORRECTNESS, Stage.TIMING)
"""Past the static check: what the worker itself catches."""


@pytest.fixture(scope="module")
def evaluator(cpu_config: EvalConfig) -> Iterator[Evaluator]:
    with Evaluator(cpu_config) as ev:
        yield ev


@pytest.fixture(scope="module")
def rand_relu_task() -> TaskProgram:
    return TaskProgram(name="relu_rand", source=task_source("relu_rand_task"))


def test_correct_kernel_records_the_new_guards(evaluator: Evaluator, relu_task: TaskProgram) -> None:
    result = evaluator.evaluate(relu_task, candidate(CORRECT))
    assert result.status is EvalStatus.CORRECT, result.message
    correctness, timing = result.correctness, result.timing
    assert correctness is not None and timing is not None
    assert [(d.name, d.passed) for d in correctness.distributions] == [("normal", True), ("normal_x4", True)]
    assert "and on normal, normal_x4 inputs" in correctness.summary()
    share = correctness.kernel_share
    assert share is not None and share.share > 0.9 and share.custom_ms > 0
    assert timing.fresh_inputs
    # Eight calls drawn at random and the last one were compared with the reference: calls are
    # counted over the timed batches (batch_calls each).
    assert len(timing.checked_calls) == 9 and timing.checked_calls[-1] == timing.candidate.trials * timing.batch_calls - 1
    assert timing.floor_ms is not None and 0 < timing.floor_ms < timing.candidate.median
    assert timing.reference_roofline_ms is not None and timing.reference_roofline_ms > 0
    assert timing.speedup_ci95 is not None
    low, high = timing.speedup_ci95
    assert low <= timing.speedup <= high


def test_content_memo_gains_nothing_from_fresh_inputs(cpu_config: EvalConfig, relu_task: TaskProgram) -> None:
    """Guard: fresh inputs per timed call. With two rotating input sets (the guard off) a memo
    keyed by a few input values hits on every timed call; with fresh values it never does."""
    rotating = cpu_config.model_copy(update={"guards": Guards(fresh_inputs=False)})
    with Evaluator(cpu_config) as ev:
        honest = ev.evaluate(relu_task, hacks.slow(candidate))
        guarded = ev.evaluate(relu_task, hacks.content_memo(candidate))
    with Evaluator(rotating) as ev:
        unguarded = ev.evaluate(relu_task, hacks.content_memo(candidate))
    timings = []
    for result in (honest, guarded):
        assert result.status is EvalStatus.CORRECT, result.message
        assert result.timing is not None
        timings.append(result.timing)
    honest_t, guarded_t = timings
    assert guarded_t.fresh_inputs and guarded_t.input_source == "mixed"
    assert guarded_t.candidate.median > 0.5 * honest_t.candidate.median, "the memo hit although every call had fresh inputs"
    # Rotating inputs let the memo hit on every call: a hit does no work, so the judge's clock sees
    # no more than the harness's own cost and the floor refuses it, or it reads as far faster.
    if unguarded.status is EvalStatus.REJECTED:
        assert "below the speed-of-light floor" in unguarded.message, unguarded.message
    else:
        assert unguarded.status is EvalStatus.CORRECT and unguarded.timing is not None, unguarded.message
        assert not unguarded.timing.fresh_inputs and unguarded.timing.input_source == "rotating"
        assert unguarded.timing.candidate.median < 0.3 * honest_t.candidate.median, "rotating inputs should have let the memo hit"


def test_pointer_memo_gains_nothing(cpu_config: EvalConfig, relu_task: TaskProgram) -> None:
    """Guard: timed outputs compared with the reference for their own inputs (as many calls checked
    here as the trials asked for, over the batches' calls). A memo keyed by the input's address hits
    whenever the allocator hands the next call's input the same memory: then that call is named. glibc may never reuse the address; then the
    memo never hit, and the candidate is as slow as its honest kernel."""
    every_call = cpu_config.model_copy(update={"guards": Guards(checked_timed_calls=cpu_config.trials)})
    with Evaluator(every_call) as ev:
        honest = ev.run(relu_task, hacks.slow(candidate), RUNTIME_ONLY)
        memo = ev.run(relu_task, hacks.pointer_memo(candidate), RUNTIME_ONLY)
    assert honest.status is EvalStatus.CORRECT and honest.timing is not None, honest.message
    if memo.status is EvalStatus.INCORRECT:
        assert "second call of the same model" in memo.message or "returned a wrong output for its own inputs" in memo.message
    else:
        assert memo.status is EvalStatus.CORRECT and memo.timing is not None, memo.message
        calls = memo.timing.candidate.trials * memo.timing.batch_calls
        assert len(memo.timing.checked_calls) == min(cpu_config.trials, calls - 1) + 1
        assert memo.timing.candidate.median > 0.5 * honest.timing.candidate.median, "a stale memo hit went unchecked"


def test_output_reused_across_timed_calls_fails_and_names_the_call(evaluator: Evaluator, relu_task: TaskProgram) -> None:
    """Guard: timed outputs checked. Correct for two calls an instance (all the correctness trials
    make), then the same output again from its third call (the second timed one) on: the last timed
    call is always among those checked."""
    result = evaluator.run(relu_task, hacks.stale_after_two_calls(candidate), RUNTIME_ONLY)
    assert result.status is EvalStatus.INCORRECT, result.message
    assert re.search(r"timed call \d+ of \d+ returned a wrong output for its own inputs", result.message), result.message
    assert result.correctness is not None and result.correctness.passed


def test_identity_on_non_negative_inputs_fails_on_signed_inputs(evaluator: Evaluator, rand_relu_task: TaskProgram) -> None:
    """Guard: other input distributions. The task's torch.rand inputs never go below zero."""
    result = evaluator.evaluate(rand_relu_task, hacks.identity(candidate))
    assert result.status is EvalStatus.INCORRECT, result.message
    assert "on inputs redrawn from a signed standard normal (normal)" in result.message
    report = result.correctness
    assert report is not None and report.failed_trial is None
    assert all(o.passed for o in report.outcomes) and len(report.outcomes) == 5, "the task's own inputs all passed"
    assert [(d.name, d.passed) for d in report.distributions] == [("normal", False)]


def test_identity_passes_with_the_distributions_switched_off(cpu_config: EvalConfig, rand_relu_task: TaskProgram) -> None:
    # The setting exists for ablations, and the result says it was off.
    off = cpu_config.model_copy(update={"guards": Guards(input_distributions=())})
    with Evaluator(off) as ev:
        result = ev.run(rand_relu_task, hacks.identity(candidate), (Stage.COMPILE, Stage.CORRECTNESS))
    assert result.status is EvalStatus.CORRECT, result.message
    assert result.correctness is not None and result.correctness.distributions == ()


def test_returned_input_is_rejected(evaluator: Evaluator, rand_relu_task: TaskProgram) -> None:
    result = evaluator.evaluate(rand_relu_task, hacks.returned_input(candidate))
    assert result.status is EvalStatus.REJECTED, result.message
    assert "the output shares memory with input 0" in result.message


def test_returned_view_of_an_input_is_rejected(evaluator: Evaluator, rand_relu_task: TaskProgram) -> None:
    result = evaluator.evaluate(rand_relu_task, hacks.returned_view(candidate))
    assert result.status is EvalStatus.REJECTED, result.message
    assert "the output shares memory with input 0" in result.message


def test_deferred_tensor_subclass_is_rejected_statically(evaluator: Evaluator, relu_task: TaskProgram) -> None:
    result = evaluator.evaluate(relu_task, hacks.lazy(candidate))
    assert result.status is EvalStatus.REJECTED
    assert "class Lazy subclasses torch.Tensor" in result.message
    assert "defines __torch_function__" in result.message


def test_deferred_tensor_subclass_is_rejected_at_run_time(evaluator: Evaluator, relu_task: TaskProgram) -> None:
    result = evaluator.run(relu_task, hacks.lazy(candidate), RUNTIME_ONLY)
    assert result.status is EvalStatus.REJECTED, result.message
    assert "Lazy, a subclass of torch.Tensor" in result.message and "deferred or lazy outputs" in result.message


def test_decoy_kernel_beside_a_substitute_torch_op_is_rejected_by_its_kernel_share(evaluator: Evaluator, relu_task: TaskProgram) -> None:
    # clamp is not the reference's relu, so the wrapper check lets it by; the kernel share does not.
    result = evaluator.evaluate(relu_task, hacks.decoy_beside_clamp(candidate))
    assert result.status is EvalStatus.REJECTED, result.message
    assert "the candidate's own kernels do" in result.message and "of its forward's compute time" in result.message
    assert "at least 10% must be custom" in result.message


def test_worker_dying_after_a_cuda_fault_is_a_cuda_fault(evaluator: Evaluator, relu_task: TaskProgram) -> None:
    """The CUDA runtime can end the process itself after an illegal access (exit code 1); its last
    words name the fault. Simulated on CPU with the same words and the same exit."""
    dies = candidate(
        "ext.touch(x)\nprint('CUDA error: an illegal memory access was encountered', file=sys.stderr, flush=True)\nos._exit(1)",
        prelude="import os\nimport sys\n",
    )
    result = evaluator.run(relu_task, dies, RUNTIME_ONLY)
    assert result.status is EvalStatus.CUDA_FAULT, result.message
    assert "the worker died after a CUDA fault (exit code 1): CUDA error: an illegal memory access" in result.message
    assert evaluator.evaluate(relu_task, candidate(CORRECT)).status is EvalStatus.CORRECT


def test_mixed_inputs_are_new_on_every_call_and_keep_what_get_inputs_promised() -> None:
    """Guard: fresh inputs per call on CPU, as convex mixes of a few drawn sets. Every call's values
    differ from every other call's and every drawn set's; signs, symmetry and rows summing to one survive;
    integer tensors are copies; a call's inputs are made again identically for its output check."""
    import random

    def drawn(seed: int) -> list[object]:
        g = torch.Generator().manual_seed(seed)
        a = torch.randn(16, 16, generator=g)
        return [a @ a.T, torch.rand(8, 32, generator=g), torch.rand(4, 10, generator=g).softmax(-1), torch.arange(5) + seed, 3]

    pool = [drawn(seed) for seed in range(MIX_POOL)]
    calls = [mixed_inputs(pool, random.Random(call)) for call in range(200)]
    for args in calls:
        sym, nonneg, rows, ints, scalar = args
        assert torch.equal(sym, sym.T) and bool((nonneg >= 0).all())
        assert torch.allclose(rows.sum(-1), torch.ones(4))
        assert any(torch.equal(ints, p[3]) for p in pool) and all(ints.data_ptr() != p[3].data_ptr() for p in pool)
        assert scalar == 3
        assert not any(torch.equal(nonneg, p[1]) for p in pool)
    fingerprints = {tuple(args[1].flatten()[:4].tolist()) for args in calls}
    assert len(fingerprints) == len(calls), "two calls had the same values"
    again = mixed_inputs(pool, random.Random(7))
    assert all(torch.equal(a, b) for a, b in zip(again[:4], calls[7][:4], strict=True))
