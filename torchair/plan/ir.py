"""The IR view of an ATen FX graph, as TorchAir's GE graph shows it.

Every placeholder is a ``Data`` node, every call an op node named by its target
(``aten.addmm``, ``npu.npu_incre_flash_attention``, ``operator.add``) and the output ``NetOutput``.
A value-dependent argument of a value-dependent op (see :mod:`torchair.base.registry`) that holds
only Python constants becomes a separate ``Const`` node wired as an input of the op: that is how
TorchAir shows "Python constants become Const nodes". When it holds FX nodes (SymInts) those nodes
are the op's inputs instead.

Attributes are plain Python values (dtypes, devices and memory formats as strings such as
``"float16"``). Inside an attribute that mixes constants and nodes, a node is written ``"%name"``.
"""
from __future__ import annotations

import dataclasses
import math
import operator
from typing import Any, Sequence

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor

from torchair.base.meta import ASCEND_KEYS, META_ATTRS, OPTIONS_KEY, PRIORITY_KEY, SCOPE_KEY, STREAM_KEY
from torchair.base.registry import get_value_dependent
from torchair.plan.inputs import InputInfo, dtype_name, ir_shape, is_symbolic

__all__ = ["IRNode", "to_ir", "op_name", "plain", "format_value", "META_ATTRS", "SCOPE_KEY",
           "OPTIONS_KEY", "STREAM_KEY", "PRIORITY_KEY", "ASCEND_KEYS"]



@dataclasses.dataclass
class IRNode:
    """One IR node. ``shape``: ``-1`` for a symbolic dim, ``[]`` for a scalar, None if unknown."""

    name: str
    op: str
    inputs: list[str] = dataclasses.field(default_factory=list)
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)
    shape: list[int] | None = None
    dtype: str = ""


def op_name(target: Any) -> str:
    """The IR op type of a call target: ``aten.add.Tensor``, ``aten.addmm``, ``operator.add``."""
    if isinstance(target, torch._ops.OpOverload):
        name = f"{target.namespace}.{target._schema.name.split('::', 1)[-1]}"
        overload = target._overloadname
        return name if overload == "default" else f"{name}.{overload}"
    if isinstance(target, torch._ops.OpOverloadPacket):
        return str(target).replace("torch.ops.", "", 1)
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order.{target.name()}"
    if isinstance(target, str):
        return target
    module = getattr(target, "__module__", None) or ""
    qualname = getattr(target, "__qualname__", None) or getattr(target, "__name__", str(target))
    if module in ("_operator", "operator"):
        return f"operator.{qualname}"
    if module in ("builtins", ""):
        return qualname
    return f"{module}.{qualname}"


def plain(value: Any) -> Any:
    """An FX argument as a plain Python value (nodes as ``"%name"``, dtypes as ``"float16"``)."""
    if isinstance(value, fx.Node):
        return f"%{value.name}"
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    if isinstance(value, (torch.device, torch.memory_format, torch.layout)):
        return str(value).replace("torch.", "")
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return str(value) if is_symbolic(value) else int(value)
    if isinstance(value, (list, tuple)):  # torch.Size and immutable_list included
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        return f"tensor({dtype_name(value.dtype)}{list(ir_shape(value))})"
    if isinstance(value, slice):
        return str(value)
    return str(value)


def _val_info(val: Any) -> tuple[list[int] | None, str]:
    """(IR shape, dtype) of a ``meta["val"]``; (None, "") when unknown."""
    if isinstance(val, torch.Tensor):
        return list(ir_shape(val)), dtype_name(val.dtype)
    if isinstance(val, (torch.SymBool, bool)):
        return [], "bool"
    if isinstance(val, (torch.SymInt, int)):
        return [], "int64"
    if isinstance(val, (torch.SymFloat, float)):
        return [], "float64"
    if isinstance(val, (list, tuple)):
        return None, "tuple"
    return None, ""


def _node_refs(value: Any) -> list[fx.Node]:
    """The FX nodes in an argument, in order, repeats kept."""
    refs: list[fx.Node] = []
    fx.node.map_arg(value, refs.append)
    return refs


def _is_constant(value: Any) -> bool:
    return not _node_refs(value)


def _has_constant_leaf(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_has_constant_leaf(v) for v in value)
    if isinstance(value, dict):
        return any(_has_constant_leaf(v) for v in value.values())
    return not isinstance(value, fx.Node)


def _named_arguments(node: fx.Node) -> list[tuple[str, Any, bool]]:
    """(name, value, given) of each argument: by schema for an OpOverload, else ``argN``/kwarg.

    Schema arguments that were not passed take their non-None default (``given`` False).
    """
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        out = []
        for i, arg in enumerate(target._schema.arguments):
            if i < len(node.args):
                out.append((arg.name, node.args[i], True))
            elif arg.name in node.kwargs:
                out.append((arg.name, node.kwargs[arg.name], True))
            elif arg.has_default_value() and arg.default_value is not None \
                    and "Tensor" not in str(arg.type):
                out.append((arg.name, arg.default_value, False))
        known = {a.name for a in target._schema.arguments}
        out.extend((k, v, True) for k, v in node.kwargs.items() if k not in known)
        return out
    return [(f"arg{i}", a, True) for i, a in enumerate(node.args)] + \
        [(k, v, True) for k, v in node.kwargs.items()]


class _Names:
    def __init__(self, gm: fx.GraphModule):
        self.used = {n.name for n in gm.graph.nodes}
        self.consts = 0

    def fresh(self, base: str) -> str:
        name, i = base, 0
        while name in self.used:
            i += 1
            name = f"{base}_{i}"
        self.used.add(name)
        return name

    def const(self) -> str:
        while f"const_{self.consts}" in self.used:
            self.consts += 1
        name = f"const_{self.consts}"
        self.used.add(name)
        self.consts += 1
        return name


def _const_node(name: str, value: Any) -> IRNode:
    value = plain(value)
    shape = [len(value)] if isinstance(value, list) else []
    return IRNode(name, "Const", [], {"value": value}, shape, "int64")


def _call_node(node: fx.Node, names: _Names, ir_name: dict[fx.Node, str]) -> list[IRNode]:
    entry = get_value_dependent(node.target)
    vd_args = set(entry.args) if entry is not None else set()
    consts: list[IRNode] = []
    inputs: list[str] = []
    attrs: dict[str, Any] = {}
    for name, value, given in _named_arguments(node):
        if name in vd_args and given and value is not None and _is_constant(value):
            const = _const_node(names.const(), value)
            consts.append(const)
            inputs.append(const.name)
            continue
        refs = _node_refs(value)
        inputs.extend(ir_name[r] for r in refs)
        if not refs or (isinstance(value, (list, tuple, dict)) and _has_constant_leaf(value)):
            attrs[name] = plain(value)
    attrs.update((key, node.meta[key]) for key in META_ATTRS if key in node.meta)
    shape, dtype = _val_info(node.meta.get("val"))
    if node.op == "call_function":
        op = op_name(node.target)
    else:
        op = f"{node.op}.{node.target}"
    return consts + [IRNode(ir_name[node], op, inputs, attrs, shape, dtype)]


def _get_attr_node(gm: fx.GraphModule, node: fx.Node, ir_name: dict[fx.Node, str]) -> IRNode:
    attrs: dict[str, Any] = {"target": str(node.target)}
    try:
        value = operator.attrgetter(str(node.target))(gm)
    except AttributeError:
        value = None
    shape, dtype = _val_info(node.meta.get("val", value))
    if isinstance(value, torch.Tensor):
        shape, dtype = list(value.shape), dtype_name(value.dtype)
        if value.numel() <= 16 and not isinstance(value, FakeTensor):
            attrs["value"] = value.detach().cpu().tolist()
    return IRNode(ir_name[node], "Const", [], attrs, shape, dtype)


def to_ir(gm: fx.GraphModule, inputs: Sequence[InputInfo]) -> list[IRNode]:
    """The IR nodes of ``gm`` in graph order; placeholders match ``inputs`` one to one."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(inputs):
        raise ValueError(f"to_ir: the graph has {len(placeholders)} placeholders but "
                         f"{len(inputs)} input descriptions were given; they must match 1:1")
    names = _Names(gm)
    ir_name = {n: n.name for n in gm.graph.nodes}
    by_node = dict(zip(placeholders, inputs))
    nodes: list[IRNode] = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            info = by_node[node]
            shape = list(info.shape)
            attrs = {"index": info.index, "name": info.name, "kind": info.kind, "shape": shape,
                     "dtype": info.dtype}
            nodes.append(IRNode(node.name, "Data", [], attrs, list(shape), info.dtype))
        elif node.op == "output":
            ir_name[node] = names.fresh("NetOutput")
            value = node.args[0] if node.args else ()
            attrs = {"outputs": plain(value)} if _has_constant_leaf(value) else {}
            nodes.append(IRNode(ir_name[node], "NetOutput",
                                [ir_name[r] for r in _node_refs(value)], attrs, None, ""))
        elif node.op == "get_attr":
            nodes.append(_get_attr_node(gm, node, ir_name))
        else:
            nodes.extend(_call_node(node, names, ir_name))
    return nodes


def format_value(value: Any) -> str:
    """An attribute in the txt dump: strings bare, lists bracketed, floats round-tripping."""
    if isinstance(value, list):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {format_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return str(value) if isinstance(value, str) else repr(value)
