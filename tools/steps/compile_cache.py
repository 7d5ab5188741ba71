"""A content-keyed build cache around torch's `load_inline`, installed in the worker.

The key covers the sources, the flags, the compiler (its binary and version), the torch version
and the device architecture, so a second evaluation of the same kernel reuses the built module and
never calls the compiler. Each built module is wrapped so the evaluator can tell whether `forward`
really called it.

The compiler is the one the job's config asks for (EvalConfig.compiler, handed to `begin`;
tools/steps/compilers.py finds it): torch reads CXX when it writes a build, so each build runs with
CXX set to it. A C++ build whose extra_cflags are exactly the header's gets the precompiled
torch/extension.h.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.utils.cpp_extension as cpp_extension

from kernel_refinery.tools.config import CompilerChoice
from kernel_refinery.tools.steps import pch
from kernel_refinery.tools.steps.compilers import Compiler, identify
from kernel_refinery.tools.steps.pch import ready_header_dir

_ORIGINAL_LOAD_INLINE = cpp_extension.load_inline

_GCC_ERROR = re.compile(r"^(?P<file>[^\s:]+\.(?:cpp|cu|h|cuh)):(?P<line>\d+):(?:(?P<col>\d+):)?\s*(?P<kind>(?:fatal )?error):(?P<msg>.*)$")
_NVCC_ERROR = re.compile(r"^(?P<file>[^\s(]+\.(?:cpp|cu|h|cuh))\((?P<line>\d+)\):\s*(?P<kind>error)\s*:?(?P<msg>.*)$")


_HARDCODED_MODULE = re.compile(r"PYBIND11_MODULE\(\s*(?!TORCH_EXTENSION_NAME)\w+")


class CompileFailed(RuntimeError):
    """The compiler rejected a candidate's kernel; `log` is trimmed for the model."""

    def __init__(self, log: str):
        super().__init__(log)
        self.log = log


@dataclass
class CompileLedger:
    """What the cache did while one candidate was loaded."""

    hits: int = 0
    misses: int = 0
    seconds: float = 0.0
    calls: dict[str, int] = field(default_factory=dict)
    compiler: str | None = None
    """The compiler its extensions were built with (Compiler.describe()), once one was loaded."""

    @property
    def kernel_calls(self) -> int:
        return sum(self.calls.values())


def profiler_range(name: str) -> Any:
    """A named profiler range with little overhead of its own (about 10 us against record_function's
    100 on a small CPU): the kernel share charges a range's own time to the candidate."""
    fast = getattr(torch._C._profiler, "_RecordFunctionFast", None)
    return fast(name) if fast is not None else torch.profiler.record_function(name)


class CountingModule(types.ModuleType):
    """A built extension whose functions count their calls; everything else passes through.

    It is a module, and its type is named `module`, so a candidate's mistakes read as they would
    without the wrapper (e.g. "'module' object is not callable").
    """

    def __init__(self, module: Any, ledger: CompileLedger):
        super().__init__(getattr(module, "__name__", "extension"), getattr(module, "__doc__", None))
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_ledger", ledger)
        object.__setattr__(self, "_wrapped", {})

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._module, name)
        if not callable(attr) or name.startswith("__"):
            return attr
        if name not in self._wrapped:
            ledger, qualified = self._ledger, f"{getattr(self._module, '__name__', '?')}.{name}"

            def counted(*args: Any, **kwargs: Any) -> Any:
                ledger.calls[qualified] = ledger.calls.get(qualified, 0) + 1
                if not torch.autograd._profiler_enabled():
                    return attr(*args, **kwargs)
                # Named in the profiler's table: pybind functions are not dispatcher ops.
                with profiler_range(f"kernel::{name}"):
                    return attr(*args, **kwargs)

            counted.__name__ = name
            counted.__doc__ = getattr(attr, "__doc__", None)
            self._wrapped[name] = counted
        return self._wrapped[name]

    def __dir__(self) -> list[str]:
        return dir(self._module)


CountingModule.__name__ = CountingModule.__qualname__ = "module"


def device_arch() -> str:
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"sm_{major}{minor}"
    return "cpu"


def cache_key(payload: dict[str, Any]) -> str:
    blob = json.dumps({**payload, "torch": torch.__version__, "arch": device_arch()}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def locate(haystack: str, snippet: str) -> int | None:
    """1-based line in `haystack` where `snippet` starts, matching its first non-blank line."""
    first = next((line.strip() for line in snippet.splitlines() if line.strip()), None)
    if first is None:
        return None
    offset_in_snippet = next(i for i, line in enumerate(snippet.splitlines()) if line.strip() == first)
    for number, line in enumerate(haystack.splitlines(), start=1):
        if line.strip() == first:
            return number - offset_in_snippet
    return None


def trim_compiler_log(raw: str, line_maps: dict[str, tuple[int, int | None]], max_errors: int = 5) -> str:
    """The first errors with their source lines, mapped back to the candidate's own lines.

    `line_maps` gives, per generated file name (main.cpp, cuda.cu), how many lines the build
    prepended and where that source starts in the candidate file.
    """
    lines = raw.splitlines()
    picked: list[str] = []
    errors = 0
    for i, line in enumerate(lines):
        match = _GCC_ERROR.match(line.strip()) or _NVCC_ERROR.match(line.strip())
        if match is None:
            continue
        errors += 1
        if errors > max_errors:
            break
        fname = Path(match["file"]).name
        lineno = int(match["line"])
        where = f"{fname}:{lineno}"
        prepended, start = line_maps.get(fname, (0, None))
        if start is not None and lineno > prepended:
            where = f"line {start + lineno - prepended - 1} of the candidate ({fname}:{lineno})"
        picked.append(f"{where}: {match['kind']}:{match['msg']}")
        # gcc follows an error with the offending source line and a caret.
        for context in lines[i + 1 : i + 3]:
            if _GCC_ERROR.match(context.strip()) or _NVCC_ERROR.match(context.strip()) or "In function" in context:
                break
            picked.append("    " + context.rstrip())
    if not picked:
        useful = [ln for ln in lines if ln.strip() and not ln.startswith("[")]
        return "\n".join(useful[-30:])[-4000:]
    if errors > max_errors:
        picked.append("(more errors follow; fix these first)")
    return "\n".join(picked)[:6000]


@contextmanager
def _build_lock(build_dir: Path) -> Iterator[None]:
    """One builder per build directory, under a lock the kernel drops when its holder dies.

    torch guards a build with a `lock` file (FileBaton) that stays behind when the building
    worker is SIGKILLed (by the OOM killer, an operator, a hang's timeout), and every later build
    of that extension then waits on it forever. Whoever holds this flock is the only builder, so a
    `lock` file found while holding it belongs to a dead one and is removed.
    """
    with open(build_dir / ".refinery-build.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            (build_dir / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def with_precompiled_header(kwargs: dict[str, Any], cuda: bool, cxx: Compiler | None = None) -> dict[str, Any]:
    """The precompiled torch/extension.h for this build, when it was built (tools/steps/pch.py); after the
    key is taken, since it changes how long a build takes, not what it builds.

    GCC: its directory first in the include path; GCC takes the `.gch` only where the build's
    options match and otherwise parses the header (a CUDA build's header serves its main.cpp; nvcc
    reads no precompiled header and finds the real one). Clang: `-include-pch`, only for a build
    with the header's extra_cflags (pch.clang_takes) that includes the header itself."""
    cxx = cxx or identify(cuda)
    directory = ready_header_dir(cuda, command=cxx.command)
    if directory is None:
        return kwargs
    if not cxx.clang:
        return {**kwargs, "extra_include_paths": [str(directory), *_as_list(kwargs.get("extra_include_paths"))]}
    flags = _as_list(kwargs.get("extra_cflags"))
    if not pch.clang_takes(flags, cuda) or kwargs.get("no_implicit_headers"):
        return kwargs
    return {**kwargs, "extra_cflags": [*flags, *pch.use_flags(directory, cxx)]}


def with_openmp_link(kwargs: dict[str, Any], cxx: Compiler) -> dict[str, Any]:
    """Clang's OpenMP code calls libomp, which only a link with -fopenmp brings: GCC's calls into
    libgomp find torch's copy when the flag is left off the link, clang's would not load."""
    if not cxx.clang or "-fopenmp" not in _as_list(kwargs.get("extra_cflags")):
        return kwargs
    ldflags = _as_list(kwargs.get("extra_ldflags"))
    return kwargs if "-fopenmp" in ldflags else {**kwargs, "extra_ldflags": [*ldflags, "-fopenmp"]}


_HEADER_REFUSED = re.compile(r"PCH file|precompiled header")


@contextmanager
def _cxx(command: str) -> Iterator[None]:
    """CXX set for torch while it writes and runs a build, as it was afterwards."""
    before = os.environ.get("CXX")
    os.environ["CXX"] = command
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CXX", None)
        else:
            os.environ["CXX"] = before


def _build(name: str, cpp: list[str], cuda: list[str], build_dir: Path, options: dict[str, Any]) -> Any:
    return _ORIGINAL_LOAD_INLINE(name, list(cpp), list(cuda) or None, build_directory=str(build_dir), verbose=False, **options)


class CompileCache:
    """Replaces `load_inline` in the worker with a cached, counting version."""

    def __init__(self, root: Path, candidate_source: str = "", compiler: CompilerChoice = "auto"):
        self.root = root
        self.candidate_source = candidate_source
        self.choice: CompilerChoice = compiler
        """The C++ compiler asked for (EvalConfig.compiler): the job's, from `begin`."""
        self.ledger = CompileLedger()
        self._ledgers: dict[str, CompileLedger] = {}

    @property
    def compiler(self) -> str:
        """The C++ compiler a CPU build uses, for results (e.g. "clang++-19 19.1.7 (clang)")."""
        return identify(choice=self.choice).describe()

    def begin(self, candidate_source: str, compiler: CompilerChoice | None = None) -> CompileLedger:
        """The ledger of this candidate source: one per source, since an imported module (and the
        counting wrappers inside it) is reused when the same source is evaluated on another task.
        `compiler`: the job's EvalConfig.compiler, which its builds use."""
        self.candidate_source = candidate_source
        if compiler is not None:
            self.choice = compiler
        key = hashlib.sha256(candidate_source.encode()).hexdigest()
        self.ledger = self._ledgers.setdefault(key, CompileLedger())
        return self.ledger

    def install(self) -> None:
        cpp_extension.load_inline = self.load_inline

    def install_triton_counter(self) -> bool:
        """Count launches of @triton.jit kernels into the candidate's ledger, as for built modules."""
        try:
            from triton.runtime.jit import JITFunction
        except ImportError:
            return False
        original = JITFunction.run
        cache = self

        def counted_run(fn_self: Any, *args: Any, **kwargs: Any) -> Any:
            name = f"triton::{getattr(fn_self.fn, '__name__', '?')}"
            calls = cache.ledger.calls
            calls[name] = calls.get(name, 0) + 1
            if not torch.autograd._profiler_enabled():
                return original(fn_self, *args, **kwargs)
            # Named in the profiler, so its launches count as the candidate's own (kernel share).
            with profiler_range(name):
                return original(fn_self, *args, **kwargs)

        # Needed where triton is installed; unused where it is not (then JITFunction is Any).
        JITFunction.run = counted_run  # type: ignore[method-assign, unused-ignore]  # patched on purpose: counts launches
        return True

    def load_inline(self, name: str, cpp_sources: Any, cuda_sources: Any = None, *args: Any, **kwargs: Any) -> Any:
        if args:
            raise TypeError("pass load_inline's options by keyword (functions=..., extra_cflags=...)")
        cpp = _as_list(cpp_sources)
        cuda = _as_list(cuda_sources)
        flags = {k: kwargs.get(k) for k in sorted(kwargs) if k not in ("verbose", "build_directory")}
        cxx = identify(bool(cuda), self.choice)
        self.ledger.compiler = cxx.describe()
        key = cache_key({"name": name, "cpp": cpp, "cuda": cuda, "flags": flags, "compiler": cxx.key()})
        # A unique module name per key keeps torch's in-process versioning (name_v1, ...) out of
        # the way, so a fresh worker finds the same .so; only a hard-coded module name keeps its own.
        if not _HARDCODED_MODULE.search("\n".join(cpp)):
            name = f"{name}_{key[:12]}"
        build_dir = self.root / "extensions" / name
        build_dir.mkdir(parents=True, exist_ok=True)
        hit = (build_dir / f"{name}.so").exists()
        failed_log = build_dir / "compile_error.log"
        if failed_log.exists():
            # The same sources and flags failed before; the compiler would say the same again.
            self.ledger.hits += 1
            raise CompileFailed(failed_log.read_text())
        kwargs.pop("verbose", None)
        kwargs.pop("build_directory", None)
        kwargs = with_openmp_link(kwargs, cxx)
        headed = with_precompiled_header(kwargs, cuda=bool(cuda), cxx=cxx)
        started = time.perf_counter()
        try:
            with _build_lock(build_dir), _cxx(cxx.command):
                try:
                    module = _build(name, cpp, cuda, build_dir, headed)
                except RuntimeError as exc:
                    # A header clang refuses (torch's files changed under it): once more without it.
                    if headed is kwargs or not cxx.clang or not _HEADER_REFUSED.search(str(exc)):
                        raise
                    module = _build(name, cpp, cuda, build_dir, kwargs)
        except RuntimeError as exc:
            text = str(exc)
            if "Error building extension" not in text:
                raise
            header = 0 if kwargs.get("no_implicit_headers") else 1
            maps = {
                "main.cpp": (header, locate(self.candidate_source, "\n".join(cpp))),
                "cuda.cu": (3 * header, locate(self.candidate_source, "\n".join(cuda)) if cuda else None),
            }
            trimmed = trim_compiler_log(text, maps)
            failed_log.write_text(trimmed)
            raise CompileFailed(trimmed) from None
        finally:
            self.ledger.seconds += time.perf_counter() - started
        if hit:
            self.ledger.hits += 1
        else:
            self.ledger.misses += 1
        return CountingModule(module, self.ledger)
