"""A precompiled `torch/extension.h` for the C++ file of an extension: parsing that header is about
half of a one-function CPU extension's compile on a 2-core machine (20.9 s plain, 10.9 s with it),
and all of a CUDA build's `main.cpp` (the bindings beside the nvcc file).

GCC uses `DIR/torch/extension.h.gch` in place of the header when `DIR` comes first in the include
path and the header's compile options match the extension's; otherwise it parses the header as
usual, so a candidate with other flags compiles as before, only slower. The header is built once,
for the flags of the one-shot examples (which the models mostly copy), by `make setup` or
`python -m tools.pch`, under a lock, and never during an evaluation. A CUDA build compiles its
`main.cpp` with other options (CUDA's include path, the candidate's extra_cflags, usually none),
so it has a header of its own, built where CUDA is (`python -m tools.pch` builds both there).
The compile cache's key does not change: the header changes how long a build takes, not what it
builds.

    python -m tools.pch            # build (about 65 s and 0.8 GB), or say it is there
    python -m tools.pch --check    # exit 1 when it is missing
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import hashlib
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.utils.cpp_extension as cpp_extension

from tools.config import default_pch_dir

PCH_FLAGS = ("-O3", "-fopenmp")
"""The extra_cflags of prompts/examples/sigmoid_cpp.py: the header is valid for extensions built with these."""

PCH_FLAGS_CUDA: tuple[str, ...] = ()
"""The extra_cflags of prompts/examples/sigmoid_cuda.py (none: its options go to nvcc)."""

_HEADER = "torch/extension.h"


def example_cflags(cuda: bool) -> tuple[str, ...]:
    """The extra_cflags a header is built for: the CPU example's, or the CUDA example's."""
    return PCH_FLAGS_CUDA if cuda else PCH_FLAGS


def compiler() -> str:
    """The C++ compiler torch builds extensions with (CXX, else c++)."""
    return os.environ.get("CXX", "c++")


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


def header_dir(extra_cflags: tuple[str, ...] = PCH_FLAGS, root: Path | None = None, with_cuda: bool = False) -> Path:
    """Where the header for these options lives; the name hashes the compiler, torch and the options."""
    version = subprocess.run([compiler(), "--version"], capture_output=True, text=True, check=False).stdout
    key = "\n".join([version, torch.__version__, *header_cflags(extra_cflags, with_cuda)])
    return (root or default_root()) / hashlib.sha256(key.encode()).hexdigest()[:16]


@functools.cache
def ready_header_dir(cuda: bool = False, root: Path | None = None) -> Path | None:
    """The include directory to put first for a CPU (or a CUDA) build's C++ file, when its header
    was built and checked; else None (asked once per process)."""
    if cuda and cpp_extension.CUDA_HOME is None:
        return None
    directory = header_dir(example_cflags(cuda), root, with_cuda=cuda)
    return directory if (directory / "ok").exists() else None


def _uses_header(directory: Path, cflags: list[str]) -> bool:
    """Whether GCC takes the precompiled header for a source that includes torch/extension.h."""
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.cpp"
        probe.write_text(f"#include <{_HEADER}>\n#include <{_HEADER}>\nint probe() {{ return 0; }}\n")
        done = subprocess.run(
            [compiler(), "-I", str(directory), *cflags, "-fsyntax-only", "-H", str(probe)],
            capture_output=True,
            text=True,
            check=False,
        )
    return done.returncode == 0 and bool(re.search(r"^! .*extension\.h\.gch$", done.stderr, re.MULTILINE))


def build(extra_cflags: tuple[str, ...] = PCH_FLAGS, root: Path | None = None, with_cuda: bool = False) -> Path:
    """Build and check the header once; concurrent callers wait for the first."""
    directory = header_dir(extra_cflags, root, with_cuda)
    (directory / "torch").mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (directory / "ok").exists():
            return directory
        cflags = header_cflags(extra_cflags, with_cuda)
        real = Path(cpp_extension.include_paths()[0]) / _HEADER
        gch = directory / "torch" / "extension.h.gch"
        partial = gch.with_suffix(".gch.partial")
        started = time.perf_counter()
        subprocess.run([compiler(), *cflags, "-x", "c++-header", str(real), "-o", str(partial)], check=True, capture_output=True)
        partial.replace(gch)
        # The same header beside it: a second `#include <torch/extension.h>` in the candidate finds
        # this path again, and `#pragma once` knows the file.
        link = directory / _HEADER
        link.unlink(missing_ok=True)
        link.symlink_to(real)
        if not _uses_header(directory, cflags):
            gch.unlink()
            raise RuntimeError(f"{compiler()} built {gch} but does not use it; C++ extensions compile without it")
        (directory / "ok").write_text(f"{time.perf_counter() - started:.1f} s\n")
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
        flags = example_cflags(cuda)
        ready = ready_header_dir.__wrapped__(cuda)
        if ready is not None:
            print(f"precompiled torch/extension.h for {kind}: {ready}")
            continue
        if args.check:
            print(f"no precompiled torch/extension.h for {kind}; build it with: {sys.executable} -m tools.pch")
            missing += 1
            continue
        print(
            f"building the precompiled torch/extension.h for {kind} ({' '.join(flags) or 'no extra flags'}; about a minute, once)...",
            flush=True,
        )
        try:
            directory = build(flags, with_cuda=cuda)
        except (RuntimeError, subprocess.CalledProcessError, OSError) as exc:
            # Extensions still compile without it: setup goes on.
            print(f"no precompiled header for {kind}: {exc}", file=sys.stderr)
            continue
        print(f"precompiled torch/extension.h for {kind}: {directory} ({(directory / 'ok').read_text().strip()})")
    return 1 if missing else 0


if __name__ == "__main__":
    raise SystemExit(main())
