"""Throughput benchmark: candidates per hour of our evaluator pool against KernelBench's batch
evaluation, on one GPU (see cli.py; run as `python -m benchmarks.throughput`).

Kept free of imports: KernelBench's spawned processes import this package to unpickle their work.
"""
