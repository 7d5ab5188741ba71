"""Which shape and init variants the judge derives for each task of a suite (tools/steps/shape_variants.py),
in this process, on the CPU: no candidate, only the reference on the meta device.

    python -m benchmarks.shape_variants_survey --suite path/to/KernelBench/KernelBench --levels 1,2,3 \\
        --json results/shape_variants_kernelbench.json

Per task: the constants taken for sizes and hyper-parameters, each variant's values or why it does not
apply, whether the meta device could judge them (else the reference's real run in the check decides),
and the seconds the choice took. A task whose module does not import (a missing package) is counted
as such.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from rich.console import Console

from kernel_refinery.bench.suite_check.run import find_tasks
from kernel_refinery.bench.tasks import load_task_file
from kernel_refinery.tools.processes.programs import Program, import_source
from kernel_refinery.tools.steps.shape_variants import classify, derive


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default="builtin")
    parser.add_argument("--levels", default=None, help="comma-separated, e.g. 1,2,3")
    parser.add_argument("--json", type=Path, help="also write every task's variants here")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")] if args.levels else None
    console = Console()
    rows: list[dict[str, object]] = []
    errors: list[str] = []
    offered: Counter[str] = Counter()
    applicable: Counter[str] = Counter()
    without_sizes: list[str] = []
    by_real_run: list[str] = []
    seconds: list[float] = []
    with_variant = 0
    with tempfile.TemporaryDirectory(prefix="refinery-survey-") as scratch:
        for found in find_tasks(args.suite, levels):
            started = time.perf_counter()
            try:
                source = load_task_file(found.path, found.level).source_for("cpu")
                program = Program(import_source(source, "task", Path(scratch)), None, torch.device("cpu"), task_source=source)
            except Exception as exc:  # noqa: BLE001 - a task's module may raise anything at import
                errors.append(found.key)
                rows.append({"task": found.key, "import_error": f"{type(exc).__name__}: {exc}".splitlines()[0]})
                continue
            kinds = classify(program)
            variants = derive(program)
            took = round(time.perf_counter() - started, 3)
            seconds.append(took)
            meta = variants.structure is not None
            plans = [
                {"name": p.name, "overrides": dict(p.overrides), "skip": p.skip, "unverified": bool(p.fallbacks) or not meta}
                for p in variants.plans
            ]
            for plan in variants.plans:
                offered[plan.name] += 1
                applicable[plan.name] += not plan.skip
            with_variant += any(not plan.skip for plan in variants.plans)
            if not kinds.sizes:
                without_sizes.append(found.key)
            if not meta:
                by_real_run.append(found.key)
            sizes = {c.name: c.value for c in kinds.sizes}
            params = {c.name: c.value for c in kinds.params}
            rows.append({"task": found.key, "sizes": sizes, "params": params, "meta": meta, "variants": plans, "seconds": took})
            shown = ", ".join(f"{p.name}{' (n/a)' if p.skip else ''}" for p in variants.plans)
            console.print(f"{found.key}: {shown or 'no variant'}  {took} s", highlight=False)

    seconds.sort()
    summary = {
        "tasks": len(rows),
        "import_errors": errors,
        "with_an_applicable_variant": with_variant,
        "without_a_size_constant": without_sizes,
        "judged_by_the_reference_run": by_real_run,
        "offered": dict(offered),
        "applicable": dict(applicable),
        "seconds_median": seconds[len(seconds) // 2] if seconds else 0.0,
        "seconds_max": seconds[-1] if seconds else 0.0,
    }
    console.print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"suite": str(args.suite), "summary": summary, "tasks": rows}, indent=1) + "\n")
        console.print(f"written: {args.json}")


if __name__ == "__main__":
    main()
