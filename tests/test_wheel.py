"""The wheel a user installs: one namespace, kernel_refinery.*, real files where the checkout has links,
the data files the code reads, and no developer tooling (benchmarks/, results/, tests/)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import kernel_refinery

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "kernel_refinery"


def _source_copy(into: Path) -> Path:
    """The files git would commit (tracked, or new and not ignored), links kept as links: a build in
    the checkout itself would also pack whatever an earlier build left in build/lib."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    for name in filter(None, listed.split("\0")):
        source, target = ROOT / name, into / name
        if not source.is_symlink() and not source.exists():
            continue  # deleted in the working tree, not yet in git
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)
    return into


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    source = _source_copy(tmp_path_factory.mktemp("source"))
    # Built as pip builds it for `pip install .` (setuptools from this environment).
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
        cwd=out,
    )
    (built,) = out.glob("kernel_refinery-*.whl")
    return built


def test_the_wheel_claims_only_its_namespace_and_ships_no_benchmarks(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {NAMESPACE}, tops
    dist_info = next(top for top in tops if top.endswith(".dist-info"))
    assert "refinery = kernel_refinery.bench.cli:app" in zipfile.ZipFile(wheel).read(f"{dist_info}/entry_points.txt").decode()
    tooling = [name for name in names if any(part in ("benchmarks", "perf", "soak", "results", "tests") for part in name.split("/"))]
    assert not tooling, tooling
    # The links of the checkout (kernel_refinery/tools -> ../tools) became real files, with the data the code reads.
    for needed in (
        "kernel_refinery/__init__.py",
        "kernel_refinery/core/verdict.py",
        "kernel_refinery/tools/evaluator.py",
        "kernel_refinery/tools/processes/worker_main.py",
        "kernel_refinery/agent/chat/local_server_main.py",
        "kernel_refinery/prompts/system.j2",
        "kernel_refinery/prompts/hints.toml",
        "kernel_refinery/prompts/examples/sigmoid_cpp.py",
        "kernel_refinery/bench/suites/builtin/level1/1_relu.py",
        "kernel_refinery/traces/assets/report.css",
    ):
        assert needed in names, f"{needed} missing from {wheel.name}"


def test_installed_into_a_fresh_environment_it_imports_by_its_namespace_only(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    # Without dependencies: the root package and core import without torch; the rest is checked by file above.
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
        check=True,
        capture_output=True,
    )
    probe = (
        "import importlib.util, kernel_refinery, kernel_refinery.core.verdict as v\n"
        "print(kernel_refinery.__file__)\n"
        "print(sorted(kernel_refinery.__all__))\n"
        "print([n for n in ('agent', 'tools', 'bench', 'traces', 'prompts', 'core', 'benchmarks') if importlib.util.find_spec(n)])\n"
    )
    out = subprocess.run([str(python), "-I", "-c", probe], check=True, capture_output=True, text=True, cwd=tmp_path).stdout.splitlines()
    assert out[0].startswith(str(venv)), out
    assert out[1] == str(sorted(kernel_refinery.__all__)), "the installed package exports the public API"
    assert out[2] == "[]", f"the wheel claims top-level names: {out[2]}"
    assert (venv / "bin" / "refinery").exists()
