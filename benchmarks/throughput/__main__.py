"""`python -m benchmarks.throughput`: see cli.py.

multiprocessing's spawned children skip a package's __main__ module, so nothing here runs in
KernelBench's compile and evaluation processes.
"""

if __name__ == "__main__":
    from benchmarks.throughput.cli import main

    raise SystemExit(main())
