"""What a one-function C++ extension costs to compile, with and without the precompiled
torch/extension.h (tools/pch.py), measured side by side.

    python -m bench.perf.compile [--rounds 2] [--json PATH]

Each round builds the one-shot example's kernel (prompts/examples/sigmoid_cpp.py) twice through
the worker's compile cache, in a fresh build cache and with a new comment so nothing is reused:
once with the precompiled header hidden, once with it, in alternating order. The header itself
is built first if it is missing (once per machine, as `make setup` does).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from unittest import mock

from rich.console import Console
from rich.table import Table

from tools import compile_cache, pch

EXAMPLE = Path(__file__).resolve().parents[2] / "prompts" / "examples" / "sigmoid_cpp.py"
TARGET = 1 / 3


def example_source() -> str:
    """The C++ source of the one-shot example (the raw string its module passes to load_inline)."""
    text = EXAMPLE.read_text()
    start = text.index('r"""') + 4
    return text[start : text.index('"""', start)]


def build_once(with_header: bool) -> float:
    source = f"// {uuid.uuid4()}\n{example_source()}"
    with tempfile.TemporaryDirectory(prefix="refinery-compile-") as root:
        cache = compile_cache.CompileCache(Path(root))
        header = contextlib.nullcontext() if with_header else mock.patch.object(compile_cache, "ready_header_dir", lambda: None)
        started = time.perf_counter()
        with header:
            cache.load_inline(
                "sigmoid_module", source, functions=["sigmoid_forward"], extra_cflags=list(pch.PCH_FLAGS), extra_ldflags=["-fopenmp"]
            )
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    console = Console()
    if pch.ready_header_dir() is None:
        console.print("building the precompiled header first (once per machine)...")
        pch.build()
        pch.ready_header_dir.cache_clear()
    seconds: dict[str, list[float]] = {"plain": [], "precompiled header": []}
    for round_ in range(args.rounds):
        order = (False, True) if round_ % 2 == 0 else (True, False)
        for with_header in order:
            which = "precompiled header" if with_header else "plain"
            seconds[which].append(build_once(with_header))
            console.print(f"round {round_ + 1} {which}: {seconds[which][-1]:.1f} s")
    plain = statistics.median(seconds["plain"])
    fast = statistics.median(seconds["precompiled header"])
    table = Table(title=f"one-function C++ extension (the sigmoid example), median of {args.rounds} rounds")
    table.add_column("build")
    table.add_column("seconds", justify="right")
    table.add_row("plain", f"{plain:.1f}")
    table.add_row("precompiled torch/extension.h", f"{fast:.1f}")
    table.add_row("ratio", f"{fast / plain:.2f}x")
    console.print(table)
    verdict = "within" if fast / plain <= TARGET else "above"
    console.print(f"compile with the header: {fast / plain:.2f}x plain ({verdict} the 1/3 target)")
    if args.json:
        args.json.write_text(json.dumps({"seconds": seconds, "ratio": fast / plain}, indent=2) + "\n")


if __name__ == "__main__":
    main()
