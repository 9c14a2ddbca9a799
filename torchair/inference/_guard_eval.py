"""Dynamo's guards for a cached frame, checked in a later process without Dynamo.

A cold start records every guard Dynamo produced for the frame it compiled
(:mod:`torchair.inference._guards`): the guard's kind, its source and its code as Dynamo prints it
(``L['self'].n == 3``, ``2 <= L['x'].size()[0]``, ``check_tensor(L['x'], Tensor, ...)``). A warm
start compiles that code here into closures and runs them before every call, so a call is served
by the cached graph exactly when Dynamo would have served it by the traced one.

The code is never ``eval``-ed: it is parsed with :mod:`ast` and only a small grammar is accepted
(names ``L`` / ``G``, constants, item and attribute access, comparisons, arithmetic, ``and`` /
``or`` / ``not``, and a fixed table of functions). Anything else raises :class:`UnsupportedGuard`
at the cold start, which then does not cache the function (with a warning naming the guard).
The per-call check of ``TORCHAIR_CACHE_GUARDS=arguments`` also runs as one generated function
(:mod:`torchair.inference._guard_codegen`), written from the accepted trees, never from the text.

Two Dynamo checks compare object identities (``___check_type_id``, ``___check_obj_id``); ids mean
nothing in another process, so the cold start records what the object *is* (a class by module and
qualified name, a module by name, a function or code object by name and place, an op by its
qualified name; see :func:`describe_object`) and the warm check compares that.

Imports only torch (no Dynamo), like the rest of a warm start.
"""
from __future__ import annotations

import ast
import builtins
import enum
import importlib
import math
import operator
import sys
import types
import weakref
from typing import Any, Callable, Sequence

import torch

from torchair.core import function_modes

__all__ = ["ADVISORY_KINDS", "Globals", "GuardSet", "Sources", "UnsupportedGuard",
           "compile_expression", "describe_object", "global_state", "module_epoch",
           "source_slot"]


class UnsupportedGuard(Exception):
    """A guard this module cannot check in another process (the message names it)."""


# Kinds recorded but not enforced, with why it is sound to skip them on a warm start.
ADVISORY_KINDS = {
    "DIMENSION_DYNAMIC_MARKING_GUARD":
        "mark_static/mark_dynamic only steer how Dynamo would retrace; the sizes the graph "
        "accepts are checked by the tensor and shape guards",
    "GRAD_MODE": "cached graphs always run under torch.no_grad()",
}
_SAVED_TENSOR_HOOKS = "top_saved_tensors_hooks"  # AOT's ambient guard (autograd graphs only)

# dunder attributes a source may read (reading never calls what it reads; Dynamo guards methods
# it inlined by their code objects, e.g. type(x).__mro__[k].__getattribute__.__code__)
_DUNDERS = frozenset({"__closure__", "__code__", "__dict__", "__defaults__", "__kwdefaults__",
                      "__func__", "__self__", "__class__", "__mro__", "__getattribute__",
                      "__getattr__", "__setattr__", "__delattr__", "__init__", "__new__",
                      "__call__", "__get__", "__set__", "__wrapped__", "__iter__", "__len__",
                      "__getitem__", "__setitem__", "__contains__", "__bool__", "__eq__",
                      "__hash__", "__enter__", "__exit__", "__name__", "__qualname__",
                      "__module__", "__bases__", "__base__", "__annotations__", "__slots__",
                      "__globals__", "__builtins__", "__doc__", "__forward__"})
# builtins a source may wrap: Dynamo reads class attributes as dict(type(x).__mro__[k].__dict__)
_SOURCE_CALLS = {"type": type, "dict": dict}
_METHODS = {"size": (0, 1), "stride": (0, 1), "storage_offset": (0, 0), "dim": (0, 0),
            "numel": (0, 0), "keys": (0, 0), "values": (0, 0), "items": (0, 0),
            "issubset": (1, 1), "is_contiguous": (0, 0)}
_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
           ast.Mult: lambda a, b: a * b, ast.FloorDiv: lambda a, b: a // b,
           ast.Mod: lambda a, b: a % b, ast.Pow: lambda a, b: a ** b,
           ast.Div: lambda a, b: a / b}
_CMPOPS = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b,
           ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b,
           ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
           ast.Is: lambda a, b: a is b, ast.IsNot: lambda a, b: a is not b,
           ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
_MISSING = object()


# ------------------------------------------------------------------------------- the frame

class Globals:
    """``G``: the function's globals, plus the names Dynamo adds to them while tracing
    (``__import_<module>`` for another module, ``__builtins_dict___<n>`` for builtins)."""

    __slots__ = ("names",)

    def __init__(self, names: dict) -> None:
        self.names = names

    def __getitem__(self, name: str) -> Any:
        if name.startswith("__import_"):
            module = name[len("__import_"):].replace("_dot_", ".")
            found = sys.modules.get(module)
            return found if found is not None else importlib.import_module(module)
        if name.startswith("__builtins_dict__"):
            return builtins.__dict__
        return self.names[name]


class Sources:
    """Every source the guards and graph inputs read, as one flat program of getter steps:
    slot 0 is ``L`` (the frame's locals), slot 1 is ``G``; each further slot is one step (an
    item, an attribute or a no-argument method call) from an earlier slot. A call evaluates all
    slots once, in order; a step that fails (missing attribute, key, index) fails the call."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {"L": 0, "G": 1}
        self.steps: list[tuple[int, Callable[[Any], Any], str]] = []
        self.items: dict[int, Any] = {}  # slot -> the key of an item step (``parent[key]``)
        self.roots: list[str] = ["L", "G"]  # slot -> the first step from L (e.g. ``L['x']``)

    def slot(self, key: str, parent: int, step: Callable[[Any], Any],
             item: Any = _MISSING) -> int:
        found = self.index.get(key)
        if found is None:
            found = self.index[key] = 2 + len(self.steps)
            self.steps.append((parent, step, key))
            self.roots.append(key if parent == 0 else self.roots[parent])
            if item is not _MISSING:
                self.items[found] = item
        return found

    def ancestors(self, slots: Any) -> list[int]:
        """The steps (indices into ``steps``) that reading ``slots`` needs, in order."""
        needed: set[int] = set()
        for slot in slots:
            while slot >= 2 and slot - 2 not in needed:
                needed.add(slot - 2)
                slot = self.steps[slot - 2][0]
        return sorted(needed)

    def evaluate_some(self, frame: dict, globals_: Globals, steps: list[int]) -> tuple[list, str]:
        """:meth:`evaluate` of the given steps only (the other slots stay None)."""
        values: list = [frame, globals_] + [None] * len(self.steps)
        all_steps = self.steps
        k = -1
        try:
            for k in steps:
                parent, step, _ = all_steps[k]
                values[k + 2] = step(values[parent])
        except Exception as error:  # noqa: BLE001 - an unreadable source fails the call
            return values, f"{all_steps[k][2]} cannot be read ({type(error).__name__}: {error})"
        return values, ""

    def evaluate(self, frame: dict, globals_: Globals) -> tuple[list, str]:
        values = [frame, globals_]
        append = values.append
        try:
            for parent, step, _ in self.steps:
                append(step(values[parent]))
        except Exception as error:  # noqa: BLE001 - an unreadable source fails the call
            key = self.steps[len(values) - 2][2]
            return values, f"{key} cannot be read ({type(error).__name__}: {error})"
        return values, ""


# ---------------------------------------------------------------- identity across processes

def _qualname(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", "")


def describe_object(obj: Any) -> dict | None:
    """What ``obj`` is, in terms that mean the same in another process (None: no such terms)."""
    if obj is None or obj is Ellipsis or isinstance(obj, bool):
        return {"const": repr(obj)}
    if isinstance(obj, types.ModuleType):
        return {"module": obj.__name__}
    if isinstance(obj, type):
        return {"class": [obj.__module__, obj.__qualname__]}
    if isinstance(obj, types.CodeType):
        return {"code": [obj.co_filename, obj.co_name, obj.co_firstlineno]}
    if isinstance(obj, types.FunctionType):
        code = obj.__code__
        return {"function": [obj.__module__, obj.__qualname__, code.co_filename,
                             code.co_firstlineno]}
    if isinstance(obj, types.BuiltinFunctionType):
        owner = getattr(obj, "__self__", None)
        owner = owner.__name__ if isinstance(owner, types.ModuleType) else type(owner).__qualname__
        return {"builtin": [str(getattr(obj, "__module__", None)), owner, _qualname(obj)]}
    if isinstance(obj, torch._ops.OpOverloadPacket):
        return {"op": obj._qualified_op_name}
    if isinstance(obj, torch._ops.OpOverload):
        return {"op": f"{obj._schema.name}.{obj._overloadname}"}
    if isinstance(obj, torch._ops._OpNamespace):
        return {"op_namespace": obj.name}
    if type(obj) is torch._ops._Ops:
        return {"torch_ops": True}
    if isinstance(obj, (torch.dtype, torch.device)):
        return {"value": [type(obj).__name__, str(obj)]}
    if isinstance(obj, enum.Enum):  # a member is unique in its class: class and name say which
        cls = type(obj)
        return {"enum": [cls.__module__, cls.__qualname__, obj.name]}
    return _describe_process_group(obj)


def _describe_process_group(obj: Any) -> dict | None:
    """A process group (Dynamo ID_MATCHes ``dist.group.WORLD`` under an in-place collective) is
    the same group in another process when its name, backend and member ranks are (the cache
    directory already separates world sizes and ranks)."""
    import torch.distributed as dist

    if not dist.is_available() or not isinstance(obj, dist.ProcessGroup):
        return None
    try:
        return {"process_group": [obj.group_name, str(dist.get_backend(obj)),
                                  list(dist.get_process_group_ranks(obj))]}
    except (RuntimeError, ValueError):  # not registered with c10d (destroyed, or not a group)
        return None


# ------------------------------------------------------------------------- global state

def global_state() -> dict:
    """Process-wide settings that change what a traced graph computes (Dynamo's GLOBAL_STATE
    guard, less the thread count and grad mode, which do not)."""
    autocast = {d: [bool(torch.is_autocast_enabled(d)), str(torch.get_autocast_dtype(d))]
                for d in ("cpu", "cuda")}
    return {"autocast": autocast, "default_dtype": str(torch.get_default_dtype()),
            "deterministic": [torch.are_deterministic_algorithms_enabled(),
                              torch.is_deterministic_algorithms_warn_only_enabled()],
            "tf32": [bool(torch.backends.cuda.matmul.allow_tf32), _cudnn_tf32()],
            "torch_function": bool(torch._C._is_torch_function_enabled())}


def _state_snapshot() -> Any:
    """PyTorch's own snapshot of the process state (the one Dynamo's GLOBAL_STATE guard
    compares in C++), or None where this PyTorch has none."""
    guards = getattr(torch._C, "_dynamo", None)
    snapshot = getattr(getattr(guards, "guards", None), "GlobalStateGuard", None)
    return snapshot() if snapshot is not None else None


def _snapshot_blind_spots() -> tuple:
    """What :func:`global_state` compares that PyTorch's snapshot does not: the autocast dtypes
    (they matter only while autocast is on) and cuDNN's TF32 switch."""
    on = torch._C._is_any_autocast_enabled()
    dtypes = (torch.get_autocast_dtype("cpu"), torch.get_autocast_dtype("cuda")) if on else ()
    return dtypes, _cudnn_tf32()


# what torch.backends.cudnn.allow_tf32 reads, without the module property on the per-call path
_cudnn_allow_tf32 = getattr(torch._C, "_get_cudnn_allow_tf32",
                            lambda: torch.backends.cudnn.allow_tf32)


def _cudnn_tf32() -> bool | str:
    """cuDNN's TF32 switch; "mixed" where PyTorch refuses to read it as one switch (its newer
    per-operation precision settings set differently)."""
    try:
        return bool(_cudnn_allow_tf32())
    except RuntimeError:
        return "mixed"


def _stack_text() -> str:
    """The current torch-function mode stack and process-wide modes, for a warning."""
    modes = function_modes.stack_modes() + function_modes.process_modes()
    if not modes:
        return "now no mode"
    texts = []
    for mode in modes:
        try:
            texts.append(function_modes.tag_of(mode))
        except function_modes.UnknownMode as unknown:
            texts.append(str(unknown))
    return "now " + ", ".join(texts)


# ------------------------------------------------------------------------- compilation

Fn = Callable[[list], Any]  # reads the per-call slot values


def compile_expression(text: str, sources: Sources, *, type_of: list | None = None,
                       obj: dict | None = None, read: set | None = None) -> Fn:
    """Compile one guard's code into ``fn(values) -> value``, adding the sources it reads to
    ``sources`` (and their slots to ``read``). ``type_of`` / ``obj`` are the recorded
    identities for ``___check_type_id`` / ``___check_obj_id``."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as error:
        raise UnsupportedGuard(f"`{text}` is not an expression ({error.msg})") from None
    compiler = _Compiler(text, sources, type_of, obj)
    fn = compiler.node(tree.body)
    if read is not None:
        read |= compiler.read
    return fn


def source_slot(text: str, sources: Sources) -> int:
    """The slot of a source expression such as ``L['self']._modules['l']._parameters['w']``."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as error:
        raise UnsupportedGuard(f"source `{text}` is not an expression ({error.msg})") from None
    return _Compiler(text, sources, None, None).slot(tree.body)


def _slot_reader(slot: int) -> Fn:
    return lambda values: values[slot]


class _Compiler:
    def __init__(self, text: str, sources: Sources, type_of: list | None,
                 obj: dict | None) -> None:
        self.text, self.sources, self.type_of, self.obj = text, sources, type_of, obj
        self.read: set[int] = set()  # the slots the compiled code reads

    def fail(self, what: str) -> UnsupportedGuard:
        return UnsupportedGuard(f"{what} in `{self.text}`")

    def node(self, node: ast.AST) -> Fn:
        if self._is_source(node):
            return _slot_reader(self.slot(node))
        method = getattr(self, f"_{type(node).__name__}", None)
        if method is None:
            raise self.fail(f"unsupported syntax {type(node).__name__}")
        return method(node)

    # -- sources: chains of items, attributes and no-argument methods from L or G
    @staticmethod
    def _is_source(node: ast.AST) -> bool:
        while True:
            if isinstance(node, ast.Name):
                return node.id in ("L", "G")
            if isinstance(node, (ast.Subscript, ast.Attribute)):
                node = node.value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and not node.args and not node.keywords and node.func.attr in _METHODS):
                node = node.func.value
            elif _Compiler._source_call(node):
                node = node.args[0]
            else:
                return False

    @staticmethod
    def _source_call(node: ast.AST) -> bool:
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in _SOURCE_CALLS and len(node.args) == 1 and not node.keywords)

    def slot(self, node: ast.AST) -> int:
        found = self._slot(node)
        self.read.add(found)
        return found

    def _slot(self, node: ast.AST) -> int:
        if isinstance(node, ast.Name) and node.id in ("L", "G"):
            return self.sources.index[node.id]
        key = ast.unparse(node)
        if key in self.sources.index:
            return self.sources.index[key]
        if isinstance(node, ast.Subscript):
            item = self._subscript_key(node.slice)
            return self.sources.slot(key, self.slot(node.value), operator.itemgetter(item),
                                     item)
        if isinstance(node, ast.Attribute):
            name = node.attr
            if name.startswith("__") and name not in _DUNDERS:
                raise self.fail(f"attribute {name!r} is not allowed")
            return self.sources.slot(key, self.slot(node.value), operator.attrgetter(name))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.args
                and not node.keywords and node.func.attr in _METHODS):
            return self.sources.slot(key, self.slot(node.func.value),
                                     operator.methodcaller(node.func.attr))
        if self._source_call(node):
            return self.sources.slot(key, self.slot(node.args[0]), _SOURCE_CALLS[node.func.id])
        raise self.fail(f"`{key}` is not a source")

    def _subscript_key(self, index: ast.AST) -> Any:
        if isinstance(index, ast.UnaryOp) and isinstance(index.op, ast.USub) and isinstance(
                index.operand, ast.Constant) and isinstance(index.operand.value, int):
            return -index.operand.value
        if isinstance(index, ast.Constant) and isinstance(index.value, (int, str)) and not \
                isinstance(index.value, bool):
            return index.value
        raise self.fail(f"unsupported subscript {ast.unparse(index)}")

    # -- values
    def _Constant(self, node: ast.Constant) -> Fn:
        value = node.value
        if not (value is None or isinstance(value, (bool, int, float, str))):
            raise self.fail(f"unsupported constant {value!r}")
        return lambda values: value

    def _Attribute(self, node: ast.Attribute) -> Fn:
        """``torch.float32``, ``torch.preserve_format``, ``torch.strided``: a dtype, memory
        format or layout constant (other attributes are read only from sources)."""
        value = getattr(torch, node.attr, None)
        if not (isinstance(node.value, ast.Name) and node.value.id == "torch"
                and isinstance(value, (torch.dtype, torch.memory_format, torch.layout))):
            raise self.fail(f"unsupported attribute `{ast.unparse(node)}`")
        return lambda values: value

    def _Name(self, node: ast.Name) -> Fn:
        if node.id in ("inf", "nan"):
            value = float(node.id)
            return lambda values: value
        raise self.fail(f"unknown name {node.id!r}")

    def _sequence(self, node: Any, make: Callable) -> Fn:
        items = [self.node(e) for e in node.elts]
        return lambda values: make(f(values) for f in items)

    def _List(self, node: ast.List) -> Fn:
        return self._sequence(node, list)

    def _Tuple(self, node: ast.Tuple) -> Fn:
        return self._sequence(node, tuple)

    def _Set(self, node: ast.Set) -> Fn:
        return self._sequence(node, set)

    # -- operators
    def _Compare(self, node: ast.Compare) -> Fn:
        fns = []
        for op in node.ops:
            fn = _CMPOPS.get(type(op))
            if fn is None:
                raise self.fail(f"unsupported comparison {type(op).__name__}")
            fns.append(fn)
        operands = [self.node(node.left)] + [self.node(c) for c in node.comparators]
        if len(fns) == 1:
            (fn,), (left, right) = fns, operands
            if isinstance(node.comparators[0], ast.Constant):
                const = node.comparators[0].value
                return lambda values: fn(left(values), const)
            return lambda values: fn(left(values), right(values))

        def compare(values: list) -> bool:
            a = operands[0](values)
            for fn, right in zip(fns, operands[1:]):
                b = right(values)
                if not fn(a, b):
                    return False
                a = b
            return True

        return compare

    def _BoolOp(self, node: ast.BoolOp) -> Fn:
        parts = [self.node(v) for v in node.values]
        if isinstance(node.op, ast.And):
            return lambda values: all(p(values) for p in parts)
        return lambda values: any(p(values) for p in parts)

    def _UnaryOp(self, node: ast.UnaryOp) -> Fn:
        operand = self.node(node.operand)
        if isinstance(node.op, ast.Not):
            return lambda values: not operand(values)
        if isinstance(node.op, ast.USub):
            return lambda values: -operand(values)
        if isinstance(node.op, ast.UAdd):
            return operand
        raise self.fail(f"unsupported operator {type(node.op).__name__}")

    def _BinOp(self, node: ast.BinOp) -> Fn:
        fn = _BINOPS.get(type(node.op))
        if fn is None:
            raise self.fail(f"unsupported operator {type(node.op).__name__}")
        left, right = self.node(node.left), self.node(node.right)
        return lambda values: fn(left(values), right(values))

    def _IfExp(self, node: ast.IfExp) -> Fn:
        test, body, orelse = self.node(node.test), self.node(node.body), self.node(node.orelse)
        return lambda values: body(values) if test(values) else orelse(values)

    # -- calls
    def _Call(self, node: ast.Call) -> Fn:
        func = node.func
        name = ast.unparse(func)
        special = {"___check_type_id": self._check_type_id, "___check_obj_id": self._check_obj_id,
                   "check_tensor": self._check_tensor, "check_no_aliasing": self._no_aliasing,
                   "___dict_contains": self._dict_contains}.get(name)
        if special is not None:
            return special(node)
        if isinstance(func, ast.Attribute) and func.attr in _METHODS and self._is_source(
                func.value):
            low, high = _METHODS[func.attr]
            if node.keywords or not low <= len(node.args) <= high:
                raise self.fail(f"unsupported call of .{func.attr}()")
            target, method = self.node(func.value), func.attr
            args = [self.node(a) for a in node.args]
            return lambda values: getattr(target(values), method)(*(a(values) for a in args))
        if name == "device":  # a torch.device's repr: device(type='cpu', index=0)
            try:
                constant = torch.device(*[ast.literal_eval(a) for a in node.args],
                                        **{k.arg: ast.literal_eval(k.value)
                                           for k in node.keywords})
            except (ValueError, TypeError, RuntimeError) as error:
                raise self.fail(f"device(...) with non-constant arguments ({error})") from None
            return lambda values: constant
        if (isinstance(func, ast.Attribute) and func.attr == "item" and not node.args
                and not node.keywords and isinstance(func.value, ast.Call)
                and ast.unparse(func.value.func) == "___as_tensor"):
            # torch 2.11 guards a float as `x == ___as_tensor(x).item()`
            inner = self.node(func.value)
            return lambda values: inner(values).item()
        fn = _FUNCTIONS.get(name)
        if fn is None or node.keywords:
            raise self.fail(f"unsupported function {name!r}")
        args = [self.node(a) for a in node.args]
        if len(args) == 1:
            (arg,) = args
            return lambda values: fn(arg(values))
        return lambda values: fn(*(a(values) for a in args))

    def _check_type_id(self, node: ast.Call) -> Fn:
        if self.type_of is None or len(node.args) != 2:
            raise self.fail("a type check without a recorded type")
        value, check = self.node(node.args[0]), TypeIs(tuple(self.type_of))
        return lambda values: check(value(values))

    def _check_obj_id(self, node: ast.Call) -> Fn:
        if self.obj is None or len(node.args) != 2:
            raise self.fail("an identity check without a recorded object")
        value, check = self.node(node.args[0]), ObjIs(self.obj)
        return lambda values: check(value(values))

    def _dict_contains(self, node: ast.Call) -> Fn:
        if len(node.args) != 2:
            raise self.fail("___dict_contains takes two arguments")
        key, mapping = self.node(node.args[0]), self.node(node.args[1])
        return lambda values: key(values) in mapping(values)

    def _no_aliasing(self, node: ast.Call) -> Fn:
        items = [self.node(a) for a in node.args]
        count = len(items)
        return lambda values: len({id(f(values)) for f in items}) == count

    def _check_tensor(self, node: ast.Call) -> Fn:
        return _tensor_check(self, node)


class TypeIs:
    """``___check_type_id`` of one value: its type by module and qualified name (ids mean
    nothing in another process); the type that passed last time is one identity test."""

    __slots__ = ("want", "last")

    def __init__(self, want: tuple) -> None:
        self.want, self.last = want, None

    def __call__(self, obj: Any) -> bool:
        tp = type(obj)
        if tp is self.last:
            return True
        if (tp.__module__, tp.__qualname__) == self.want:
            self.last = tp
            return True
        return False


class ObjIs:
    """``___check_obj_id`` of one value: what the object is (:func:`describe_object`); the
    object that passed last time (a module, a function...) is one identity test."""

    __slots__ = ("want", "last")

    def __init__(self, want: Any) -> None:
        self.want, self.last = want, _MISSING

    def __call__(self, obj: Any) -> bool:
        if obj is self.last:
            return True
        if describe_object(obj) == self.want:
            self.last = obj
            return True
        return False


def _math(name: str) -> Callable:
    return getattr(math, name)


_FUNCTIONS: dict[str, Callable] = {
    "len": len, "hasattr": hasattr, "getattr": getattr, "set": set, "list": list,
    "tuple": tuple, "int": int, "float": float, "abs": abs, "max": max, "min": min,
    "bool": bool, "math.isnan": _math("isnan"), "math.floor": _math("floor"),
    "math.ceil": _math("ceil"), "math.sqrt": _math("sqrt"), "math.trunc": _math("trunc"),
    "dict.keys": dict.keys,
    # torch 2.11 reads an instance's __dict__ past any custom __getattribute__
    "object.__getattribute__": object.__getattribute__,
}
if hasattr(torch, "_as_tensor_fullprec"):  # Dynamo's own binding of the name (float64 for a float)
    _FUNCTIONS["___as_tensor"] = torch._as_tensor_fullprec


def _tensor_check(c: _Compiler, node: ast.Call) -> Fn:
    """``check_tensor(src, Cls, DispatchKeySet(...), dtype, device=, requires_grad=, size=,
    stride=)``: Dynamo's TENSOR_MATCH. ``None`` in size / stride: symbolic (shape guards)."""
    if len(node.args) != 4:
        raise c.fail("check_tensor with an unexpected signature")
    value = c.node(node.args[0])
    cls_name = ast.unparse(node.args[1])
    keys = _key_names(ast.unparse(node.args[2]))
    dtype_text = ast.unparse(node.args[3])
    dtype = getattr(torch, dtype_text.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise c.fail(f"unknown dtype {dtype_text}")
    kw = {}
    for k in node.keywords:
        try:
            kw[k.arg] = ast.literal_eval(k.value)
        except ValueError:
            raise c.fail(f"check_tensor keyword {k.arg}") from None
    if set(kw) - {"device", "requires_grad", "size", "stride"}:
        raise c.fail(f"check_tensor keywords {sorted(kw)}")
    device = -1 if kw.get("device") is None else int(kw["device"])  # get_device(): -1 on CPU
    grad = kw.get("requires_grad")
    shape_ok = _dims_check(kw.get("size"))
    stride_ok = _dims_check(kw.get("stride"))
    tls = c.sources.slot("<dispatch tls>", 0, _dispatch_tls)
    c.read.add(tls)
    keys_seen: dict[int, tuple] = {}
    last_type: list = [None]

    def check(values: list) -> bool:
        t = value(values)
        tp = type(t)
        if tp is not last_type[0]:
            if not issubclass(tp, torch.Tensor) or tp.__name__ != cls_name:
                return False
            last_type[0] = tp
        if t.dtype != dtype or t.get_device() != device or (
                grad is not None and t.requires_grad != grad):
            return False
        if not shape_ok(t.shape) or not stride_ok(t.stride()):
            return False
        return _dispatch_keys(t, values[tls], keys_seen) == keys

    return check


def _dims_check(dims: list | None) -> Callable[[Sequence[int]], bool]:
    """A check of sizes or strides against Dynamo's list (None entries: symbolic, not checked
    here)."""
    if dims is None:
        return lambda got: True
    want = tuple(dims)
    if None not in want:
        return lambda got: got == want
    fixed = tuple((d, s) for d, s in enumerate(want) if s is not None)
    ndim = len(want)

    def check(got: Sequence[int]) -> bool:
        if len(got) != ndim:
            return False
        for d, s in fixed:
            if got[d] != s:
                return False
        return True

    return check


def _dispatch_tls(_: Any) -> tuple:
    """The thread-local dispatch include / exclude sets (read once per call)."""
    return (torch._C._dispatch_tls_local_include_set(),
            torch._C._dispatch_tls_local_exclude_set())


def _key_names(text: str) -> frozenset:
    inner = text[text.find("(") + 1:text.rfind(")")]
    return frozenset(k.strip() for k in inner.split(",") if k.strip())


def _dispatch_keys(t: torch.Tensor, tls: tuple, seen: dict) -> frozenset:
    """The tensor's dispatch keys as Dynamo compares them: with the thread-local include set
    added and the exclude set removed. Memoized per tensor (weakly: user tensors are never
    kept alive) and thread-local state."""
    hit = seen.get(id(t))
    if hit is not None and hit[0]() is t and hit[1] == tls:
        return hit[2]
    include, exclude = tls
    names = _key_names(str((torch._C._dispatch_keys(t) | include) - exclude))
    if len(seen) > 1024:
        seen.clear()
    seen[id(t)] = (weakref.ref(t), tls, names)
    return names


# ---------------------------------------------------------------------------- guard sets

class _Guard:
    __slots__ = ("kind", "code", "source", "fn", "read", "type_of", "obj")

    def __init__(self, kind: str, code: str, source: str, fn: Fn, read: set,
                 type_of: list | None = None, obj: dict | None = None) -> None:
        self.kind, self.code, self.source, self.fn, self.read = kind, code, source, fn, read
        self.type_of, self.obj = type_of, obj  # what identity checks compare (recorded)


# Bumped whenever any nn.Module gets a parameter, buffer or submodule assigned (PyTorch's global
# registration hooks): the state guards of a cached frame are checked again on the next call.
_module_epoch = [0]
_epoch_hooks: list = []


def _bump_epoch(*_: Any) -> None:
    # Dynamo traces these hooks where a compiled forward assigns a buffer (transformers' caches
    # do): bumping there made every such frame guard on the epoch's value and compile again at
    # each call, up to Dynamo's recompile limit. Dynamo replays the assignment after its graph
    # without the hooks, so an assignment inside a compiled region does not bump the epoch;
    # cache_compile's per-call check still reads each call's parameters and buffers.
    if torch.compiler.is_compiling():
        return
    _module_epoch[0] += 1


def _watch_modules() -> None:
    if _epoch_hooks:
        return
    from torch.nn.modules import module as nn_module

    _epoch_hooks.extend([nn_module.register_module_parameter_registration_hook(_bump_epoch),
                         nn_module.register_module_buffer_registration_hook(_bump_epoch),
                         nn_module.register_module_module_registration_hook(_bump_epoch)])


def module_epoch() -> int:
    return _module_epoch[0]


_TENSOR_DICTS = ("._parameters", "._buffers")
# the per-call check as one generated function (0: its general form; see _guard_codegen)
ENV_CODEGEN = "TORCHAIR_GUARD_CODEGEN"


class TensorMemo:
    """The tensors that last passed some per-call tensor checks, remembered as one C++ check
    (PyTorch's ``TensorGuards``, what Dynamo's guards compare: Python type, dispatch keys with
    the thread's include/exclude sets, dtype, device, requires_grad, sizes, strides). When the
    call's tensors match them exactly, the checks (which look at a subset of that) hold without
    running their Python, one call instead of a few per tensor, each run with the caches the
    step's weights evicted. Otherwise the caller runs its checks and, when they hold,
    :meth:`remember` s the new tensors. Without ``TensorGuards`` (another PyTorch) it never
    holds."""

    _factory: Any = getattr(getattr(getattr(torch._C, "_dynamo", None), "guards", None),
                            "TensorGuards", None)

    MAX_MISSES = 8  # consecutive misses after which it stops remembering (shapes that vary)

    def __init__(self, slots: Sequence[int]) -> None:
        self.slots = tuple(slots)
        self._check: Callable[..., bool] | None = None
        self._misses = 0

    def holds(self, values: Sequence[Any]) -> bool:
        check = self._check
        if check is None:
            return False
        try:
            held = bool(check(*[values[k] for k in self.slots]))
        except Exception:  # noqa: BLE001 - not a tensor any more: the checks say why
            held = False
        self._misses = 0 if held else self._misses + 1
        return held

    def remember(self, values: Sequence[Any]) -> None:
        if self._misses >= self.MAX_MISSES:
            return  # metadata that changes call after call: building it again would not pay
        tensors = [values[k] for k in self.slots]
        self._check = None
        if self._factory is None or not self.slots or not all(
                isinstance(t, torch.Tensor) for t in tensors) or any(
                t.is_nested or t.layout != torch.strided for t in tensors):
            return  # (a nested tensor would abort the process inside TensorGuards)
        try:
            # the keywords must be passed (its constructor reads them from the keyword dict)
            self._check = self._factory(*tensors, dynamic_dims_sizes=None,
                                        dynamic_dims_strides=None).check
        except Exception:  # noqa: BLE001 - a tensor it cannot describe: keep the Python checks
            self._check = None


class GuardSet:
    """The checks of one cached frame (records from :mod:`torchair.inference._guards`) and the
    sources they and the graph inputs read."""

    def __init__(self, records: Sequence[dict], input_sources: Sequence[str] = ()) -> None:
        self.sources = Sources()
        self.guards: list[_Guard] = []
        self.state: dict | None = None
        self.modes: int | None = None
        self.mode_tags: list[str] = []  # tags of the (cacheable) modes traced under
        self._modes_seen: tuple = ((), ())  # the modes whose tags matched last, their attributes
        for rec in records:
            kind = rec["kind"]
            if rec.get("advisory"):
                continue
            if kind == "GLOBAL_STATE":
                self.state = rec["state"]
            elif kind == "TORCH_FUNCTION_MODE_STACK":
                self.modes = int(rec["depth"])
                # the stack's modes, then the process-wide ones (function_modes.process_modes)
                self.mode_tags = list(rec.get("modes", ())) + list(rec.get("process", ()))
            else:
                for code in rec["code"]:
                    read: set[int] = set()
                    fn = compile_expression(code, self.sources, type_of=rec.get("type"),
                                            obj=rec.get("obj"), read=read)
                    self.guards.append(_Guard(kind, code, rec.get("source", ""), fn, read,
                                              rec.get("type"), rec.get("obj")))
        self.inputs = [source_slot(s, self.sources) for s in input_sources]
        self._per_call: tuple | None = None  # see :meth:`watch_arguments`
        self._tensor_slots = {source_slot(g.source, self.sources) for g in self.guards
                              if g.kind == "TENSOR_MATCH" and g.source}

    def tensor_inputs(self, count: int, per_call: bool = False) -> set[int]:
        """Which of the first ``count`` input sources a TENSOR_MATCH guard checks (dtype,
        device, static sizes and strides); ``per_call``: one that :meth:`check_arguments` runs
        on every call."""
        slots = self._tensor_slots
        if per_call and self._per_call is not None:
            slots = {source_slot(g.source, self.sources) for g in self._per_call[0]
                     if g.kind == "TENSOR_MATCH" and g.source}
        return {k for k, slot in enumerate(self.inputs[:count]) if slot in slots}

    def __len__(self) -> int:
        return len(self.guards)

    def _modes_differ(self) -> str:
        """Why this thread's torch-function mode stack, with the process-wide modes, is not the
        one traced under ("" when it is): the same depth, and each mode a registered one with
        an equal tag."""
        if self.modes is None:
            return ""
        stack = function_modes.stack_modes()
        if len(stack) != self.modes:
            if not self.modes and not self.mode_tags:
                return "a TorchFunctionMode is active (e.g. torch.device as a context manager)"
            return (f"the TorchFunctionMode stack differs from the one traced under "
                    f"({', '.join(self.mode_tags) or 'no mode'}): {_stack_text()}")
        modes = stack + function_modes.process_modes()
        if not modes and not self.mode_tags:
            return ""  # traced and called without any mode (the plain process)
        seen, states = self._modes_seen  # the modes whose tags matched last, their attributes
        if modes == seen:  # (modes compare by identity)
            for mode, state in zip(modes, states):
                if mode.__dict__ != state:
                    break
            else:
                return ""
        try:
            tags = function_modes.stack_tags(modes)
        except function_modes.UnknownMode:
            tags = None
        if tags != self.mode_tags:
            return (f"the TorchFunctionMode stack differs from the one traced under "
                    f"({', '.join(self.mode_tags) or 'no mode'}): {_stack_text()}")
        self._modes_seen = (modes, tuple(dict(vars(m)) for m in modes))
        return ""

    def _process_state(self) -> str:
        why = self._modes_differ()
        if why:
            return why
        if self.state is not None:
            now = global_state()
            if now != self.state:
                diff = sorted(k for k in now if now[k] != self.state.get(k))
                return f"global state changed: {', '.join(diff)}"
        return ""

    def _run(self, guards: Sequence[_Guard], values: list) -> str:
        for guard in guards:
            try:
                ok = guard.fn(values)
            except Exception as error:  # noqa: BLE001 - an unreadable value fails the guard
                return f"{guard.kind} `{guard.code}`: {type(error).__name__}: {error}"
            if not ok:
                return f"{guard.kind} `{guard.code}` does not hold{self._now(guard, values)}"
        return ""

    def check(self, frame: dict, globals_: dict | Globals) -> tuple[str, list]:
        """("", graph inputs) when every guard holds, else (a sentence naming the first guard
        that does not, [])."""
        epoch = module_epoch()  # before reading: an assignment during the check is seen next
        why = self._process_state()
        if why:
            return why, []
        if not isinstance(globals_, Globals):
            globals_ = Globals(globals_)
        values, why = self.sources.evaluate(frame, globals_)
        if not why:
            why = self._run(self.guards, values)
        if why:
            return why, []
        if self._per_call is not None:
            self._tensor_dicts = {k: values[parent] for k, parent, _ in self._per_call[2]}
            self._checked_epoch = epoch
        return "", [values[i] for i in self.inputs]

    # ------------------------------------------------------------- per-call argument checks
    def watch_arguments(self, arguments: Sequence[str]) -> None:
        """Prepare :meth:`check_arguments`: the guards that read a call argument (a name in
        ``arguments``) or no source at all, the sources they and the graph inputs read, and
        the inputs that are a module's parameters or buffers (read from the module's
        ``_parameters`` / ``_buffers`` dict, kept from the last full check)."""
        roots = {f"L[{name!r}]" for name in arguments}
        sources = self.sources

        def per_call(guard: _Guard) -> bool:
            read = [r for r in guard.read if sources.roots[r] != "<dispatch tls>"]
            return not read or any(sources.roots[r] in roots for r in read)

        guards = [g for g in self.guards if per_call(g)]
        dict_inputs, read = [], set()
        for k, slot in enumerate(self.inputs):
            parent = sources.steps[slot - 2][0] if slot >= 2 else -1
            if (sources.roots[slot] not in roots and slot in sources.items and parent >= 2
                    and sources.steps[parent - 2][2].endswith(_TENSOR_DICTS)):
                dict_inputs.append((k, parent, sources.items[slot]))
            else:
                read.add(slot)
        for guard in guards:
            read |= guard.read
        self._per_call = (guards, sources.ancestors(read), dict_inputs)
        # the tensors the per-call TENSOR_MATCH guards check, remembered after they held: a call
        # with the same tensor metadata runs only the other guards
        memoed = [g for g in guards if g.kind == "TENSOR_MATCH" and g.source]
        self._memo = TensorMemo(sorted({source_slot(g.source, sources) for g in memoed}))
        self._untensored = [g for g in guards if not any(g is m for m in memoed)]
        self._tensor_dicts: dict[int, Any] = {}
        self._checked_epoch = -1
        self._state_snapshot: Any = None
        self._blind_spots: tuple = ()
        self._program = self._generate()
        _watch_modules()

    def _generate(self) -> Callable[[dict, Any], list | None] | None:
        """The per-call check as one generated function (:mod:`._guard_codegen`), or None
        (``$TORCHAIR_GUARD_CODEGEN=0``, or a check it does not cover)."""
        from torchair.base.log import env_switch, logger
        from torchair.inference._guard_codegen import NotGenerated, per_call_program

        if not env_switch(ENV_CODEGEN):
            return None
        try:
            return per_call_program(self)
        except NotGenerated as why:
            logger.debug("cache_compile: the per-call check runs in its general form (%s)", why)
        except Exception as why:  # noqa: BLE001 - the general form is always there
            logger.debug("cache_compile: the per-call check runs in its general form (%s: %s)",
                         type(why).__name__, why)
        return None

    def dict_inputs(self) -> list:
        """(graph input index, its module dict's slot, key) of the inputs read from a module's
        ``_parameters`` / ``_buffers`` dict on per-call checks ([] before watch_arguments)."""
        return list(self._per_call[2]) if self._per_call is not None else []

    def _process_state_per_call(self) -> str:
        """:meth:`_process_state` through a snapshot of the whole process state taken after the
        last full comparison (one C++ call); a difference there (including ones the guard
        ignores, such as the thread count) falls back to the full comparison."""
        if self.state is None:
            return self._process_state()
        if self._modes_differ():
            return self._process_state()
        if (self._state_snapshot is not None and self._state_snapshot.check()
                and _snapshot_blind_spots() == self._blind_spots):
            return ""
        why = self._process_state()
        if not why:
            self._state_snapshot = _state_snapshot()
            self._blind_spots = _snapshot_blind_spots()
        return why

    def check_arguments(self, frame: dict, globals_: dict | Globals) -> tuple[str, list]:
        """:meth:`check` of what can change from call to call without touching a module: the
        process state (grad, autocast, function modes...), every guard that reads a call
        argument, and the graph inputs read again (parameters and buffers from their module's
        dict). Guards on module attributes and globals are checked by the full :meth:`check`,
        which runs instead on the first call and after any parameter, buffer or submodule
        assignment (:func:`module_epoch`)."""
        if self._per_call is None or self._checked_epoch != module_epoch():
            return self.check(frame, globals_)
        guards, steps, dict_inputs = self._per_call
        why = self._process_state_per_call()
        if why:
            return why, []
        program = self._program
        if program is not None:
            flat = program(frame, globals_)
            if flat is not None:
                return "", flat
        if not isinstance(globals_, Globals):
            globals_ = Globals(globals_)
        values, why = self.sources.evaluate_some(frame, globals_, steps)
        if not why:
            memo = self._memo
            if memo.holds(values):
                why = self._run(self._untensored, values)
            else:
                why = self._run(guards, values)
                if not why:
                    memo.remember(values)
        if why:
            return why, []
        dicts = self._tensor_dicts
        for k, _, key in dict_inputs:
            try:
                values[self.inputs[k]] = dicts[k][key]
            except KeyError:  # removed from its module: the full check says which source
                return self.check(frame, globals_)
        return "", [values[i] for i in self.inputs]

    def _now(self, guard: _Guard, values: list) -> str:
        """The guarded value now, when it is short to show (for the warning)."""
        slot = self.sources.index.get(guard.source) if guard.source else None
        if slot is None or slot >= len(values):
            return ""
        value = values[slot]
        if guard.kind == "TYPE_MATCH":
            return f" ({guard.source} is a {type(value).__qualname__})"
        if guard.kind == "TENSOR_MATCH" and isinstance(value, torch.Tensor):
            return (f" ({guard.source} is {str(value.dtype).removeprefix('torch.')}"
                    f"{list(value.shape)} with strides {list(value.stride())})")
        if guard.kind in ("LENGTH_CHECK", "DICT_LENGTH"):
            try:
                return f" (len({guard.source}) is {len(value)})"
            except TypeError:
                return ""
        if guard.kind in ("EQUALS_MATCH", "TRUE_MATCH", "FALSE_MATCH", "NONE_MATCH"):
            text = repr(value)
            return f" ({guard.source} is {text if len(text) <= 60 else text[:57] + '...'})"
        return ""
