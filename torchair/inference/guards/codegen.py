"""The per-call check of a cached frame as one generated Python function.

:meth:`GuardSet.check_arguments <torchair.inference.guards.GuardSet.check_arguments>` runs
on every call ``cache_compile`` serves. Its general form walks a list of getter steps and a tree
of closures per guard: about a hundred small Python calls, each of which, in a decode loop, runs
with the caches the step's weights evicted (``bench/README.md``). :func:`per_call_program`
turns the same checks into one straight-line function: the process state's common case first
(:meth:`ProcessState.per_call_lines <torchair.inference.guards.state.ProcessState.per_call_lines>`),
then every source read is a local variable, every guard one expression, the graph inputs one
list display.

Only the common case is generated: the per-call tensor guards' memo holds
(:class:`~torchair.inference.guards.tensors.TensorMemo`) and every check passes. Anything else (a
guard that fails or raises, a memo that does not hold, a parameter dict without the key) makes
the function return None and the caller runs the general check, which says why and remembers
new tensors. So the generated function can only serve a call the general check would serve.

No recorded text is compiled. The code is built from the guards' parsed trees after
:func:`~torchair.inference.guards.grammar.compile_expression` accepted them: names are ours
(``v12``, ``k3``), every constant, key, type and function is bound by name in the function's
namespace (which has no builtins), and attribute and method names are identifiers the grammar
allowed. A tree with anything else is not generated (the general check keeps serving).

The generator reads a guard set through the public per-call attributes of
:class:`PerCallChecks` (``GuardSet`` has them; this module does not import it).

:class:`ServedCall` asks for a second form, the whole served call: a function of the call's
positional arguments (the frame read from them, not from a dict built per call) whose check is
the same, then the caller's own lines (the launch unit's call) instead of returning the graph
inputs. Each layer of Python a decode step's call goes through runs with the caches the step's
weights evicted; this form leaves one.
"""
from __future__ import annotations

import ast
import dataclasses
import keyword
import re
from typing import Any, Callable, Protocol, Sequence

import torch

from torchair.inference.guards.grammar import FUNCTIONS, METHODS, is_source
from torchair.inference.guards.hoist import ATTR, ITEM, StateHoist, available
from torchair.inference.guards.objects import ObjIs, TypeIs
from torchair.inference.guards.sources import Globals, Sources
from torchair.inference.guards.tensors import DISPATCH_TLS, TensorMemo
from torchair.runtime.unit_call import state_watch

__all__ = ["ENV_CODEGEN", "NotGenerated", "PerCallChecks", "ServedCall", "per_call_program"]

# the per-call check as one generated function (0: its general form)
ENV_CODEGEN = "TORCHAIR_GUARD_CODEGEN"


class NotGenerated(Exception):
    """The checks use something the generator does not cover (the general check runs)."""


class PerCallChecks(Protocol):
    """What :func:`per_call_program` reads of a guard set after its ``watch_arguments``:
    ``sources`` and the graph inputs' slots (``inputs``); ``per_call``, the tuple
    ``(guards, source steps, dict inputs)``; ``process``, the process state to check first;
    ``memo``, the per-call tensor guards' memo;
    ``untensored``, the per-call guards it does not imply (each with ``code``, ``type_of``,
    ``obj`` and, when known, ``read``: the source slots it reads); ``tensor_dicts``, read by
    the generated function on every call (graph input -> its module's parameter or buffer dict,
    replaced by each full check); ``module_root``, the source of the module whose state may be
    hoisted (:mod:`.hoist`; None: none)."""

    sources: Sources
    inputs: list[int]
    process: Any  # a ProcessState: its per_call_lines open the function
    per_call: tuple | None
    memo: TensorMemo | None
    untensored: Sequence[Any]
    tensor_dicts: dict[int, Any]
    module_root: str | None


@dataclasses.dataclass(frozen=True)
class ServedCall:
    """What :func:`per_call_program` needs for the served-call form. The frame is ``names``
    (the positional parameters, in order: the generated function's parameters) and
    ``self_name``, bound to ``module``; ``globals_`` the function's globals. ``miss`` is what the
    function returns for a call it does not serve (the caller then takes the general path);
    ``head(bind)`` lines run first and ``tail(bind)`` lines after the check held (they read the
    graph inputs as ``flat`` and return the call's result), each naming the values they use
    through ``bind(value, prefix)``. A tail line's ``return None`` means ``miss``. ``hoist``:
    the generated per-call program's :class:`~.hoist.StateHoist`, shared (one record of the
    module state serves both forms, and one watch counts their calls)."""

    names: tuple[str, ...]
    self_name: str
    module: Any
    globals_: Any
    miss: Any
    head: Callable[[Callable[..., str]], list[str]]
    tail: Callable[[Callable[..., str]], list[str]]
    hoist: StateHoist | None = None


_CMP = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
        ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in"}
_BIN = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%",
        ast.Pow: "**", ast.Div: "/"}
_ITEM = re.compile(r"\[(?:'[A-Za-z0-9_.]*'|-?[0-9]+)\]")  # a step's suffix: ['name'] or [3]
_CALL = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)\(\)")
_VARIABLE = re.compile(r"v[0-9]+")  # a source's local variable in the generated function


def _identifier(name: str) -> str:
    if not name.isidentifier() or keyword.iskeyword(name):
        raise NotGenerated(f"name {name!r}")
    return name


class _Writer:
    """Writes the generated function's lines, binding every value they use by name."""

    def __init__(self, gs: PerCallChecks, served: ServedCall | None = None) -> None:
        self.gs = gs
        self.served = served
        self.sources = gs.sources
        self.names: dict[str, Any] = {"__builtins__": {}}
        self._bound: dict[int, str] = {}
        self.spec: tuple = (None, None)  # the guard's recorded type / object (identity checks)
        # one TypeIs per recorded type: the guards on a batch's lengths (one per int) then read
        # one object's ``last``, not one object per guard, on a call that runs with the caches
        # the step evicted (a TypeIs depends only on what it wants)
        self._types: dict[tuple, TypeIs] = {}

    def bind(self, value: Any, prefix: str = "c") -> str:
        """A name for ``value`` in the function's namespace."""
        key = id(value)
        name = self._bound.get(key)
        if name is None or self.names.get(name) is not value:
            name = f"{prefix}{len(self.names)}"
            self.names[name] = value
            self._bound[key] = name
        return name

    # ---------------------------------------------------------------- source steps
    def kind(self, k: int) -> tuple[str, Any]:
        """What step ``k`` of the sources does: (:data:`~.hoist.ITEM`, key), (:data:`~.hoist.ATTR`,
        name), ("call", method name) or ("getter", its function)."""
        parent, fn, key = self.sources.steps[k]
        slot, pkey = k + 2, self.sources.steps[parent - 2][2] if parent >= 2 else "LG"[parent]
        suffix = key[len(pkey):] if key.startswith(pkey) else None
        if suffix is not None and _ITEM.fullmatch(suffix) and slot in self.sources.items:
            return ITEM, self.sources.items[slot]
        if suffix is not None and suffix.startswith(".") and suffix[1:].isidentifier():
            return ATTR, _identifier(suffix[1:])
        if suffix is not None and _CALL.fullmatch(suffix):
            return "call", _identifier(_CALL.fullmatch(suffix).group(1))
        return "getter", fn

    def step(self, k: int) -> str:
        """``v<slot> = ...`` for step ``k`` of the sources."""
        kind, what = self.kind(k)
        target, src = f"v{k + 2}", f"v{self.sources.steps[k][0]}"
        served = self.served
        if served is not None and self.sources.steps[k][0] == 0:  # L[name]: a parameter
            if kind == ITEM and what in served.names:
                return f"{target} = a{served.names.index(what)}"
            if kind == ITEM and what == served.self_name:
                return f"{target} = {self.bind(served.module, 'o')}"
            raise NotGenerated(f"frame read {self.sources.steps[k][2]}")
        if kind == ITEM:
            return f"{target} = {src}[{self.bind(what, 'k')}]"
        if kind == ATTR:
            return f"{target} = {src}.{what}"
        if kind == "call":
            return f"{target} = {src}.{what}()"
        return f"{target} = {self.bind(what, 's')}({src})"  # any other step: its own getter

    # ---------------------------------------------------------------- guard expressions
    def expr(self, node: ast.AST) -> str:
        if is_source(node):
            slot = self.sources.index.get(ast.unparse(node))
            if slot is None:
                raise NotGenerated(f"source {ast.unparse(node)}")
            return f"v{slot}"
        method = getattr(self, f"_{type(node).__name__}", None)
        if method is None:
            raise NotGenerated(type(node).__name__)
        return method(node)

    def _Constant(self, node: ast.Constant) -> str:
        value = node.value
        if not (value is None or isinstance(value, (bool, int, float, str))):
            raise NotGenerated(f"constant {value!r}")
        return self.bind(value)

    def _Attribute(self, node: ast.Attribute) -> str:
        value = getattr(torch, node.attr, None)
        if not (isinstance(node.value, ast.Name) and node.value.id == "torch"
                and isinstance(value, torch.dtype)):
            raise NotGenerated(ast.unparse(node))
        return self.bind(value)

    def _Name(self, node: ast.Name) -> str:
        if node.id in ("inf", "nan"):
            return self.bind(float(node.id))
        raise NotGenerated(node.id)

    def _List(self, node: ast.List) -> str:
        return "[" + ", ".join(self.expr(e) for e in node.elts) + "]"

    def _Tuple(self, node: ast.Tuple) -> str:
        return "(" + "".join(self.expr(e) + ", " for e in node.elts) + ")"

    def _Set(self, node: ast.Set) -> str:
        return "{" + ", ".join(self.expr(e) for e in node.elts) + "}"

    def _Compare(self, node: ast.Compare) -> str:
        ops = []
        for op in node.ops:
            if type(op) not in _CMP:
                raise NotGenerated(type(op).__name__)
            ops.append(_CMP[type(op)])
        parts = [self.expr(node.left)]
        for op, right in zip(ops, node.comparators):
            parts += [op, self.expr(right)]
        if len(ops) == 1:
            return "(" + " ".join(parts) + ")"  # the comparison's own result, as the general one
        return f"{self.bind(bool)}(" + " ".join(parts) + ")"  # a chain: True or False, as there

    def _BoolOp(self, node: ast.BoolOp) -> str:
        join = " and " if isinstance(node.op, ast.And) else " or "
        return f"{self.bind(bool)}(" + join.join(self.expr(v) for v in node.values) + ")"

    def _UnaryOp(self, node: ast.UnaryOp) -> str:
        operand = self.expr(node.operand)
        if isinstance(node.op, ast.Not):
            return f"(not {operand})"
        if isinstance(node.op, ast.USub):
            return f"(-{operand})"
        if isinstance(node.op, ast.UAdd):
            return operand  # as the general check: the operand itself
        raise NotGenerated(type(node.op).__name__)

    def _BinOp(self, node: ast.BinOp) -> str:
        if type(node.op) not in _BIN:
            raise NotGenerated(type(node.op).__name__)
        return f"({self.expr(node.left)} {_BIN[type(node.op)]} {self.expr(node.right)})"

    def _IfExp(self, node: ast.IfExp) -> str:
        return f"({self.expr(node.body)} if {self.expr(node.test)} else {self.expr(node.orelse)})"

    def _Call(self, node: ast.Call) -> str:
        func = node.func
        name = ast.unparse(func)
        if name == "check_no_aliasing" and not node.keywords:
            distinct = getattr(state_watch(), "distinct", None)
            if distinct is not None:  # one C call (csrc/state_watch.c)
                return (f"{self.bind(distinct, 'f')}("
                        + ", ".join(self.expr(a) for a in node.args) + ")")
            ids = ", ".join(f"{self.bind(id)}({self.expr(a)})" for a in node.args)
            return f"({self.bind(len)}({{{ids}}}) == {self.bind(len(node.args))})"
        if name == "___dict_contains" and len(node.args) == 2 and not node.keywords:
            return f"({self.expr(node.args[0])} in {self.expr(node.args[1])})"
        if (isinstance(func, ast.Attribute) and func.attr in METHODS
                and is_source(func.value) and not node.keywords):
            low, high = METHODS[func.attr]
            if not low <= len(node.args) <= high:
                raise NotGenerated(f".{func.attr}()")
            args = ", ".join(self.expr(a) for a in node.args)
            return f"{self.expr(func.value)}.{_identifier(func.attr)}({args})"
        if (isinstance(func, ast.Attribute) and func.attr == "item" and not node.args
                and not node.keywords and isinstance(func.value, ast.Call)
                and ast.unparse(func.value.func) == "___as_tensor"):
            return f"{self.expr(func.value)}.item()"  # torch 2.11's float guard
        spec = self.spec
        # identity checks: the type or object that passed last time is tested inline, the
        # check's own call runs only when it is another one (a variable is read twice, any other
        # expression goes to the call alone)
        if name == "___check_type_id" and len(node.args) == 2 and spec[0] is not None:
            want = tuple(spec[0])
            check = self.bind(self._types.setdefault(want, TypeIs(want)), "t")
            value = self.expr(node.args[0])
            if _VARIABLE.fullmatch(value):
                return f"({self.bind(type)}({value}) is {check}.last or {check}({value}))"
            return f"{check}({value})"
        if name == "___check_obj_id" and len(node.args) == 2 and spec[1] is not None:
            check, value = self.bind(ObjIs(spec[1]), "o"), self.expr(node.args[0])
            if _VARIABLE.fullmatch(value):
                return f"({value} is {check}.last or {check}({value}))"
            return f"{check}({value})"
        fn = FUNCTIONS.get(name)
        if fn is None or node.keywords:
            raise NotGenerated(name)  # tensor checks, device(...), .item()
        return f"{self.bind(fn, 'f')}(" + ", ".join(self.expr(a) for a in node.args) + ")"


def per_call_program(gs: PerCallChecks, served: ServedCall | None = None) -> Callable:
    """The generated form of ``gs``'s per-call check (after ``watch_arguments``): a function of
    the frame and globals that returns the graph inputs, or None for "run the general check".
    With ``served``, the served-call form instead (see :class:`ServedCall`). Raises
    :class:`NotGenerated` when some check is outside what it covers."""
    w = _Writer(gs, served)
    body, flat, hoisted = _check_lines(gs, w)
    if served is None:
        body.append("return " + flat)
        source = ("def per_call(v0, G):\n    try:\n" + _block(body, 2)
                  + f"    except {w.bind(Exception, 'e')}:\n        return None\n")
        name = "per_call"
    else:
        miss = w.bind(served.miss, "x")
        params = ", ".join(f"a{i}" for i in range(len(served.names)))
        body = served.head(w.bind) + body + ["flat = " + flat]
        source = (f"def served({params}):\n    try:\n" + _block(body, 2, miss)
                  + f"    except {w.bind(Exception, 'e')}:\n        return {miss}\n"
                  + _block(served.tail(w.bind), 1, miss))
        name = "served"
    namespace = dict(w.names)
    exec(compile(source, f"<torchair {name.replace('_', '-')} check>", "exec"), namespace)  # noqa: S102
    program = namespace[name]
    program.source = source  # type: ignore[attr-defined]
    program.hoist = hoisted[0] if hoisted is not None else None  # type: ignore[attr-defined]
    return program


def _block(lines: list[str], depth: int, miss: str | None = None) -> str:
    """``lines`` indented ``depth`` levels; with ``miss``, each ``return None`` returns it."""
    pad = "    " * depth
    if miss is not None:
        lines = [line.replace("return None", f"return {miss}")
                 if line.strip() == "return None" else line for line in lines]
    return "".join(f"{pad}{line}\n" for line in lines)


def _check_lines(gs: PerCallChecks, w: _Writer) -> tuple[list[str], str, tuple | None]:
    """The check's lines (each failure a ``return None``), the graph inputs' list display
    and the hoist (:func:`_hoisted`)."""
    guards, steps, dict_inputs = gs.per_call
    # the process state first, as check_arguments' general form compares it before any guard
    body = gs.process.per_call_lines(w.bind)
    if w.served is None:
        body.append(f"v1 = G if {w.bind(type)}(G) is {w.bind(Globals)} else {w.bind(Globals)}(G)")
    else:
        given = w.served.globals_
        body.append(f"v1 = {w.bind(given if type(given) is Globals else Globals(given), 'o')}")
    memo = gs.memo
    # the thread's dispatch-key sets are read for the TENSOR_MATCH guards, which the memo's C++
    # comparison replaces here (it reads them itself): skip that read unless another guard uses
    # it (it cannot fail, so skipping it changes no outcome)
    reads = [getattr(g, "read", None) for g in gs.untensored]  # (None: not known, keep it)
    read = set().union(*reads) if None not in reads else None
    steps = [k for k in steps
             if read is None or gs.sources.roots[k + 2] != DISPATCH_TLS or k + 2 in read]
    hoisted = _hoisted(gs, w, steps)
    by_input = {k: (parent, key) for k, parent, key in dict_inputs}
    if hoisted is None:
        body += [w.step(k) for k in steps]
        body += _dict_reads(w, gs, dict_inputs)
        values = {k: f"p{parent}[{w.bind(key, 'k')}]" for k, (parent, key) in by_input.items()}
    else:
        hoist_lines, values = _hoist_block(w, gs, steps, hoisted, dict_inputs)
        body += hoist_lines
    tests = []
    if memo.slots:
        args = ", ".join(f"v{slot}" for slot in memo.slots)
        body += [f"check = {w.bind(memo, 'm')}.check",
                 "if check is None:", "    return None"]
        tests.append(f"check({args})")
    for guard in gs.untensored:
        w.spec = (guard.type_of, guard.obj)
        tests.append(w.expr(ast.parse(guard.code.strip(), mode="eval").body))
    for test in tests:
        body += [f"if not {test}:", "    return None"]
    if memo.slots:
        body.append(f"{w.bind(memo, 'm')}.misses = 0")
    flat = [values[k] if k in values else f"v{slot}" for k, slot in enumerate(gs.inputs)]
    return body, "[" + ", ".join(flat) + "]", hoisted


def _dict_reads(w: _Writer, gs: PerCallChecks, dict_inputs: Sequence[tuple]) -> list[str]:
    """One read per module dict of the inputs read from one (the inputs of one dict share it:
    the same full check stored it for each): ``p<dict slot> = d[...]``."""
    if not dict_inputs:
        return []
    lines = [f"d = {w.bind(gs, 'g')}.tensor_dicts"]
    first: set[int] = set()
    for k, parent, _ in dict_inputs:
        if parent not in first:
            first.add(parent)
            lines.append(f"p{parent} = d[{w.bind(k)}]")
    return lines


def _hoisted(gs: PerCallChecks, w: _Writer, steps: list[int]) -> tuple | None:
    """(the :class:`~.hoist.StateHoist`, the root step or None, the hoisted steps) of a check
    whose module state can be hoisted (:mod:`.hoist`), else None: the steps from the module root
    that are attribute or item reads of the root or of another such step."""
    root = gs.module_root
    helper = available() if root is not None else None
    if helper is None:
        return None
    root_step, hoisted, plan = None, [], []
    position: dict[int, int] = {}  # slot -> index in the hoisted values
    for k in steps:
        slot, parent = k + 2, gs.sources.steps[k][0]
        if gs.sources.roots[slot] != root:
            continue
        if parent == 0:
            root_step = k
            continue
        kind, what = w.kind(k)
        from_root = root_step is not None and parent == root_step + 2
        if kind not in (ATTR, ITEM) or not (from_root or parent in position):
            continue
        position[slot] = len(plan)
        plan.append((kind, position.get(parent, -1), what))
        hoisted.append(k)
    if not hoisted and not gs.per_call[2]:
        return None
    keys = [key for _, _, key in gs.per_call[2]]
    shared = w.served.hoist if w.served is not None else None
    if shared is None:
        return StateHoist(plan, helper, keys), root_step, hoisted
    if shared.steps != tuple(plan) or shared.param_keys != tuple(keys):
        raise NotGenerated("the per-call program hoists other module state")
    return shared, root_step, hoisted


def _hoist_block(w: _Writer, gs: PerCallChecks, steps: list[int], hoisted: tuple,
                 dict_inputs: Sequence[tuple]) -> tuple[list[str], dict[int, str]]:
    """The source reads with the module state hoisted (:mod:`.hoist`): the steps that do not read
    module state, then the hoisted values served again while the watch says nothing changed
    (else read and recorded), then the module-state steps the hoist does not cover. Returns the
    lines and the graph inputs read from module dicts (index -> variable)."""
    hoist, root_step, hoisted_steps = hoisted
    root = gs.module_root
    inside = set(hoisted_steps)
    before = [k for k in steps if gs.sources.roots[k + 2] != root or k == root_step]
    after = [k for k in steps if gs.sources.roots[k + 2] == root and k != root_step
             and k not in inside]
    params = [(k, f"q{k}") for k, _, _ in dict_inputs]
    names = [f"v{k + 2}" for k in hoisted_steps] + [name for _, name in params]
    # the values a call needs after the block (the rest are only read on the way to them)
    needed = {f"v{slot}" for slot in gs.inputs} | {f"v{gs.sources.steps[k][0]}" for k in after}
    needed |= {f"v{slot}" for slot in gs.memo.slots} if gs.memo is not None else set()
    for guard in gs.untensored:
        needed |= ({f"v{slot}" for slot in guard.read} if getattr(guard, "read", None)
                   is not None else set(names))
    keep = [i for i, n in enumerate(names) if n in needed or n.startswith("q")]
    hoist.keep = tuple(keep)
    unpack = "(" + "".join(f"{n}, " for n in names) + ")"
    kept = "(" + "".join(f"{names[i]}, " for i in keep) + ")"
    h, g = w.bind(hoist, "h"), w.bind(gs, "g")
    rv = f"v{root_step + 2}" if root_step is not None else w.bind(None)
    read = [w.step(k) for k in hoisted_steps] + _dict_reads(w, gs, dict_inputs)
    read += [f"{name} = p{parent}[{w.bind(key, 'k')}]"
             for (_, name), (_, parent, key) in zip(params, dict_inputs)]
    pdicts = "(" + "".join(f"p{p}, " for _, p, _ in dict_inputs) + ")"  # one per parameter
    lines = [w.step(k) for k in before]
    lines += [f"h = {h}.current",
              f"if h is not None and {rv} is h[0] and {g}.tensor_dicts is h[1] and "
              f"{w.bind(hoist.unchanged, 'f')}(h[2]):",
              f"    {kept} = h[3]",
              f"    {h}.hits += 1",
              "else:"]
    tensor_dicts = "d" if dict_inputs else w.bind(None)  # (d: read by _dict_reads' lines)
    lines += ["    " + line for line in read]
    lines += [f"    {h}.record({rv}, {tensor_dicts}, {unpack}, {pdicts})"]
    lines += [w.step(k) for k in after]
    return lines, dict(params)
