"""The evaluator's steps after the static check: build, correctness, timing and its floor, profiling."""
