"""Shape and init variants of a task: which other values of its module-level constants the candidate
is also checked on. Chosen here, in the judge; run against the candidate by
tools/steps/correctness.py (`check_variants`).

A KernelBench task fixes its sizes in constants that `get_inputs()` and `get_init_inputs()` read.
A kernel can hard-code them (a grid for exactly 16384 columns, a loop without a tail for sizes that
are not a multiple of 8, a block that assumes `in_channels == 3`) and still pass every check at the
task's own values. The variants, at most four, each a copy of the task with some constants set
otherwise (tools/steps/task_constants.py):

- larger: the largest size grown by about an eighth, to an odd number (16384 -> 18433);
- odd: every even size to the odd number just below it (16 -> 15, 1024 -> 1023; 4095 stays);
- small: a batch size to 1, every other size to the largest of 3, 17, 127, 1000 at most a quarter
  of it (else 1);
- init: each hyper-parameter of `get_init_inputs()` that is not a size (a kernel size, a stride, a
  reduced dimension, a scale) one up, or one down where up fails (a float halved; an epsilon under
  TINY_FLOAT left alone).

Sizes are the ints (and int tuples) `get_inputs()` reads, directly, through helpers or through
constants derived from them, and the ints of 8 or more only `get_init_inputs()` reads (a layer's
width). Each variant is first run on the meta device, which builds the reference and gives its
outputs' structure, bytes and FLOPs without computing anything:
- where the reference raises (a size that must divide another, a kernel larger than its input),
  the variant is repaired (`repairs`): the constants that divided each other in the task are made
  to divide again, one relation at a time, then a layer's, then those whose divisor the variant
  keeps, then all; then the variant without the layer widths, then without sizes under 8 as well;
  for `small`, the next size of the ladder; then it is not applicable;
- where the outputs change structure (count, dtype, rank), it is not applicable;
- where its bytes or estimated time exceed BUDGET times the task's own, it is not applicable.
A task whose reference does not run on the meta device (`.item()`, data-dependent shapes), or runs
there slower than META_DEADLINE_S (a recurrent network, op by op), has only its inputs' bytes held
to the budget here: its variants go to the check with up to MAX_FALLBACKS other values each, and
the reference's real run there decides (`settle`). What is decided here depends only on the task,
its precision and device: it is kept per judge process (`resolve`).
"""

from __future__ import annotations

import contextlib
import dis
import math
import re
import signal
import threading
import time
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal

import structlog
import torch

from kernel_refinery.tools.processes.programs import Program, cast_floats, tensors_of
from kernel_refinery.tools.steps.roofline import OpCost, roofline_ms
from kernel_refinery.tools.steps.task_constants import Constant, Overrides, Value, dependencies, literal_constants

log = structlog.get_logger()

SMALL_SIZES = (1, 3, 17, 127, 1000)
"""Sizes that are not multiples of a vector width or a warp (1000 is of 8, never of 32)."""
WIDTH_OF_LAYER = 8
"""An int only get_init_inputs reads is a size (a layer's width) from this value up, else a hyper-parameter."""
TINY_FLOAT = 1e-3
"""A float hyper-parameter smaller than this is an epsilon: halving it shows nothing, and costs a variant."""
BUDGET = 1.5
"""A variant's bytes (inputs and outputs) and estimated time, at most this many times the task's own."""
META_DEADLINE_S = 2.0
"""The longest one probe of the reference on the meta device may take."""
META_TOTAL_S = 5.0
"""A task's probes on the meta device, all together (once per judge): later attempts go to the
check unjudged, as fallbacks."""
MAX_FALLBACKS = 2
"""Other values an unverified variant may try when the reference refuses it (each a real run)."""

Kind = Literal["shape", "init"]

Structure = tuple[tuple[str, int], ...]
"""(dtype, rank) of each output tensor of a call."""


@dataclass(frozen=True)
class Plan:
    """One variant as chosen here: what it sets, or why it does not apply."""

    name: str
    kind: Kind
    overrides: Overrides
    skip: str = ""
    """Why it is not applicable (the reference refuses it, or the budget); "" to run it."""
    fallbacks: tuple[Overrides, ...] = ()
    """Where the meta device could not judge the variant: other values to try, in order, when the
    reference refuses `overrides` in its real run (the check settles the plan then: `settle`)."""


@dataclass(frozen=True)
class Footprint:
    """One call of the reference, as far as its variant's choice needs it."""

    structure: Structure
    """(dtype, rank) of each output tensor."""
    nbytes: int
    """Inputs and outputs."""
    seconds: float
    """Its roofline estimate on the device (0 where unknown)."""


@dataclass(frozen=True)
class Variants:
    """A task's variants and the values the task itself gives the constants they change."""

    plans: tuple[Plan, ...]
    constants: dict[str, Value]
    structure: Structure | None
    """The task's own outputs' structure, to hold a variant's to (None where it could not be had)."""


# --- which constants a function reads -------------------------------------------------------------


def _loads(code: types.CodeType) -> set[str]:
    names: set[str] = set()
    stack = [code]
    while stack:
        current = stack.pop()
        names.update(str(i.argval) for i in dis.get_instructions(current) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME"))
        stack.extend(c for c in current.co_consts if isinstance(c, types.CodeType))
    return names


def global_reads(function: Callable[..., Any], module: types.ModuleType, derived: dict[str, set[str]]) -> set[str]:
    """The module-level names `function` reads: directly, through the module's other functions it
    calls, and through the names the module derives them from."""
    namespace = vars(module)
    seen: set[str] = set()
    pending = [function]
    names: set[str] = set()
    while pending:
        current = pending.pop()
        code = getattr(current, "__code__", None)
        if code is None:
            continue
        for name in _loads(code) - names:
            names.add(name)
            value = namespace.get(name)
            if isinstance(value, types.FunctionType) and value.__globals__ is namespace and name not in seen:
                seen.add(name)
                pending.append(value)
    todo = list(names)
    while todo:
        for source in derived.get(todo.pop(), ()):
            if source not in names:
                names.add(source)
                todo.append(source)
    return names


# --- the values of each variant ---------------------------------------------------------------------


def _odd_at_least(n: int) -> int:
    return n if n % 2 else n + 1


def _larger(v: int) -> int:
    return _odd_at_least(v + max(1, v // 8))


def _odd_below(v: int) -> int:
    """v itself where it is odd already, else the odd number just below it."""
    return v if v % 2 else v - 1


def _small(v: int, step: int = 0) -> int:
    """The largest of SMALL_SIZES at most a quarter of v (`step` sizes further up the ladder), else 1."""
    fitting = [s for s in SMALL_SIZES if s <= v // 4]
    if not fitting:
        return 1
    index = min(len(fitting) - 1 + step, len(SMALL_SIZES) - 1)
    return min(SMALL_SIZES[index], max(1, v - 1))


def _each(value: Value, change: Callable[[int], int]) -> Value:
    if isinstance(value, tuple):
        return tuple(change(v) for v in value)
    assert isinstance(value, int)
    return change(value)


def _is_size(value: Value) -> bool:
    if isinstance(value, tuple):
        return all(v >= 1 for v in value)
    return type(value) is int and value >= 1


def _largest(value: Value) -> int:
    return max(value) if isinstance(value, tuple) else int(value)


def _param_choices(value: Value) -> list[Value]:
    """A hyper-parameter's other values, the first preferred."""
    if isinstance(value, float):
        return [value / 2] if value != 0 else [0.5]
    if isinstance(value, tuple):
        ups: Value = tuple(v + 1 for v in value)
        downs: Value = tuple(v - 1 for v in value)
        return [ups] + ([downs] if all(v >= 2 for v in value) else [])
    if value < 0:
        return [value - 1]
    choices: list[Value] = [value + 1]
    if value >= 1:
        choices.append(value - 1)
    return choices


@dataclass(frozen=True)
class Classified:
    sizes: tuple[Constant, ...]
    params: tuple[Constant, ...]
    batch: str | None
    init: frozenset[str]
    """The constants get_init_inputs reads: a constraint between two of them (channels and groups,
    width and heads) is a layer's, and repaired first."""
    inputs: frozenset[str]
    """The constants get_inputs reads."""


def classify(program: Program) -> Classified:
    """The task's literal constants that its inputs' sizes, and its hyper-parameters, come from."""
    constants = literal_constants(program.task_source)
    derived = dependencies(program.task_source)
    task = program.task
    inputs = global_reads(task.get_inputs, task, derived)
    init = global_reads(task.get_init_inputs, task, derived)
    sizes, params = [], []
    for constant in constants.values():
        value = constant.value
        if constant.name in inputs:
            if _is_size(value):
                sizes.append(constant)
        elif constant.name in init:
            if type(value) is int and value >= WIDTH_OF_LAYER:
                sizes.append(constant)
            elif not (isinstance(value, float) and abs(value) < TINY_FLOAT):
                params.append(constant)
    batch = next((c.name for c in sizes if "batch" in c.name.lower() and type(c.value) is int), None)
    return Classified(tuple(sizes), tuple(params), batch, frozenset(init), frozenset(inputs))


def shape_plans(found: Classified, small_step: int = 0) -> list[Plan]:
    """larger, odd and small, before any check; empty ones left out."""
    plans = []
    if found.sizes:
        largest = max(reversed(found.sizes), key=lambda c: _largest(c.value))
        plans.append(Plan("larger", "shape", ((largest.name, _each(largest.value, _larger)),)))
    plans.append(Plan("odd", "shape", tuple((c.name, _each(c.value, _odd_below)) for c in found.sizes)))
    small = tuple((c.name, 1 if c.name == found.batch else _each(c.value, lambda v: _small(v, small_step))) for c in found.sizes)
    plans.append(Plan("small", "shape", small))
    return [replace(p, overrides=_changed(p.overrides, found)) for p in plans if _changed(p.overrides, found)]


def _changed(overrides: Overrides, found: Classified) -> Overrides:
    own = {c.name: c.value for c in (*found.sizes, *found.params)}
    return tuple((name, value) for name, value in overrides if own.get(name) != value)


# --- constraints between constants ----------------------------------------------------------------


Relation = tuple[str, str]
"""(divisor, dividend): two int constants of which the first divides the second in the task."""


def relations(constants: dict[str, Value]) -> list[Relation]:
    """Every (divisor, dividend) pair of the task's int constants above 1, smallest dividend first."""
    own = {n: _scalar(v) for n, v in constants.items() if _scalar(v) > 1}
    pairs = [(d, n) for n in own for d in own if own[d] < own[n] and own[n] % own[d] == 0]
    return sorted(pairs, key=lambda pair: (own[pair[1]], own[pair[0]]))


def repair(overrides: Overrides, constants: dict[str, Value], among: Iterable[Relation] | None = None) -> Overrides:
    """The variant with each dividend of the given relations (every one of the task's, by default)
    a multiple of its divisors' values in the variant again: the multiple nearest its variant value
    that is not its own. With every relation, a constant equal to one the variant changes also
    takes its value (a loss's targets broadcast against its predictions)."""
    values = {**{n: _scalar(v) for n, v in constants.items() if _scalar(v)}, **{n: _scalar(v) for n, v in overrides if _scalar(v)}}
    own = {n: _scalar(v) for n, v in constants.items() if _scalar(v) > 1}
    changed = dict(overrides)
    if among is None:
        for name in own:
            twin = next((n for n, v in overrides if n in own and n != name and own[n] == own[name] and _scalar(v)), None)
            if name not in changed and twin is not None:
                values[name] = values[twin]
                changed[name] = _like(constants[name], values[twin])
    chosen_relations = relations(constants) if among is None else list(among)
    for name in sorted({dividend for _, dividend in chosen_relations}, key=lambda n: own[n]):
        target = int(values[name])
        # The smallest divisors first, while their common multiple stays within the size.
        step = 1
        for divisor in sorted((d for d, n in chosen_relations if n == name), key=lambda d: values[d]):
            widened = math.lcm(step, int(values[divisor]))
            if widened <= max(target, 1) * 2:
                step = widened
        if step == 1 or target % step == 0:
            continue
        options = sorted({m * step for m in range(max(1, target // step - 1), target // step + 3)}, key=lambda o: (abs(o - target), o))
        chosen = next((o for o in options if o != own[name]), options[0])
        values[name] = chosen
        changed[name] = _like(constants[name], chosen)
    return tuple(changed.items())


def repairs(overrides: Overrides, constants: dict[str, Value], init: frozenset[str]) -> list[Overrides]:
    """Ways to restore the divisibility a variant broke, the smallest change first: one relation at
    a time (of those the variant touches), then a layer's (between constants get_init_inputs reads),
    then those whose divisor the variant keeps (a group count it does not touch is a constraint; a
    batch of 8 dividing 64 channels more likely a coincidence), then all of them."""
    touched = dict(overrides)
    every = relations(constants)
    mine = [r for r in every if r[0] in touched or r[1] in touched]
    return [
        *(repair(overrides, constants, [r]) for r in mine),
        repair(overrides, constants, [r for r in every if r[0] in init and r[1] in init]),
        repair(overrides, constants, [r for r in every if r[0] not in touched]),
        repair(overrides, constants),
    ]


def _scalar(value: Value) -> int:
    """An int, or the one int of a 1-tuple (`input_shape = (32768,)`); 0 for anything else."""
    if type(value) is int:
        return value
    if isinstance(value, tuple) and len(value) == 1:
        return value[0]
    return 0


def _like(original: Value, value: int) -> Value:
    return (value,) if isinstance(original, tuple) else value


# --- probing the reference ------------------------------------------------------------------------


class Refused(Exception):
    """The reference cannot run the variant, or runs it out of budget or out of shape."""


def meta_footprint(program: Program) -> Footprint:
    """Build the reference and call it on the meta device: raises what the task raises."""
    task = program.task
    with torch.device("meta"):
        init = list(task.get_init_inputs())
        model = task.Model(*init).eval()
        inputs = list(task.get_inputs())
    if program.dtype != torch.float32:
        model = model.to(program.dtype)
        inputs = [cast_floats(a, program.dtype) for a in inputs]
    counter = OpCost()
    with torch.no_grad(), counter:
        out = model(*inputs)
    outputs = tensors_of(out)
    nbytes = sum(t.numel() * t.element_size() for t in [*tensors_of(inputs), *outputs])
    return Footprint(structure(outputs), nbytes, roofline_ms(counter.bytes, counter.flops, program.device) / 1e3)


def structure(outputs: Iterable[torch.Tensor]) -> Structure:
    return tuple((str(t.dtype).removeprefix("torch."), t.dim()) for t in outputs)


def short(exc: BaseException) -> str:
    """`Type: first line` of an exception, for a variant's reason."""
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    first = re.sub(r"\s+", " ", first)
    return f"{type(exc).__name__}: {first[:200]}" if first else type(exc).__name__


class ProbeTimeout(BaseException):
    """The meta device took longer than its deadline (a BaseException: a task's `except Exception` must not swallow it)."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise ProbeTimeout in this block after `seconds` (main thread only; elsewhere no limit).

    The meta device runs some modules op by op in Python (an LSTM of 512 steps takes 20 s there,
    four times its real call on a CPU): such a task is then probed by its real runs instead."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: object) -> None:
        raise ProbeTimeout

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


_META_WARM: list[bool] = []


def warm_meta() -> None:
    """The meta device's first use in a process loads its kernels and decompositions (1.6 s on this
    2-core machine): paid here, outside any probe's deadline. The judge calls it at its start."""
    if _META_WARM:
        return
    with torch.device("meta"):
        layer = torch.nn.Linear(4, 4)
        x = torch.rand(2, 4)
    with torch.no_grad(), OpCost():
        layer(x).view(2, 2, 2).sum(dim=(1, 2))
    _META_WARM.append(True)


def input_nbytes(program: Program) -> int | None:
    """The bytes of get_inputs()'s tensors, from the meta device; None where it cannot tell."""
    try:
        with deadline(META_DEADLINE_S), torch.device("meta"):
            inputs = list(program.task.get_inputs())
    except (Exception, ProbeTimeout):  # noqa: BLE001 - the task's code may raise anything on the meta device
        return None
    if program.dtype != torch.float32:
        inputs = [cast_floats(a, program.dtype) for a in inputs]
    return sum(t.numel() * t.element_size() for t in tensors_of(inputs))


class Prober:
    """Tries variants of one task on the reference on the meta device. Where the reference does
    not run there (or too slowly), nothing is decided here but the input budget: the variants go
    to the check unverified, each with fallbacks, and the reference's real run there decides."""

    def __init__(self, program: Program):
        self.program = program
        warm_meta()
        self.started = time.perf_counter()
        self.base: Footprint | None = None
        try:
            with deadline(META_DEADLINE_S):
                self.base = meta_footprint(program)
        except (Exception, ProbeTimeout) as exc:  # noqa: BLE001 - the task's code may raise anything on the meta device
            log.info("shape_variants_no_meta", task=program.task.__name__, reason=short(exc) if isinstance(exc, Exception) else "too slow")
        self.base_inputs = input_nbytes(program) if self.base is None else None

    @property
    def meta(self) -> bool:
        return self.base is not None

    def refusal(self, overrides: Overrides) -> str | None:
        """Why the reference cannot run this variant within budget and structure, "" where it can,
        None where the meta device cannot tell."""
        try:
            variant = self.program.variant(overrides)
        except Exception as exc:  # noqa: BLE001 - the task's module-level code, under other values
            return f"the task's module-level code raised {short(exc)}"
        if self.base is not None and time.perf_counter() - self.started > META_TOTAL_S:
            log.info("shape_variants_meta_spent", task=self.program.task.__name__)
            self.base_inputs = input_nbytes(self.program)
            self.base = None
        if self.base is None:
            found_inputs = input_nbytes(variant) if self.base_inputs else None
            if self.base_inputs and found_inputs is not None and found_inputs > BUDGET * self.base_inputs:
                return f"over the memory budget ({found_inputs / self.base_inputs:.2f}x the task's input bytes)"
            return None
        try:
            with deadline(META_DEADLINE_S):
                found = meta_footprint(variant)
        except ProbeTimeout:
            self.base = None  # too slow here: the rest go to the check unverified
            return None
        except Exception as exc:  # noqa: BLE001 - the reference may refuse sizes it was not written for
            return f"the reference raised {short(exc)}"
        if found.structure != self.base.structure:
            return "the reference's outputs change structure (count, dtype or rank)"
        if found.nbytes > BUDGET * max(self.base.nbytes, 1):
            return f"over the memory budget ({found.nbytes / max(self.base.nbytes, 1):.2f}x the task's bytes)"
        if self.base.seconds > 0 and found.seconds > BUDGET * self.base.seconds:
            return f"over the time budget ({found.seconds / self.base.seconds:.2f}x the task's estimated time)"
        return ""

    def choose(self, plan: Plan, attempts: Iterable[Overrides]) -> Plan:
        """The plan with the first attempt the reference accepts; else not applicable, with the first
        attempt's refusal; attempts the meta device cannot judge become the plan's fallbacks."""
        refused: tuple[Overrides, str] | None = None
        unjudged: list[Overrides] = []
        tried: set[Overrides] = set()
        for overrides in attempts:
            if not overrides or overrides in tried:
                continue
            tried.add(overrides)
            why = self.refusal(overrides)
            if why is None:
                unjudged.append(overrides)
            elif not why and not unjudged:
                return replace(plan, overrides=overrides)
            elif why and refused is None:
                refused = (overrides, why)
        if unjudged:
            return replace(plan, overrides=unjudged[0], fallbacks=tuple(unjudged[1 : 1 + MAX_FALLBACKS]))
        if refused is not None:
            return replace(plan, overrides=refused[0], skip=refused[1])
        return replace(plan, overrides=(), skip="no constant to change")


def derive(program: Program) -> Variants:
    """The task's variants, each checked against the reference where it can be (see the module's text)."""
    found = classify(program)
    own = {name: c.value for name, c in literal_constants(program.task_source).items()}
    prober = Prober(program)
    plans: list[Plan] = []
    softer = {p.name: p for p in shape_plans(found, small_step=1)}

    def repaired(overrides: Overrides) -> list[Overrides]:
        return repairs(overrides, own, found.init)

    def narrower(overrides: Overrides) -> list[Overrides]:
        """Without the layer widths only get_init_inputs reads (a pooling window has constraints of
        its own), then without the sizes under WIDTH_OF_LAYER too (3 colour channels a network expects)."""
        inputs_only = tuple((n, v) for n, v in overrides if n in found.inputs)
        return [inputs_only, tuple((n, v) for n, v in inputs_only if _largest(own[n]) >= WIDTH_OF_LAYER)]

    for plan in shape_plans(found):
        tries = [plan.overrides, *narrower(plan.overrides)]
        if plan.name == "small" and "small" in softer:
            tries += [softer["small"].overrides, *narrower(softer["small"].overrides)]
        plans.append(prober.choose(plan, (a for t in tries for a in (t, *repaired(t)))))
    if found.params:
        init = Plan("init", "init", ())
        if prober.meta:
            accepted: Overrides = ()
            for constant in found.params:
                options = [(*accepted, (constant.name, choice)) for choice in _param_choices(constant.value)]
                chosen = prober.choose(init, [*options, *(r for o in options for r in repaired(o))])
                if not chosen.skip and not chosen.fallbacks:
                    accepted = chosen.overrides
            names = ", ".join(c.name for c in found.params)
            every = tuple((c.name, _param_choices(c.value)[0]) for c in found.params)
            refused = f"the reference refuses other values of {names}"
            plans.append(replace(init, overrides=accepted) if accepted else replace(init, overrides=every, skip=refused))
        else:
            every = tuple((c.name, _param_choices(c.value)[0]) for c in found.params)
            singles = [((c.name, _param_choices(c.value)[0]),) for c in found.params]
            plans.append(prober.choose(init, [every, *repaired(every), *singles]))
    shown = {name for plan in plans for overrides in (plan.overrides, *plan.fallbacks) for name, _ in overrides}
    return Variants(tuple(plans), {n: v for n, v in own.items() if n in shown}, prober.base.structure if prober.base else None)


_RESOLVED: dict[tuple[str, str, str], Variants] = {}
"""A judge's variants per task, precision and device: a task's candidates all get the same ones."""


def _key(program: Program) -> tuple[str, str, str]:
    return (program.task.__name__, str(program.dtype), program.device.type)


def resolve(program: Program) -> Variants:
    """The task's variants, derived once per judge process."""
    key = _key(program)
    if key not in _RESOLVED:
        _RESOLVED[key] = derive(program)
        plans = [(p.name, p.overrides, p.skip, p.fallbacks) for p in _RESOLVED[key].plans]
        log.info("shape_variants", task=program.task.__name__, plans=plans)
    return _RESOLVED[key]


def settle(program: Program, plan: Plan | None, structure: Structure | None = None) -> None:
    """Keep what a real run decided of an unverified plan (the values the reference accepted, or why
    none), and the task's own outputs' structure where it was not known, for the task's later candidates."""
    key = _key(program)
    found = _RESOLVED.get(key)
    if found is None:
        return
    plans = tuple(plan if plan is not None and p.name == plan.name else p for p in found.plans)
    _RESOLVED[key] = replace(found, plans=plans, structure=found.structure if found.structure is not None else structure)
