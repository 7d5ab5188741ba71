from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from kernel_refinery.bench.tasks import (
    SIZES_NAME,
    SuiteError,
    Task,
    builtin_suite_root,
    load_suite,
    load_task_file,
    render_source,
    resolve_suite,
)

BUILTIN = load_suite(builtin_suite_root())


def run_program(source: str, name: str = "task") -> dict[str, Any]:
    """Define the program's classes and constants; runs nothing beyond its module level."""
    namespace: dict[str, Any] = {"__name__": f"test_tasks_{name}"}
    exec(compile(source, f"<{name}>", "exec"), namespace)  # noqa: S102 - the task program is the input under test
    return namespace


def tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors(v)]
    return []


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_builtin_suite_has_enough_tasks_per_level():
    counts = {level: sum(t.level == level for t in BUILTIN) for level in (1, 2, 3)}
    assert counts[1] >= 12 and counts[2] >= 8 and counts[3] >= 4, counts
    assert len({t.key for t in BUILTIN}) == len(BUILTIN)


def test_builtin_suite_resolves_by_name():
    assert resolve_suite("builtin") == builtin_suite_root()
    assert all(t.key == f"level{t.level}/{t.path.stem}" for t in BUILTIN)
    with pytest.raises(ValidationError):
        BUILTIN[0].name = "renamed"


@pytest.mark.parametrize("task", BUILTIN, ids=lambda t: t.key)
def test_builtin_task_runs_at_cpu_size(task: Task, one_thread):
    program = run_program(task.source_for("cpu"), task.name)
    torch.manual_seed(0)
    model = program["Model"](*program["get_init_inputs"]())
    inputs = program["get_inputs"]()
    assert all(t.dtype == torch.float32 for t in tensors(inputs))
    with torch.no_grad():
        outputs = tensors(model(*inputs))
    assert outputs
    for out in outputs:
        assert out.dtype == torch.float32
        assert torch.isfinite(out).all(), f"{task.key} gave a non-finite output"


@pytest.mark.parametrize("task", BUILTIN, ids=lambda t: t.key)
def test_builtin_task_is_device_neutral_and_sized_for_cuda(task: Task):
    assert ".cuda(" not in task.source and 'device="cuda"' not in task.source
    assert "cuda" in task.sizes, f"{task.key} has no GPU size"


@pytest.mark.parametrize("task", BUILTIN, ids=lambda t: t.key)
def test_source_for_cuda_substitutes_the_sizes(task: Task):
    rendered = task.source_for("cuda")
    assert SIZES_NAME not in rendered
    gpu = run_program(rendered, task.name)
    cpu = run_program(task.source_for("cpu"), task.name)
    overrides = task.sizes["cuda"]
    for name, value in overrides.items():
        assert gpu[name] == value
    assert any(cpu[name] != value for name, value in overrides.items()), "GPU size equals the CPU size"
    assert SIZES_NAME not in gpu and SIZES_NAME not in cpu


def test_source_for_cpu_only_removes_the_sizes_statement():
    source = textwrap.dedent(
        """\
        import torch

        n = 8  # rows
        shape = (n, 4)

        REFINERY_SIZES = {"cuda": {"n": 4096}}  # GPU size

        def f():
            return 'REFINERY_SIZES stays in strings'
        """
    )
    assert render_source(source, "cpu") == source.replace('REFINERY_SIZES = {"cuda": {"n": 4096}}  # GPU size\n\n', "")
    rendered = render_source(source, "cuda")
    assert "n = 4096  # rows\nshape = (n, 4)\n" in rendered
    assert run_program(rendered)["shape"] == (4096, 4)


def test_source_for_keeps_layout_and_handles_awkward_statements():
    source = textwrap.dedent(
        """\
        # Grüße: non-ASCII text shifts byte columns
        name = "größe"; dims = (2, 3)
        scale = 0.5
        REFINERY_SIZES = {
            "cuda": {"dims": (64, 128), "scale": 1e-05, "name": "big"},
        }
        keep = 1; REFINERY_SIZES_TOO = 2
        """
    )
    rendered = render_source(source, "cuda")
    program = run_program(rendered)
    assert (program["name"], program["dims"], program["scale"]) == ("big", (64, 128), 1e-05)
    assert rendered.startswith("# Grüße: non-ASCII text shifts byte columns\n")
    assert "REFINERY_SIZES =" not in rendered and program["REFINERY_SIZES_TOO"] == 2

    inline = "a = 1; REFINERY_SIZES = {'cuda': {'a': 2}}; b = a\n"
    assert run_program(render_source(inline, "cuda"))["b"] == 2
    assert run_program(render_source(inline, "cpu"))["b"] == 1


def test_device_without_an_entry_keeps_the_written_sizes():
    source = "n = 8\nREFINERY_SIZES = {'cuda': {'n': 4096}}\n"
    assert render_source(source, "mps") == "n = 8\n"


def write_kernelbench_checkout(root: Path) -> Path:
    """A KernelBench checkout as cloned: repo/KernelBench/levelN/<number>_<Name>.py."""
    tasks = root / "KernelBench"
    files = {
        "level1/19_ReLU.py": '''
            import torch
            import torch.nn as nn

            class Model(nn.Module):
                """
                Simple model that performs a ReLU activation.
                """
                def __init__(self):
                    super(Model, self).__init__()

                def forward(self, x: torch.Tensor) -> torch.Tensor:
                    return torch.relu(x)

            batch_size = 16
            dim = 16384

            def get_inputs():
                x = torch.rand(batch_size, dim)
                return [x]

            def get_init_inputs():
                return []  # No special initialization inputs needed
            ''',
        "level1/2_Standard_matrix_multiplication_.py": """
            import torch
            import torch.nn as nn

            class Model(nn.Module):
                def __init__(self):
                    super(Model, self).__init__()

                def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
                    return torch.matmul(A, B)

            M = 64
            K = 32
            N = 48

            def get_inputs():
                A = torch.rand(M, K)
                B = torch.rand(K, N)
                return [A, B]

            def get_init_inputs():
                return []
            """,
        "level1/100_HingeLoss.py": """
            import torch
            import torch.nn as nn

            class Model(nn.Module):
                def __init__(self):
                    super(Model, self).__init__()

                def forward(self, predictions, targets):
                    return torch.mean(torch.clamp(1 - predictions * targets, min=0))

            batch_size = 128
            input_shape = (1,)
            dim = 1

            def get_inputs():
                return [torch.rand(batch_size, *input_shape), torch.randint(0, 2, (batch_size, 1)).float() * 2 - 1]

            def get_init_inputs():
                return []
            """,
        "level2/12_Gemm_Multiply_LeakyReLU.py": """
            import torch
            import torch.nn as nn

            class Model(nn.Module):
                \"\"\"
                Simple model that performs a Gemm, multiplies the result, and applies LeakyReLU.
                \"\"\"
                def __init__(self, in_features, out_features, multiplier, negative_slope):
                    super(Model, self).__init__()
                    self.gemm = nn.Linear(in_features, out_features)
                    self.multiplier = multiplier
                    self.leaky_relu = nn.LeakyReLU(negative_slope)

                def forward(self, x):
                    x = self.gemm(x)
                    x = x * self.multiplier
                    x = self.leaky_relu(x)
                    return x

            batch_size = 128
            in_features = 64
            out_features = 32
            multiplier = 2.0
            negative_slope = 0.1

            def get_inputs():
                return [torch.rand(batch_size, in_features)]

            def get_init_inputs():
                return [in_features, out_features, multiplier, negative_slope]
            """,
        "level3/1_MLP.py": """
            import torch
            import torch.nn as nn
            import torch.nn.functional as F

            class Model(nn.Module):
                def __init__(self, input_size, layer_sizes, output_size):
                    \"\"\"
                    :param input_size: The number of input features
                    :param layer_sizes: A list of ints containing the sizes of each hidden layer
                    :param output_size: The number of output features
                    \"\"\"
                    super(Model, self).__init__()
                    layers = []
                    current_input_size = input_size
                    for layer_size in layer_sizes:
                        layers.append(nn.Linear(current_input_size, layer_size))
                        layers.append(nn.ReLU())
                        current_input_size = layer_size
                    layers.append(nn.Linear(current_input_size, output_size))
                    self.network = nn.Sequential(*layers)

                def forward(self, x):
                    return self.network(x)

            # Test code
            batch_size = 1
            input_size = 100
            layer_sizes = [40, 20]
            output_size = 10

            def get_inputs():
                return [torch.rand(batch_size, input_size)]

            def get_init_inputs():
                return [input_size, layer_sizes, output_size]
            """,
    }
    for relative, text in files.items():
        path = tasks / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    (tasks / "level1" / "__init__.py").write_text("")
    (tasks / "level1" / "notes.txt").write_text("not a task\n")
    return tasks


def test_kernelbench_checkout_loads_unchanged(tmp_path: Path, one_thread):
    suite = write_kernelbench_checkout(tmp_path / "KernelBench")
    tasks = load_suite(resolve_suite(str(suite)))

    assert [t.key for t in tasks] == [
        "level1/2_Standard_matrix_multiplication_",
        "level1/19_ReLU",
        "level1/100_HingeLoss",
        "level2/12_Gemm_Multiply_LeakyReLU",
        "level3/1_MLP",
    ]
    for task in tasks:
        assert task.source == task.path.read_text()
        assert task.sizes == {}
        assert task.source_for("cuda") == task.source_for("cpu") == task.source
        program = run_program(task.source_for("cuda"), task.name)
        torch.manual_seed(0)
        with torch.no_grad():
            out = program["Model"](*program["get_init_inputs"]())(*program["get_inputs"]())
        assert math.isfinite(float(out.sum()))


def test_kernelbench_checkout_filters(tmp_path: Path):
    suite = write_kernelbench_checkout(tmp_path / "KernelBench")

    assert [t.key for t in load_suite(suite, levels=[2, 3])] == ["level2/12_Gemm_Multiply_LeakyReLU", "level3/1_MLP"]
    assert [t.name for t in load_suite(suite, name_filter="relu")] == ["19_ReLU", "12_Gemm_Multiply_LeakyReLU"]
    assert [t.name for t in load_suite(suite, levels=[1], name_filter="1*_*")] == ["19_ReLU", "100_HingeLoss"]
    assert [t.name for t in load_suite(suite, name_filter="*MLP")] == ["1_MLP"]
    assert load_suite(suite, name_filter="conv") == []


def test_builtin_name_filter_is_case_insensitive():
    assert [t.key for t in load_suite(builtin_suite_root(), levels=[1], name_filter="SOFTMAX")] == ["level1/4_softmax"]


def test_repository_root_is_refused_with_a_hint(tmp_path: Path):
    suite = write_kernelbench_checkout(tmp_path / "KernelBench")
    with pytest.raises(SuiteError, match=r"no levelN folder \(the repository root was given: use .*KernelBench"):
        resolve_suite(str(suite.parent))


def test_bad_suite_paths_say_what_was_expected(tmp_path: Path):
    with pytest.raises(SuiteError, match=r"does not exist.*level1/, level2/"):
        resolve_suite(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SuiteError, match=r"has no levelN folder.*level1/, level2/"):
        resolve_suite(str(tmp_path / "empty"))
    with pytest.raises(SuiteError, match="has no levelN folder"):
        load_suite(tmp_path / "empty")
    with pytest.raises(SuiteError, match="no folder for level 4; it has level1, level2, level3"):
        load_suite(builtin_suite_root(), levels=[1, 4])


def write_task(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "level1" / "1_task.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (
        "import torch\nclass Model(torch.nn.Module):\n    pass\ndef get_inputs():\n    return []\ndef get_init_inputs():\n    return []\n"
    )
    path.write_text(header + textwrap.dedent(body))
    return path


def test_unknown_size_name_is_an_error_naming_the_file(tmp_path: Path):
    path = write_task(tmp_path, "batch_size = 4\nREFINERY_SIZES = {'cuda': {'batch_sise': 64}}\n")
    with pytest.raises(SuiteError, match=r"1_task\.py: REFINERY_SIZES\['cuda'\] sets batch_sise.*batch_size"):
        load_task_file(path, 1)
    with pytest.raises(SuiteError, match="batch_sise"):
        load_suite(tmp_path)


def test_size_names_must_be_module_level_assignments(tmp_path: Path):
    path = write_task(tmp_path, "def f():\n    n = 1\nREFINERY_SIZES = {'cuda': {'n': 64}}\n")
    with pytest.raises(SuiteError, match="sets n, which the file does not assign at module level"):
        load_task_file(path, 1)


@pytest.mark.parametrize(
    "statement, message",
    [
        ("REFINERY_SIZES = {'cuda': {'n': 2 * n}}", "must be a literal"),
        ("REFINERY_SIZES = {'cuda': 64}", "wrong shape"),
        ("REFINERY_SIZES = {'cuda': {'n': 64}}\nREFINERY_SIZES = {}", "more than once"),
    ],
)
def test_malformed_sizes_are_errors(tmp_path: Path, statement: str, message: str):
    path = write_task(tmp_path, f"n = 4\n{statement}\n")
    with pytest.raises(SuiteError, match=message):
        load_task_file(path, 1)


def test_a_file_that_is_not_a_task_is_an_error(tmp_path: Path):
    path = tmp_path / "level1" / "3_helper.py"
    path.parent.mkdir()
    path.write_text("def helper():\n    return 1\n")
    with pytest.raises(SuiteError, match=r"3_helper.py is not a KernelBench task: it has no module-level Model"):
        load_suite(tmp_path)
    path.write_text("def broken(:\n")
    with pytest.raises(SuiteError, match=r"3_helper.py is not valid Python \(line 1"):
        load_task_file(path, 1)
