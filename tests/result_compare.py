"""What two evaluations of the same input must agree on: the verdict and every field of the result
but timings, the build cache's hit counts, the worker's own log, and what depends on the inputs
drawn for the correctness trials (seeded afresh for each evaluation, so that a candidate cannot
know its inputs in advance: a wrong kernel's differences and the message quoting them)."""

from __future__ import annotations

import json
from typing import Any

from kernel_refinery.tools.results import EvalResult

_TIMED = {"stage_seconds", "timing", "profile", "worker_log"}
_COMPILE_RUN = {"seconds", "cache_hits", "cache_misses"}
_DRAWN = {"reason", "max_abs_diff", "mean_abs_diff", "rel_l2", "mismatches"}


def comparable(result: EvalResult) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(result.model_dump_json())
    for key in _TIMED:
        data.pop(key)
    if data["compile"] is not None:
        data["compile"] = {k: v for k, v in data["compile"].items() if k not in _COMPILE_RUN}
    correctness = data["correctness"]
    if correctness is not None:
        correctness.pop("kernel_share")  # milliseconds per call, from the profiler
        data["correctness"] = {k: v for k, v in correctness.items() if k not in _DRAWN}
        shapes = correctness.get("shapes")
        if shapes is not None:  # the variants' run time and the diffs of their drawn inputs
            shapes.pop("seconds")
            shapes["variants"] = [{k: v for k, v in variant.items() if k not in _DRAWN} for variant in shapes["variants"]]
        data["correctness"]["outcomes"] = [(o["trial"], o["passed"]) for o in correctness["outcomes"]]
        if not correctness["passed"]:
            data["message"] = data["message"].split(":")[0]  # "trial 0": which trial failed, not its drawn values
    return data


def eval_json(text: str) -> EvalResult:
    """`refinery eval --json`'s output as an EvalResult (a manifest beside the result's fields is left out)."""
    data = json.loads(text)
    data.pop("manifest", None)
    return EvalResult.model_validate(data)


EVAL_SETS = ("--set", "eval.trials=5", "--set", "eval.correctness_trials=2", "--set", "eval.time_compiled_reference=false")
"""`refinery eval` flags for the settings the tests evaluate with (trials 5, 2 correctness trials, no torch.compile baseline)."""
