"""The GPU's own utilization, sampled through NVML while a side of the benchmark runs.

NVML's utilization is the share of its last sample period (1/6 s to 1 s) in which a kernel ran,
so it is a coarser and different measure from the device lock's held time: a timing run holds
the lock while the GPU waits on the host between calls. Each sample records, beside the
percentage, a label the caller sets (KernelBench's phase, or whether our compiles are pending),
so averages can be taken per label.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def nvml_index() -> int:
    """The NVML index of CUDA device 0: the first of CUDA_VISIBLE_DEVICES when it names one by number."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(visible) if visible.isdigit() else 0


@dataclass
class Sample:
    t: float
    util: int
    label: str


@dataclass
class GpuSampler:
    """Samples every `interval_s` on a thread between `start` and `stop`; `label()` tags each sample."""

    label: Callable[[], str] = lambda: ""
    interval_s: float = 0.25
    samples: list[Sample] = field(default_factory=list)
    error: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _origin: float = 0.0

    def start(self) -> GpuSampler:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index())
        except Exception as exc:  # noqa: BLE001 - NVML missing or unusable: the run goes on without the series
            self.error = f"{type(exc).__name__}: {exc}"
            return self
        self._origin = time.monotonic()
        self._thread = threading.Thread(target=self._run, args=(pynvml, handle), name="gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self, pynvml: Any, handle: Any) -> None:
        while not self._stop.is_set():
            try:
                util = int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except Exception as exc:  # noqa: BLE001 - one failed read ends the series, not the run
                self.error = f"{type(exc).__name__}: {exc}"
                return
            self.samples.append(Sample(t=round(time.monotonic() - self._origin, 3), util=util, label=self.label()))
            self._stop.wait(self.interval_s)

    def stop(self) -> GpuSampler:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            import pynvml

            with contextlib.suppress(Exception):  # shutting NVML down is a courtesy
                pynvml.nvmlShutdown()
        return self

    def mean(self, label: str | None = None) -> float | None:
        """Mean utilization (0-1) over the samples with this label (all samples for None)."""
        chosen = [s.util for s in self.samples if label is None or s.label == label]
        return sum(chosen) / (100 * len(chosen)) if chosen else None

    def summary(self, labels: tuple[str, ...] = ()) -> dict[str, Any]:
        return {
            "interval_s": self.interval_s,
            "samples": len(self.samples),
            "error": self.error,
            "mean": self.mean(),
            "mean_by_label": {label: self.mean(label) for label in labels},
            "count_by_label": {label: sum(1 for s in self.samples if s.label == label) for label in labels},
            "series": [[s.t, s.util, s.label] for s in self.samples],
        }
