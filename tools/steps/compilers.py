"""The C++ compiler a CPU candidate's extension is built with: the one EvalConfig.compiler asks for.

The choice travels with each job's config to the runner (tools/processes/worker_main.py), which
builds with it (tools/steps/compile_cache.py); it is never read from the runner's environment,
which is scrubbed (tools/processes/sandbox.py) and, in a runner forked from the warm template,
fixed when the template started. The parent checks the choice before any runner starts
(tools/evaluator.py), so a compiler that is not installed is an error the user can act on rather
than every candidate's compile error. No torch here: the parent does not import it.

- "gcc": `c++` (GCC), or CXX where it names a GCC.
- "clang": CXX where it names a clang, else the first of CLANG_NAMES on PATH with LLVM's OpenMP
  runtime (libomp and its omp.h: without them every `-fopenmp` candidate would fail to build).
- "auto": CXX where it is set, else `c++`: torch's own choice.

A CUDA build's `main.cpp` stays with CXX/`c++` whatever the choice: it is nvcc's host compiler too
(tools/steps/pch.py). Results name the compiler that built (CompileReport.compiler), and a run's
manifest both the choice and the compiler (traces/manifest.py).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kernel_refinery.core.errors import ConfigError
from kernel_refinery.tools.config import CompilerChoice

CLANG_NAMES: tuple[str, ...] = ("clang++-19", "clang++")
"""Where clang++ is looked for on PATH, in order (Debian 12's package is clang-19); tests point it
at a missing path to see the error."""

GCC_DEFAULT = "c++"
"""torch's own default when CXX is not set."""


class CompilerMissing(ConfigError):
    """The compiler asked for (EvalConfig.compiler) is not on this machine."""


@dataclass(frozen=True)
class Compiler:
    """A C++ compiler: the command torch runs (CXX), its family and version."""

    command: str
    family: str
    """"clang" or "gcc" (anything that is not clang is taken for GCC, as torch does)."""
    version: str
    banner: str
    """The first line of `--version`."""
    version_text: str = ""
    """All of `--version`: what the header's key takes (as it did before clang)."""

    @property
    def clang(self) -> bool:
        return self.family == "clang"

    def describe(self) -> str:
        """What results record, e.g. "clang++-19 19.1.7 (clang)"."""
        return f"{Path(self.command).name} {self.version} ({self.family})"

    def key(self) -> str:
        """What the build cache's and the header's keys take from it: the resolved binary and its banner."""
        return f"{os.path.realpath(shutil.which(self.command) or self.command)}\n{self.banner}"


@functools.cache
def _has_openmp(path: str) -> bool:
    """Whether this clang has LLVM's OpenMP runtime to link and its omp.h (libomp-NN-dev)."""

    def ask(flag: str) -> str:
        return subprocess.run([path, flag], capture_output=True, text=True, check=False).stdout.strip()

    library, resources = ask("-print-file-name=libomp.so"), ask("-print-resource-dir")
    return os.path.isabs(library) and os.path.exists(library) and os.path.exists(os.path.join(resources, "include", "omp.h"))


def find_clang() -> str | None:
    """The first of CLANG_NAMES that is an executable on PATH (or a path to one) with its OpenMP
    runtime, else None."""
    for name in CLANG_NAMES:
        path = shutil.which(name)
        if path and _has_openmp(path):
            return name
    return None


@functools.cache
def identify_command(command: str) -> Compiler:
    try:
        done = subprocess.run([command, "--version"], capture_output=True, text=True, check=False)
    except OSError as exc:
        raise CompilerMissing(f"the C++ compiler {command!r} cannot be run ({exc.strerror or exc}): install it, or set CXX") from None
    banner = (done.stdout.splitlines() or [""])[0].strip()
    family = "clang" if "clang version" in banner else "gcc"
    # "Debian clang version 19.1.7 (3~deb12u1)"; "c++ (Debian 12.2.0-14+deb12u1) 12.2.0"
    found = re.search(r"clang version (\S+)", banner) if family == "clang" else re.search(r"(\d+(?:\.\d+)+)\s*$", banner)
    return Compiler(command=command, family=family, version=found.group(1) if found else "?", banner=banner, version_text=done.stdout)


def compiler(cuda: bool = False, choice: CompilerChoice = "auto") -> str:
    """The command a build runs as CXX for this choice (see the module's docstring); CompilerMissing
    where the family asked for is not installed.

    GCC is the default although clang builds in a fifth of the time: clang 19 vectorises no
    transcendental function (GCC calls glibc's vector math, libmvec, under -ffast-math), so a
    candidate's `tanhf` loop ran 8x slower (4.0 against 32.8 ms here; -fveclib=libmvec did not
    help) and its speedup would say more about the compiler than about the kernel."""
    pinned = os.environ.get("CXX")
    if cuda or choice == "auto":
        return pinned or GCC_DEFAULT
    if pinned and identify_command(pinned).family == choice:
        return pinned
    if choice == "gcc":
        command = GCC_DEFAULT
    else:
        found = find_clang()
        if found is None:
            raise CompilerMissing(
                f"eval.compiler=clang, but no clang++ with LLVM's OpenMP runtime is on PATH (looked for {', '.join(CLANG_NAMES)}): "
                "install clang-19 and libomp-19-dev (`make setup` does, as root), or build with GCC (--set eval.compiler=gcc)"
            )
        command = found
    built = identify_command(command)
    if built.family != choice:
        raise CompilerMissing(f"eval.compiler={choice}, but {command} is {built.describe()}: set CXX to a {choice} C++ compiler")
    return command


def identify(cuda: bool = False, choice: CompilerChoice = "auto") -> Compiler:
    """The compiler this choice builds with (see compiler()), with its family and version."""
    return identify_command(compiler(cuda, choice))
