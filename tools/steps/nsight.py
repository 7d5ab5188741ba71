"""Nsight Compute feedback (variant N): per-kernel hardware counters and a roofline verdict.

The candidate runs under `ncu --clock-control none` (the GPU's clocks are never changed), limited
to one forward between profiler start and stop, and PyTorch's own kernels are left out. Where
ncu is missing or cannot read the counters, the reason is reported once and the caller falls
back to the torch.profiler table.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import structlog

from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.processes import sandbox
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.tools.results import KernelCounters, NsightReport

log = structlog.get_logger()

SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats")
_STALL = re.compile(r"^smsp__average_warps?_issue_stalled_(?P<reason>\w+?)_per_issue_active\.ratio$")
# The DRAM throughput metric is named differently across ncu versions and chips.
_DRAM_COLUMNS = ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed")
# PyTorch's own kernels (allocation fills, copies) are not the candidate's work.
_FRAMEWORK_KERNEL = re.compile(r"at::native::|at_cuda_detail|cub::|^void cutlass")


def roofline_verdict(dram_pct: float, sm_pct: float, top_stall: str) -> str:
    if max(dram_pct, sm_pct) < 40:
        return f"latency-bound (neither memory nor compute is busy; mostly stalled on {top_stall})"
    if dram_pct >= sm_pct:
        return "memory-bound (DRAM throughput is the limit: move fewer bytes, fuse, vectorise loads)"
    return "compute-bound (the SM pipelines are the limit: fewer or cheaper instructions)"


def _number(text: str) -> float:
    cleaned = text.replace(",", "").strip()
    try:
        return float(cleaned)
    except ValueError:
        return 0.0


def _duration_us(value: str, unit: str) -> float:
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
    return _number(value) * scale.get(unit.strip(), 1e-3)


def parse_raw_csv(text: str) -> tuple[KernelCounters, ...]:
    """Parse `ncu --csv --page raw` output: a header row of metric names, a row of units, then kernels."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if len(lines) < 3:
        return ()
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    header, units, data = rows[0], rows[1], rows[2:]
    col = {name: i for i, name in enumerate(header)}

    def get(row: list[str], name: str) -> str:
        return row[col[name]] if name in col and col[name] < len(row) else "0"

    kernels = []
    for row in data:
        name = get(row, "Kernel Name")
        if _FRAMEWORK_KERNEL.search(name):
            continue
        stalls = {m["reason"]: _number(row[i]) for n, i in col.items() if (m := _STALL.match(n)) and i < len(row)}
        stalls.pop("selected", None)  # issuing, not stalling
        top = max(stalls, key=lambda r: stalls[r]) if stalls else "unknown"
        dram = _number(next((get(row, n) for n in _DRAM_COLUMNS if n in col), "0"))
        sm = _number(get(row, "sm__throughput.avg.pct_of_peak_sustained_elapsed"))
        duration_col = "gpu__time_duration.sum"
        kernels.append(
            KernelCounters(
                name=name,
                duration_us=_duration_us(get(row, duration_col), units[col[duration_col]] if duration_col in col else "ns"),
                dram_pct=dram,
                sm_pct=sm,
                occupancy_pct=_number(get(row, "sm__warps_active.avg.pct_of_peak_sustained_active")),
                registers=int(_number(get(row, "launch__registers_per_thread"))),
                shared_bytes=int(
                    _number(get(row, "launch__shared_mem_per_block_static")) + _number(get(row, "launch__shared_mem_per_block_dynamic"))
                ),
                top_stall=top,
                top_stall_ratio=stalls.get(top, 0.0),
                verdict=roofline_verdict(dram, sm, top),
            )
        )
    return tuple(kernels)


_warned: set[str] = set()


def _unavailable(reason: str) -> NsightReport:
    if reason not in _warned:
        _warned.add(reason)
        log.warning("nsight_unavailable", reason=reason, fallback="torch.profiler table (variant P)")
    return NsightReport(available=False, reason=reason)


def profile_with_ncu(task: TaskProgram, candidate: str, config: EvalConfig, timeout_s: float = 300.0) -> NsightReport:
    ncu = shutil.which("ncu") or next((str(p) for p in sorted(Path("/opt/nvidia").glob("nsight-compute/*/ncu")) if p.exists()), None)
    if ncu is None:
        return _unavailable("ncu is not installed or not on PATH")
    if config.device != "cuda":
        return _unavailable("Nsight Compute needs the CUDA device")
    with tempfile.TemporaryDirectory(prefix="refinery-ncu-") as tmp:
        task_file = Path(tmp) / "task.py"
        cand_file = Path(tmp) / "candidate.py"
        task_file.write_text(task.source)
        cand_file.write_text(candidate)
        cmd = [
            ncu,
            "--clock-control",
            "none",
            "--profile-from-start",
            "off",
            "--target-processes",
            "all",
            *[arg for s in SECTIONS for arg in ("--section", s)],
            "--csv",
            "--page",
            "raw",
            sys.executable,
            "-m",
            "kernel_refinery.tools.steps.ncu_target",
            str(task_file),
            str(cand_file),
            "--cache-dir",
            str(config.cache_dir),
        ]
        env = sandbox.scrubbed_env(
            PYTHONPATH=sandbox.project_pythonpath(), HOME=tmp, TORCH_EXTENSIONS_DIR=str(config.cache_dir / "extensions")
        )
        try:
            done = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout_s, start_new_session=True)
        except subprocess.TimeoutExpired:
            return NsightReport(available=False, reason=f"ncu did not finish within {timeout_s:.0f} s")
    output = done.stdout + "\n" + done.stderr
    dump = os.environ.get("REFINERY_NCU_DUMP")
    if dump:  # keep ncu's raw CSV, e.g. to add a parser fixture
        Path(dump).write_text(done.stdout)
    if "ERR_NVGPUCTRPERM" in output or "LibraryNotLoaded" in output or "Failed to initialize" in output:
        return _unavailable("ncu cannot read the GPU's performance counters here")
    kernels = parse_raw_csv(done.stdout)
    if not kernels:
        tail = "\n".join(output.strip().splitlines()[-5:])
        return NsightReport(available=False, reason=f"ncu profiled no kernel of the candidate (exit {done.returncode}): {tail[-400:]}")
    return NsightReport(available=True, kernels=kernels)
