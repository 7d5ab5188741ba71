"""A precompiled `torch/extension.h` for the C++ file of an extension, for the compiler of the run.

Parsing that header is most of a one-function CPU extension's compile on a 2-core machine. Two
compilers are served, one per run (`compiler()` picks it, the same way in every process):

- **clang++** where it is installed (`clang++-19`, else `clang++`, on PATH): the header is built
  with `-fpch-instantiate-templates`, so the templates the header's own inline functions use are
  instantiated once, in the header, instead of in every build (GCC cannot do that). Clang reads a
  precompiled header only when told (`-include-pch`), and refuses with an error one built with
  other language, target or optimisation options (its equivalent of `-Werror=invalid-pch`); the
  compile cache tells it only when a build's extra_cflags are exactly the header's.
  Clang's OpenMP code calls LLVM's runtime (libomp, `__kmpc_*`); `-fopenmp=libgomp`, which would
  link torch's GNU libgomp instead, makes clang ignore every `#pragma omp` (no `_OPENMP`, one
  thread), so a clang build links libomp beside torch's libgomp (tests/test_clang.py shows both at
  work in one process with correct results).
- **GCC** (`c++`) where clang is missing, or when `CXX` names a compiler: GCC uses
  `DIR/torch/extension.h.gch` in place of the header when `DIR` comes first in the include path
  and the header's options match the extension's, and otherwise parses the header as usual.

A CUDA build's `main.cpp` (the bindings beside the nvcc file) stays with `CXX`/`c++` (GCC), which
is also nvcc's host compiler; it has a header of its own (CUDA's include path, the candidate's
extra_cflags, usually none), built where CUDA is.

The header is built once per machine, for the flags of the one-shot examples (which the models
mostly copy), by `make setup` or `python -m kernel_refinery.tools.steps.pch`, under a lock, and never during an
evaluation. Its directory's name hashes the compiler (path and `--version`), torch's version, the
build's options and the header's own build options, so another compiler or other flags find no
header and one is built for them. The compile cache's key includes the compiler (`identify()`),
and results name it (CompileReport.compiler).

    python -m kernel_refinery.tools.steps.pch            # build (clang: about 20 s and 0.2 GB; GCC: about 65 s and 0.8 GB)
    python -m kernel_refinery.tools.steps.pch --check    # exit 1 when it is missing
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.utils.cpp_extension as cpp_extension

from kernel_refinery.tools.config import default_pch_dir

PCH_FLAGS = ("-O3", "-fopenmp")
"""The extra_cflags of prompts/examples/sigmoid_cpp.py: the header is valid for extensions built with these."""

PCH_FLAGS_CUDA: tuple[str, ...] = ()
"""The extra_cflags of prompts/examples/sigmoid_cuda.py (none: its options go to nvcc)."""

CLANG_NAMES: tuple[str, ...] = ("clang++-19", "clang++")
"""Where clang++ is looked for on PATH, in order (Debian 12's package is clang-19); tests point it
at a missing path to see the fallback to GCC."""

GCC_DEFAULT = "c++"
"""torch's own default when CXX is not set."""

CLANG_HEADER_OPTIONS = ("-fpch-instantiate-templates",)
"""How clang builds the header: the header's templates instantiated once, in the header.
(`-fpch-codegen` would also emit the header's functions once, in an object of their own; clang 19
rejects a structured binding in torch's nn/modules/conv.h when compiling that object.)"""

_HEADER = "torch/extension.h"


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


def example_cflags(cuda: bool) -> tuple[str, ...]:
    """The extra_cflags a header is built for: the CPU example's, or the CUDA example's."""
    return PCH_FLAGS_CUDA if cuda else PCH_FLAGS


@functools.cache
def _has_openmp(path: str) -> bool:
    """Whether this clang has LLVM's OpenMP runtime to link and its omp.h (libomp-NN-dev): without
    them every `-fopenmp` candidate would fail to build."""

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


def compiler(cuda: bool = False) -> str:
    """The C++ compiler this run builds extensions with: CXX when it is set (the user's choice; it
    reaches workers, which keep CXX); else clang++ where installed and REFINERY_COMPILER=clang asks
    for it; else `c++` (GCC). A CUDA build keeps CXX/`c++`, nvcc's host compiler too. Every process
    on the machine decides the same way, so a run uses one compiler for all its candidates.

    GCC is the default although clang builds in a fifth of the time: clang 19 vectorises no
    transcendental function (GCC calls glibc's vector math, libmvec, under -ffast-math), so a
    candidate's `tanhf` loop ran 8x slower (4.0 against 32.8 ms here; -fveclib=libmvec did not
    help) and its speedup would say more about the compiler than about the kernel."""
    pinned = os.environ.get("CXX")
    if pinned or cuda:
        return pinned or GCC_DEFAULT
    if os.environ.get("REFINERY_COMPILER", "gcc") == "clang":
        return find_clang() or GCC_DEFAULT
    return GCC_DEFAULT


@functools.cache
def _identify(command: str) -> Compiler:
    done = subprocess.run([command, "--version"], capture_output=True, text=True, check=False)
    banner = (done.stdout.splitlines() or [""])[0].strip()
    family = "clang" if "clang version" in banner else "gcc"
    # "Debian clang version 19.1.7 (3~deb12u1)"; "c++ (Debian 12.2.0-14+deb12u1) 12.2.0"
    found = re.search(r"clang version (\S+)", banner) if family == "clang" else re.search(r"(\d+(?:\.\d+)+)\s*$", banner)
    return Compiler(command=command, family=family, version=found.group(1) if found else "?", banner=banner, version_text=done.stdout)


def identify(cuda: bool = False) -> Compiler:
    """The compiler of this run (see compiler()), with its family and version."""
    return _identify(compiler(cuda))


def header_cflags(extra_cflags: tuple[str, ...] = PCH_FLAGS, with_cuda: bool = False) -> list[str]:
    """The options torch's `load_inline` compiles a C++ source with, less the module's name."""
    with tempfile.TemporaryDirectory() as tmp:
        ninja = Path(tmp) / "build.ninja"
        cpp_extension._write_ninja_file_to_build_library(  # the one place torch assembles them
            path=str(ninja),
            name="probe",
            sources=[str(Path(tmp) / "main.cpp")],
            extra_cflags=list(extra_cflags),
            extra_cuda_cflags=[],
            extra_sycl_cflags=[],
            extra_ldflags=[],
            extra_include_paths=[],
            with_cuda=with_cuda,
            with_sycl=False,
            is_standalone=False,
        )
        line = next(raw for raw in ninja.read_text().splitlines() if raw.startswith("cflags = "))
    return [f for f in shlex.split(line.removeprefix("cflags = ")) if not f.startswith("-DTORCH_EXTENSION_NAME=")]


default_root = default_pch_dir
"""Shared by every run and test on the machine (REFINERY_PCH_DIR moves it): the key says what it was built for."""


def header_options(cxx: Compiler) -> tuple[str, ...]:
    """The options the header itself is built with, beyond the build's own."""
    return CLANG_HEADER_OPTIONS if cxx.clang else ()


def header_dir(
    extra_cflags: tuple[str, ...] = PCH_FLAGS, root: Path | None = None, with_cuda: bool = False, cxx: Compiler | None = None
) -> Path:
    """Where the header for these options lives; the name hashes the compiler (its `--version`),
    torch, the build's options and the header's own (clang's; GCC's key is as before clang)."""
    cxx = cxx or identify(with_cuda)
    own = ["header:", *header_options(cxx)] if header_options(cxx) else []
    key = "\n".join([cxx.version_text, torch.__version__, *header_cflags(extra_cflags, with_cuda), *own])
    return (root or default_root()) / hashlib.sha256(key.encode()).hexdigest()[:16]


def header_file(directory: Path, cxx: Compiler) -> Path:
    """The precompiled file inside a header directory: GCC finds `.gch` beside the header's name,
    clang is given the `.pch` with -include-pch."""
    return directory / "torch" / ("extension.h.pch" if cxx.clang else "extension.h.gch")


@functools.cache
def _ready(cuda: bool, root: Path | None, command: str) -> Path | None:
    if cuda and cpp_extension.CUDA_HOME is None:
        return None
    cxx = _identify(command)
    directory = header_dir(example_cflags(cuda), root, with_cuda=cuda, cxx=cxx)
    return directory if (directory / "ok").exists() else None


def ready_header_dir(cuda: bool = False, root: Path | None = None) -> Path | None:
    """The header directory for a CPU (or a CUDA) build's C++ file with the run's compiler, when
    its header was built and checked; else None (asked once per process and compiler)."""
    return _ready(cuda, root, compiler(cuda))


def forget_ready() -> None:
    """Ask again: a header was built or removed since."""
    _ready.cache_clear()


_OPTIMISE = re.compile(r"-O[123]$")


def clang_takes(extra_cflags: list[str], cuda: bool = False) -> bool:
    """Whether a clang build with these extra_cflags is given the header: only the header's own
    flags, in any order, -O1, -O2 and -O3 alike (they define the same macros and language options,
    which is all a header holds; the build's own -O level still decides its code, as GCC's header
    does). Clang refuses a header built with other language, target or optimisation options with an
    error, but would take one beside another -D or -include: those never get it."""

    def norm(flags: tuple[str, ...] | list[str]) -> list[str]:
        return sorted("-O" if _OPTIMISE.match(f) else f for f in flags)

    return norm(extra_cflags) == norm(example_cflags(cuda))


def use_flags(directory: Path, cxx: Compiler) -> list[str]:
    """The options that make a build read the header: GCC finds it first on the include path;
    clang is named the file."""
    return ["-include-pch", str(header_file(directory, cxx))] if cxx.clang else ["-I", str(directory)]


def _uses_header(directory: Path, cflags: list[str], cxx: Compiler | None = None) -> bool:
    """Whether the compiler takes the precompiled header for a source that includes
    torch/extension.h (twice: the candidate's include after load_inline's)."""
    cxx = cxx or identify()
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.cpp"
        probe.write_text(f"#include <{_HEADER}>\n#include <{_HEADER}>\nint probe() {{ return 0; }}\n")
        if cxx.clang and not header_file(directory, cxx).exists():
            return False
        done = subprocess.run(
            [cxx.command, *use_flags(directory, cxx), *cflags, "-fsyntax-only", "-H", str(probe)],
            capture_output=True,
            text=True,
            check=False,
        )
    if cxx.clang:
        # -H lists the headers read from source; with the header in use, torch's are not among them.
        return done.returncode == 0 and "torch/csrc/api/include/torch/all.h" not in done.stderr
    return done.returncode == 0 and bool(re.search(r"^! .*extension\.h\.gch$", done.stderr, re.MULTILINE))


def build(
    extra_cflags: tuple[str, ...] = PCH_FLAGS, root: Path | None = None, with_cuda: bool = False, cxx: Compiler | None = None
) -> Path:
    """Build and check the header once; concurrent callers wait for the first."""
    cxx = cxx or identify(with_cuda)
    directory = header_dir(extra_cflags, root, with_cuda, cxx)
    (directory / "torch").mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (directory / "ok").exists():
            return directory
        cflags = header_cflags(extra_cflags, with_cuda)
        real = Path(cpp_extension.include_paths()[0]) / _HEADER
        target = header_file(directory, cxx)
        partial = target.with_suffix(target.suffix + ".partial")
        started = time.perf_counter()
        command = [cxx.command, *cflags, *header_options(cxx), "-x", "c++-header", str(real), "-o", str(partial)]
        subprocess.run(command, check=True, capture_output=True)
        partial.replace(target)
        # The same header beside it: a second `#include <torch/extension.h>` in the candidate finds
        # this path again, and `#pragma once` knows the file.
        link = directory / _HEADER
        link.unlink(missing_ok=True)
        link.symlink_to(real)
        if not _uses_header(directory, cflags, cxx):
            target.unlink()
            raise RuntimeError(f"{cxx.command} built {target} but does not use it; C++ extensions compile without it")
        (directory / "ok").write_text(f"{time.perf_counter() - started:.1f} s\n{cxx.describe()}\n{shlex.join(command)}\n")
    return directory


def flavours() -> list[bool]:
    """The headers this machine needs: the CPU one, and the CUDA one where torch builds CUDA extensions."""
    return [False, True] if torch.version.cuda and cpp_extension.CUDA_HOME is not None else [False]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when a header is missing, build nothing")
    args = parser.parse_args(argv)
    missing = 0
    for cuda in flavours():
        kind = "CUDA builds' main.cpp" if cuda else "C++ builds"
        cxx = identify(cuda)
        if not cuda and not cxx.clang and "CXX" not in os.environ:
            clang = find_clang()
            if clang is None:
                print(
                    f"clang++ with OpenMP (libomp) not found ({', '.join(CLANG_NAMES)}): "
                    f"C++ builds use {cxx.describe()} and its header (only slower)"
                )
            elif os.environ.get("REFINERY_COMPILER") != "clang":
                print(f"C++ builds use {cxx.describe()}, the default; REFINERY_COMPILER=clang builds with {clang} instead")
        kind = f"{kind}, {cxx.describe()}"
        flags = example_cflags(cuda)
        ready = _ready.__wrapped__(cuda, None, cxx.command)
        if ready is not None:
            print(f"precompiled torch/extension.h for {kind}: {ready}")
            continue
        if args.check:
            print(f"no precompiled torch/extension.h for {kind}; build it with: {sys.executable} -m kernel_refinery.tools.steps.pch")
            missing += 1
            continue
        print(
            f"building the precompiled torch/extension.h for {kind} ({' '.join(flags) or 'no extra flags'}; under a minute, once)...",
            flush=True,
        )
        try:
            directory = build(flags, with_cuda=cuda, cxx=cxx)
        except (RuntimeError, subprocess.CalledProcessError, OSError) as exc:
            # Extensions still compile without it: setup goes on.
            print(f"no precompiled header for {kind}: {exc}", file=sys.stderr)
            continue
        print(f"precompiled torch/extension.h for {kind}: {directory} ({(directory / 'ok').read_text().splitlines()[0]})")
    return 1 if missing else 0


if __name__ == "__main__":
    raise SystemExit(main())
