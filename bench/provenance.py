"""Collecting a run's manifest (traces/manifest.py) on this machine: code, software, device, settings.

Each fact is asked of the machine once per call; a fact that cannot be had (no git, no GPU driver
library, no nvcc) is left empty rather than failing the run that wants the manifest.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import shutil
import socket
import subprocess
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from kernel_refinery.tools.config import CompilerChoice, EvalConfig, clock_of
from kernel_refinery.tools.hardware import _cpu_flags, _cpu_model, nvml
from kernel_refinery.tools.processes.sandbox import PROJECT_ROOT
from kernel_refinery.traces.manifest import DeviceFacts, EvalFacts, RunManifest, SoftwareFacts, SourceFacts, TaskFile

_ROOT = Path(PROJECT_ROOT)
_SIMD = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "neon", "asimd", "sve")
_TIMEOUT_S = 20.0


def _run(*command: str, cwd: Path | None = None) -> str | None:
    """stdout of a short command, or None when it is missing, fails or hangs."""
    if shutil.which(command[0]) is None:
        return None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def source_facts(root: Path = _ROOT) -> SourceFacts:
    try:
        version: str | None = importlib.metadata.version("kernel-refinery")
    except importlib.metadata.PackageNotFoundError:
        version = None
    commit = _run("git", "-C", str(root), "rev-parse", "HEAD")
    # Tracked files only: a run directory or a scratch file in the checkout does not change the code.
    status = _run("git", "-C", str(root), "status", "--porcelain", "--untracked-files=no") if commit else None
    dirty = bool(status.strip()) if status is not None else None
    return SourceFacts(version=version, commit=commit.strip() if commit else None, dirty=dirty)


def _first_line(text: str | None) -> str | None:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[0] if lines else None


def compiler_versions(device: str, choice: CompilerChoice = "auto") -> dict[str, str]:
    """The run's C++ compiler (the one `choice`, EvalConfig.compiler, builds with), and gcc, clang
    and nvcc where they are on PATH."""
    from kernel_refinery.tools.steps.compilers import CLANG_NAMES, identify

    found = {"c++ (run)": identify(cuda=device == "cuda", choice=choice).describe()}
    for name, command in (("gcc", "gcc"), ("clang", next((c for c in CLANG_NAMES if shutil.which(c)), "clang"))):
        line = _first_line(_run(command, "--version"))
        if line:
            found[name] = line
    nvcc = _run("nvcc", "--version")
    if nvcc:
        # "Cuda compilation tools, release 12.4, V12.4.131"
        found["nvcc"] = next((line.strip() for line in nvcc.splitlines() if "release" in line), _first_line(nvcc) or "?")
    return found


def _package_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def software_facts(device: str, compiler: CompilerChoice = "auto") -> SoftwareFacts:
    try:
        import torch
    except ImportError:
        torch_version = cuda = hip = None
    else:
        torch_version, cuda, hip = torch.__version__, torch.version.cuda, getattr(torch.version, "hip", None)
    return SoftwareFacts(
        python=platform.python_version(),
        torch=torch_version,
        cuda=cuda,
        hip=hip,
        triton=_package_version("triton", "pytorch-triton-rocm", "pytorch-triton"),
        compilers=compiler_versions(device, compiler),
    )


def _driver() -> str | None:
    pynvml = nvml()
    if pynvml is not None:
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
            return version.decode() if isinstance(version, bytes) else str(version)
        except pynvml.NVMLError:
            pass
    return _first_line(_run("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"))


def cores_used(config: EvalConfig) -> int:
    return config.cpu_threads or len(os.sched_getaffinity(0))


def device_facts(config: EvalConfig) -> DeviceFacts:
    flags = _cpu_flags()
    simd = tuple(f for f in _SIMD if f in flags)
    if config.device != "cuda":
        return DeviceFacts(kind="cpu", name=_cpu_model(), cores_used=cores_used(config), simd=simd)
    import torch

    props = torch.cuda.get_device_properties(0)
    return DeviceFacts(
        kind="cuda",
        name=props.name,
        count=torch.cuda.device_count(),
        memory_gib=round(props.total_memory / (1 << 30), 1),
        sm_count=props.multi_processor_count,
        compute_capability=f"{props.major}.{props.minor}",
        driver=_driver(),
        cores_used=len(os.sched_getaffinity(0)),
        simd=simd,
    )


def eval_facts(config: EvalConfig) -> EvalFacts:
    return EvalFacts(
        device=config.device,
        precision=config.precision,
        tolerance=config.precision_tolerance.atol,
        allow_tf32=config.allow_tf32,
        timing=clock_of(config.device, config.timing),
        trials=config.trials,
        warmup=config.warmup,
        correctness_trials=config.correctness_trials,
        baseline=config.baseline,
        noise_band=config.noise_band,
        compiler=config.compiler,
        seed=config.seed,
    )


def sha256_of(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def collect_manifest(config: EvalConfig, task_files: Sequence[tuple[str, Path]]) -> RunManifest:
    """This machine's manifest for an evaluation with `config` of the tasks (key, file) given."""
    return RunManifest(
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        host=socket.gethostname(),
        source=source_facts(),
        software=software_facts(config.device, config.compiler),
        device=device_facts(config),
        eval=eval_facts(config),
        tasks=tuple(TaskFile(key=key, path=str(path), sha256=sha256_of(path)) for key, path in task_files),
    )
