"""A run's manifest: what a reviewer needs to reproduce its numbers, as RUN_DIR/manifest.json.

The code's version and commit, the software (Python, torch, CUDA/HIP, Triton, compilers), the
device, the evaluator's settings and each task file's sha256. The model and reading it live here,
where the reports (bench/report.py, bench/compare.py) and the HTML report (traces/html.py) can all
read it; collecting the facts (torch, git, compilers) is bench/provenance.py's job.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from kernel_refinery.core.errors import RunDirError
from kernel_refinery.core.numerics import Numerics

MANIFEST_SCHEMA_VERSION = 1


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SourceFacts(Frozen):
    version: str | None
    """kernel-refinery's package version; None where it is not installed as a package."""
    commit: str | None
    """The git commit of the code that ran; None outside a git checkout."""
    dirty: bool | None
    """Tracked files changed since that commit (untracked ones are not counted)."""


class SoftwareFacts(Frozen):
    python: str
    torch: str | None
    cuda: str | None
    """The CUDA torch was built with (torch.version.cuda)."""
    hip: str | None
    triton: str | None
    compilers: dict[str, str] = {}
    """`--version` of each compiler present: the run's C++ compiler ("c++ (run)"), gcc, clang, nvcc."""


class DeviceFacts(Frozen):
    kind: str
    """cpu or cuda."""
    name: str
    """The GPU's name, or the CPU's model."""
    count: int = 1
    """GPUs visible (cuda); 1 on cpu."""
    memory_gib: float | None = None
    sm_count: int | None = None
    compute_capability: str | None = None
    driver: str | None = None
    cores_used: int | None = None
    """CPU cores the evaluation may run on (cpu: where kernels run; cuda: where they compile)."""
    simd: tuple[str, ...] = ()
    """SIMD flags from /proc/cpuinfo that change what a CPU kernel can do."""


class EvalFacts(Frozen):
    """The evaluator's settings that change what a number means."""

    device: str
    precision: str
    tolerance: float
    """atol = rtol in force for outputs of the precision."""
    allow_tf32: bool
    timing: str
    """How calls are timed: cuda-events, host-wall or cuda-graph (EvalConfig.timing), or monotonic on CPU."""
    trials: int
    warmup: int
    correctness_trials: int
    baseline: str
    """What a speedup is measured against (EvalConfig.baseline): eager, compile or best."""
    noise_band: bool = True
    """Whether the reference was timed against itself for each task's noise band."""
    compiler: str | None = None
    """The C++ compiler asked for (EvalConfig.compiler: auto, gcc or clang); None in manifests written
    before it. The one that built is software.compilers["c++ (run)"], and each result's compile.compiler."""
    seed: int
    """The first seed of inputs and weights (not compared: reverify draws fresh ones on purpose)."""

    @property
    def numerics(self) -> Numerics:
        return Numerics.recorded(self.precision, self.tolerance, self.allow_tf32)


class TaskFile(Frozen):
    key: str
    path: str
    sha256: str


class RunManifest(Frozen):
    schema_version: int = MANIFEST_SCHEMA_VERSION
    created_at: str
    host: str
    source: SourceFacts
    software: SoftwareFacts
    device: DeviceFacts
    eval: EvalFacts
    tasks: tuple[TaskFile, ...] = ()

    def summary(self) -> str:
        """One line for a report's header: commit, device, torch, precision."""
        commit = "commit unknown" if self.source.commit is None else f"commit {self.source.commit[:10]}"
        commit += " (dirty)" if self.source.dirty else ""
        d = self.device
        if d.kind == "cuda":
            details = [f"{d.sm_count} SMs" if d.sm_count else "", f"{d.memory_gib:.0f} GiB" if d.memory_gib else ""]
            details.append(f"sm_{d.compute_capability.replace('.', '')}" if d.compute_capability else "")
            details.append(f"driver {d.driver}" if d.driver else "")
            count = f"{d.count}× " if d.count > 1 else ""
            device = f"{count}{d.name} ({', '.join(x for x in details if x)})"
        else:
            device = f"{d.name} ({d.cores_used} cores)" if d.cores_used else d.name
        s = self.software
        torch = f"torch {s.torch or 'absent'}" + (f" CUDA {s.cuda}" if s.cuda else "") + (f" HIP {s.hip}" if s.hip else "")
        e = self.eval
        timing = f"{e.timing} timing, speedups against {e.baseline}"
        built = s.compilers.get("c++ (run)")
        # A CPU candidate's kernels are the C++ compiler's code: its speedup depends on which.
        compiler = f" · built with {built}" if built and d.kind == "cpu" else ""
        return f"{commit} · {device} · {torch} · {e.numerics.describe()} · {timing}{compiler}"


class Difference(Frozen):
    """One fact that differs between two manifests."""

    field: str
    """Dotted: device.name, software.torch, eval.trials, source.commit, tasks.level1/1_relu."""
    a: str
    b: str

    def describe(self) -> str:
        return f"{self.field}: {self.a} vs {self.b}"


_NOT_COMPARED = {"eval.seed"}


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested tables as one level of dotted keys: {"eval": {"trials": 5}} -> {"eval.trials": 5}."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _shown(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, str) and len(value) == 40 and all(c in "0123456789abcdef" for c in value):
        return value[:10]  # a commit: ten hex digits name it in practice
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value)) or "none"
    return str(value)


def differences(a: RunManifest, b: RunManifest) -> list[Difference]:
    """What tells the two runs' measurements apart: machine, software, settings, code and task files
    (the tasks both hold). Timestamps, host names and seeds are left out: they differ by design."""
    flat_a, flat_b = ({**flatten(m.model_dump(mode="json", include={"source", "software", "device", "eval"}))} for m in (a, b))
    found = [
        Difference(field=key, a=_shown(flat_a.get(key)), b=_shown(flat_b.get(key)))
        for key in sorted(flat_a.keys() | flat_b.keys())
        if key not in _NOT_COMPARED and key != "source.version" and flat_a.get(key) != flat_b.get(key)
    ]
    hashes_a, hashes_b = {t.key: t.sha256 for t in a.tasks}, {t.key: t.sha256 for t in b.tasks}
    found += [
        Difference(field=f"tasks.{key}", a=f"sha256 {hashes_a[key][:12]}", b=f"sha256 {hashes_b[key][:12]}")
        for key in sorted(hashes_a.keys() & hashes_b.keys())
        if hashes_a[key] != hashes_b[key]
    ]
    return found


def manifest_path(run_dir: Path) -> Path:
    return Path(run_dir) / "manifest.json"


def write_manifest(run_dir: Path, manifest: RunManifest) -> Path:
    path = manifest_path(run_dir)
    path.write_text(manifest.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return path


def parse_manifest(text: str, where: str) -> RunManifest:
    """A manifest from its JSON; RunDirError saying where and what to do when it is not one."""
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise RunDirError(f"{where} is not JSON ({exc}); delete it to go on without a manifest") from exc
    version = raw.get("schema_version") if isinstance(raw, dict) else None
    if isinstance(version, int) and version > MANIFEST_SCHEMA_VERSION:
        raise RunDirError(
            f"{where}: manifest schema version {version} is newer than this kernel-refinery "
            f"(reads up to {MANIFEST_SCHEMA_VERSION}); upgrade kernel-refinery to read it"
        )
    try:
        return RunManifest.model_validate(raw)
    except ValidationError as exc:
        raise RunDirError(
            f"{where} is not a run manifest this version of refinery reads ({exc.errors()[0]['msg']} at "
            f"{'.'.join(map(str, exc.errors()[0]['loc']))}); delete it to go on without one, or read the run "
            "with the version that wrote it"
        ) from exc


def read_manifest(run_dir: Path) -> RunManifest | None:
    """RUN_DIR/manifest.json; None for runs made before manifests were written."""
    path = manifest_path(run_dir)
    if not path.is_file():
        return None
    return parse_manifest(path.read_text(encoding="utf-8"), str(path))
