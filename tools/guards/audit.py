"""The candidate's process, second line of defence: name the global settings a candidate changed,
and make reaching into the harness from Python harder.

Neither part is a wall, and the verdict does not rest on them: the static check
(tools/guards/static_check.py) refuses these things in the source before it runs, the runner confines
writes with Landlock (tools/processes/confine.py), and nothing a verdict depends on lives in this process.
Both parts are speed bumps: cheap, silent for honest candidates (load_inline runs ninja and the
compilers, Triton runs ptxas), and loud for the plain forms of tampering, which are then named
instead of quietly working.

snapshot() / changed()
    Every setting that changes speed or numerics (threads, backend flags, matmul precision,
    determinism, default dtype and device, grad and inference mode, autocast, torch function and
    dispatch modes, denormal flushing, the environment, the switch interval, gc, CPU affinity and
    priority; on an initialised GPU its current device and stream) and which object every name of
    torch, torch.nn.functional, torch.cuda, torch.Tensor, torch.nn.Module, os, time, builtins and
    of the harness (every `tools.*` module, and its classes) stands for. changed() names what
    differs: "torch.get_num_threads(): 2 -> 1", "torch.relu replaced". The snapshot keeps the
    objects and compares them with `is`: id() raises the audit event builtins.id, so thousands of
    id() calls under the hook would cost milliseconds, and a stored id could be reused by a new
    object once the original is freed. Reading CUDA state never initialises CUDA. Not changes:
    names that appeared (lazy imports add some), and what torch rebinds itself: importing
    torch._dynamo (the profiler does) wraps torch.manual_seed and sets TORCHINDUCTOR_CACHE_DIR,
    and CUDA's initialisation rebinds torch.cuda.default_generators.
    Cost, snapshot() + changed(): 0.2 ms with torch alone, 0.35 ms with the whole harness loaded
    (1300 modules) on this 2-core machine; 0.8 ms on an H200 machine with CUDA initialised.

install_hook() / arm()
    A PEP 578 audit hook, installed once before the candidate is imported, then armed (one-way;
    the armed flag lives in an object only the interpreter's hook list holds, and gc's object
    walks are refused once armed). Armed, it raises PermissionError("refused by the evaluator:
    ...") for:
      - frames of the harness (files under tools/): sys._getframe returning one, frame.f_code,
        tb.tb_frame, gen.gi_frame, coro.cr_frame reaching one; sys._current_frames and
        sys._current_exceptions outright;
      - gc.get_objects / get_referrers / get_referents, sys.settrace / sys.setprofile (also set by
        C code through PyEval_SetProfile), sys.addaudithook (CPython then drops the new hook
        without an error);
      - new threads, subprocesses and signals: every executable but the compilers (see
        DEFAULT_COMPILERS), and those only from folders the candidate cannot write; os.system,
        os.exec*, os.fork, os.forkpty, os.killpg, signal.pthread_kill; os.kill of anything but
        a child of this process;
      - ctypes: every ctypes.* event except dlopen of a built .so in a writable folder (which is
        how torch.ops.load_library loads a load_inline(is_python_module=False) extension), and a
        fresh import of ctypes / _ctypes;
      - writes (open for writing, mkdir, remove, rmdir, rename, link, symlink, chmod, chown,
        truncate, shutil.rmtree) outside the writable folders, or into the harness's, Python's or
        the site-packages folders even where those lie inside one. Reading stays allowed.
    The introspection refusals (frames, gc, trace/profile hooks) do not apply to the harness's own
    code: for those the hook walks up from the event, over standard-library frames (traceback,
    inspect, logging), to the first other frame, and allows the event when that frame runs code
    of a harness module loaded at arm() (matched by code object, so code compiled under a
    harness file name does not pass). That is how the runner can still format a candidate's
    traceback, which reads tb_frame and f_code of its own frames.

Events as seen on CPython 3.11.7 (tests/test_audit.py checks the refusals):
    sys._getframe(1), inspect.currentframe()   "sys._getframe" (argument: the frame returned)
    inspect.stack(), traceback.extract_stack() "sys._getframe", then "object.__getattr__"
                                               (frame, "f_code") for every frame they describe
    frame.f_back, f_globals, f_locals, f_lineno, f_builtins: no event
    tb.tb_frame, gen.gi_frame, gen.gi_code, coro.cr_frame, func.__code__: "object.__getattr__"
    sys._current_frames(), sys._current_exceptions(): events of the same names
    sys.settrace, sys.setprofile: events of the same names (threading.settrace: none)
    gc.get_objects / get_referrers / get_referents: events of the same names (gc.disable: none)
    threading.Thread.start, _thread.start_new_thread: no event before 3.13 (handled below)
    subprocess.run: "subprocess.Popen" (executable, args, cwd, env); shell=True shows /bin/sh
    os.system, os.exec*, os.fork, os.posix_spawn(p) ("os.posix_spawn"), os.kill: events
    _posixsubprocess.fork_exec called directly: no event (handled below)
    ctypes.CDLL: "ctypes.dlopen"; attribute lookup of a C function: "ctypes.dlsym";
    ctypes.addressof, from_address, string_at: events; ctypes.cast, CFUNCTYPE(address)(...),
    calling a C function, pointer dereference: no event (handled below)
    import of a module not yet loaded: "import"; torch imports ctypes, gc and inspect itself,
    so `import ctypes` in a candidate raises no event: the ctypes.* events are what count
    open(), os.open, Path.write_text: "open" (path, mode or None for os.open, flags)
    id(): "builtins.id"

Where 3.11 raises no event, arm() replaces the function instead, under every module-level name
that holds it (subprocess keeps its own _fork_exec, threading its _start_new_thread, ctypes._endian
and pynvml their memmove and cast): _thread.start_new_thread with a refusal;
_posixsubprocess.fork_exec with a wrapper that asks the hook (through a private audit event, so
the wrapper holds no reference to the original) to check the executables and then run it; and
ctypes.cast, memmove, memset and the raw function addresses behind them with refusals. arm()
takes about 13 ms with the harness loaded (most of it that scan).

Allowed, and why:
    - subprocesses of DEFAULT_COMPILERS: load_inline runs `c++ --version`, `c++ -dumpfullversion`,
      `ninja --version`, `ninja -v` (seen here), nvcc runs its own tools as its children; Triton
      runs ptxas, `ldconfig -p` and `file` (platform.architecture(), for its cache key) and builds
      its launcher with gcc or cc (seen on an H200 machine). Each must lie outside
      the writable folders (or under Python's prefix), so a candidate cannot drop its own `gcc`
      there or point PATH at one.
    - writes under the writable folders: the work folder (the candidate file), the build cache
      (build.ninja, main.cpp, lock files), the Triton cache, /tmp (tempfile, the PCH flags probe),
      /dev/shm, and /dev/null (subprocess's DEVNULL opens it read-write). Writes through file
      descriptors that are already open (int paths: os.fdopen, os.ftruncate) are not judged.
    - ctypes.dlopen of a .so inside a writable folder: torch.ops.load_library.
    - standard-library and site-packages code calling sys._getframe (logging, typing, torch.jit,
      warnings' pure-Python fallback): only the frame returned is judged, not who asked.
    - os.putenv and friends: allowed, but changed() names every change to os.environ.
    - torch.cuda initialisation starts no Python thread and runs no subprocess; load_inline uses
      no thread, no ctypes and no frame introspection (seen with a real build here, and with a
      CUDA build and a Triton kernel on an H200 under Python 3.12). Nothing in the harness starts
      a thread after arm(): start the runner's own threads before it.
    - not allowed, and harmless: torch.cuda.device_count() first asks NVML through
      ctypes.CDLL("libnvidia-ml.so.1"); refused (an OSError), torch falls back to the CUDA
      runtime's count. The runner initialises CUDA before arm() anyway.

Known gaps (why this is a second line): frame.f_back, f_globals and f_locals raise no event, so a
candidate that walks up blindly from its own frame reaches the harness's locals; code whose file
name claims the standard library counts as such; C callables (functools.partial(gc.get_objects))
handed to the harness as callbacks run with the harness's trust; a computed address still makes
a ctypes function; an allowed compiler can be told to run anything (gcc -wrapper). Not tried:
torch.compile in a candidate, whose compile workers are threads and Python subprocesses unless
TORCHINDUCTOR_COMPILE_THREADS=1. Refused although torch has uses for them: torch.cuda's pluggable
allocators and NVRTC helpers (ctypes). And the candidate's own C++ can do anything the process can.
"""

from __future__ import annotations

import builtins
import gc
import operator
import os
import shutil
import sys
import sysconfig
import tempfile
import time
import types
from collections.abc import Callable, Iterable, Iterator
from itertools import repeat
from pathlib import Path, PosixPath, PurePosixPath
from typing import Any, NoReturn

import torch
import torch.nn.functional as F
from torch import nn

REFUSED = "refused by the evaluator"
TOOLS_DIR = Path(__file__).resolve().parents[1]
"""The evaluator's code (tools/), by its real path: in a checkout kernel_refinery/tools links to it."""
HARNESS_DIRS = (TOOLS_DIR, Path(__file__).parents[2].resolve())
"""Whose frames a candidate may not reach: the evaluator, and the package root with core/ (its vocabulary)."""

_TOOL_NAMES = ("g++", "gcc", "c++", "cc", "clang", "clang++")
DEFAULT_COMPILERS: frozenset[str] = frozenset(
    {
        "ninja",
        *_TOOL_NAMES,
        *(f"{name}-{version}" for name in _TOOL_NAMES for version in range(7, 25)),
        *(f"{arch}-linux-gnu-{name}" for arch in ("x86_64", "aarch64") for name in ("g++", "gcc", "c++")),
        *(f"{arch}-linux-gnu-{name}-{v}" for arch in ("x86_64", "aarch64") for name in ("g++", "gcc") for v in range(7, 25)),
        "ld",
        "ld.bfd",
        "ld.gold",
        "ld.lld",
        "as",
        "ar",
        "nvcc",
        "ptxas",
        "cicc",
        "fatbinary",
        "nvlink",
        "cudafe++",
        "cuobjdump",
        "nvdisasm",
        "which",
        "uname",
        "ldconfig",
        "ldconfig.real",
        "file",
    }
)
"""Basenames of the executables a build may start: load_inline's ninja and C++ compilers (also
versioned and target-prefixed names, for CXX=g++-12 or clang++-19), CUDA's tools, and what
Triton runs (ptxas, gcc/cc for its launcher, ldconfig -p to find libcuda, and `file`, which
platform.architecture() runs for Triton's cache key: refused, it would key differently)."""

_ARM_EVENT = "refinery.audit.arm"
_FORK_EXEC_EVENT = "refinery.audit.fork_exec"

# ---------------------------------------------------------------------------------------------
# snapshot / changed

_PLAIN = (bool, int, float, str, type(None), tuple)
_TINY = sys.float_info.min
_DENORMAL = 5e-324
_HALF = 0.5
_ONE = 1.0


def _flush_denormal() -> str:
    """torch.set_flush_denormal sets FTZ and DAZ in this thread's MXCSR; torch has no getter, but
    they act on Python's own float arithmetic too (a denormal result, or input, becomes 0)."""
    ftz = _TINY * _HALF == 0.0
    daz = _DENORMAL * _ONE == 0.0
    return {(False, False): "off", (True, True): "on"}.get((ftz, daz), f"ftz={ftz} daz={daz}")


def _reader(owner: object, name: str, *args: object) -> Callable[[], object] | None:
    """A getter captured now (a candidate replacing it later changes nothing here), or None when
    this torch lacks it or it fails."""
    fn = getattr(owner, name, None)
    if not callable(fn):
        return None
    read: Callable[[], object] = (lambda: fn(*args)) if args else fn
    try:
        read()
    except Exception:  # noqa: BLE001 - a getter this build of torch cannot answer is left out
        return None
    return read


_C: Any = torch._C
_FP32_PRECISION = (("generic", "all"), ("cuda", "matmul"), ("cudnn", "conv"), ("cudnn", "rnn"), ("mkldnn", "matmul"), ("mkldnn", "conv"))
_SETTING_SOURCES: tuple[tuple[str, object, str, tuple[object, ...]], ...] = (
    ("torch.get_num_threads()", torch, "get_num_threads", ()),
    ("torch.get_num_interop_threads()", torch, "get_num_interop_threads", ()),
    ("torch.get_float32_matmul_precision()", _C, "_get_float32_matmul_precision", ()),
    ("torch.are_deterministic_algorithms_enabled()", _C, "_get_deterministic_algorithms", ()),
    ("torch.is_deterministic_algorithms_warn_only_enabled()", _C, "_get_deterministic_algorithms_warn_only", ()),
    ("torch.utils.deterministic.fill_uninitialized_memory", _C, "_get_deterministic_fill_uninitialized_memory", ()),
    ("torch.get_default_dtype()", torch, "get_default_dtype", ()),
    ("torch.get_default_device()", _C, "_get_default_device", ()),
    ("torch.is_grad_enabled()", torch, "is_grad_enabled", ()),
    ("torch.is_inference_mode_enabled()", torch, "is_inference_mode_enabled", ()),
    ("torch.is_anomaly_enabled()", torch, "is_anomaly_enabled", ()),
    ("autocast enabled on some device", _C, "_is_any_autocast_enabled", ()),
    ("torch.autograd profiler enabled", getattr(_C, "_autograd", None), "_profiler_enabled", ()),
    ("torch function modes on the stack", _C, "_len_torch_function_stack", ()),
    ("torch dispatch modes on the stack", _C, "_len_torch_dispatch_stack", ()),
    ("__torch_function__ enabled", _C, "_is_torch_function_enabled", ()),
    ("torch.backends.cudnn.enabled", _C, "_get_cudnn_enabled", ()),
    ("torch.backends.cudnn.benchmark", _C, "_get_cudnn_benchmark", ()),
    ("torch.backends.cudnn.deterministic", _C, "_get_cudnn_deterministic", ()),
    ("torch.backends.cudnn.allow_tf32", _C, "_get_cudnn_allow_tf32", ()),
    ("torch.backends.cuda.matmul.allow_tf32", _C, "_get_cublas_allow_tf32", ()),
    ("torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction", _C, "_get_cublas_allow_fp16_reduced_precision_reduction", ()),
    ("torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction", _C, "_get_cublas_allow_bf16_reduced_precision_reduction", ()),
    ("torch.backends.cuda.matmul.allow_fp16_accumulation", _C, "_get_cublas_allow_fp16_accumulation", ()),
    ("torch.backends.cuda.preferred_blas_library()", _C, "_get_blas_preferred_backend", ()),
    ("torch.backends.cuda.preferred_linalg_library()", _C, "_get_linalg_preferred_backend", ()),
    ("torch.backends.cuda.flash_sdp_enabled()", _C, "_get_flash_sdp_enabled", ()),
    ("torch.backends.cuda.mem_efficient_sdp_enabled()", _C, "_get_mem_efficient_sdp_enabled", ()),
    ("torch.backends.cuda.math_sdp_enabled()", _C, "_get_math_sdp_enabled", ()),
    ("torch.backends.cuda.cudnn_sdp_enabled()", _C, "_get_cudnn_sdp_enabled", ()),
    ("torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()", _C, "_get_math_sdp_allow_fp16_bf16_reduction", ()),
    ("torch.backends.cuda SM carveout", _C, "_get_sm_carveout_experimental", ()),
    ("torch.backends.mkldnn.enabled", _C, "_get_mkldnn_enabled", ()),
    ("torch.backends.mkldnn.deterministic", _C, "_get_mkldnn_deterministic", ()),
    ("torch.backends.mkldnn.allow_tf32", _C, "_get_onednn_allow_tf32", ()),
    ("torch.backends.nnpack.enabled", _C, "_get_nnpack_enabled", ()),
    ("torch.backends.cpu fp16 reduced-precision reduction", _C, "_get_cpu_allow_fp16_reduced_precision_reduction", ()),
    ("torch.backends.quantized.engine", _C, "_get_qengine", ()),
    ("torch.backends.mha.get_fastpath_enabled()", torch.backends.mha, "get_fastpath_enabled", ()),
    *(
        (f"torch.backends.{backend}.{op}.fp32_precision".replace(".generic.all", ""), _C, "_get_fp32_precision_getter", (backend, op))
        for backend, op in _FP32_PRECISION
    ),
)

_OPT_EINSUM: Any = torch.backends.opt_einsum
_SETTINGS: tuple[tuple[str, Callable[[], object]], ...] = (
    *((label, r) for label, owner, name, args in _SETTING_SOURCES if (r := _reader(owner, name, *args)) is not None),
    ("torch.backends.opt_einsum.enabled", lambda: _OPT_EINSUM.enabled),
    ("torch.backends.opt_einsum.strategy", lambda: _OPT_EINSUM.strategy),
    ("denormal flushing (torch.set_flush_denormal)", _flush_denormal),
    ("sys.getswitchinterval()", sys.getswitchinterval),
    ("gc.isenabled()", gc.isenabled),
    ("gc.get_threshold()", gc.get_threshold),
    ("sys.gettrace() is set", lambda: sys.gettrace() is not None),
    ("sys.getprofile() is set", lambda: sys.getprofile() is not None),
)
if hasattr(os, "sched_getaffinity"):
    _SETTINGS += (("os.sched_getaffinity(0)", lambda: tuple(sorted(os.sched_getaffinity(0)))),)
if hasattr(os, "getpriority"):
    _SETTINGS += (("os.getpriority(PRIO_PROCESS, 0)", lambda: os.getpriority(os.PRIO_PROCESS, 0)),)

_cuda_current_stream = torch.cuda.current_stream
_CUDA_SETTINGS: tuple[tuple[str, Callable[[], object]], ...] = (
    ("torch.cuda.current_device()", torch.cuda.current_device),
    ("torch.cuda.current_stream()", lambda: _cuda_current_stream().cuda_stream),
    ("torch.cuda.get_sync_debug_mode()", torch.cuda.get_sync_debug_mode),
    *(
        (("torch.backends.cudnn.benchmark_limit", _C._cuda_get_cudnn_benchmark_limit),)
        if hasattr(_C, "_cuda_get_cudnn_benchmark_limit")
        else ()
    ),
)
"""Read only once CUDA is initialised: reading them earlier would initialise it."""
_cuda_is_initialized = torch.cuda.is_initialized

_ENVIRON = os.environ
_MODULE_DICT: Any = vars(types.ModuleType)["__dict__"]
_CLASS_DICT: Any = vars(type)["__dict__"]
_MRO: Any = vars(type)["__mro__"]
"""The raw namespaces, read past any __getattr__ or __dict__ a candidate could give a module or class."""

_WATCHED_MODULES: tuple[tuple[str, types.ModuleType, bool], ...] = (
    ("torch", torch, False),
    ("torch.nn.functional", F, False),
    ("torch.cuda", torch.cuda, False),
    ("os", os, False),
    ("time", time, False),
    ("builtins", builtins, True),
)
"""(name, module, callables only): every public name, or (builtins) every callable one."""
_WATCHED_CLASSES: tuple[tuple[str, type], ...] = (
    ("torch.Tensor", torch.Tensor),
    ("torch.nn.Module", nn.Module),
    ("torch.cuda.Event", torch.cuda.Event),
)
_WATCHED_IN_SYS_MODULES = ("torch", "torch.nn", "torch.nn.functional", "torch.cuda", "os", "time", "builtins", "sys")
_LAZY_NAMES = frozenset({"default_generators"})
"""Public names torch rebinds itself: torch.cuda.default_generators, when CUDA initialises."""
_CLASS_VOLATILE = frozenset({"__doc__", "__module__", "__dict__", "__weakref__", "__annotations__", "__abstractmethods__", "_abc_impl"})


_ABSENT = object()
_FUNCTION_DICT: Any = vars(types.FunctionType)["__dict__"]
_TORCH_COMPILE_PY = os.path.join(os.path.dirname(os.path.realpath(torch.__file__)), "_compile.py")
_DESCRIPTORS = (
    classmethod,
    staticmethod,
    property,
    types.GetSetDescriptorType,
    types.MemberDescriptorType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.ClassMethodDescriptorType,
)


def _torch_lazy_wrapper(new: object, old: object) -> bool:
    """Importing torch._dynamo (the profiler and torch.compile do, lazily) replaces torch.manual_seed
    with a _disable_dynamo wrapper of the same function: torch's doing, not the candidate's."""
    if type(new) is not types.FunctionType:
        return False
    return _FUNCTION_DICT.__get__(new).get("__wrapped__") is old and new.__code__.co_filename == _TORCH_COMPILE_PY


class _Identities:
    """Which object each name of one namespace stood for: the objects themselves, compared with
    `is`, never `==` (a replacement could define __eq__) and never by id() (see the module
    docstring). Only type() and callable() look at the objects, so no candidate code runs here."""

    __slots__ = ("label", "names", "objects")

    def __init__(self, label: str, names: tuple[str, ...], objects: tuple[object, ...]) -> None:
        self.label, self.names, self.objects = label, names, objects

    def same_as(self, other: _Identities) -> bool:
        return self.names == other.names and all(map(operator.is_, self.objects, other.objects))

    def changes(self, after: _Identities) -> Iterator[str]:
        now = dict(zip(after.names, after.objects, strict=True))
        for name, obj in zip(self.names, self.objects, strict=True):
            current = now.get(name, _ABSENT)
            if current is obj:
                continue
            if current is _ABSENT:
                yield f"{self.label}{name} removed"
            elif obj is not _ABSENT and not _torch_lazy_wrapper(current, obj):
                yield f"{self.label}{name} replaced"

    def __repr__(self) -> str:
        return f"<{self.label}*: {len(self.names)} names>"


_chosen: dict[str, tuple[object, int, tuple[str, ...]]] = {}
"""Per namespace: its owner, its size, and the names chosen from it then. The choice runs again
only when the size changes; in between the same names are looked up (in C), so a name deleted
and another added shows as removed, and a replaced one as replaced."""


def _identities(label: str, owner: object, namespace: Any, choose: Callable[[str, object], bool]) -> _Identities:
    size = len(namespace)
    cached = _chosen.get(label)
    if cached is None or cached[0] is not owner or cached[1] != size:
        names = tuple(name for name, value in list(namespace.items()) if type(name) is str and choose(name, value))
        cached = _chosen[label] = (owner, size, names)
    names = cached[2]
    return _Identities(f"{label}.", names, tuple(map(namespace.get, names, repeat(_ABSENT))))


def _public(name: str, value: object) -> bool:
    return name[:1] != "_" and name not in _LAZY_NAMES


def _callable(name: str, value: object) -> bool:
    return callable(value)


def _member(name: str, value: object) -> bool:
    return name not in _CLASS_VOLATILE and not name.startswith("__pydantic") and (callable(value) or type(value) in _DESCRIPTORS)


def _class_identities(label: str, cls: type, inherited: bool) -> _Identities:
    """The class's own functions and descriptors, and (inherited) its bases' but object's, as its
    MRO resolves them."""
    if not inherited:
        return _identities(label, cls, _CLASS_DICT.__get__(cls), _member)
    resolved: dict[str, object] = {}
    for base in reversed(_MRO.__get__(cls)):
        if base is not object:
            resolved.update(_CLASS_DICT.__get__(base))
    return _identities(label, cls, resolved, _member)


_harness_names: list[Any] = [-1, ()]
"""sys.modules' length and the harness's module names then: a new scan only when modules came or went."""


def _harness_modules() -> list[tuple[str, types.ModuleType]]:
    """The harness's modules: kernel_refinery.*, and __main__ when it is a file under tools/."""
    modules = sys.modules
    if _harness_names[0] != len(modules):
        names = []
        for name, module in list(modules.items()):
            if type(name) is not str or not issubclass(type(module), types.ModuleType):
                continue
            if (
                name == "kernel_refinery"
                or name.startswith("kernel_refinery.")
                or (name == "__main__" and _in_tools(_MODULE_DICT.__get__(module).get("__file__")))
            ):
                names.append(name)
        _harness_names[:] = [len(modules), tuple(names)]
    found = []
    for name in _harness_names[1]:
        loaded: Any = modules.get(name)
        if issubclass(type(loaded), types.ModuleType):
            found.append((name, loaded))
    return found


_harness_classes: dict[str, tuple[object, int, tuple[str, ...]]] = {}
"""Per harness module: its namespace, that namespace's size, and the names of the classes it
defines. A class rebound under the same name is still seen: the module's own names say so."""


def _classes_defined(name: str, namespace: dict[str, object]) -> tuple[str, ...]:
    cached = _harness_classes.get(name)
    if cached is not None and cached[0] is namespace and cached[1] == len(namespace):
        return cached[2]
    classes = tuple(
        attr
        for attr, value in list(namespace.items())
        # Classes defined here (not imported), read past any metaclass.
        if type(attr) is str and issubclass(type(value), type) and _CLASS_DICT.__get__(value).get("__module__") == name
    )
    _harness_classes[name] = (namespace, len(namespace), classes)
    return classes


def _in_tools(path: object) -> bool:
    return type(path) is str and os.path.realpath(path).startswith(str(TOOLS_DIR) + os.sep)


def snapshot() -> dict[str, object]:
    """The global settings and which object each name of torch, the standard library's time, os
    and builtins, and the harness stands for, as they are now. A fraction of a millisecond (see
    the module docstring); never initialises CUDA."""
    state: dict[str, object] = {}
    readers = _SETTINGS + _CUDA_SETTINGS if _cuda_is_initialized() else _SETTINGS
    for label, read in readers:
        try:
            value = read()
        except Exception as exc:  # noqa: BLE001 - an unreadable setting is recorded as such
            value = f"<unreadable: {type(exc).__name__}>"
        state[label] = value if type(value) in _PLAIN else str(value)
    state["os.environ"] = tuple(sorted(_ENVIRON.items()))
    for label, module, callables_only in _WATCHED_MODULES:
        state[f"names of {label}"] = _identities(label, module, _MODULE_DICT.__get__(module), _callable if callables_only else _public)
    for label, cls in _WATCHED_CLASSES:
        state[f"names of {label}"] = _class_identities(label, cls, inherited=True)
    harness = _harness_modules()
    for name, module in harness:
        namespace = _MODULE_DICT.__get__(module)
        state[f"names of {name}"] = _identities(name, module, namespace, _callable)
        for attr in _classes_defined(name, namespace):
            value = namespace.get(attr)
            if issubclass(type(value), type):
                state[f"names of {name}.{attr}"] = _class_identities(f"{name}.{attr}", value, inherited=False)
    modules = sys.modules
    watched = [*_WATCHED_IN_SYS_MODULES, *(name for name, _ in harness)]
    present = tuple(name for name in watched if name in modules)
    state["sys.modules"] = _Identities("sys.modules", tuple(f"[{name!r}]" for name in present), tuple(map(modules.get, present)))
    return state


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_LAZY_ENVIRON = frozenset({"TORCHINDUCTOR_CACHE_DIR"})
"""Set by torch itself when torch._dynamo is first imported (by the profiler, say)."""


def _environ_changes(before: object, after: object) -> Iterator[str]:
    old = dict(before) if isinstance(before, tuple) else {}
    new = dict(after) if isinstance(after, tuple) else {}
    for key in sorted(old.keys() | new.keys()):
        if key not in new:
            yield f"os.environ[{key!r}] removed"
        elif key not in old:
            if key not in _LAZY_ENVIRON:
                yield f"os.environ[{key!r}] set to {_short(new[key])}"
        elif old[key] != new[key]:
            yield f"os.environ[{key!r}]: {_short(old[key])} -> {_short(new[key])}"


def changed(before: dict[str, object], after: dict[str, object]) -> list[str]:
    """What differs between two snapshots, one human-readable line each, sorted. Names (and
    harness modules) that appeared are not changes: a lazy import adds some. Replaced or removed
    ones are; a removed harness module or class shows as its own name removed."""
    lines: list[str] = []
    missing = object()
    for key in before.keys() | after.keys():
        old, new = before.get(key, missing), after.get(key, missing)
        if type(old) is _Identities or type(new) is _Identities:
            if type(old) is _Identities and type(new) is _Identities and not old.same_as(new):
                lines.extend(old.changes(new))
        elif key == "os.environ":
            if old != new:
                lines.extend(_environ_changes(old, new))
        elif old is missing or new is missing:
            continue  # read on one side only: CUDA's, initialised in between
        elif type(old) is not type(new) or old != new:
            lines.append(f"{key}: {_short(old)} -> {_short(new)}")
    return sorted(lines)


# ---------------------------------------------------------------------------------------------
# the audit hook

_installed = False
"""Only so that a second install_hook() says so; the hook's own state is not here."""

_STDLIB, _PROTECTED, _OTHER, _LIBRARY = 0, 1, 2, 3
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATHLIB_TYPES = (Path, PosixPath, PurePosixPath)
_FRAME_ATTRS = frozenset({"f_code", "tb_frame", "gi_frame", "cr_frame", "ag_frame"})
_CTYPES_MODULES = frozenset({"ctypes", "_ctypes"})
_CTYPES_UNAUDITED = ("cast", "_cast", "memmove", "memset")
"""ctypes functions that reach memory without an audit event (string_at and the like raise one)."""
_CTYPES_ADDRESSES = ("_memmove_addr", "_memset_addr", "_cast_addr", "_string_at_addr", "_wstring_at_addr")
"""The raw addresses ctypes builds those functions from, with CFUNCTYPE(...)(address): no event either."""
_PATH_EVENTS: dict[str, tuple[tuple[int, int | None], ...]] = {
    # event: (index of a path argument, index of its dir_fd argument or None), as 3.11 passes them
    "os.mkdir": ((0, 2),),
    "os.remove": ((0, 1),),
    "os.rmdir": ((0, 1),),
    "os.rename": ((0, 2), (1, 3)),
    "os.link": ((0, 2), (1, 3)),
    "os.symlink": ((1, 2),),
    "os.chmod": ((0, 2),),
    "os.chown": ((0, 3),),
    "os.truncate": ((0, None),),
    "shutil.rmtree": ((0, 1),),
}


def default_writable_dirs() -> tuple[str, ...]:
    """The work folder, the temporary folders and the torch and Triton build caches."""
    home = os.path.expanduser("~")
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    torch_builds = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(cache, "torch_extensions")
    triton = os.environ.get("TRITON_CACHE_DIR") or os.path.join(home, ".triton")
    return (os.getcwd(), tempfile.gettempdir(), "/dev/shm", torch_builds, triton)


def _real(path: str | os.PathLike[str]) -> str:
    return os.path.realpath(os.fspath(path))


def _inside(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root + os.sep) for root in roots)


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    roots |= {p for p in sys.path if "site-packages" in p or "dist-packages" in p}
    roots |= {sys.prefix, sys.base_prefix, sys.exec_prefix}
    return tuple(sorted({_real(r) for r in roots if r and _real(r) != os.sep}))


def _stdlib_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(sorted({_real(paths[key]) for key in ("stdlib", "platstdlib") if key in paths}))


def _refusal(what: str, advice: str) -> Callable[..., NoReturn]:
    def refused(*args: object, **kwargs: object) -> NoReturn:
        raise PermissionError(f"{REFUSED}: {what}; {advice}")

    refused.__name__ = refused.__qualname__ = what.rsplit(".", 1)[-1]
    return refused


def _replace_everywhere(replaced: list[tuple[object, object]]) -> None:
    """Rebind every module-level name bound to one of the originals to its replacement."""
    if not replaced:
        return
    by_id = {id(original): (original, replacement) for original, replacement in replaced}
    kinds = {type(original) for original, _ in replaced}
    for module in list(sys.modules.values()):
        if not issubclass(type(module), types.ModuleType):
            continue
        namespace = _MODULE_DICT.__get__(module)
        for name, value in list(namespace.items()):
            if type(value) in kinds:
                hit = by_id.get(id(value))
                if hit is not None and hit[0] is value:
                    namespace[name] = hit[1]


def _fork_exec(*args: Any) -> Any:
    """Stands in for _posixsubprocess.fork_exec once armed: the hook checks the executables and
    runs the original, which only it holds."""
    box: list[Any] = []
    sys.audit(_FORK_EXEC_EVENT, box, args)
    if not box:
        raise PermissionError(f"{REFUSED}: _posixsubprocess.fork_exec (no audit hook ran it)")
    return box[0]


def _code_objects(modules: Iterable[types.ModuleType], protected: tuple[str, ...]) -> dict[int, types.CodeType]:
    """Every code object of these modules' functions, methods and the functions nested in them,
    that comes from a file under the protected folders (not what a module imported from torch)."""
    codes: dict[int, types.CodeType] = {}
    files: dict[str, bool] = {}
    seen: set[int] = set()

    def add_code(code: types.CodeType) -> None:
        filename = code.co_filename
        if filename not in files:
            files[filename] = os.path.isabs(filename) and _inside(os.path.realpath(filename), protected)
        if files[filename] and id(code) not in codes:
            codes[id(code)] = code
            for const in code.co_consts:
                if isinstance(const, types.CodeType):
                    add_code(const)

    def add(value: object, depth: int) -> None:
        if id(value) in seen or depth > 4:
            return
        seen.add(id(value))
        if isinstance(value, (classmethod, staticmethod)):
            add(value.__func__, depth + 1)
        elif isinstance(value, property):
            for fn in (value.fget, value.fset, value.fdel):
                add(fn, depth + 1)
        elif isinstance(value, types.FunctionType):
            add_code(value.__code__)
            add(value.__dict__.get("__wrapped__"), depth + 1)
        elif isinstance(value, type):
            for member in list(_CLASS_DICT.__get__(value).values()):
                add(member, depth + 1)
        elif callable(value) and "__wrapped__" in getattr(value, "__dict__", {}):
            add(value.__dict__["__wrapped__"], depth + 1)

    for module in modules:
        namespace = _MODULE_DICT.__get__(module)
        for value in list(namespace.values()):
            if isinstance(value, type) and _CLASS_DICT.__get__(value).get("__module__") != namespace.get("__name__"):
                continue  # an imported class is its own module's business
            add(value, 0)
    return codes


class _Guard:
    """The hook. Only the interpreter's list of audit hooks holds it: a candidate has no name
    for it, and gc's walks that could find it are refused once it is armed."""

    def __init__(self, allowed: frozenset[str] | None, writable: tuple[str, ...], protected: tuple[str, ...]) -> None:
        self.allowed = allowed
        self.writable = writable
        self.read_only = tuple(sorted(set(protected) | set(_library_roots())))
        self.protected = protected
        self.stdlib = _stdlib_roots()
        self.armed = False
        self.busy: set[int] = set()
        self.kinds: dict[str, int] = {}
        self.harness: frozenset[int] = frozenset()
        self.harness_codes: tuple[types.CodeType, ...] = ()
        self.fork_exec: Callable[..., Any] | None = None
        self.get_ident = sys.modules["_thread"].get_ident
        self.handlers: dict[str, Callable[[str, tuple[Any, ...]], Callable[[], None] | None]] = {
            "sys._getframe": self.on_getframe,
            "object.__getattr__": self.on_getattr,
            "sys._current_frames": self.on_introspection,
            "sys._current_exceptions": self.on_introspection,
            "gc.get_objects": self.on_introspection,
            "gc.get_referrers": self.on_introspection,
            "gc.get_referents": self.on_introspection,
            "sys.settrace": self.on_introspection,
            "sys.setprofile": self.on_introspection,
            "sys.addaudithook": self.on_refused,
            "subprocess.Popen": self.on_popen,
            "os.posix_spawn": self.on_posix_spawn,
            "os.system": self.on_refused,
            "os.exec": self.on_refused,
            "os.fork": self.on_refused,
            "os.forkpty": self.on_refused,
            "os.killpg": self.on_refused,
            "signal.pthread_kill": self.on_refused,
            "_thread.start_new_thread": self.on_refused,
            "os.kill": self.on_kill,
            _FORK_EXEC_EVENT: self.on_fork_exec,
            "import": self.on_import,
            "open": self.on_open,
            **dict.fromkeys(_PATH_EVENTS, self.on_path_event),
            **dict.fromkeys(
                (
                    "ctypes.dlsym",
                    "ctypes.dlsym/handle",
                    "ctypes.addressof",
                    "ctypes.call_function",
                    "ctypes.cdata",
                    "ctypes.cdata/buffer",
                    "ctypes.create_string_buffer",
                    "ctypes.create_unicode_buffer",
                    "ctypes.get_errno",
                    "ctypes.set_errno",
                    "ctypes.get_last_error",
                    "ctypes.set_last_error",
                    "ctypes.string_at",
                    "ctypes.wstring_at",
                    "ctypes.PyObj_FromPtr",
                    "ctypes.set_exception",
                    "ctypes.seh_exception",
                ),
                self.on_refused,
            ),
            "ctypes.dlopen": self.on_dlopen,
        }

    # -- dispatch --------------------------------------------------------------------------

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.armed:
            if event == _ARM_EVENT:
                self._arm()
            return
        handler = self.handlers.get(event)
        if handler is None:
            return
        me = self.get_ident()
        if me in self.busy:
            return  # the hook's own frame and attribute reads raise events too
        self.busy.add(me)
        try:
            then = handler(event, args)
        finally:
            self.busy.discard(me)
        if then is not None:
            then()

    def _arm(self) -> None:
        codes = _code_objects((module for _, module in _harness_modules()), self.protected)
        self.harness, self.harness_codes = frozenset(codes), tuple(codes.values())
        import _thread

        # Where 3.11 raises no event, the function itself goes: in every module that holds it
        # (subprocess keeps its own _fork_exec, threading its _start_new_thread, ctypes._endian
        # and pynvml their memmove and cast), so no other name still reaches the original.
        replaced: list[tuple[object, object]] = []
        no_threads = _refusal(
            "_thread.start_new_thread",
            "the candidate's process runs on one Python thread; do the work on the calling thread or in your kernel",
        )
        for name in ("start_new_thread", "start_joinable_thread"):
            if name in _MODULE_DICT.__get__(_thread):
                replaced.append((_MODULE_DICT.__get__(_thread)[name], no_threads))
        posixsubprocess = sys.modules.get("_posixsubprocess")
        if posixsubprocess is not None:
            self.fork_exec = _MODULE_DICT.__get__(posixsubprocess)["fork_exec"]
            replaced.append((self.fork_exec, _fork_exec))
        memory = "raw memory access is not allowed; do it in your kernel"
        ctypes_module = sys.modules.get("ctypes")
        if ctypes_module is not None:
            namespace = _MODULE_DICT.__get__(ctypes_module)
            replaced += [(namespace[a], _refusal(f"ctypes.{a.strip('_')}", memory)) for a in _CTYPES_UNAUDITED if a in namespace]
        _replace_everywhere(replaced)
        for name in ("ctypes", "_ctypes"):
            module = sys.modules.get(name)
            for attr in _CTYPES_ADDRESSES if module is not None else ():
                if attr in _MODULE_DICT.__get__(module):
                    setattr(module, attr, _refusal(f"ctypes.{attr.strip('_')}", memory))
        self.armed = True

    # -- who asks, and what they reach ------------------------------------------------------

    def _kind(self, filename: str) -> int:
        kind = self.kinds.get(filename)
        if kind is None:
            if filename.startswith("<frozen "):
                kind = _STDLIB
            elif not os.path.isabs(filename):
                kind = _OTHER
            else:
                real = os.path.realpath(filename)
                if _inside(real, self.protected):
                    kind = _PROTECTED
                elif _inside(real, self.stdlib) and "-packages" + os.sep not in real:
                    kind = _STDLIB
                elif "-packages" + os.sep in real:
                    kind = _LIBRARY
                else:
                    kind = _OTHER
            if len(self.kinds) > 4096:
                self.kinds.clear()
            self.kinds[filename] = kind
        return kind

    def _harness_asks(self, skip: int) -> bool:
        """Whether the nearest frame above the event (`skip` frames of the hook's own above this
        one) that is not the standard library's (traceback, inspect or logging doing the reading
        for someone) runs harness code."""
        try:
            frame: Any = sys._getframe(skip + 1)
        except ValueError:
            return False  # raised with no Python frame above: nobody of the harness asked
        while frame is not None:
            code = frame.f_code
            if id(code) in self.harness:
                return True
            if self._kind(code.co_filename) != _STDLIB:
                return False
            frame = frame.f_back
        return False

    def _reaches_harness(self, event: str, frame: Any) -> None:
        if frame is None or self._kind(frame.f_code.co_filename) != _PROTECTED:
            return
        if self._harness_asks(skip=3):  # this method, the handler, __call__
            return
        where = os.path.relpath(frame.f_code.co_filename, TOOLS_DIR.parent)
        raise PermissionError(
            f"{REFUSED}: {event} reached a frame of the evaluator's own code ({where}); a candidate may "
            "look at its own frames only, so compute what you need in your kernel"
        )

    # -- handlers: each returns None, or a callable to run once the hook is no longer busy -----

    def on_getframe(self, event: str, args: tuple[Any, ...]) -> None:
        self._reaches_harness(event, args[0])

    def on_getattr(self, event: str, args: tuple[Any, ...]) -> None:
        name = args[1]
        if name not in _FRAME_ATTRS:
            return
        try:
            reader: Any = sys._getframe(2)  # above this handler and __call__: the code reading the attribute
        except ValueError:
            reader = None
        while reader is not None and self._kind(reader.f_code.co_filename) == _STDLIB:
            reader = reader.f_back
        if reader is not None and self._kind(reader.f_code.co_filename) == _LIBRARY:
            # An installed library had the standard library read the stack: torch.manual_seed
            # formats its caller's stack for lazy CUDA seeding, whoever seeds. It keeps text.
            return
        target = args[0] if name == "f_code" else getattr(args[0], name, None)
        self._reaches_harness(f"{type(args[0]).__name__}.{name}", target)

    def on_introspection(self, event: str, args: tuple[Any, ...]) -> None:
        if not self._harness_asks(skip=2):  # the handler, __call__
            raise PermissionError(
                f"{REFUSED}: {event}; the candidate's process does not let code walk the interpreter's "
                "objects, frames or trace hooks, so compute what you need in your kernel"
            )

    def on_refused(self, event: str, args: tuple[Any, ...]) -> NoReturn:
        advice = {
            "sys.addaudithook": "the evaluator's hook is the only one",
            "os.system": "no shell: only the compilers that build an extension may run, through load_inline",
            "os.exec": "the candidate's process may not be replaced",
            "os.fork": "no new processes but the compilers that build an extension",
            "os.forkpty": "no new processes but the compilers that build an extension",
        }.get(event, "threads, signals, processes and ctypes are not for candidates; do the work in your kernel")
        raise PermissionError(f"{REFUSED}: {event}; {advice}")

    def _executable_problem(self, executable: object, search_path: str | None) -> str | None:
        name = _path_text(executable)
        if name is None:
            return "an executable given as an unusual object"
        base = os.path.basename(name)
        if self.allowed is not None and base not in self.allowed:
            return f"{base!r} is not one of the compilers an extension build runs ({', '.join(sorted(self.allowed)[:8])}, ...)"
        if os.sep not in name:
            found = shutil.which(name, path=search_path)
            if found is None:
                return None  # nothing by that name to run: starting it fails by itself
            name = found
        full = os.path.abspath(name)
        for where in (os.path.realpath(os.path.dirname(full)), os.path.realpath(full)):
            if _inside(where, self.writable) and not _inside(where, self.read_only):
                return f"{full!r} lies in a folder the candidate can write"
        return None

    def _refuse_executable(self, event: str, executable: object, search_path: str | None) -> None:
        problem = self._executable_problem(executable, search_path)
        if problem is not None:
            raise PermissionError(
                f"{REFUSED}: {event} of {_short(executable)}: {problem}; only the compilers load_inline and Triton run may start"
            )

    def on_popen(self, event: str, args: tuple[Any, ...]) -> None:
        executable, _, _, env = args
        search = env.get("PATH") if type(env) is dict else None
        self._refuse_executable(event, executable, search if type(search) is str else None)

    def on_posix_spawn(self, event: str, args: tuple[Any, ...]) -> None:
        self._refuse_executable(event, args[0], None)

    def on_fork_exec(self, event: str, args: tuple[Any, ...]) -> Callable[[], None]:
        box, call = args[0], tuple(args[1])
        # Copied into plain values once: what was checked is what runs.
        executables = tuple(os.fsencode(e) for e in call[1] if type(e) in (bytes, str))
        if len(executables) != len(call[1]) or any(callable(a) for a in call[2:]):
            raise PermissionError(f"{REFUSED}: _posixsubprocess.fork_exec with unusual arguments (a preexec_fn, or odd executables)")
        for path in executables:
            if os.path.exists(path) or (self.allowed is not None and os.path.basename(os.fsdecode(path)) not in self.allowed):
                self._refuse_executable("_posixsubprocess.fork_exec", os.fsdecode(path), None)
        original = self.fork_exec
        assert original is not None
        checked = (call[0], executables, *call[2:])
        return lambda: box.append(original(*checked))

    def on_kill(self, event: str, args: tuple[Any, ...]) -> None:
        pid = args[0]
        if type(pid) is int and pid > 0 and pid != os.getpid() and _parent_of(pid) == os.getpid():
            return  # subprocess's own kill() of a compiler it started
        raise PermissionError(f"{REFUSED}: os.kill({_short(pid)}, ...); a candidate may signal only the processes it started")

    def on_import(self, event: str, args: tuple[Any, ...]) -> None:
        if args[0] in _CTYPES_MODULES:
            raise PermissionError(f"{REFUSED}: import {args[0]}; ctypes is not for candidates")

    def on_dlopen(self, event: str, args: tuple[Any, ...]) -> None:
        name = _path_text(args[0])
        if name is not None and name.endswith(".so") and os.path.isabs(name) and self._may_write(os.path.realpath(name)):
            return  # torch.ops.load_library of an extension load_inline built
        raise PermissionError(f"{REFUSED}: ctypes.dlopen({_short(args[0])}); ctypes is not for candidates")

    def _may_write(self, real: str) -> bool:
        return real == os.devnull or (_inside(real, self.writable) and not _inside(real, self.read_only))

    def _refuse_write(self, event: str, path: object, dir_fd: object, relative_ok: bool = True) -> None:
        if type(path) is int:
            return  # an open descriptor: what it may write was settled when it was opened
        text = _path_text(path)
        if text is None:
            raise PermissionError(f"{REFUSED}: {event} of a path given as {type(path).__name__}; pass a str or a pathlib.Path")
        if not os.path.isabs(text):
            if type(dir_fd) is int and dir_fd >= 0:
                text = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), text)
            elif not relative_ok:
                raise PermissionError(f"{REFUSED}: {event} of the relative path {text!r} (relative to what?); pass an absolute path")
        real = os.path.realpath(text)
        if not self._may_write(real):
            raise PermissionError(
                f"{REFUSED}: {event} {_short(text)} for writing; only the work folder and the build caches "
                f"({', '.join(self.writable)}) may be written"
            )

    def on_open(self, event: str, args: tuple[Any, ...]) -> None:
        path, mode, flags = args
        writes = (type(flags) is int and flags & _WRITE_FLAGS) or (type(mode) is str and any(c in mode for c in "wax+"))
        if writes:
            # os.open (mode None) may be relative to a dir_fd this event does not show.
            self._refuse_write("open", path, None, relative_ok=mode is not None)

    def on_path_event(self, event: str, args: tuple[Any, ...]) -> None:
        for index, fd_index in _PATH_EVENTS[event]:
            dir_fd = args[fd_index] if fd_index is not None else None
            self._refuse_write(event, args[index], dir_fd)


def _path_text(path: object) -> str | None:
    """A path as text, reading only types whose __fspath__ the candidate cannot have written."""
    kind = type(path)
    if kind is str:
        return str(path)
    if kind is bytes:
        return os.fsdecode(path)  # type: ignore[arg-type]  # kind is bytes
    if kind in _PATHLIB_TYPES:
        return os.fspath(path)  # type: ignore[call-overload]  # a pathlib type
    return None


def _parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return int(handle.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def install_hook(
    *,
    allowed_executables: frozenset[str] | None = DEFAULT_COMPILERS,
    writable_dirs: Iterable[str | os.PathLike[str]] | None = None,
    protected_dirs: Iterable[str | os.PathLike[str]] = HARNESS_DIRS,
) -> None:
    """Add the audit hook, unarmed: until arm() it only waits for the call. Once per process
    (audit hooks cannot be removed). writable_dirs defaults to default_writable_dirs();
    protected_dirs holds the harness's code, whose frames a candidate may not reach.
    allowed_executables None: any program outside the writable folders may start (a process that
    never loads a candidate: the judge's reference runner)."""
    global _installed
    if _installed:
        raise RuntimeError("the audit hook is already installed; install_hook() runs once per process")
    writable = tuple(sorted({_real(d) for d in (default_writable_dirs() if writable_dirs is None else writable_dirs)}))
    allowed = None if allowed_executables is None else frozenset(allowed_executables)
    guard = _Guard(allowed, writable, tuple(sorted({_real(d) for d in protected_dirs})))
    sys.addaudithook(guard)
    _installed = True


def arm() -> None:
    """From now on the hook refuses (see the module docstring); there is no way back. Call it
    after the harness's modules are imported (their code is what the hook trusts) and before the
    candidate's."""
    if not _installed:
        raise RuntimeError("install_hook() first")
    sys.audit(_ARM_EVENT)
