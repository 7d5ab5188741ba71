"""C++ candidates built with clang++ and its template-instantiating precompiled header (tools/steps/pch.py):
the same evaluator verdicts as GCC's with the compiler chosen by eval.compiler, OpenMP beside torch's
threads, the header only where it is valid, the compiler in the key and the results, and GCC's
header, and an error for clang asked for, where clang is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from candidates import FIXTURES, candidate
from cli_runner import run_cli
from result_compare import EVAL_SETS

from kernel_refinery.core.verdict import EvalStatus
from kernel_refinery.tools.config import EvalConfig
from kernel_refinery.tools.evaluator import Evaluator
from kernel_refinery.tools.processes.jobs import TaskProgram
from kernel_refinery.tools.results import CompileReport
from kernel_refinery.tools.steps import compile_cache, compilers, pch

CLANG = compilers.find_clang()
needs_clang = pytest.mark.skipif(CLANG is None, reason=f"no clang++ with libomp here ({', '.join(compilers.CLANG_NAMES)})")
COMPILERS = [pytest.param("gcc", id="gcc"), pytest.param("clang", id="clang", marks=needs_clang)]


@pytest.fixture(scope="module")
def clang_header(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """clang's header for the example's flags, built in a private root (about 20 s)."""
    assert CLANG is not None
    return pch.build(root=tmp_path_factory.mktemp("pch"), cxx=compilers.identify_command(CLANG))


@pytest.fixture(scope="module", params=COMPILERS)
def pinned(request: pytest.FixtureRequest, cpu_config: EvalConfig) -> Iterator[tuple[str, Evaluator]]:
    """An evaluator whose runners build with one compiler, asked for by eval.compiler (the job carries
    it to the runner); CXX is unset, so that only the setting can choose."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("CXX", raising=False)
        with Evaluator(cpu_config.model_copy(update={"compiler": request.param})) as evaluator:
            yield compilers.compiler(choice=request.param), evaluator


# The same verdicts from either compiler (a subset of tests/test_evaluator_cpu.py).


def test_a_correct_kernel_is_correct_and_names_its_compiler(pinned: tuple[str, Evaluator], relu_task: TaskProgram) -> None:
    command, evaluator = pinned
    result = evaluator.evaluate(relu_task, candidate("return ext.relu_fwd(x)"))
    assert result.status is EvalStatus.CORRECT, result.message
    assert result.correctness is not None and result.correctness.max_abs_diff == 0.0
    assert result.timing is not None and result.timing.speedup > 0
    assert result.compile is not None
    assert result.compile.compiler == compilers.identify_command(command).describe()


def test_a_compile_error_names_the_candidate_line(pinned: tuple[str, Evaluator], relu_task: TaskProgram) -> None:
    command, evaluator = pinned
    source = candidate("return ext.relu_fwd(x)").replace(
        'cpp_source = r"""', 'cpp_source = r"""\nint broken() { return undeclared_name; }', 1
    )
    bad_line = next(i for i, line in enumerate(source.splitlines(), 1) if "undeclared_name" in line)
    result = evaluator.evaluate(relu_task, source)
    assert result.status is EvalStatus.COMPILE_ERROR
    assert f"line {bad_line} of the candidate" in result.message
    said = "use of undeclared identifier" if compilers.identify_command(command).clang else "was not declared"
    assert "undeclared_name" in result.message and said in result.message
    assert "ninja" not in result.message and len(result.message) < 3000


def test_a_wrong_kernel_is_wrong(pinned: tuple[str, Evaluator], relu_task: TaskProgram) -> None:
    _, evaluator = pinned
    result = evaluator.evaluate(relu_task, candidate("return ext.leaky_wrong(x)"))
    assert result.status is EvalStatus.INCORRECT
    assert result.correctness is not None and result.correctness.mismatches
    assert result.timing is None


# Asked for as a user does: `refinery eval` with eval.compiler (or REFINERY_COMPILER, its default).

WAYS = {
    "gcc": (("--set", "eval.compiler=gcc"), {}),
    "clang": (("--set", "eval.compiler=clang"), {}),
    "clang_by_environment": ((), {"REFINERY_COMPILER": "clang"}),
}


@pytest.mark.parametrize(
    "way", [pytest.param("gcc"), pytest.param("clang", marks=needs_clang), pytest.param("clang_by_environment", marks=needs_clang)]
)
def test_refinery_eval_builds_with_the_compiler_asked_for(
    way: str, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiler asked for is the one that built: in the result and in the run's manifest. (Once,
    REFINERY_COMPILER=clang never reached the runner, whose environment is scrubbed, and GCC built.)"""
    monkeypatch.delenv("CXX", raising=False)  # only the setting chooses
    monkeypatch.delenv("REFINERY_COMPILER", raising=False)
    flags, env = WAYS[way]
    family = way.split("_")[0]
    source = tmp_path / "candidate.py"
    source.write_text(candidate("return ext.relu_fwd(x)"))
    done = run_cli(
        "eval", FIXTURES / "relu_task.py", source, "--device", "cpu", "--json", *flags, *EVAL_SETS,
        "--set", f"eval.cache_dir={json.dumps(str(cache_dir))}", "--set", "eval.cpu_threads=1", env=env,
    )  # fmt: skip
    assert done.exit_code == 0, (done.stdout[-2000:], done.stderr[-2000:])
    out = json.loads(done.stdout)
    built = compilers.identify(choice=family).describe()
    assert built.endswith(f"({family})")
    assert out["status"] == "correct" and out["compile"]["compiler"] == built, out["compile"]
    assert out["manifest"]["eval"]["compiler"] == family
    assert out["manifest"]["software"]["compilers"]["c++ (run)"] == built


# OpenMP: clang's code calls libomp; torch runs its own threads on libgomp.

_OPENMP_PROBE = textwrap.dedent(
    r'''
    import json, sys, threading, tempfile
    from pathlib import Path
    import torch
    from kernel_refinery.tools.steps import compile_cache

    source = r"""
    #include <torch/extension.h>
    #include <omp.h>
    #include <cmath>

    torch::Tensor twice_exp(torch::Tensor x) {
        auto xc = x.contiguous();
        auto y = torch::empty_like(xc);
        const float* a = xc.data_ptr<float>();
        float* b = y.data_ptr<float>();
        const int64_t n = xc.numel();
        #pragma omp parallel for schedule(static) num_threads(2)
        for (int64_t i = 0; i < n; ++i) b[i] = 2.0f * std::exp(a[i]);
        return y;
    }

    // Threads in a region, distinct thread numbers seen, and whether _OPENMP was defined.
    std::vector<int64_t> team() {
        int threads = 0;
        std::vector<int64_t> seen(64, 0);
        #pragma omp parallel num_threads(2)
        {
            #pragma omp single
            threads = omp_get_num_threads();
            seen[omp_get_thread_num()] = 1;
        }
        int64_t distinct = 0;
        for (auto s : seen) distinct += s;
    #ifdef _OPENMP
        const int64_t openmp = 1;
    #else
        const int64_t openmp = 0;
    #endif
        return {threads, distinct, openmp};
    }

    // torch's own parallel ops inside the candidate's region, one slice per thread.
    torch::Tensor nested_exp(torch::Tensor x) {
        auto xc = x.contiguous();
        auto y = torch::empty_like(xc);
        const int64_t n = xc.size(0);
        #pragma omp parallel num_threads(2)
        {
            const int64_t t = omp_get_thread_num(), k = omp_get_num_threads();
            y.slice(0, n * t / k, n * (t + 1) / k).copy_(torch::exp(xc.slice(0, n * t / k, n * (t + 1) / k)));
        }
        return y;
    }
    """

    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as root:
        cache = compile_cache.CompileCache(Path(root))
        ext = cache.load_inline(
            "omp_probe", source, functions=["twice_exp", "team", "nested_exp"], extra_cflags=["-O3", "-fopenmp"]
        )
        x = torch.randn(1 << 22)
        m = torch.randn(384, 384)
        # Each side's own answer, computed alone first; then both at once must give the same.
        alone_twice, want_exp, want_mm = ext.twice_exp(x), torch.exp(x), m @ m
        errors = []
        if not torch.allclose(alone_twice, 2 * want_exp, rtol=1e-6, atol=0):
            errors.append("twice_exp against torch")

        def candidate_side():
            for _ in range(20):
                if not torch.equal(ext.twice_exp(x), alone_twice):
                    errors.append("twice_exp")

        def torch_side():
            for _ in range(20):
                if not torch.equal(torch.exp(x), want_exp) or not torch.allclose(m @ m, want_mm):
                    errors.append("torch")

        both = [threading.Thread(target=candidate_side), threading.Thread(target=torch_side)]
        for t in both:
            t.start()
        for t in both:
            t.join()
        nested_ok = all(torch.allclose(ext.nested_exp(x), want_exp, rtol=1e-6, atol=0) for _ in range(5))
        maps = Path("/proc/self/maps").read_text()
        print(json.dumps({
            "compiler": cache.ledger.compiler,
            "team": list(ext.team()),
            "errors": errors,
            "nested_ok": nested_ok,
            "torch_threads": torch.get_num_threads(),
            "torch_backend_openmp": "ATen parallel backend: OpenMP" in torch.__config__.parallel_info(),
            "libgomp": "libgomp" in maps,
            "libomp": "libomp.so" in maps,
        }))
    '''
)


@needs_clang
def test_a_clang_candidates_openmp_runs_beside_torchs_own_threads(tmp_path: Path) -> None:
    """A clang-built loop runs on a team of two (libomp) while torch's intra-op threads (libgomp)
    work at the same time, and torch's ops run inside the candidate's region: all results exact."""
    root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "CXX": str(CLANG), "OMP_WAIT_POLICY": "PASSIVE", "REFINERY_PCH_DIR": str(pch.default_root()), "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-c", _OPENMP_PROBE], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["compiler"] == compilers.identify_command(str(CLANG)).describe()
    assert seen["team"] == [2, 2, 1], "the candidate's region ran on two threads, with _OPENMP defined"
    assert seen["errors"] == [] and seen["nested_ok"]
    assert seen["torch_threads"] == 2 and seen["torch_backend_openmp"]
    assert seen["libgomp"] and seen["libomp"], "torch's libgomp and the candidate's libomp, one process"


@needs_clang
def test_clang_with_libgomp_would_drop_the_pragmas(tmp_path: Path) -> None:
    """Why a clang build links libomp: asked for torch's libgomp (-fopenmp=libgomp), clang compiles
    no OpenMP at all (no _OPENMP; every `#pragma omp` ignored, one thread)."""
    empty = tmp_path / "empty.cpp"
    empty.write_text("\n")

    def macros(flag: str) -> str:
        return subprocess.run([str(CLANG), flag, "-dM", "-E", str(empty)], capture_output=True, text=True, check=True).stdout

    assert "#define _OPENMP " in macros("-fopenmp")
    assert "_OPENMP" not in macros("-fopenmp=libgomp")


def test_clang_links_openmp_when_the_candidate_forgot() -> None:
    clang = compilers.Compiler("clang++", "clang", "19", "clang version 19")
    gcc = compilers.Compiler("c++", "gcc", "12", "c++ 12")
    kwargs = {"extra_cflags": ["-O3", "-fopenmp"]}
    assert compile_cache.with_openmp_link(kwargs, clang)["extra_ldflags"] == ["-fopenmp"]
    assert compile_cache.with_openmp_link(kwargs, gcc) is kwargs, "GCC's calls find torch's libgomp"
    assert compile_cache.with_openmp_link({"extra_cflags": ["-O3"]}, clang) == {"extra_cflags": ["-O3"]}


# The header: where it is used, and what its key covers.


@needs_clang
def test_clangs_header_is_taken_and_refused_with_other_flags(clang_header: Path) -> None:
    """The header is built and used; clang itself refuses it with an error for other language,
    target or optimisation options (its equivalent of -Werror=invalid-pch)."""
    cxx = compilers.identify_command(str(CLANG))
    assert (clang_header / "ok").exists() and pch.header_file(clang_header, cxx).stat().st_size > 5e7
    assert pch._uses_header(clang_header, pch.header_cflags(), cxx)
    for other in (("-O0", "-fopenmp"), ("-O3",), ("-O3", "-fopenmp", "-march=native"), ("-O3", "-fopenmp", "-ffast-math")):
        assert not pch._uses_header(clang_header, pch.header_cflags(other), cxx), other


def test_a_clang_build_gets_the_header_only_with_the_headers_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """-include-pch only for the header's flags (any order, -O1/-O2/-O3 alike); never beside another
    -D, target or math flag, nor for a source that does not include the header itself."""
    clang = compilers.Compiler("clang++", "clang", "19", "clang version 19")
    monkeypatch.setattr(compile_cache, "ready_header_dir", lambda cuda, command=None: tmp_path)
    pch_file = str(tmp_path / "torch" / "extension.h.pch")

    def given(flags: list[str], **more: Any) -> list[str]:
        return list(compile_cache.with_precompiled_header({"extra_cflags": flags, **more}, cuda=False, cxx=clang).get("extra_cflags", []))

    assert given(["-O3", "-fopenmp"]) == ["-O3", "-fopenmp", "-include-pch", pch_file]
    assert given(["-fopenmp", "-O2"])[-2:] == ["-include-pch", pch_file]
    for other in (
        ["-O3"],
        ["-O0", "-fopenmp"],
        ["-O3", "-fopenmp", "-DNDEBUG"],
        ["-O3", "-fopenmp", "-march=native"],
        ["-Ofast", "-fopenmp"],
    ):
        assert "-include-pch" not in given(other), other
    assert "-include-pch" not in given(["-O3", "-fopenmp"], no_implicit_headers=True)


def test_the_header_is_rebuilt_when_the_compiler_or_its_flags_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each compiler, version, build flag set and header option has a directory of its own: a change
    finds no header there (ready_header_dir gives None) and `python -m kernel_refinery.tools.steps.pch` builds one."""
    clang = compilers.Compiler("clang++", "clang", "19.1.7", "clang version 19.1.7", "clang version 19.1.7\n")
    newer = compilers.Compiler("clang++", "clang", "19.1.8", "clang version 19.1.8", "clang version 19.1.8\n")
    gcc = compilers.Compiler("c++", "gcc", "12.2.0", "c++ 12.2.0", "c++ 12.2.0\n")
    dirs = {
        pch.header_dir(root=tmp_path, cxx=clang),
        pch.header_dir(root=tmp_path, cxx=newer),
        pch.header_dir(root=tmp_path, cxx=gcc),
        pch.header_dir(("-O2", "-fopenmp"), root=tmp_path, cxx=clang),
    }
    with monkeypatch.context() as patch:
        patch.setattr(pch, "CLANG_HEADER_OPTIONS", ("-fpch-instantiate-templates", "-fpch-codegen"))
        dirs.add(pch.header_dir(root=tmp_path, cxx=clang))
    assert len(dirs) == 5
    built = pch.header_dir(root=tmp_path, cxx=clang)
    built.mkdir(parents=True)
    (built / "ok").write_text("ok\n")
    monkeypatch.setattr(pch, "identify_command", lambda command: {"clang++": clang, "c++": gcc}[command])
    assert pch._ready.__wrapped__(False, tmp_path, "clang++") == built
    monkeypatch.setattr(pch, "PCH_FLAGS", ("-O3", "-fopenmp", "-ffast-math"))
    assert pch._ready.__wrapped__(False, tmp_path, "clang++") is None, "other flags: no header yet"
    assert pch._ready.__wrapped__(False, tmp_path, "c++") is None, "another compiler: no header yet"


def test_the_compiler_is_in_the_build_cache_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same source and flags built by another compiler is another build; its ledger names it."""
    names: list[str] = []
    during: list[str | None] = []

    def fake_build(name: str, cpp: Any, cuda: Any, **kwargs: Any) -> object:
        names.append(name)
        during.append(os.environ.get("CXX"))
        return object()

    monkeypatch.setattr(compile_cache, "_ORIGINAL_LOAD_INLINE", fake_build)
    monkeypatch.setattr(compile_cache, "ready_header_dir", lambda cuda, command=None: None)
    fakes = {
        "clang++": compilers.Compiler("clang++", "clang", "19", "clang version 19"),
        "c++": compilers.Compiler("c++", "gcc", "12", "c++ 12"),
    }
    monkeypatch.setattr(compilers, "identify_command", lambda command: fakes[command])
    ledgers = []
    for command in ("clang++", "c++"):
        monkeypatch.setenv("CXX", command)
        cache = compile_cache.CompileCache(tmp_path / "cache")
        cache.load_inline("k", "int f() { return 1; }", functions=["f"], extra_cflags=["-O3"])
        ledgers.append((cache.ledger.compiler, cache.compiler))
    assert names[0] != names[1]
    assert during == ["clang++", "c++"], "torch reads CXX while it builds"
    assert ledgers == [("clang++ 19 (clang)",) * 2, ("c++ 12 (gcc)",) * 2]
    assert CompileReport(ok=True, compiler="clang++ 19 (clang)").compiler == "clang++ 19 (clang)"


def test_gcc_and_its_header_where_clang_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """clang looked for where it is not: the default compiler is GCC (c++), with GCC's header on the
    include path, and setup says so; clang asked for is an error that says what to install."""
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.delenv("REFINERY_COMPILER", raising=False)
    monkeypatch.setattr(compilers, "CLANG_NAMES", ("/nonexistent/clang++-19",))
    monkeypatch.setenv("REFINERY_PCH_DIR", str(tmp_path / "pch"))
    assert compilers.find_clang() is None and compilers.compiler() == compilers.GCC_DEFAULT
    with pytest.raises(compilers.CompilerMissing, match=r"eval.compiler=clang, but no clang\+\+ .*install clang-19 and libomp-19-dev"):
        compilers.compiler(choice="clang")
    gcc = compilers.identify()
    assert gcc.family == "gcc" and gcc.version[0].isdigit()
    directory = pch.header_dir(root=tmp_path / "pch")
    directory.mkdir(parents=True)
    (directory / "ok").write_text("ok\n")
    pch.forget_ready()  # asked again under this REFINERY_PCH_DIR
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(compile_cache, "_ORIGINAL_LOAD_INLINE", lambda name, cpp, cuda, **kw: seen.append({**kw, "CXX": os.environ["CXX"]}))
    cache = compile_cache.CompileCache(tmp_path / "cache")
    cache.load_inline("k", "int f() { return 1; }", functions=["f"], extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"])
    (built,) = seen
    assert built["CXX"] == compilers.GCC_DEFAULT and built["extra_include_paths"] == [str(directory)]
    assert built["extra_cflags"] == ["-O3", "-fopenmp"], "no -include-pch for GCC"
    assert cache.ledger.compiler == gcc.describe() and "(gcc)" in gcc.describe()
    assert pch.main(["--check"]) == 0
    assert "clang++ with OpenMP (libomp) not found" in capsys.readouterr().out
    pch.forget_ready()


@needs_clang
def test_setup_says_gcc_is_the_default_where_clang_is_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With clang and its OpenMP runtime installed, GCC still builds unless asked otherwise, setup
    says how to choose clang rather than that clang is missing, and serves a header for each."""
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.delenv("REFINERY_COMPILER", raising=False)
    monkeypatch.setenv("REFINERY_PCH_DIR", str(tmp_path / "pch"))
    pch.forget_ready()
    assert pch.main(["--check"]) == 1, "neither header is built in this empty root"
    out = capsys.readouterr().out
    assert "not found" not in out.splitlines()[0]
    assert f"the default; --set eval.compiler=clang builds with {CLANG} instead" in out
    for family in ("gcc", "clang"):
        assert f"no precompiled torch/extension.h for C++ builds, {compilers.identify(choice=family).describe()}" in out
    pch.forget_ready()


@needs_clang
def test_a_clang_without_its_openmp_runtime_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """clang installed without libomp-NN-dev would fail every -fopenmp build: it is not found, and
    asking for it is an error naming the runtime; the default stays GCC."""
    monkeypatch.delenv("CXX", raising=False)
    assert compilers.find_clang() == CLANG
    monkeypatch.setattr(compilers, "_has_openmp", lambda path: False)
    assert compilers.find_clang() is None and compilers.compiler() == compilers.GCC_DEFAULT
    with pytest.raises(compilers.CompilerMissing, match="libomp"):
        compilers.compiler(choice="clang")


def test_auto_checks_nothing_before_a_build_a_named_family_is_checked_at_once(
    monkeypatch: pytest.MonkeyPatch, cpu_config: EvalConfig
) -> None:
    """`auto` (the default) is CXX or c++ as the build finds it, so an evaluator for Triton
    candidates needs no C++ compiler; a family asked for is checked when the evaluator is made."""
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    Evaluator(cpu_config.model_copy(update={"compiler": "auto"})).close()
    with pytest.raises(compilers.CompilerMissing, match="cannot be run"):
        Evaluator(cpu_config.model_copy(update={"compiler": "gcc"}))


@needs_clang
def test_the_setting_picks_the_family_and_cxx_the_binary_within_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """eval.compiler names the family; CXX is used where it is of that family, and is all `auto` reads.
    A CUDA build's main.cpp stays with CXX/GCC, nvcc's host compiler, whatever the setting."""
    assert CLANG is not None
    monkeypatch.setenv("CXX", CLANG)
    assert (compilers.compiler(choice="clang"), compilers.compiler(choice="gcc"), compilers.compiler()) == (CLANG, "c++", CLANG)
    monkeypatch.setenv("CXX", "g++")
    assert (compilers.compiler(choice="clang"), compilers.compiler(choice="gcc"), compilers.compiler()) == (CLANG, "g++", "g++")
    monkeypatch.delenv("CXX")
    assert compilers.compiler(cuda=True, choice="clang") == compilers.GCC_DEFAULT
    assert compilers.identify(choice="clang").clang and compilers.identify(choice="gcc").family == "gcc"
