"""Developer benchmarks, not part of the product; each prints ratios measured side by side.

    python -m benchmarks.eval --device cpu|cuda      # where an evaluation's wall time goes
    python -m benchmarks.guards --device cpu|cuda    # what the evaluator's guards cost
    python -m benchmarks.experiment                  # runner throughput, device busy fraction, per-turn overhead
    python -m benchmarks.measure_suite               # each task's reference time at its CPU and GPU sizes
    python -m benchmarks.throughput                  # candidates per hour: our evaluator pool against KernelBench's batch eval (GPU)
"""  # keeps the commands indented  # fmt: skip

from pathlib import Path

# The repository's root, for the benchmarks that read its tests' fixtures, prompts and tasks. One
# constant, so that moving a benchmark cannot leave it counting parents to a folder that is not the
# repository (tests/test_benchmark_paths.py checks every path a benchmark module names).
REPO_ROOT = Path(__file__).resolve().parent.parent
