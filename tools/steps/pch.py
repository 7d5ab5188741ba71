"""A precompiled `torch/extension.h` for the C++ file of an extension, for the compiler of the run.

Parsing that header is most of a one-function CPU extension's compile on a 2-core machine. Two
compilers are served, the one a run asks for (EvalConfig.compiler; tools/steps/compilers.py picks it
from the job's config, the same way in every process):

- **clang++** (`clang++-19`, else `clang++`, on PATH), with eval.compiler=clang: the header is built
  with `-fpch-instantiate-templates`, so the templates the header's own inline functions use are
  instantiated once, in the header, instead of in every build (GCC cannot do that). Clang reads a
  precompiled header only when told (`-include-pch`), and refuses with an error one built with
  other language, target or optimisation options (its equivalent of `-Werror=invalid-pch`); the
  compile cache tells it only when a build's extra_cflags are exactly the header's.
  Clang's OpenMP code calls LLVM's runtime (libomp, `__kmpc_*`); `-fopenmp=libgomp`, which would
  link torch's GNU libgomp instead, makes clang ignore every `#pragma omp` (no `_OPENMP`, one
  thread), so a clang build links libomp beside torch's libgomp (tests/test_clang.py shows both at
  work in one process with correct results).
- **GCC** (`c++`, or CXX), the default: GCC uses
  `DIR/torch/extension.h.gch` in place of the header when `DIR` comes first in the include path
  and the header's options match the extension's, and otherwise parses the header as usual.

A CUDA build's `main.cpp` (the bindings beside the nvcc file) stays with `CXX`/`c++` (GCC), which
is also nvcc's host compiler; it has a header of its own (CUDA's include path, the candidate's
extra_cflags, usually none), built where CUDA is.

The header is built once per machine, for the flags of the one-shot examples (which the models
mostly copy) and for each compiler a run may ask for here (the default's, and clang's where it is
installed), by `make setup` or `python -m kernel_refinery.tools.steps.pch`, under a lock, and never
during an evaluation. Its directory's name hashes the compiler (path and `--version`), torch's version, the
build's options and the header's own build options, so another compiler or other flags find no
header and one is built for them. The compile cache's key includes the compiler
(`compilers.identify()`), and results name it (CompileReport.compiler).

    python -m kernel_refinery.tools.steps.pch            # build (clang: about 20 s and 0.2 GB; GCC: about 65 s and 0.8 GB)
    python -m kernel_refinery.tools.steps.pch --check    # exit 1 when it is missing
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import hashlib
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.utils.cpp_extension as cpp_extension

from kernel_refinery.core.errors import ConfigError
from kernel_refinery.tools.config import default_compiler, default_pch_dir
from kernel_refinery.tools.steps.compilers import CLANG_NAMES, Compiler, find_clang, identify, identify_command

PCH_FLAGS = ("-O3", "-fopenmp")
"""The extra_cflags of prompts/examples/sigmoid_cpp.py: the header is valid for extensions built with these."""

PCH_FLAGS_CUDA: tuple[str, ...] = ()
"""The extra_cflags of prompts/examples/sigmoid_cuda.py (none: its options go to nvcc)."""

CLANG_HEADER_OPTIONS = ("-fpch-instantiate-templates",)
"""How clang builds the header: the header's templates instantiated once, in the header.
(`-fpch-codegen` would also emit the header's functions once, in an object of their own; clang 19
rejects a structured binding in torch's nn/modules/conv.h when compiling that object.)"""

_HEADER = "torch/extension.h"


def example_cflags(cuda: bool) -> tuple[str, ...]:
    """The extra_cflags a header is built for: the CPU example's, or the CUDA example's."""
    return PCH_FLAGS_CUDA if cuda else PCH_FLAGS


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
    cxx = identify_command(command)
    directory = header_dir(example_cflags(cuda), root, with_cuda=cuda, cxx=cxx)
    return directory if (directory / "ok").exists() else None


def ready_header_dir(cuda: bool = False, root: Path | None = None, command: str | None = None) -> Path | None:
    """The header directory for a CPU (or a CUDA) build's C++ file with this compiler (by default
    the one `auto` picks), when its header was built and checked; else None (asked once per process
    and compiler)."""
    return _ready(cuda, root, command or identify(cuda).command)


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


def compilers_to_serve(cuda: bool) -> list[Compiler]:
    """The compilers a header is built for: the default choice's (REFINERY_COMPILER, else `auto`),
    and for C++ builds clang's too where it is installed, one setting away (eval.compiler=clang)."""
    try:
        served = [identify(cuda, "auto" if cuda else default_compiler())]
    except ConfigError as exc:  # REFINERY_COMPILER names a compiler that is not here, or none
        print(f"{exc}; the header is built for {identify(cuda).describe()}", file=sys.stderr)
        served = [identify(cuda)]
    clang = None if cuda else find_clang()
    if clang is not None and all(not c.clang for c in served):
        served.append(identify_command(clang))
    return served


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when a header is missing, build nothing")
    args = parser.parse_args(argv)
    missing = 0
    for cuda, cxx in [(flavour, cxx) for flavour in flavours() for cxx in compilers_to_serve(flavour)]:
        kind = "CUDA builds' main.cpp" if cuda else "C++ builds"
        if not cuda and not cxx.clang:
            clang = find_clang()
            if clang is None:
                print(
                    f"clang++ with OpenMP (libomp) not found ({', '.join(CLANG_NAMES)}): "
                    f"C++ builds use {cxx.describe()} and its header (only slower)"
                )
            else:
                print(f"C++ builds use {cxx.describe()}, the default; --set eval.compiler=clang builds with {clang} instead")
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
