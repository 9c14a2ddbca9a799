"""The static/dynamic decision at the three levels of seed 000 (FX, IR, build), with reasons.

1. FX graph static  <=> no symbolic input (no SymInt input, no symbolic tensor dim).
2. IR graph static  <=> every tensor input has a fully known shape (SymInts are scalar Data).
3. Build static     <=> IR static, and every value-dependent op can read its value-dependent
   arguments on the device: they are Consts, or tiling sink is on and the host scalars that feed
   them can be sunk into one device buffer (they feed nothing but value-dependent arguments).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch
import torch.fx as fx

from torchair.base.registry import HOST_SYNC_OPS, ValueDependentOp, get_value_dependent
from torchair.plan.inputs import InputInfo


@dataclasses.dataclass
class ValueDependentUse:
    """One call of a value-dependent op in the graph and how its host-read arguments arrive."""

    node: fx.Node
    entry: ValueDependentOp
    symbolic_args: tuple[str, ...]  # arguments that hold at least one runtime scalar
    const_args: dict[str, Any]  # arguments whose values are compile-time constants (IR Const)

    @property
    def op_name(self) -> str:
        return self.entry.name


@dataclasses.dataclass
class Analysis:
    fx_static: bool
    ir_static: bool
    build_static: bool
    reasons: list[str]
    value_dependent: list[ValueDependentUse]
    host_scalars: list[fx.Node]  # SymInt placeholders and scalar arithmetic on them, topo order
    sinkable: bool  # every host scalar feeds only value-dependent arguments


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, fx.Node) else node


def _is_scalar_node(node: fx.Node) -> bool:
    return isinstance(_val(node), (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool))


def node_arg(node: fx.Node, name: str) -> Any:
    if name in node.kwargs:
        return node.kwargs[name]
    for i, a in enumerate(node.target._schema.arguments):
        if a.name == name and i < len(node.args):
            return node.args[i]
    return None


def flatten_args(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def value_dependent_uses(gm: fx.GraphModule) -> list[ValueDependentUse]:
    uses = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        entry = get_value_dependent(node.target)
        if entry is None:
            continue
        symbolic, consts = [], {}
        for name in entry.args:
            value = node_arg(node, name)
            if any(isinstance(v, fx.Node) for v in flatten_args(value)):
                symbolic.append(name)
            elif value is not None:
                consts[name] = value
        uses.append(ValueDependentUse(node, entry, tuple(symbolic), consts))
    return uses


# Checks on scalars (``torch._check``, value ranges): host work that returns nothing.
_HOST_CHECKS = {torch.ops.aten._assert_scalar.default, torch.ops.aten.sym_constrain_range.default,
                torch.ops.aten.sym_constrain_range_for_size.default}


def host_scalar_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    """Scalar placeholders, the scalar arithmetic computed only from them and checks on them
    (host work, in graph order)."""
    scalars: list[fx.Node] = []
    known: set[fx.Node] = set()
    for node in gm.graph.nodes:
        scalar_input = node.op == "placeholder" and _is_scalar_node(node)
        host_work = node.op == "call_function" and _is_host_arith(node, known) and (
            _is_scalar_node(node) or node.target in _HOST_CHECKS)
        if scalar_input or host_work:
            scalars.append(node)
            known.add(node)
    return scalars


def _is_host_arith(node: fx.Node, known: set[fx.Node]) -> bool:
    inputs = node.all_input_nodes
    return bool(inputs) and all(n in known for n in inputs)


def _uses_outside_value_args(node: fx.Node, scalars: set[fx.Node],
                             vd_nodes: dict[fx.Node, ValueDependentUse]) -> list[fx.Node]:
    bad = []
    for user in node.users:
        if user in scalars:
            continue
        use = vd_nodes.get(user)
        if use is not None and _only_in_args(user, node, use):
            continue
        bad.append(user)
    return bad


def _outside_uses(scalars: list[fx.Node], scalar_set: set[fx.Node],
                  vd_nodes: dict[fx.Node, ValueDependentUse]) -> dict[fx.Node, list[fx.Node]]:
    """Users outside value-dependent arguments, grouped by the scalar inputs they derive from."""
    sources: dict[fx.Node, list[fx.Node]] = {}
    for node in scalars:
        sources[node] = [node] if node.op == "placeholder" else sorted(
            {s for n in node.all_input_nodes for s in sources[n]}, key=scalars.index)
    outside: dict[fx.Node, list[fx.Node]] = {}
    for node in scalars:
        for user in _uses_outside_value_args(node, scalar_set, vd_nodes):
            for source in sources[node] or [node]:
                if user not in outside.setdefault(source, []):
                    outside[source].append(user)
    return outside


def _only_in_args(user: fx.Node, node: fx.Node, use: ValueDependentUse) -> bool:
    inside = sum(flatten_args(node_arg(user, name)).count(node) for name in use.symbolic_args)
    return inside == _all_refs(user).count(node)


def _all_refs(node: fx.Node) -> list[fx.Node]:
    refs: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), refs.append)
    return refs


def analyze(gm: fx.GraphModule, inputs: Sequence[InputInfo], *, tiling_sink: bool) -> Analysis:
    """Decide the three levels for ``gm`` (an ATen inference graph) and say why not static."""
    reasons: list[str] = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    by_node = dict(zip(placeholders, inputs))
    dynamic_tensors = [i for i in inputs if i.kind != "symint" and i.is_dynamic]
    symints = [i for i in inputs if i.kind == "symint"]
    fx_static = not dynamic_tensors and not symints
    ir_static = not dynamic_tensors
    for info in dynamic_tensors:
        reasons.append(f"input {info.index} (`{info.name}`) has shape {list(info.shape)}: call "
                       f"torch._dynamo.mark_static on it before the first call (or compile with "
                       f"dynamic=False, which recompiles when the shape changes)")

    uses = value_dependent_uses(gm)
    scalars = host_scalar_nodes(gm)
    scalar_set = set(scalars)
    vd_nodes = {u.node: u for u in uses}
    outside = _outside_uses(scalars, scalar_set, vd_nodes)
    sinkable = not outside
    if ir_static:
        for source, users in outside.items():
            info = by_node.get(source)
            what = f"SymInt input {info.index} (`{info.name}`)" if info else f"scalar `{source.name}`"
            ops = ", ".join(f"`{_target_name(u)}` (node `{u.name}`)" for u in users[:3])
            more = f" and {len(users) - 3} more" if len(users) > 3 else ""
            reasons.append(f"{what} is used by {ops}{more} outside a value-dependent argument, "
                           f"so the host must read it: pass it as a tensor, or make it a constant")
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in HOST_SYNC_OPS:
            sinkable = False
            reasons.append(f"op `{_target_name(node)}` (node `{node.name}`) reads tensor data on "
                           f"the host (.item(), .tolist() or a data-dependent shape): the graph "
                           f"cannot run as one launch unit; compute it outside the compiled "
                           f"region or keep it on the device")
    for use in uses:
        for name in use.symbolic_args:
            foreign = [v for v in flatten_args(node_arg(use.node, name))
                       if isinstance(v, fx.Node) and v not in scalar_set]
            if foreign:
                sinkable = False
                reasons.append(f"op `{use.op_name}` (node `{use.node.name}`) takes `{name}` from "
                               f"`{foreign[0].name}`, a value computed from tensor data in the "
                               f"graph, which cannot be sunk: pass the values as a Python list")
    host_read = [u for u in uses if u.symbolic_args]
    if ir_static and not tiling_sink:
        for use in host_read:
            for name in use.symbolic_args:
                reasons.append(f"op `{use.op_name}` (node `{use.node.name}`) reads `{name}` on "
                               f"the host: set config.experimental_config."
                               f"tiling_schedule_optimize = True to read it on the device")
    build_static = ir_static and sinkable and (tiling_sink or not host_read)
    return Analysis(fx_static, ir_static, build_static, reasons, uses, scalars, sinkable)


def _target_name(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return str(target).replace(".default", "")
    return getattr(target, "__name__", str(target))
