"""The static check reads real candidate sources; nothing here compiles or runs a kernel."""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import pytest

from kernel_refinery.tools.guards.static_check import check_candidate, kernel_bindings

CPP_HEADER = dedent(
    '''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.cpp_extension import load_inline

    relu_source = """
    #include <torch/extension.h>

    torch::Tensor relu_forward(torch::Tensor x) {
        auto out = torch::empty_like(x);
        auto src = x.data_ptr<float>();
        auto dst = out.data_ptr<float>();
        for (int64_t i = 0; i < x.numel(); ++i) dst[i] = src[i] > 0.f ? src[i] : 0.f;
        return out;
    }
    """

    relu_ext = load_inline(
        name="relu_ext",
        cpp_sources=relu_source,
        functions=["relu_forward"],
        verbose=False,
    )
    '''
)

CPP_MODEL = dedent(
    '''
    class ModelNew(nn.Module):
        """A ReLU in a C++ extension."""

        def __init__(self) -> None:
            super().__init__()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return relu_ext.relu_forward(x.contiguous())
    '''
)

CPP_CANDIDATE = CPP_HEADER + CPP_MODEL

TRITON_CANDIDATE = dedent(
    """
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl


    @triton.jit
    def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=mask)


    def triton_relu(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        n = x.numel()
        grid = (triton.cdiv(n, 1024),)
        relu_kernel[grid](x, out, n, BLOCK=1024)
        return out


    class ModelNew(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return triton_relu(x.contiguous())
    """
)


def line_of(source: str, text: str, occurrence: int = 1) -> int:
    """1-based line of the n-th line containing `text`, so tests do not hard-code line numbers."""
    hits = [n for n, line in enumerate(source.splitlines(), start=1) if text in line]
    return hits[occurrence - 1]


def with_model(body: str) -> str:
    return CPP_HEADER + dedent(body)


def only_rejection(source: str, backend: str = "cpp") -> str:
    report = check_candidate(source, backend)
    assert len(report.rejections) == 1, report.rejections
    return report.rejections[0]


def test_load_inline_candidate_is_accepted() -> None:
    report = check_candidate(CPP_CANDIDATE)
    assert report.ok
    assert report.rejections == ()
    assert report.warnings == ()


@pytest.mark.parametrize("backend", ["cpp", "cuda", "triton"])
def test_load_inline_counts_for_every_backend(backend: str) -> None:
    assert check_candidate(CPP_CANDIDATE, backend).ok


def test_triton_candidate_is_accepted_for_triton() -> None:
    report = check_candidate(TRITON_CANDIDATE, "triton")
    assert report.rejections == ()
    assert report.warnings == ()


def test_triton_kernel_does_not_count_for_cpp() -> None:
    message = only_rejection(TRITON_CANDIDATE, "cuda")
    assert f"line {line_of(TRITON_CANDIDATE, 'def relu_kernel')}:" in message
    assert "backend is cuda" in message and "load_inline" in message


def test_unknown_backend_is_a_bug_not_a_rejection() -> None:
    with pytest.raises(ValueError, match="backend"):
        check_candidate(CPP_CANDIDATE, "opencl")


def test_syntax_error_names_the_line() -> None:
    source = CPP_CANDIDATE.replace("return relu_ext.relu_forward(x.contiguous())", "return relu_ext.relu_forward(x")
    message = only_rejection(source)
    assert message.startswith(f"line {line_of(source, 'return relu_ext.relu_forward(x')}: syntax error")


def test_missing_model_new() -> None:
    source = CPP_CANDIDATE.replace("class ModelNew(", "class FastRelu(")
    assert "no `class ModelNew(nn.Module)`" in only_rejection(source)


def test_model_new_inside_a_function_is_not_at_module_level() -> None:
    source = CPP_HEADER + "\n\ndef build():\n" + "\n".join("    " + line for line in CPP_MODEL.splitlines())
    assert "no `class ModelNew(nn.Module)`" in only_rejection(source)


def test_try_except_fallback_in_forward_is_rejected() -> None:
    source = with_model(
        """
        class ModelNew(nn.Module):
            def forward(self, x):
                try:
                    return relu_ext.relu_forward(x)
                except RuntimeError:
                    return torch.relu(x)
        """
    )
    message = only_rejection(source)
    assert f"line {line_of(source, 'try:')}: try/except" in message


def test_try_in_a_helper_function_is_rejected() -> None:
    source = CPP_CANDIDATE + dedent(
        """

        def warm_up():
            try:
                relu_ext.relu_forward(torch.ones(4))
            finally:
                pass
        """
    )
    assert f"line {line_of(source, 'try:')}: try/except" in only_rejection(source)


def test_contextlib_suppress_is_rejected_through_an_alias() -> None:
    source = with_model(
        """
        from contextlib import suppress as quietly

        class ModelNew(nn.Module):
            def forward(self, x):
                out = torch.relu(x)
                with quietly(RuntimeError):
                    out = relu_ext.relu_forward(x)
                return out
        """
    )
    message = only_rejection(source)
    assert f"line {line_of(source, 'with quietly')}: contextlib.suppress" in message


def test_a_docstring_mentioning_try_is_fine() -> None:
    source = CPP_CANDIDATE.replace('"""A ReLU in a C++ extension."""', '"""No fallback: we never write try: ... except: here."""')
    assert check_candidate(source).ok


PATCHES = [
    "torch.cuda.synchronize = _noop",
    "torch.cuda.Event.elapsed_time = _noop",
    "torch.cuda.Event.elapsed_time += 0",
    "torch.cuda.synchronize, unused = _noop, 0",
    "time.perf_counter = _noop",
    "setattr(torch.cuda, 'synchronize', _noop)",
    "del torch.cuda.synchronize",
    "T.cuda.synchronize = _noop",
    "cuda.synchronize = _noop",
    "Event.elapsed_time = _noop",
    "sync_owner = torch.cuda\nsync_owner.synchronize = _noop",
    "sys.modules['time'] = _noop",
    "torch.cuda.__setattr__('synchronize', _noop)",
]


@pytest.mark.parametrize("patch", PATCHES)
def test_patching_timers_or_sync_is_rejected(patch: str) -> None:
    imports = "import sys\nimport time\nimport torch as T\nfrom torch import cuda\nfrom torch.cuda import Event\n"
    source = imports + CPP_CANDIDATE + "\n\ndef _noop(*args, **kwargs):\n    return 0.0\n\n" + patch + "\n"
    message = only_rejection(source)
    last = patch.splitlines()[-1]
    assert f"line {line_of(source, last)}:" in message
    assert "patch" in message


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("import builtins", "imports builtins"),
        ("__builtins__['print'] = len", "__builtins__"),
    ],
)
def test_builtins_are_off_limits(code: str, expected: str) -> None:
    source = CPP_CANDIDATE + "\n" + code + "\n"
    message = only_rejection(source)
    assert f"line {line_of(source, code)}: " in message and expected in message


def test_perf_counter_used_and_rebound_normally_is_accepted() -> None:
    source = with_model(
        """
        from time import perf_counter

        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.started = perf_counter()
                self.calls = 0

            def forward(self, x):
                self.calls += 1
                return relu_ext.relu_forward(x)

        perf_counter = None
        """
    )
    assert check_candidate(source).ok


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("import threading", "imports threading"),
        ("import _thread", "imports _thread"),
        ("from concurrent.futures import ThreadPoolExecutor", "imports concurrent.futures"),
        ("import multiprocessing as mp", "imports multiprocessing"),
        ("import torch.multiprocessing", "imports torch.multiprocessing"),
        ("import subprocess", "imports subprocess"),
        ("import _posixsubprocess", "imports _posixsubprocess"),
        ("import signal", "imports signal"),
        ("import socket", "imports socket"),
        ("from ctypes import CDLL", "imports ctypes.CDLL"),
        ("import pty", "imports pty"),
        ("import os\nos.system('nvidia-smi')", "uses os.system"),
        ("import os\nos.execv('/bin/true', ['true'])", "uses os.execv"),
        ("from os import fork\nfork()", "uses os.fork"),
        ("import os\nos.kill(os.getpid(), 9)", "uses os.kill"),
        ("import os\nDEBUG = os.environ.get('DEBUG')", "uses os.environ"),
        ("from os import getenv\nDEBUG = getenv('DEBUG')", "uses os.getenv"),
        ("exec('import time')", "exec(...) runs code this check cannot see"),
        ("import importlib\nimportlib.import_module('subprocess')", "importlib.import_module(...)"),
        ("from os import *", "import *"),
    ],
)
def test_process_escapes_are_rejected(code: str, expected: str) -> None:
    source = CPP_CANDIDATE + "\n" + code + "\n"
    message = only_rejection(source)
    assert f"line {line_of(source, code.splitlines()[-1])}: " in message
    assert expected in message


def test_no_custom_kernel_at_all() -> None:
    source = dedent(
        """
        import torch
        import torch.nn as nn

        class ModelNew(nn.Module):
            def forward(self, x):
                return torch.relu(x)
        """
    )
    message = only_rejection(source, "triton")
    assert message.startswith("no custom kernel")
    assert "@triton.jit" in message


def test_forward_that_never_calls_the_kernel_is_rejected() -> None:
    source = with_model(
        """
        class ModelNew(nn.Module):
            def forward(self, x):
                return torch.relu(x)
        """
    )
    report = check_candidate(source)
    assert report.rejections == (
        f"line {line_of(source, 'def forward')}: ModelNew.forward never calls a custom kernel: nothing it reaches "
        "calls relu_ext (an extension's function, or a Triton kernel launched as kernel[grid](...)); "
        "call your kernel from forward",
    )
    assert f"torch.relu (line {line_of(source, 'return torch.relu')})" in report.warnings[0]


def test_kernel_called_only_outside_forward_does_not_count() -> None:
    source = with_model(
        """
        class ModelNew(nn.Module):
            def forward(self, x):
                return torch.relu(x)

            def unused(self, x):
                return relu_ext.relu_forward(x)
        """
    )
    assert "never calls a custom kernel" in only_rejection(source)


def test_unbound_load_inline_result_is_explained() -> None:
    source = CPP_CANDIDATE.replace("relu_ext = load_inline(", "load_inline(").replace(
        "return relu_ext.relu_forward(x.contiguous())", "return x.clamp(min=0)"
    )
    assert "the result of load_inline is never kept" in only_rejection(source)


def test_extension_loaded_in_init_as_self_attribute() -> None:
    source = dedent(
        """
        import torch
        from torch import nn
        from torch.utils import cpp_extension

        SOURCE = "torch::Tensor relu_forward(torch::Tensor x);"

        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.ext = cpp_extension.load_inline("relu", cpp_sources=SOURCE, functions=["relu_forward"])

            def forward(self, x):
                return self.ext.relu_forward(x)
        """
    )
    assert check_candidate(source, "cuda").ok
    assert kernel_bindings(source) == {"self.ext"}


def test_self_alias_of_a_kernel_function_counts() -> None:
    source = with_model(
        """
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.op = relu_ext.relu_forward

            def forward(self, x):
                return self.op(x)
        """
    )
    assert check_candidate(source).ok
    assert kernel_bindings(source) == {"relu_ext", "self.op"}


def test_kernel_reached_through_a_method_and_a_function() -> None:
    source = with_model(
        """
        def run_relu(x):
            return relu_ext.relu_forward(x.contiguous())

        class ModelNew(nn.Module):
            def forward(self, x):
                return self._body(x)

            def _body(self, x):
                return run_relu(x)
        """
    )
    assert check_candidate(source).ok


def test_kernel_in_an_autograd_function_counts() -> None:
    source = with_model(
        """
        class ReluFn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return relu_ext.relu_forward(x)

            @staticmethod
            def backward(ctx, grad):
                return grad.clamp(min=0)

        class ModelNew(nn.Module):
            def forward(self, x):
                return ReluFn.apply(x)
        """
    )
    report = check_candidate(source)
    assert report.ok
    assert report.warnings == ()


def test_kernel_in_an_autograd_function_nested_in_model_new_counts() -> None:
    source = with_model(
        """
        class ModelNew(nn.Module):
            class _Relu(torch.autograd.Function):
                @staticmethod
                def forward(ctx, x):
                    return relu_ext.relu_forward(x)

            def forward(self, x):
                return self._Relu.apply(x)
        """
    )
    assert check_candidate(source).ok


def test_lazily_built_extension_counts() -> None:
    source = dedent(
        """
        import torch
        import torch.nn as nn
        from torch.utils.cpp_extension import load_inline

        _EXT = None

        def get_ext():
            global _EXT
            if _EXT is None:
                _EXT = load_inline("relu", cpp_sources="...", functions=["relu_forward"])
            return _EXT

        class ModelNew(nn.Module):
            def forward(self, x):
                return get_ext().relu_forward(x)
        """
    )
    assert check_candidate(source).ok


def test_ops_registered_with_torch_library_count() -> None:
    source = dedent(
        '''
        import torch
        import torch.nn as nn
        from torch.utils.cpp_extension import load_inline

        SOURCE = """
        TORCH_LIBRARY(fast_ops, m) { m.def("relu(Tensor x) -> Tensor", &relu_forward); }
        """
        load_inline("fast_ops_build", cpp_sources=SOURCE, is_python_module=False)

        class ModelNew(nn.Module):
            def forward(self, x):
                return torch.ops.fast_ops.relu(x)
        '''
    )
    report = check_candidate(source)
    assert report.ok
    assert report.warnings == ()


def test_model_new_subclassing_the_reference_is_rejected() -> None:
    source = with_model(
        """
        class Model(nn.Module):
            def forward(self, x):
                return torch.relu(x)

        class ModelNew(Model):
            def forward(self, x):
                relu_ext.relu_forward(x)
                return super().forward(x)
        """
    )
    message = only_rejection(source)
    assert f"line {line_of(source, 'class ModelNew(Model)')}: ModelNew subclasses the reference `Model`" in message


def test_instantiating_the_reference_is_rejected() -> None:
    source = with_model(
        """
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.reference = Model()

            def forward(self, x):
                return relu_ext.relu_forward(self.reference(x))
        """
    )
    message = only_rejection(source)
    assert f"line {line_of(source, 'self.reference = Model()')}: uses the reference `Model`" in message


def test_fused_candidate_keeping_a_conv_is_accepted_with_a_warning() -> None:
    source = with_model(
        """
        class ModelNew(nn.Module):
            def __init__(self, in_channels, out_channels, kernel_size):
                super().__init__()
                self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)

            def forward(self, x):
                x = self.conv(x)
                return relu_ext.relu_forward(x.contiguous())
        """
    )
    report = check_candidate(source)
    assert report.ok
    assert report.warnings == (
        f"forward still calls PyTorch compute ops: self.conv (line {line_of(source, 'x = self.conv(x)')}); "
        "the evaluator rejects a candidate that runs every compute op of the reference, and each of these "
        "is a chance to fuse into your kernel",
    )


def test_torch_compute_ops_are_listed_by_line_and_shape_ops_are_not() -> None:
    source = with_model(
        """
        from torch.nn.functional import gelu

        class ModelNew(nn.Module):
            def forward(self, a, b):
                out = torch.empty(a.size(0), b.size(1), device=a.device)
                y = torch.matmul(a, b)
                y = F.softmax(y, dim=-1).contiguous().view(-1, 4)
                z = y.sum(dim=0) + (a @ b).flatten()[0]
                z = gelu(z)
                return relu_ext.relu_forward(out + z.unsqueeze(0).to(a.dtype))
        """
    )
    report = check_candidate(source)
    assert report.ok
    lines = {text: line_of(source, text) for text in ("torch.matmul", "F.softmax", "y.sum", "gelu(z)")}
    assert report.warnings[0].startswith(
        "forward still calls PyTorch compute ops: "
        f"torch.matmul (line {lines['torch.matmul']}), F.softmax (line {lines['F.softmax']}), "
        f"@ (line {lines['y.sum']}), y.sum (line {lines['y.sum']}), gelu (line {lines['gelu(z)']}); "
    )


def test_ops_in_a_block_built_in_init_are_reached() -> None:
    source = with_model(
        """
        class Block(nn.Module):
            def forward(self, x):
                return relu_ext.relu_forward(torch.tanh(x))

        class ModelNew(nn.Module):
            def __init__(self):
                super(ModelNew, self).__init__()
                self.blocks = nn.ModuleList([Block() for _ in range(2)])

            def forward(self, x):
                for block in self.blocks:
                    x = block(x)
                return x
        """
    )
    report = check_candidate(source)
    assert report.ok
    assert f"torch.tanh (line {line_of(source, 'torch.tanh')})" in report.warnings[0]


def test_streams_are_warned_about() -> None:
    source = (
        CPP_CANDIDATE.replace("    return out;\n}", "    cudaStream_t s;\n    cudaStreamCreate(&s);\n    return out;\n}")
        + "\nSIDE = torch.cuda.Stream()\n"
    )
    report = check_candidate(source)
    assert report.ok
    assert report.warnings == (
        f"line {line_of(source, 'SIDE = ')}: creates a CUDA stream (torch.cuda.Stream); timing synchronises "
        "every stream, so a side stream hides no work and only adds overhead; launch on the current stream",
        f"line {line_of(source, 'cudaStreamCreate(')}: the kernel source creates a CUDA stream "
        "(cudaStreamCreate); timing synchronises every stream, so a side stream hides no work and only adds "
        "overhead; launch on the current stream",
    )


def test_several_problems_are_all_reported() -> None:
    source = with_model(
        """
        import threading

        class ModelNew(nn.Module):
            def forward(self, x):
                try:
                    return relu_ext.relu_forward(x)
                except Exception:
                    return x
        """
    )
    report = check_candidate(source)
    assert len(report.rejections) == 2
    assert "try/except" in report.rejections[0] and "imports threading" in report.rejections[1]


def test_kernel_bindings_of_a_triton_candidate() -> None:
    assert kernel_bindings(TRITON_CANDIDATE) == {"relu_kernel"}
    assert kernel_bindings(CPP_CANDIDATE) == {"relu_ext"}


FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize(("folder", "backend"), [("cpu_solutions", "cpp"), ("cuda_solutions", "cuda"), ("triton_solutions", "triton")])
def test_the_honest_fixture_solutions_are_accepted(folder: str, backend: str) -> None:
    paths = sorted((FIXTURES / folder).rglob("*.py"))
    assert paths
    for path in paths:
        report = check_candidate(path.read_text(), backend)
        assert report.ok, (path.name, report.rejections)


@pytest.mark.parametrize(
    ("code", "verb"),
    [
        ("import sys\nFAST = sys.modules['torch'].relu", "reads"),
        ("import sys\nTIMER = sys.modules.get('kernel_refinery.tools.steps.timing')", "reads"),
        ("import sys as s\nTIMER = s.modules['kernel_refinery.tools.steps.timing']", "reads"),
        ("from sys import modules\nTIMER = modules['kernel_refinery.tools.steps.timing']", "reads"),
        ("import sys\ntable = sys.modules\ntable['time'] = None", "patches"),
        ("import sys\ndel sys.modules['time']", "patches"),
        ("import sys\nsys.modules.setdefault('time', None)", "patches"),
    ],
)
def test_sys_modules_is_off_limits(code: str, verb: str) -> None:
    source = CPP_CANDIDATE + "\n" + code + "\n"
    rejections = check_candidate(source).rejections
    last = line_of(source, code.splitlines()[-1])
    expected = f"line {last}: {verb} the module table through sys.modules; "
    assert any(r.startswith(expected) for r in rejections), rejections
    assert all("sys.modules" in r for r in rejections), rejections
    assert "leave sys.modules alone" in rejections[-1]


@pytest.mark.parametrize(
    ("code", "name"),
    [
        ("import sys\nCALLER = sys._getframe(1)", "sys._getframe"),
        ("from sys import _getframe as frame\nCALLER = frame(1)", "sys._getframe"),
        ("import sys\nFRAMES = sys._current_frames()", "sys._current_frames"),
        ("import sys\nsys.settrace(None)", "sys.settrace"),
        ("import sys\nsys.setprofile(print)", "sys.setprofile"),
    ],
)
def test_frame_access_is_rejected(code: str, name: str) -> None:
    source = CPP_CANDIDATE + "\n" + code + "\n"
    rejections = check_candidate(source).rejections
    last = line_of(source, code.splitlines()[-1])
    assert f"line {last}: uses {name}, which reaches the interpreter's frames" in rejections[-1], rejections
    assert "compute the output from forward's arguments alone" in rejections[-1]


@pytest.mark.parametrize("code", ["import inspect", "from inspect import currentframe", "import inspect as ins"])
def test_importing_inspect_is_rejected(code: str) -> None:
    source = CPP_CANDIDATE + "\n" + code + "\n"
    message = only_rejection(source)
    assert message.startswith(f"line {line_of(source, code)}: imports inspect")
    assert "frames" in message and "remove it" in message


@pytest.mark.parametrize("code", ["import gc", "from gc import get_objects", "import gc as collector"])
def test_importing_gc_is_rejected(code: str) -> None:
    source = CPP_CANDIDATE + "\n" + code + "\n"
    message = only_rejection(source)
    assert message.startswith(f"line {line_of(source, code)}: imports gc")
    assert "gc.get_objects" in message and "remove it" in message


@pytest.mark.parametrize(
    "code",
    [
        "SEED = torch.initial_seed()",
        "SEED = torch.random.initial_seed()",
        "SEED = torch.cuda.initial_seed()",
        "STATE = torch.get_rng_state()",
        "STATE = torch.random.get_rng_state()",
        "SEED = torch.default_generator.initial_seed()",
        "from torch import initial_seed",
        "SEED = torch.Generator().initial_seed()",
    ],
)
def test_reading_torch_rng_state_is_rejected(code: str) -> None:
    source = CPP_CANDIDATE + "\n" + code + "\n"
    message = only_rejection(source)
    assert message.startswith(f"line {line_of(source, code)}: reads torch's random-number state (")
    assert "the same for any seed" in message


def test_the_new_rules_come_before_the_generic_ones() -> None:
    source = CPP_CANDIDATE + "\nimport sys\nsys.modules['time'].perf_counter = None\nimport threading\n"
    rejections = check_candidate(source).rejections
    assert rejections[0].startswith(f"line {line_of(source, 'perf_counter = None')}: patches the module table through sys.modules")
    assert "imports threading" in rejections[-1]
