"""The suite measurement lists every task, also those whose forward the meta device cannot follow."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import measure_suite

NEEDS_VALUES = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        # A data-dependent branch, as level3/29_SwinMLP has: .item() on the meta device raises.
        return x * (int(x.abs().max().item() > 0) + 1)


def get_inputs():
    return [torch.rand(64, 64)]


def get_init_inputs():
    return []
"""

BROKEN = NEEDS_VALUES.replace("return x * (", "return undefined_name * (")


def test_a_task_the_meta_device_cannot_follow_is_listed_without_an_estimate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "level3").mkdir()
    (tmp_path / "level3" / "1_needs_values.py").write_text(NEEDS_VALUES)
    (tmp_path / "level3" / "2_broken.py").write_text(BROKEN)
    (tmp_path / "level3" / "3_plain.py").write_text(NEEDS_VALUES.replace("x * (int(x.abs().max().item() > 0) + 1)", "torch.relu(x)"))
    measure_suite.main(["--suite", str(tmp_path), "--repeats", "3", "--budget", "0.1"])
    out = capsys.readouterr().out
    assert "level3/1_needs_values" in out and "no estimate: RuntimeError: Tensor.item() cannot be called on meta tensors" in out
    assert re.search(r"level3/2_broken +reference failed: NameError", out)
    plain = next(line for line in out.splitlines() if line.startswith("level3/3_plain"))
    assert "no estimate" not in plain and "failed" not in plain
    assert "2 of 3 tasks ran" in out
