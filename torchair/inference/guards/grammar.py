"""The guard grammar: Dynamo's printed guard code compiled into closures, never ``eval``-ed.

A cold start records every guard as Dynamo prints it (``L['self'].n == 3``,
``2 <= L['x'].size()[0]``, ``check_tensor(L['x'], Tensor, ...)``). The code is parsed with
:mod:`ast` and only a small grammar is accepted: names ``L`` / ``G``, constants, item and
attribute access, comparisons, arithmetic, ``and`` / ``or`` / ``not``, and a fixed table of
functions (:data:`FUNCTIONS`, the methods of :data:`METHODS`). Anything else raises
:class:`UnsupportedGuard` at the cold start, which then does not cache the function (with a
warning naming the guard).

:func:`compile_expression` turns one guard into ``fn(values) -> value`` over the slots of
:class:`~torchair.inference.guards.sources.Sources` it adds (:func:`source_slot` adds a graph
input's source); identity checks compare what the object is
(:mod:`~torchair.inference.guards.objects`) and tensor checks are built by
:mod:`~torchair.inference.guards.tensors`. The generated per-call check
(:mod:`~torchair.inference.guards.codegen`) writes its code from the trees this grammar accepted,
through :func:`is_source` and the same tables.

Imports only torch (no Dynamo), like the rest of a warm start.
"""
from __future__ import annotations

import ast
import math
import operator
from typing import Any, Callable

import torch

from torchair.inference.guards.objects import ObjIs, TypeIs
from torchair.inference.guards.sources import Fn, Sources
from torchair.inference.guards.tensors import DISPATCH_TLS, dispatch_tls, key_names, tensor_check

__all__ = ["FUNCTIONS", "METHODS", "UnsupportedGuard", "compile_expression", "is_source",
           "source_slot"]


class UnsupportedGuard(Exception):
    """A guard this module cannot check in another process (the message names it)."""



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
# methods a guard may call on a source: name -> (fewest, most) arguments
METHODS = {"size": (0, 1), "stride": (0, 1), "storage_offset": (0, 0), "dim": (0, 0),
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


def _math(name: str) -> Callable:
    return getattr(math, name)


# the functions a guard may call, by the name Dynamo prints
FUNCTIONS: dict[str, Callable] = {
    "len": len, "hasattr": hasattr, "getattr": getattr, "set": set, "list": list,
    "tuple": tuple, "int": int, "float": float, "abs": abs, "max": max, "min": min,
    "bool": bool, "math.isnan": _math("isnan"), "math.floor": _math("floor"),
    "math.ceil": _math("ceil"), "math.sqrt": _math("sqrt"), "math.trunc": _math("trunc"),
    "dict.keys": dict.keys,
    # torch 2.11 reads an instance's __dict__ past any custom __getattribute__
    "object.__getattribute__": object.__getattribute__,
}
if hasattr(torch, "_as_tensor_fullprec"):  # Dynamo's own binding of the name (float64 for a float)
    FUNCTIONS["___as_tensor"] = torch._as_tensor_fullprec


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


def is_source(node: ast.AST) -> bool:
    """Whether ``node`` is a source: a chain of items, attributes, no-argument methods of
    :data:`METHODS` and ``type(...)`` / ``dict(...)`` from ``L`` or ``G``."""
    while True:
        if isinstance(node, ast.Name):
            return node.id in ("L", "G")
        if isinstance(node, (ast.Subscript, ast.Attribute)):
            node = node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and not node.args and not node.keywords and node.func.attr in METHODS):
            node = node.func.value
        elif _source_call(node):
            node = node.args[0]
        else:
            return False


def _source_call(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in _SOURCE_CALLS and len(node.args) == 1 and not node.keywords)


def _slot_reader(slot: int) -> Fn:
    return lambda values: values[slot]


class _Compiler:
    """Compiles the tree of one guard's code (``text``, for messages) against ``sources``;
    ``read`` collects the slots the compiled code reads."""

    def __init__(self, text: str, sources: Sources, type_of: list | None,
                 obj: dict | None) -> None:
        self.text, self.sources, self.type_of, self.obj = text, sources, type_of, obj
        self.read: set[int] = set()  # the slots the compiled code reads

    def fail(self, what: str) -> UnsupportedGuard:
        return UnsupportedGuard(f"{what} in `{self.text}`")

    def node(self, node: ast.AST) -> Fn:
        if is_source(node):
            return _slot_reader(self.slot(node))
        method = getattr(self, f"_{type(node).__name__}", None)
        if method is None:
            raise self.fail(f"unsupported syntax {type(node).__name__}")
        return method(node)

    # -- sources: chains of items, attributes and no-argument methods from L or G (is_source)
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
                and not node.keywords and node.func.attr in METHODS):
            return self.sources.slot(key, self.slot(node.func.value),
                                     operator.methodcaller(node.func.attr))
        if _source_call(node):
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
        if isinstance(func, ast.Attribute) and func.attr in METHODS and is_source(
                func.value):
            low, high = METHODS[func.attr]
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
        fn = FUNCTIONS.get(name)
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
        """``check_tensor(src, Cls, DispatchKeySet(...), dtype, device=, requires_grad=, size=,
        stride=)``: Dynamo's TENSOR_MATCH. ``None`` in size / stride: symbolic (shape guards)."""
        if len(node.args) != 4:
            raise self.fail("check_tensor with an unexpected signature")
        value = self.node(node.args[0])
        cls_name = ast.unparse(node.args[1])
        keys = key_names(ast.unparse(node.args[2]))
        dtype_text = ast.unparse(node.args[3])
        dtype = getattr(torch, dtype_text.removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            raise self.fail(f"unknown dtype {dtype_text}")
        kw = {}
        for k in node.keywords:
            try:
                kw[k.arg] = ast.literal_eval(k.value)
            except ValueError:
                raise self.fail(f"check_tensor keyword {k.arg}") from None
        if set(kw) - {"device", "requires_grad", "size", "stride"}:
            raise self.fail(f"check_tensor keywords {sorted(kw)}")
        device = -1 if kw.get("device") is None else int(kw["device"])  # get_device(): -1 on CPU
        tls = self.sources.slot(DISPATCH_TLS, 0, dispatch_tls)
        self.read.add(tls)
        return tensor_check(value, tls, cls_name, keys, dtype, device, kw.get("requires_grad"),
                            kw.get("size"), kw.get("stride"))

