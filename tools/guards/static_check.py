"""The static step: read a candidate's AST and reject the known hacks before anything runs.

One visitor pass collects facts (imports and aliases, functions and classes, assignments,
calls, names read); small rule functions then turn those facts into rejections and warnings.
Every message starts with the line it is about and says what to do instead, because it goes
back to the model that wrote the candidate.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from kernel_refinery.tools.results import StaticReport

BACKENDS = ("cpp", "cuda", "triton")

LOAD_FUNCTIONS = frozenset({"torch.utils.cpp_extension.load_inline", "torch.utils.cpp_extension.load"})

# Names that mean a module even when the candidate forgot to import them.
ROOT_MODULES = frozenset({"torch", "time", "timeit", "triton", "os", "sys"})

FORBIDDEN_MODULES = frozenset(
    {"threading", "_thread", "multiprocessing", "concurrent", "subprocess", "_posixsubprocess", "signal", "socket", "ctypes", "pty"}
)
FORBIDDEN_SUBMODULES = frozenset({"torch.multiprocessing"})

OS_PROCESS_CALLS = frozenset({"fork", "forkpty", "system", "popen", "kill", "killpg", "posix_spawn", "posix_spawnp", "_exit", "abort"})
OS_ENVIRONMENT = frozenset({"os.environ", "os.environb", "os.getenv", "os.getenvb", "os.putenv", "os.unsetenv"})

DYNAMIC_CODE = frozenset({"exec", "eval", "compile", "__import__"})
DYNAMIC_IMPORTS = frozenset({"importlib.import_module", "importlib.__import__"})

SYS_MODULES_MUTATORS = frozenset({"update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__"})

# Reaching into the evaluator from Python: its frames, its objects, its module table, its RNG state.
FRAME_ACCESS = frozenset({"sys._getframe", "sys._current_frames", "sys._current_exceptions", "sys.settrace", "sys.setprofile"})
INTROSPECTION_MODULES = {
    "inspect": "it reads the interpreter's frames (currentframe, stack) and the evaluator's code",
    "gc": "gc.get_objects and gc.get_referrers walk every object of the process, the evaluator's too",
}
RNG_STATE = frozenset(
    {
        "torch.initial_seed",
        "torch.random.initial_seed",
        "torch.cuda.initial_seed",
        "torch.get_rng_state",
        "torch.random.get_rng_state",
        "torch.cuda.get_rng_state",
        "torch.cuda.get_rng_state_all",
        "torch.default_generator",
        "torch.random.default_generator",
        "torch.cuda.default_generators",
    }
)
RNG_STATE_METHODS = frozenset({"initial_seed", "get_rng_state", "get_rng_state_all"})

STREAM_CLASSES = frozenset({"torch.cuda.Stream", "torch.Stream", "torch.cuda.ExternalStream"})
STREAM_SOURCE_CALLS = ("cudaStreamCreate", "getStreamFromPool")

# Allocation, shape and bookkeeping calls: they move no data through a compute kernel.
NON_COMPUTE = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "zeros",
        "zeros_like",
        "ones",
        "ones_like",
        "full",
        "full_like",
        "arange",
        "tensor",
        "as_tensor",
        "as_strided",
        "from_numpy",
        "view",
        "view_as",
        "reshape",
        "reshape_as",
        "contiguous",
        "size",
        "shape",
        "permute",
        "transpose",
        "t",
        "flatten",
        "unflatten",
        "unsqueeze",
        "squeeze",
        "movedim",
        "swapaxes",
        "to",
        "float",
        "half",
        "double",
        "bfloat16",
        "int",
        "long",
        "bool",
        "type",
        "type_as",
        "numel",
        "dim",
        "stride",
        "storage_offset",
        "data_ptr",
        "is_contiguous",
        "cuda",
        "cpu",
        "new_empty",
        "new_zeros",
        "new_ones",
        "new_full",
        "new_tensor",
        "expand",
        "expand_as",
        "broadcast_to",
        "broadcast_tensors",
        "broadcast_shapes",
        "chunk",
        "split",
        "unbind",
        "narrow",
        "select",
        "detach",
        "clone",
        "copy_",
        "fill_",
        "zero_",
        "requires_grad_",
        "element_size",
        "item",
        "tolist",
        "get_device",
        "device",
        "is_tensor",
        "is_floating_point",
        "result_type",
        "promote_types",
        "get_default_dtype",
        "finfo",
        "iinfo",
        "manual_seed",
        "no_grad",
        "inference_mode",
        "set_grad_enabled",
        "enable_grad",
        "compile",
    }
)
NON_COMPUTE_TORCH_PREFIXES = (
    "torch.cuda.",
    "torch.utils.",
    "torch.backends.",
    "torch.autograd.",
    "torch.library.",
    "torch.nn.init.",
    "torch.jit.",
    "torch.compiler.",
    "torch.testing.",
)

# Methods called on a value of unknown type count as PyTorch ops only when they are tensor compute.
TENSOR_COMPUTE_METHODS = frozenset(
    {
        "matmul",
        "mm",
        "bmm",
        "addmm",
        "baddbmm",
        "addbmm",
        "mv",
        "dot",
        "outer",
        "einsum",
        "softmax",
        "log_softmax",
        "sum",
        "mean",
        "max",
        "min",
        "amax",
        "amin",
        "argmax",
        "argmin",
        "prod",
        "cumsum",
        "cumprod",
        "logsumexp",
        "norm",
        "var",
        "std",
        "relu",
        "relu_",
        "sigmoid",
        "sigmoid_",
        "tanh",
        "tanh_",
        "exp",
        "exp_",
        "log",
        "log_",
        "sqrt",
        "rsqrt",
        "pow",
        "abs",
        "neg",
        "reciprocal",
        "sin",
        "cos",
        "erf",
        "clamp",
        "clamp_",
        "clamp_min",
        "clamp_max",
        "add",
        "add_",
        "sub",
        "sub_",
        "mul",
        "mul_",
        "div",
        "div_",
        "maximum",
        "minimum",
        "where",
        "masked_fill",
        "masked_fill_",
        "square",
        "lerp",
        "sort",
        "topk",
        "gather",
        "scatter",
        "scatter_add",
        "index_select",
        "addcmul",
        "addcdiv",
        "floor",
        "ceil",
        "round",
        "sign",
    }
)
# nn modules that hold no compute worth a kernel, or are containers called element by element.
NON_COMPUTE_MODULES = frozenset(
    {"Identity", "Flatten", "Unflatten", "Parameter", "ParameterList", "ParameterDict", "ModuleList", "ModuleDict", "Buffer"}
)

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef
Key = tuple[str | None, str]
"""A function: (its class, or None at module level; its name)."""


@dataclass
class Function:
    """A module-level function or a method of a module-level class; nested code counts as its own."""

    name: str
    owner: str | None
    node: FunctionNode
    calls: list[ast.Call] = field(default_factory=list)
    loads: list[ast.expr] = field(default_factory=list)
    returns: list[ast.expr] = field(default_factory=list)
    matmuls: list[ast.BinOp] = field(default_factory=list)

    @property
    def key(self) -> Key:
        return (self.owner, self.name)


@dataclass(frozen=True)
class Binding:
    """`target = value`: a plain name, or (on_self) `self.target = ...` or a class attribute of `owner`."""

    target: str
    on_self: bool
    owner: str | None
    value: ast.expr


@dataclass
class Facts:
    """What one pass over the module found; names are resolved later, once every import is known."""

    tree: ast.Module
    aliases: dict[str, str] = field(default_factory=dict)
    """Local name to the dotted path it stands for (`T` -> `torch`, `cuda` -> `torch.cuda`)."""
    imports: list[tuple[str, ast.stmt]] = field(default_factory=list)
    star_imports: list[ast.ImportFrom] = field(default_factory=list)
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    functions: dict[Key, Function] = field(default_factory=dict)
    bindings: list[Binding] = field(default_factory=list)
    tries: list[ast.stmt] = field(default_factory=list)
    exits: list[FunctionNode] = field(default_factory=list)
    stores: list[ast.Attribute | ast.Subscript] = field(default_factory=list)
    """Attribute and subscript targets of assignment, augmented assignment, for, with and del."""
    calls: list[ast.Call] = field(default_factory=list)
    loads: list[ast.expr] = field(default_factory=list)
    """Every name and attribute read, anywhere."""
    strings: list[tuple[ast.Constant, str]] = field(default_factory=list)
    """String constants, each with its text."""
    triton_kernels: dict[str, FunctionNode] = field(default_factory=dict)

    def resolve(self, expr: ast.expr) -> str | None:
        """The dotted module path an expression stands for, or None if it is not reached from a module."""
        if isinstance(expr, ast.Name):
            if expr.id in self.aliases:
                return self.aliases[expr.id]
            return expr.id if expr.id in ROOT_MODULES else None
        if isinstance(expr, ast.Attribute):
            base = self.resolve(expr.value)
            return f"{base}.{expr.attr}" if base is not None else None
        return None

    def is_load_call(self, call: ast.Call) -> bool:
        if isinstance(call.func, ast.Name) and call.func.id == "load_inline":
            return True
        return self.resolve(call.func) in LOAD_FUNCTIONS

    def mro(self, cls: str) -> list[str]:
        """The class and its bases defined in this module, nearest first."""
        order: list[str] = []
        todo = [cls]
        while todo:
            name = todo.pop(0)
            if name in order or name not in self.classes:
                continue
            order.append(name)
            todo.extend(b.id for b in self.classes[name].bases if isinstance(b, ast.Name))
        return order

    def method(self, cls: str, name: str) -> Key | None:
        for owner in self.mro(cls):
            if (owner, name) in self.functions:
                return (owner, name)
        return None

    def self_bindings(self, cls: str) -> Iterator[Binding]:
        owners = set(self.mro(cls))
        return (b for b in self.bindings if b.on_self and b.owner in owners)


class _Collector(ast.NodeVisitor):
    """The one pass: records facts and leaves every judgement to the rules."""

    def __init__(self, tree: ast.Module) -> None:
        self.facts = Facts(tree)
        self._class: str | None = None
        self._function: Function | None = None

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            root = alias.name.split(".")[0]
            self.facts.aliases[alias.asname or root] = alias.name if alias.asname else root
            self.facts.imports.append((alias.name, node))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = "." * node.level + (node.module or "")
        for alias in node.names:
            if alias.name == "*":
                self.facts.star_imports.append(node)
                continue
            path = f"{module}.{alias.name}"
            self.facts.aliases[alias.asname or alias.name] = path
            self.facts.imports.append((path, node))

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if self._function is not None:
            self.generic_visit(node)
            return
        # A class nested in a class body (an autograd.Function kept inside ModelNew, say) is its own class.
        self.facts.classes[node.name] = node
        outer, self._class = self._class, node.name
        self.generic_visit(node)
        self._class = outer

    def visit_FunctionDef(self, node: FunctionNode) -> None:
        if node.name == "__exit__":
            self.facts.exits.append(node)
        if self._function is not None:
            self.generic_visit(node)
            return
        function = Function(node.name, self._class, node)
        self.facts.functions[function.key] = function
        self._function = function
        self.generic_visit(node)
        self._function = None

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Try(self, node: ast.stmt) -> None:
        self.facts.tries.append(node)
        self.generic_visit(node)

    visit_TryStar = visit_Try

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._bind(target, node.value)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._bind(node.target, node.value)
        self.generic_visit(node)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self._bind(node.target, node.value)
        self.generic_visit(node)

    def _bind(self, target: ast.expr, value: ast.expr) -> None:
        if isinstance(target, ast.Name):
            # A name bound in a class body is a class attribute: methods reach it as self.name.
            in_class_body = self._class is not None and self._function is None
            self.facts.bindings.append(Binding(target.id, in_class_body, self._class, value))
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
            self.facts.bindings.append(Binding(target.attr, True, self._class, value))
        elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) and len(target.elts) == len(value.elts):
            for t, v in zip(target.elts, value.elts, strict=True):
                self._bind(t, v)

    def visit_Call(self, node: ast.Call) -> None:
        self.facts.calls.append(node)
        if self._function is not None:
            self._function.calls.append(node)
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        self._access(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._access(node)
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if not isinstance(node.ctx, ast.Load):
            self.facts.stores.append(node)
        self.generic_visit(node)

    def _access(self, node: ast.Name | ast.Attribute) -> None:
        if isinstance(node.ctx, ast.Load):
            self.facts.loads.append(node)
            if self._function is not None:
                self._function.loads.append(node)
        elif isinstance(node, ast.Attribute):
            self.facts.stores.append(node)

    def visit_Return(self, node: ast.Return) -> None:
        if node.value is not None and self._function is not None:
            self._function.returns.append(node.value)
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult) and self._function is not None:
            self._function.matmuls.append(node)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            self.facts.strings.append((node, node.value))


def collect(tree: ast.Module) -> Facts:
    collector = _Collector(tree)
    collector.visit(tree)
    facts = collector.facts
    _add_assigned_aliases(facts)
    facts.triton_kernels = {
        fn.name: fn.node
        for fn in facts.functions.values()
        if fn.owner is None and any(_decorator_path(facts, d) == "triton.jit" for d in fn.node.decorator_list)
    }
    return facts


def _add_assigned_aliases(facts: Facts) -> None:
    # `sync = torch.cuda` makes `sync.synchronize = f` as much a patch as the direct form.
    changed = True
    while changed:
        changed = False
        for b in facts.bindings:
            if b.on_self or b.target in facts.aliases:
                continue
            path = facts.resolve(b.value)
            if path is not None:
                facts.aliases[b.target] = path
                changed = True


def _decorator_path(facts: Facts, decorator: ast.expr) -> str | None:
    return facts.resolve(decorator.func if isinstance(decorator, ast.Call) else decorator)


@dataclass
class Kernels:
    """What stands for a custom kernel under one backend, found by following assignments."""

    facts: Facts
    names: set[str]
    self_attrs: dict[str | None, set[str]] = field(default_factory=dict)
    factories: set[Key] = field(default_factory=set)
    namespaces: set[str] = field(default_factory=set)
    """torch.ops namespaces the extensions register (for is_python_module=False)."""

    def attrs_of(self, cls: str | None) -> set[str]:
        if cls is None:
            return set()
        return set().union(*(self.self_attrs.get(c, set()) for c in self.facts.mro(cls)))

    def refers(self, expr: ast.expr, cls: str | None) -> bool:
        """Whether `expr` is an extension, a kernel function or a launcher, with `self` an instance of cls."""
        if isinstance(expr, ast.Name):
            return expr.id in self.names
        if isinstance(expr, ast.Attribute):
            if isinstance(expr.value, ast.Name) and expr.value.id == "self" and expr.attr in self.attrs_of(cls):
                return True
            path = self.facts.resolve(expr)
            if path is not None and any(path.startswith(f"torch.ops.{ns}.") for ns in self.namespaces):
                return True
            return self.refers(expr.value, cls)
        if isinstance(expr, ast.Subscript):
            return self.refers(expr.value, cls)
        if isinstance(expr, ast.IfExp):
            return self.refers(expr.body, cls) or self.refers(expr.orelse, cls)
        if isinstance(expr, ast.Call):
            return self._returns_kernel(expr, cls)
        return False

    def _returns_kernel(self, call: ast.Call, cls: str | None) -> bool:
        func = call.func
        if self.facts.is_load_call(call):
            return True
        if isinstance(func, ast.Name) and func.id == "getattr" and call.args:
            return self.refers(call.args[0], cls)
        if isinstance(func, ast.Name):
            return (None, func.id) in self.factories
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
            return cls is not None and self.facts.method(cls, func.attr) in self.factories
        return False

    def is_kernel_call(self, call: ast.Call, cls: str | None) -> bool:
        return not self.facts.is_load_call(call) and self.refers(call.func, cls)


def find_kernels(facts: Facts, backend: str) -> Kernels:
    names = set(facts.triton_kernels) if backend == "triton" else set()
    kernels = Kernels(facts, names, namespaces=_op_namespaces(facts))
    changed = True
    while changed:
        changed = False
        for b in facts.bindings:
            bound = kernels.self_attrs.setdefault(b.owner, set()) if b.on_self else kernels.names
            if b.target not in bound and kernels.refers(b.value, b.owner):
                bound.add(b.target)
                changed = True
        for key, fn in facts.functions.items():
            if key not in kernels.factories and any(kernels.refers(r, fn.owner) for r in fn.returns):
                kernels.factories.add(key)
                changed = True
    return kernels


def _op_namespaces(facts: Facts) -> set[str]:
    namespaces = set()
    for call in facts.calls:
        if facts.is_load_call(call):
            name = next((k.value for k in call.keywords if k.arg == "name"), call.args[0] if call.args else None)
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                namespaces.add(name.value)
    for _, text in facts.strings:
        for chunk in text.split("TORCH_LIBRARY")[1:]:
            # TORCH_LIBRARY(ns, m) and TORCH_LIBRARY_IMPL(ns, CUDA, m): the namespace is the first argument.
            args = chunk.split("(", 1)[-1]
            namespaces.add(args.split(",", 1)[0].strip())
    return namespaces


@dataclass(frozen=True)
class Reached:
    """A function reachable from ModelNew.forward, with the class `self` is an instance of there."""

    function: Function
    self_class: str | None


def reachable(facts: Facts, seeds: Iterable[Reached]) -> list[Reached]:
    seen: dict[Key, Reached] = {}
    todo = list(seeds)
    while todo:
        here = todo.pop()
        if here.function.key in seen:
            continue
        seen[here.function.key] = here
        for load in here.function.loads:
            todo.extend(_callees(facts, load, here.self_class))
    return list(seen.values())


def forward_reach(facts: Facts) -> list[Reached]:
    """ModelNew.forward and every function and method it can run; empty when there is no forward."""
    forward = facts.method("ModelNew", "forward")
    if forward is None:
        return []
    seeds = [Reached(facts.functions[forward], "ModelNew")]
    init = facts.method("ModelNew", "__init__")
    if init is not None:
        # Blocks built in __init__ run in forward even when it reaches them by a loop over an nn.ModuleList.
        own = set(facts.mro("ModelNew"))
        for load in facts.functions[init].loads:
            if isinstance(load, ast.Name) and load.id in facts.classes and load.id not in own:
                seeds.extend(_methods(facts, load.id))
    return reachable(facts, seeds)


def _callees(facts: Facts, load: ast.expr, self_class: str | None) -> Iterator[Reached]:
    if isinstance(load, ast.Name):
        if (None, load.id) in facts.functions and load.id not in facts.triton_kernels:
            yield Reached(facts.functions[(None, load.id)], None)
        elif load.id in facts.classes:
            yield from _methods(facts, load.id)
        return
    if not isinstance(load, ast.Attribute) or self_class is None:
        return
    target = load.value
    if isinstance(target, ast.Name) and target.id == "self":
        key = facts.method(self_class, load.attr)
        if key is not None:
            yield Reached(facts.functions[key], self_class)
        elif load.attr in facts.classes:
            yield from _methods(facts, load.attr)
        for b in facts.self_bindings(self_class):
            if (
                b.target == load.attr
                and isinstance(b.value, ast.Call)
                and isinstance(b.value.func, ast.Name)
                and b.value.func.id in facts.classes
            ):
                yield from _methods(facts, b.value.func.id)
    elif isinstance(target, ast.Call) and isinstance(target.func, ast.Name) and target.func.id == "super":
        for base in facts.mro(self_class)[1:]:
            if (base, load.attr) in facts.functions:
                yield Reached(facts.functions[(base, load.attr)], self_class)
                return


def _methods(facts: Facts, cls: str) -> Iterator[Reached]:
    # backward never runs in an inference-only evaluation; its torch ops are not worth a warning.
    for owner in facts.mro(cls):
        for (fn_owner, name), fn in facts.functions.items():
            if fn_owner == owner and name != "backward":
                yield Reached(fn, cls)


def _line(node: ast.AST) -> int:
    return getattr(node, "lineno", 0)


def _model_new(facts: Facts) -> ast.ClassDef | None:
    return next((n for n in facts.tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"), None)


def check_model_new(facts: Facts) -> list[str]:
    if _model_new(facts) is not None:
        return []
    return [
        "the module defines no `class ModelNew(nn.Module)` at its top level; define ModelNew there, with the "
        "same constructor arguments and forward signature as the reference Model"
    ]


def check_fallbacks(facts: Facts) -> list[str]:
    found = [
        f"line {_line(t)}: try/except is not allowed anywhere in a candidate (it is how a kernel falls back "
        "to PyTorch when it fails); remove it and let errors surface so they can be fixed"
        for t in facts.tries
    ]
    found += [
        f"line {_line(load)}: contextlib.suppress swallows the kernel's exceptions like try/except; remove it and let errors surface"
        for load in facts.loads
        if facts.resolve(load) == "contextlib.suppress"
    ]
    found += [
        f"line {_line(fn)}: defines __exit__; a context manager can swallow the kernel's exceptions like "
        "try/except, so candidates may not define one"
        for fn in facts.exits
    ]
    return found


def check_introspection(facts: Facts) -> list[str]:
    """The module table, frames, gc and torch's RNG state: how a candidate would reach into the
    evaluator (its timer, its reference, its inputs' seed) from Python. A second line, an audit
    hook in the candidate's process (tools/guards/audit.py), refuses the same at run time."""
    found: dict[tuple[int, str], str] = {}
    # What a store or a mutating call writes through: `sys.modules["t"].perf_counter = f` patches too.
    written = {id(n) for t in facts.stores for n in _receivers(t.value)}
    written |= {
        id(n)
        for c in facts.calls
        if isinstance(c.func, ast.Attribute) and c.func.attr in SYS_MODULES_MUTATORS
        for n in _receivers(c.func.value)
    }
    for path, node in facts.imports:
        module = path.split(".")[0]
        line = _line(node)
        if module in INTROSPECTION_MODULES:
            found[(line, module)] = f"line {line}: imports {path}; {INTROSPECTION_MODULES[module]}; a kernel never needs it, so remove it"
        elif path == "sys.modules" or path in FRAME_ACCESS or path in RNG_STATE:
            found.setdefault((line, _introspection_kind(path)), _introspection_message(path, line, written=False))
    for load in facts.loads:
        resolved = facts.resolve(load)
        line = _line(load)
        if resolved == "sys.modules" or resolved in FRAME_ACCESS or resolved in RNG_STATE:
            assert resolved is not None
            message = _introspection_message(resolved, line, written=id(load) in written)
            key = (line, _introspection_kind(resolved))
            # `sys.modules["x"] = sys.modules["y"]` is said once, and as the patch it is.
            if key not in found or "patches" in message:
                found[key] = message
        elif resolved is None and isinstance(load, ast.Attribute) and load.attr in RNG_STATE_METHODS:
            found.setdefault((line, "rng"), _introspection_message(f"...{load.attr}", line, written=False))
    return [found[key] for key in sorted(found)]


def _receivers(expr: ast.expr) -> Iterator[ast.expr]:
    """`a.b[c].d` and the expressions it is reached through: a.b[c], a.b, a."""
    while isinstance(expr, (ast.Attribute, ast.Subscript)):
        yield expr
        expr = expr.value
    yield expr


def _introspection_kind(path: str) -> str:
    return "modules" if path == "sys.modules" else "frames" if path in FRAME_ACCESS else "rng"


def _introspection_message(path: str, line: int, written: bool) -> str:
    if path == "sys.modules":
        verb = "patches the module table through" if written else "reads the module table through"
        return (
            f"line {line}: {verb} sys.modules; a module reached that way can be the evaluator's or a replaced one, so "
            "import what you need with ordinary import statements and leave sys.modules alone"
        )
    if path in FRAME_ACCESS:
        return (
            f"line {line}: uses {path}, which reaches the interpreter's frames or tracing (the evaluator's among them); "
            "compute the output from forward's arguments alone"
        )
    return (
        f"line {line}: reads torch's random-number state ({path.removeprefix('...')}); the inputs' seed is the "
        "evaluator's business, so compute the output from the inputs alone, the same for any seed"
    )


def check_patching(facts: Facts) -> list[str]:
    found = []
    for target in facts.stores:
        path = facts.resolve(target.value)
        if path is None or path in OS_ENVIRONMENT or path == "sys.modules":
            continue  # sys.modules has its own message (check_introspection)
        verb = "deletes" if isinstance(target.ctx, ast.Del) else "assigns"
        found.append(
            f"line {_line(target)}: {verb} {ast.unparse(target)}, patching the module `{path}`; timers, "
            "synchronisation and library state must stay as they are, so put the speedup in your kernel"
        )
    for call in facts.calls:
        found += _patching_call(facts, call)
    for path, node in facts.imports:
        if path.split(".")[0] == "builtins":
            found.append(f"line {_line(node)}: imports builtins; a kernel never needs it, and patching builtins is not allowed")
    found += [
        f"line {_line(load)}: touches __builtins__; leave the builtins alone"
        for load in facts.loads
        if isinstance(load, ast.Name) and load.id == "__builtins__"
    ]
    return found


def _patching_call(facts: Facts, call: ast.Call) -> list[str]:
    func = call.func
    first = call.args[0] if call.args else None
    if isinstance(func, ast.Name) and func.id in ("setattr", "delattr") and first is not None:
        path = facts.resolve(first)
    elif isinstance(func, ast.Attribute) and func.attr in ("__setattr__", "__delattr__"):
        path = facts.resolve(func.value) or (facts.resolve(first) if first is not None else None)
    else:
        return []
    if path is None:
        return []
    return [
        f"line {_line(call)}: {ast.unparse(func)}(...) patches the module `{path}`; timers, synchronisation and "
        "library state must stay as they are, so put the speedup in your kernel"
    ]


def check_escapes(facts: Facts) -> list[str]:
    found = []
    for imported, node in facts.imports:
        if imported.split(".")[0] in FORBIDDEN_MODULES or any(imported.startswith(m) for m in FORBIDDEN_SUBMODULES):
            found.append(
                f"line {_line(node)}: imports {imported}; threads, subprocesses, signals, sockets and ctypes are not "
                "allowed in a candidate, so do the work in your kernel on the calling thread"
            )
    found += [
        f"line {_line(node)}: `from {node.module} import *` hides which names the code uses from this check; import the names you need"
        for node in facts.star_imports
    ]
    for load in facts.loads:
        path = facts.resolve(load)
        if path is None:
            continue
        module, _, name = path.rpartition(".")
        if module == "os" and (name in OS_PROCESS_CALLS or name.startswith(("exec", "spawn"))):
            found.append(
                f"line {_line(load)}: uses {path}; starting, killing or leaving processes is not allowed, so do "
                "the work in your kernel inside this process"
            )
        elif path in OS_ENVIRONMENT:
            found.append(f"line {_line(load)}: uses {path}; the environment is not part of the task, so neither read nor change it")
    for call in facts.calls:
        func = call.func
        if (isinstance(func, ast.Name) and func.id in DYNAMIC_CODE) or facts.resolve(func) in DYNAMIC_IMPORTS:
            found.append(
                f"line {_line(call)}: {ast.unparse(func)}(...) runs code this check cannot see; write it as "
                "plain Python with ordinary import statements"
            )
    return found


TENSOR_CLASSES = frozenset({"torch.Tensor", "torch._C.TensorBase", "torch._C._TensorBase", "torch.nn.Parameter"})
INTERCEPT_METHODS = frozenset({"__torch_function__", "__torch_dispatch__"})
SUBCLASS_BUILDERS = frozenset({"_make_subclass", "_make_wrapper_subclass", "as_subclass"})
INTERCEPT_MODULES = ("torch.overrides", "torch.utils._python_dispatch", "torch._subclasses")


def check_deferred_outputs(facts: Facts) -> list[str]:
    """Tensor subclasses and operator interception: an output that computes when looked at."""
    found = []
    for node in ast.walk(facts.tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                if facts.resolve(base) in TENSOR_CLASSES:
                    found.append(
                        f"line {_line(base)}: class {node.name} subclasses {ast.unparse(base)}; a tensor subclass can "
                        "defer the work until its values are read, so return plain tensors your kernel has filled"
                    )
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in INTERCEPT_METHODS:
            found.append(
                f"line {_line(node)}: defines {node.name}, which intercepts PyTorch operators; "
                "compute the output in your kernel during forward instead"
            )
    for imported, stmt in facts.imports:
        if imported.startswith(INTERCEPT_MODULES):
            found.append(
                f"line {_line(stmt)}: imports {imported}, which intercepts operators or builds tensor subclasses; "
                "return plain tensors computed by your kernel"
            )
    for load in facts.loads:
        path = facts.resolve(load)
        attr = load.attr if isinstance(load, ast.Attribute) else None
        if attr in SUBCLASS_BUILDERS or (path is not None and path.startswith(INTERCEPT_MODULES)):
            found.append(
                f"line {_line(load)}: uses {ast.unparse(load)}, which builds tensor subclasses or intercepts "
                "operators; return plain tensors computed by your kernel"
            )
    return found


def check_reference_use(facts: Facts) -> list[str]:
    model_new = _model_new(facts)
    bases = [b for b in model_new.bases if _names_model(b)] if model_new is not None else []
    found = [
        f"line {_line(b)}: ModelNew subclasses the reference `{ast.unparse(b)}`; subclass nn.Module and write forward with your own kernels"
        for b in bases
    ]
    found += [
        f"line {_line(load)}: uses the reference `{ast.unparse(load)}`; ModelNew must not create, call or "
        "inherit from Model, since that runs the reference instead of your kernels"
        for load in facts.loads
        if _names_model(load) and all(load is not b for b in bases)
    ]
    return found


def _names_model(expr: ast.expr) -> bool:
    return (isinstance(expr, ast.Name) and expr.id == "Model") or (isinstance(expr, ast.Attribute) and expr.attr == "Model")


def check_has_kernel(facts: Facts, backend: str) -> list[str]:
    if any(facts.is_load_call(c) for c in facts.calls):
        return []
    if backend == "triton" and facts.triton_kernels:
        return []
    if facts.triton_kernels:
        name, node = next(iter(facts.triton_kernels.items()))
        return [
            f"line {_line(node)}: the backend is {backend}, so the kernel must be built with "
            f"torch.utils.cpp_extension.load_inline; the @triton.jit function `{name}` does not count here, so "
            "write it in C++/CUDA and call the extension from ModelNew.forward"
        ]
    if backend == "triton":
        return [
            "no custom kernel: the source defines no @triton.jit function and never calls "
            "torch.utils.cpp_extension.load_inline or load; write the computation as a Triton kernel and "
            "launch it from ModelNew.forward"
        ]
    return [
        "no custom kernel: the source never calls torch.utils.cpp_extension.load_inline or load; write the "
        "computation as a load_inline extension and call it from ModelNew.forward"
    ]


def check_forward_calls_kernel(facts: Facts, kernels: Kernels, reached: list[Reached]) -> list[str]:
    forward = facts.method("ModelNew", "forward")
    if forward is None:
        line = _line(facts.classes["ModelNew"])
        return [f"line {line}: ModelNew has no forward method; define forward and call your kernel in it"]
    if any(kernels.is_kernel_call(c, r.self_class) for r in reached for c in r.function.calls):
        return []
    line = _line(facts.functions[forward].node)
    bound = sorted(kernels.names | {f"self.{a}" for a in kernels.attrs_of("ModelNew")})
    if not bound:
        return [
            f"line {line}: ModelNew.forward never calls a custom kernel, and the result of load_inline is never "
            "kept; write `ext = load_inline(...)` (or `self.ext = ...`) and call `ext.your_function(x)` in forward"
        ]
    return [
        f"line {line}: ModelNew.forward never calls a custom kernel: nothing it reaches calls "
        f"{', '.join(bound)} (an extension's function, or a Triton kernel launched as kernel[grid](...)); "
        "call your kernel from forward"
    ]


def warn_torch_ops(facts: Facts, kernels: Kernels, reached: list[Reached]) -> list[str]:
    ops: set[tuple[int, str]] = set()
    for r in reached:
        modules = _nn_module_attrs(facts, r.self_class)
        for call in r.function.calls:
            op = None if kernels.is_kernel_call(call, r.self_class) else _torch_op(facts, call, modules)
            if op is not None:
                ops.add((_line(call), op))
        ops.update((_line(m), "@") for m in r.function.matmuls)
    if not ops:
        return []
    listed = ", ".join(f"{op} (line {line})" for line, op in sorted(ops))
    return [
        f"forward still calls PyTorch compute ops: {listed}; the evaluator rejects a candidate that runs every "
        "compute op of the reference, and each of these is a chance to fuse into your kernel"
    ]


def _nn_module_attrs(facts: Facts, cls: str | None) -> set[str]:
    if cls is None:
        return set()
    attrs = set()
    for b in facts.self_bindings(cls):
        path = facts.resolve(b.value.func) if isinstance(b.value, ast.Call) else None
        if path is not None and path.startswith("torch.nn."):
            name = path.rsplit(".", 1)[1]
            if name[:1].isupper() and name not in NON_COMPUTE_MODULES:
                attrs.add(b.target)
    return attrs


def _torch_op(facts: Facts, call: ast.Call, modules: set[str]) -> str | None:
    """How to name the PyTorch compute op a call runs, or None when it runs none."""
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        return f"self.{func.attr}" if func.attr in modules else None
    path = facts.resolve(func)
    if path is None:
        # The receiver's type is unknown: only a tensor compute method's name gives it away.
        return ast.unparse(func) if isinstance(func, ast.Attribute) and func.attr in TENSOR_COMPUTE_METHODS else None
    if not path.startswith("torch.") or path.startswith(NON_COMPUTE_TORCH_PREFIXES):
        return None
    name = path.rsplit(".", 1)[1]
    if name in NON_COMPUTE or name[:1].isupper():
        return None
    return ast.unparse(func)


def warn_streams(facts: Facts) -> list[str]:
    advice = "timing synchronises every stream, so a side stream hides no work and only adds overhead; launch on the current stream"
    found = [
        f"line {_line(load)}: creates a CUDA stream ({ast.unparse(load)}); {advice}"
        for load in facts.loads
        if facts.resolve(load) in STREAM_CLASSES
    ]
    for node, text in facts.strings:
        for needle in STREAM_SOURCE_CALLS:
            at = text.find(needle)
            if at >= 0:
                line = _line(node) + text.count("\n", 0, at)
                found.append(f"line {line}: the kernel source creates a CUDA stream ({needle}); {advice}")
    return found


def _syntax_error(error: SyntaxError) -> str:
    text = (error.text or "").strip()
    shown = f" in `{text}`" if text else ""
    return f"line {error.lineno}: syntax error: {error.msg}{shown}; fix the Python so the module can be imported"


def _unique(messages: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(messages))


def check_candidate(source: str, backend: str = "cpp") -> StaticReport:
    """Reject what must never run (fallbacks, patches, escapes, no kernel) and warn about leftover torch ops."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        return StaticReport(rejections=(_syntax_error(error),))
    except ValueError as error:
        # Python 3.11 reports null bytes in the source as ValueError, later versions as SyntaxError.
        return StaticReport(rejections=(f"the source cannot be parsed: {error}; send plain Python text",))
    facts = collect(tree)
    kernels = find_kernels(facts, backend)
    reached = forward_reach(facts) if _model_new(facts) is not None else []
    rejections = [
        *check_model_new(facts),
        *check_fallbacks(facts),
        *check_introspection(facts),
        *check_patching(facts),
        *check_escapes(facts),
        *check_reference_use(facts),
        *check_deferred_outputs(facts),
    ]
    missing_kernel = check_has_kernel(facts, backend)
    rejections += missing_kernel
    if _model_new(facts) is not None and not missing_kernel:
        rejections += check_forward_calls_kernel(facts, kernels, reached)
    warnings = [*warn_torch_ops(facts, kernels, reached), *warn_streams(facts)]
    return StaticReport(rejections=_unique(rejections), warnings=_unique(warnings))


def kernel_bindings(source: str, backend: str = "triton") -> set[str]:
    """Names bound to an extension or a kernel: module-level names, and self attributes as `self.name`.

    Raises SyntaxError on a source that does not parse; check_candidate reports that instead.
    """
    kernels = find_kernels(collect(ast.parse(source)), backend)
    return kernels.names | {f"self.{a}" for attrs in kernels.self_attrs.values() for a in attrs}
