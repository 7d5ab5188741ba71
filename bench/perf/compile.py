"""What a one-function extension costs to compile: C++ with and without the precompiled
torch/extension.h (tools/pch.py), side by side; CUDA (nvcc) per object file.

    python -m bench.perf.compile [--rounds 2] [--json PATH]
    python -m bench.perf.compile --device cuda [--rounds 2] [--json PATH]

CPU: each round builds the one-shot example's kernel (prompts/examples/sigmoid_cpp.py) twice
through the worker's compile cache, in a fresh build cache and with a new comment so nothing is
reused: once with the precompiled header hidden, once with it, in alternating order. The header
itself is built first if it is missing (once per machine, as `make setup` does).

Each round also compiles, with the header, a source that holds nothing but `#include
<torch/extension.h>`: what every C++ extension pays before its own code (the floor).

CUDA: each round builds the CUDA example (prompts/examples/sigmoid_cuda.py) the same way; the
wall time, and from ninja's log how long the host C++ file (main.cpp, torch/extension.h and the
Python bindings) and the nvcc file (cuda.cu) took. Ninja builds the two in parallel, so the
slower one is the wall time's floor.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from unittest import mock

from rich.console import Console
from rich.table import Table

from tools import compile_cache, pch

EXAMPLES = Path(__file__).resolve().parents[2] / "prompts" / "examples"
EXAMPLE = EXAMPLES / "sigmoid_cpp.py"
CUDA_EXAMPLE = EXAMPLES / "sigmoid_cuda.py"
TARGET = 1 / 3


def example_source(path: Path = EXAMPLE) -> str:
    """The first raw string of a one-shot example: the source its module passes to load_inline."""
    text = path.read_text()
    start = text.index('r"""') + 4
    return text[start : text.index('"""', start)]


def build_once(with_header: bool) -> float:
    source = f"// {uuid.uuid4()}\n{example_source()}"
    with tempfile.TemporaryDirectory(prefix="refinery-compile-") as root:
        cache = compile_cache.CompileCache(Path(root))
        header = contextlib.nullcontext() if with_header else mock.patch.object(compile_cache, "ready_header_dir", lambda cuda: None)
        started = time.perf_counter()
        with header:
            cache.load_inline(
                "sigmoid_module", source, functions=["sigmoid_forward"], extra_cflags=list(pch.PCH_FLAGS), extra_ldflags=["-fopenmp"]
            )
        return time.perf_counter() - started


def header_alone_once() -> float:
    """Seconds to compile a source holding only the header, with the precompiled header, as
    load_inline would (the same compiler and options); nothing is linked."""
    directory = pch.ready_header_dir()
    assert directory is not None, "build the precompiled header first"
    with tempfile.TemporaryDirectory(prefix="refinery-compile-") as root:
        source = Path(root) / "main.cpp"
        source.write_text(f"// {uuid.uuid4()}\n#include <torch/extension.h>\n")
        command = [pch.compiler(), "-I", str(directory), *pch.header_cflags(), "-c", str(source), "-o", str(Path(root) / "main.o")]
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        return time.perf_counter() - started


def ninja_seconds(build_dir: Path) -> dict[str, float]:
    """Seconds per output in ninja's log (`.ninja_log`: start ms, end ms, mtime, output, hash)."""
    seconds: dict[str, float] = {}
    log = build_dir / ".ninja_log"
    for line in log.read_text().splitlines()[1:] if log.exists() else []:
        start, end, _, output, *_ = line.split("\t")
        # The module's name changes every round; its line is the link.
        seconds["link (.so)" if output.endswith(".so") else output] = (int(end) - int(start)) / 1000
    return seconds


def build_cuda_once() -> tuple[float, dict[str, float]]:
    source = f"// {uuid.uuid4()}\n{example_source(CUDA_EXAMPLE)}"
    with tempfile.TemporaryDirectory(prefix="refinery-compile-") as root:
        cache = compile_cache.CompileCache(Path(root))
        started = time.perf_counter()
        cache.load_inline(
            "sigmoid_module",
            "torch::Tensor sigmoid_forward(torch::Tensor input);",
            source,
            functions=["sigmoid_forward"],
            extra_cuda_cflags=["-O3"],
        )
        wall = time.perf_counter() - started
        (build_dir,) = (Path(root) / "extensions").iterdir()
        return wall, ninja_seconds(build_dir)


def cuda_main(rounds: int, json_path: Path | None, console: Console) -> None:
    import torch

    walls: list[float] = []
    parts: dict[str, list[float]] = {}
    for round_ in range(rounds):
        wall, seconds = build_cuda_once()
        walls.append(wall)
        for output, value in seconds.items():
            parts.setdefault(output, []).append(value)
        console.print(f"round {round_ + 1}: {wall:.1f} s ({', '.join(f'{k} {v:.1f} s' for k, v in seconds.items())})")
    table = Table(title=f"one-function CUDA extension (the sigmoid example), median of {rounds} rounds")
    table.add_column("step")
    table.add_column("seconds", justify="right")
    table.add_row("wall (load_inline)", f"{statistics.median(walls):.1f}")
    for output, values in sorted(parts.items()):
        table.add_row(output, f"{statistics.median(values):.1f}")
    console.print(table)
    console.print(f"on {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}, {os.cpu_count()} cores")
    if json_path:
        json_path.write_text(json.dumps({"device": "cuda", "wall": walls, "parts": parts}, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    console = Console()
    if args.device == "cuda":
        cuda_main(args.rounds, args.json, console)
        return
    if pch.ready_header_dir() is None:
        console.print("building the precompiled header first (once per machine)...")
        pch.build()
        pch.ready_header_dir.cache_clear()
    seconds: dict[str, list[float]] = {"plain": [], "precompiled header": [], "header alone": []}
    for round_ in range(args.rounds):
        order = (False, True) if round_ % 2 == 0 else (True, False)
        for with_header in order:
            which = "precompiled header" if with_header else "plain"
            seconds[which].append(build_once(with_header))
            console.print(f"round {round_ + 1} {which}: {seconds[which][-1]:.1f} s")
        seconds["header alone"].append(header_alone_once())
        console.print(f"round {round_ + 1} header alone: {seconds['header alone'][-1]:.1f} s")
    plain = statistics.median(seconds["plain"])
    fast = statistics.median(seconds["precompiled header"])
    floor = statistics.median(seconds["header alone"])
    table = Table(title=f"one-function C++ extension (the sigmoid example), median of {args.rounds} rounds")
    table.add_column("build")
    table.add_column("seconds", justify="right")
    table.add_row("plain", f"{plain:.1f}")
    table.add_row("precompiled torch/extension.h", f"{fast:.1f}")
    table.add_row("ratio", f"{fast / plain:.2f}x")
    table.add_row("a source with only the header (compile, no link)", f"{floor:.1f} ({floor / plain:.2f}x)")
    console.print(table)
    verdict = "within" if fast / plain <= TARGET else "above"
    console.print(f"compile with the header: {fast / plain:.2f}x plain ({verdict} the 1/3 target)")
    if args.json:
        args.json.write_text(json.dumps({"seconds": seconds, "ratio": fast / plain, "header_alone_ratio": floor / plain}, indent=2) + "\n")


if __name__ == "__main__":
    main()
