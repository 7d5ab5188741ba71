"""The precompiled torch/extension.h: GCC takes it for the example's flags, and it changes how long a
C++ file's build takes, never the compile cache's key; a CUDA build's main.cpp gets a header of its own.
(clang's header: tests/test_clang.py.) GCC is pinned here with CXX, which workers keep."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from kernel_refinery.tools.steps import compile_cache, compilers, pch


def test_header_options_are_torchs_without_the_module_name() -> None:
    flags = pch.header_cflags()
    assert "-DTORCH_API_INCLUDE_EXTENSION_H" in flags and "-fPIC" in flags
    assert any(f.startswith("-std=") for f in flags) and flags[-2:] == list(pch.PCH_FLAGS)
    assert not any(f.startswith("-DTORCH_EXTENSION_NAME") for f in flags)
    assert pch.header_dir(("-O2",), Path("/x")) != pch.header_dir(pch.PCH_FLAGS, Path("/x")), "the options are in the key"


def test_no_cuda_header_where_torch_builds_no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pch.cpp_extension, "CUDA_HOME", None)
    assert pch._ready.__wrapped__(True, None, "c++") is None
    assert pch.flavours() == [False]


def test_gcc_takes_the_built_header(tmp_path: Path) -> None:
    """Built in a private root (about a minute): a source including torch/extension.h twice reads the .gch."""
    gcc = compilers.identify_command(compilers.GCC_DEFAULT)
    directory = pch.build(root=tmp_path, cxx=gcc)
    assert (directory / "ok").exists() and (directory / "torch" / "extension.h.gch").stat().st_size > 1e8
    assert pch._uses_header(directory, pch.header_cflags(), gcc)
    assert not pch._uses_header(tmp_path / "elsewhere", pch.header_cflags(), gcc)


@pytest.mark.parametrize("ready", [True, False])
def test_the_header_leaves_the_cache_key_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ready: bool) -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    def fake_build(name: str, cpp: Any, cuda: Any, **kwargs: Any) -> object:
        seen.append((name, kwargs))
        return object()

    monkeypatch.setenv("CXX", compilers.GCC_DEFAULT)
    monkeypatch.setattr(compile_cache, "_ORIGINAL_LOAD_INLINE", fake_build)
    headers = {False: tmp_path / "pch", True: tmp_path / "pch-cuda"}
    monkeypatch.setattr(compile_cache, "ready_header_dir", lambda cuda, command=None: headers[cuda] if ready else None)
    cache = compile_cache.CompileCache(tmp_path / "cache")
    cache.load_inline("k", "int f() { return 1; }", functions=["f"], extra_include_paths=["/mine"])
    cache.load_inline("k", "int f();", cuda_sources="__global__ void g() {}", functions=["f"])
    (cpp_name, cpp_kwargs), (_, cuda_kwargs) = seen
    expected = [str(tmp_path / "pch"), "/mine"] if ready else ["/mine"]
    assert cpp_kwargs["extra_include_paths"] == expected
    if ready:
        assert cuda_kwargs["extra_include_paths"] == [str(tmp_path / "pch-cuda")], "a CUDA build's main.cpp has options of its own"
    else:
        assert "extra_include_paths" not in cuda_kwargs
    flags = {"extra_include_paths": ["/mine"], "functions": ["f"]}
    compiler = compilers.identify_command(compilers.GCC_DEFAULT).key()
    key = compile_cache.cache_key({"name": "k", "cpp": ["int f() { return 1; }"], "cuda": [], "flags": flags, "compiler": compiler})
    assert cpp_name == f"k_{key[:12]}"


def test_a_workers_build_takes_the_header_from_the_real_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers run with a HOME of their own; the header's place is passed to them, so their builds see it."""
    from candidates import candidate

    from kernel_refinery.core.verdict import EvalStatus
    from kernel_refinery.tools.config import EvalConfig
    from kernel_refinery.tools.evaluator import Evaluator
    from kernel_refinery.tools.processes.jobs import TaskProgram
    from kernel_refinery.tools.results import Stage

    root = tmp_path / "pch"
    monkeypatch.setenv("REFINERY_PCH_DIR", str(root))
    monkeypatch.setenv("CXX", compilers.GCC_DEFAULT)
    directory = pch.header_dir(root=root)
    directory.mkdir(parents=True)
    (directory / "ok").write_text("ok\n")  # no .gch inside: GCC parses the header as usual, only the path is checked
    source = (Path(__file__).parent / "fixtures" / "small_relu_task.py").read_text()
    config = EvalConfig(device="cpu", trials=3, warmup=1, time_compiled_reference=False, cache_dir=tmp_path / "cache", cpu_threads=1)
    with Evaluator(config) as evaluator:
        result = evaluator.run(TaskProgram(name="small_relu", source=source), candidate("return ext.relu_fwd(x)"), (Stage.COMPILE,))
    assert result.status is not EvalStatus.COMPILE_ERROR, result.message
    (ninja,) = (tmp_path / "cache" / "extensions").glob("*/build.ninja")
    assert f"-I{directory}" in ninja.read_text() or f"-I {directory}" in ninja.read_text()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or pch.cpp_extension.CUDA_HOME is None, reason="needs CUDA")
def test_a_cuda_builds_main_cpp_takes_its_header(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Built in a private root for a CUDA build's options; then the CUDA example builds through the
    compile cache with it, GCC told to fail on a .gch it finds and cannot use, and its kernel still correct."""
    from kernel_refinery.tools.steps import compile_cache as cc

    directory = pch.build(pch.PCH_FLAGS_CUDA, root=tmp_path / "pch", with_cuda=True)
    assert pch._uses_header(directory, pch.header_cflags(pch.PCH_FLAGS_CUDA, with_cuda=True), compilers.identify(cuda=True))
    assert directory != pch.header_dir(root=tmp_path / "pch"), "the CPU header is another"
    example = (Path(__file__).parents[1] / "prompts" / "examples" / "sigmoid_cuda.py").read_text()
    source = example[example.index('r"""') + 4 : example.index('"""', example.index('r"""') + 4)]
    cache = cc.CompileCache(tmp_path / "cache")
    monkeypatch.setattr(cc, "ready_header_dir", lambda cuda, command=None: directory if cuda else None)
    try:
        module = cache.load_inline(
            "sig",
            "torch::Tensor sigmoid_forward(torch::Tensor input);",
            source,
            functions=["sigmoid_forward"],
            extra_cflags=["-Winvalid-pch", "-Werror=invalid-pch"],
        )
    except cc.CompileFailed as exc:
        pytest.fail(exc.log)
    x = torch.randn(4096, device="cuda")
    torch.testing.assert_close(module.sigmoid_forward(x), torch.sigmoid(x))
    (ninja,) = (tmp_path / "cache" / "extensions").glob("*/build.ninja")
    assert f"-I{directory}" in ninja.read_text() or f"-I {directory}" in ninja.read_text()
