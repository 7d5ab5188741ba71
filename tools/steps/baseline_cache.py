"""Reference baselines kept on disk, so that a new worker or a later run need not time the reference again.

One JSON file per setting under `EvalConfig.baseline_root` (`cache_dir/baselines` unless
`baseline_dir` moves it), named by a sha256 over everything that moves the reference's time: the
device (on CPU its model, the worker's cores and torch threads), torch, the task's source,
precision, tolerance, TF32, warm-up, trials, seed, the fresh-input guard and torch.compile. A file
is only a proposal: the judge re-times the reference in a quiet window (`spot_calls`) and believes
the file only when the two agree (`agrees`), so a speedup still rests on a reference seen in the
same run; a disagreement is checked once more before the reference is timed again.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import structlog
import torch
from pydantic import Field, ValidationError

from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.hardware import _cpu_model
from kernel_refinery.tools.results import Frozen, TimingStats

log = structlog.get_logger()

FORMAT = 2
"""Part of the key: bump it when the way the reference is timed changes, and older files miss.
2: timed by the judge's clock through the reference runner, in batches (tools/steps/timing_stage.py)."""

SPOT_CALLS = 10
"""Reference calls re-timed in this process before a stored baseline is believed (fewer if trials are fewer)."""

SPOT_BAND = 0.10
"""How far (relative) the spot median may sit from the stored median and the file still be used.

Why 10%: a speedup is reference median over candidate median, so an accepted file can move a
speedup by at most about this much from what this process sees of the reference now; it is
wider than the scatter expected of a ten-call median on a quiet device (CUDA events on a GPU with
the same clocks and no co-tenant), and narrower than what a throttled or shared GPU, or a CPU
under different load, does to a reference. A file refused costs only the spot calls on top of
the full measurement that would have run without the cache. On a loaded 2-core CPU, where two
medians of the same reference in one process were seen 2x apart, files are often refused, as
they should be: there the cache saves little, and claims nothing it did not check."""


class StoredBaseline(Frozen):
    """One file's content: the reference's timings and what was measured with them."""

    format: int = FORMAT
    key: str
    setting: dict[str, Any]
    """The parts of the key, in the clear, for whoever opens the file."""
    reference: TimingStats
    reference_samples_ms: tuple[float, ...]
    compiled: TimingStats | None = None
    """torch.compile of the reference: used only together with an accepted eager reference."""
    roofline_ms: float | None = None
    compiled_samples_ms: tuple[float, ...] = ()
    """torch.compile's per-call times, for a speedup's interval against that baseline."""
    noise_band: tuple[float, float] | None = None
    """The reference's A/A band (see tools/steps/timing_stage.py): None in files written before it."""
    batch_calls: int = 1
    """Calls per hand-over the reference was timed in; a spot check hands over as many."""
    reference_single_ms: tuple[float, ...] = ()
    """The reference handed over one call at a time, per call (when batch_calls > 1)."""
    harness_ms: float | None = None
    """The harness's cost of one batch when it was measured (information: each judge measures its own)."""
    measured_at: float = Field(default_factory=time.time)
    """Unix time of the measurement."""


def store_for(cfg: EvalConfig) -> BaselineStore | None:
    """The store the worker uses, or None when the cache is off.

    A parent started before these settings existed sends a config without them (pickled across the
    pipe, defaults are not filled in): such a run keeps timing every reference, as it did."""
    if not getattr(cfg, "baseline_cache", False):
        return None
    return BaselineStore(cfg.baseline_root)


def device_identity(device: torch.device) -> str:
    """What a timing on this device depends on beyond the task: the chip, and on CPU the cores and threads."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        # A MIG slice has the full GPU's name but fewer multiprocessors.
        return f"{torch.cuda.get_device_name(device)}; {props.multi_processor_count} SMs; {props.total_memory} B; CUDA {torch.version.cuda}"
    return f"{_cpu_model()}; {len(os.sched_getaffinity(0))} cores; {torch.get_num_threads()} torch threads"


def baseline_setting(cfg: EvalConfig, device: torch.device, worker_key: tuple[Any, ...]) -> dict[str, Any]:
    """Everything the key is made of; `worker_key` is the worker's in-memory key (task source hash and all)."""
    tolerance = cfg.tolerance_for(cfg.dtype_name)
    return {
        "format": FORMAT,
        "device": device_identity(device),
        "torch": torch.__version__,
        "worker_key": [str(part) for part in worker_key],
        "precision": cfg.precision,
        "tolerance": None if tolerance is None else [tolerance.atol, tolerance.rtol],
        "allow_tf32": cfg.allow_tf32,
        "warmup": cfg.warmup,
        "trials": cfg.trials,
        "seed": cfg.seed,
        "fresh_inputs": cfg.guards.fresh_inputs,
        "fresh_input_source": cfg.guards.fresh_input_source,
        "time_compiled_reference": cfg.times_compiled_reference,
        "noise_band": cfg.noise_band,
        "timing": cfg.timing,
    }


def baseline_key(setting: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(setting, sort_keys=True).encode()).hexdigest()


def spot_calls(cfg: EvalConfig) -> int:
    return min(cfg.trials, SPOT_CALLS)


def agrees(stored_median_ms: float, spot_median_ms: float) -> bool:
    """Whether the reference timed now matches the stored one (see SPOT_BAND)."""
    if stored_median_ms <= 0:
        return False
    return abs(spot_median_ms / stored_median_ms - 1) <= SPOT_BAND


class BaselineStore:
    """One JSON file per key; written whole (temporary file, then rename), so that concurrent
    workers never read half a file: the last writer wins, and every version is a full measurement."""

    def __init__(self, root: Path):
        self.root = root

    def path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def load(self, key: str) -> StoredBaseline | None:
        """The stored baseline, or None: missing, unreadable or corrupt files are misses, never errors."""
        path = self.path(key)
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("baseline cache file unreadable; timing the reference", path=str(path), error=str(exc))
            return None
        try:
            stored = StoredBaseline.model_validate_json(text)
        except ValidationError as exc:
            log.warning(
                "baseline cache file corrupt; timing the reference and overwriting it", path=str(path), error=str(exc).splitlines()[0]
            )
            return None
        if stored.key != key or stored.format != FORMAT or len(stored.reference_samples_ms) != stored.reference.trials:
            log.warning("baseline cache file does not match its name; timing the reference and overwriting it", path=str(path))
            return None
        return stored

    def save(self, stored: StoredBaseline) -> None:
        """Best effort: a full disk or a read-only cache only costs the next worker a measurement."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{stored.key[:16]}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as out:
                    out.write(stored.model_dump_json(indent=1))
                os.replace(tmp, self.path(stored.key))
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            log.warning(
                "could not write the baseline cache; the next worker times the reference again", root=str(self.root), error=str(exc)
            )
