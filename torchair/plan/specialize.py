"""Specialize a graph with symbolic sizes to one gear: every size becomes a constant.

A gear graph is traced once with its gear dims as symbols (``u0``, ``u1``, ...). For one gear
the symbols have known values; :func:`specialize` copies the graph and replaces every scalar node
whose value depends on gear symbols only (the size placeholders Dynamo passes, arithmetic on
them, comparisons and the runtime checks on them) by its value, so what remains is a fixed-shape
graph whose only runtime scalars are real values (e.g. ``actual_seq_lengths``). Size placeholders
stay (the caller still passes them) but have no users. A check that fails for the gear's values
raises ``ValueError``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import sympy
import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor

from torchair.plan.inputs import InputInfo

_CHECKS = {torch.ops.aten._assert_scalar.default, torch.ops.aten.sym_constrain_range.default,
           torch.ops.aten.sym_constrain_range_for_size.default}


def gear_symbols(example_inputs: Sequence[Any], dims: Sequence[tuple[int, int]]
                 ) -> list[sympy.Symbol | None]:
    """The symbol of each gear dim ``(input_index, dim)``; None where the dim is not one symbol
    (Dynamo specialized it, e.g. under ``dynamic=False``)."""
    symbols = []
    for index, dim in dims:
        size = example_inputs[index].shape[dim]
        expr = size.node.expr if isinstance(size, torch.SymInt) else None
        symbols.append(expr if isinstance(expr, sympy.Symbol) else None)
    return symbols


def specialize(gm: fx.GraphModule, values: Mapping[sympy.Symbol, int]) -> fx.GraphModule:
    """A copy of ``gm`` with every scalar computed from ``values``' symbols only made constant."""
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    for node in list(graph.nodes):
        if node.op not in ("placeholder", "call_function"):
            continue
        if node.op == "call_function" and node.target in _CHECKS:
            _fold_check(graph, node, values)
            continue
        value = _constant(node.meta.get("val"), values)
        if value is None:
            if "val" in node.meta:
                node.meta["val"] = _concrete(node.meta["val"], values)
            continue
        node.replace_all_uses_with(value)  # type: ignore[arg-type]
        if node.op == "call_function":
            graph.erase_node(node)
    graph.lint()
    return fx.GraphModule(gm, graph)


def _constant(val: Any, values: Mapping[sympy.Symbol, int]) -> int | bool | None:
    if not isinstance(val, (torch.SymInt, torch.SymBool)):
        return None
    expr = val.node.expr
    if not expr.free_symbols or not expr.free_symbols <= set(values):
        return None
    result = expr.xreplace(dict(values))
    return bool(result) if isinstance(val, torch.SymBool) else int(result)


def _concrete(val: Any, values: Mapping[sympy.Symbol, int]) -> Any:
    """``val`` with tensor shapes/strides of gear symbols made concrete (for dumps and reports)."""

    def fix(t: Any) -> Any:
        if not isinstance(t, FakeTensor):
            return t
        dims = [*t.shape, *t.stride()]
        if not any(isinstance(d, torch.SymInt) for d in dims):
            return t
        fixed = [_constant(d, values) if isinstance(d, torch.SymInt) else d for d in dims]
        if any(d is None for d in fixed):
            return t  # a dim that is dynamic beyond the gears stays symbolic
        rank = t.dim()
        with t.fake_mode:
            return torch.empty_strided(fixed[:rank], fixed[rank:], dtype=t.dtype, device=t.device)

    return pytree.tree_map(fix, val)


def _fold_check(graph: fx.Graph, node: fx.Node, values: Mapping[sympy.Symbol, int]) -> None:
    if any(isinstance(a, fx.Node) for a in node.args):
        return  # still depends on a runtime scalar: the host checks it at run time
    if node.target is torch.ops.aten._assert_scalar.default:
        if not node.args[0]:
            raise ValueError(f"gear {dict(values)}: the graph's check `{node.args[1]}` fails for "
                             f"these sizes")
    graph.erase_node(node)


def gear_inputs(inputs: Sequence[InputInfo], dims: Sequence[tuple[int, int]],
                gear: Sequence[int]) -> list[InputInfo]:
    """``inputs`` with each gear dim's ``-1`` replaced by the gear's size."""
    shapes = {info.index: list(info.shape) for info in inputs}
    for (index, dim), size in zip(dims, gear):
        shapes[index][dim] = size
    return [dataclasses.replace(info, shape=tuple(shapes[info.index])) for info in inputs]
