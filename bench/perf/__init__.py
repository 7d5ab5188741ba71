"""Developer benchmarks, not part of the product; each prints ratios measured side by side.

    python -m bench.perf.eval --device cpu|cuda      # where an evaluation's wall time goes
    python -m bench.perf.guards --device cpu|cuda    # what the evaluator's guards cost
    python -m bench.perf.experiment                  # runner throughput, device busy fraction, per-turn overhead
    python -m bench.perf.measure_suite               # each task's reference time at its CPU and GPU sizes
    python -m bench.perf.throughput                  # candidates per hour: our evaluator pool against KernelBench's batch eval (GPU)
"""  # keeps the commands indented  # fmt: skip
