"""The program Nsight Compute profiles: one forward of the candidate, between profiler start/stop.

Run as `ncu --profile-from-start off ... python -m kernel_refinery.tools.steps.ncu_target TASK CANDIDATE`. Kernels are
built (from the shared cache) and warmed up before the profiled range, so only the candidate's
own forward is measured.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from kernel_refinery.tools.processes.programs import Program, import_source
from kernel_refinery.tools.steps.compile_cache import CompileCache


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("task", type=Path)
    parser.add_argument("candidate", type=Path)
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    workdir = Path.cwd()
    CompileCache(args.cache_dir).install()
    task = import_source(args.task.read_text(), "task", workdir)
    candidate = import_source(args.candidate.read_text(), "candidate", workdir)
    program = Program(task, candidate, torch.device("cuda:0"))
    model = program.new_model(args.seed)
    inputs = program.inputs(args.seed + 1_000_003)
    with torch.no_grad():
        for _ in range(2):
            model(*inputs)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        model(*inputs)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
