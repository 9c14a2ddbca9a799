"""RemoveNoOpsPass (``experimental_config.remove_noop_ops``): drop ops that return their input
unchanged.

Functionalization, decompositions and model code leave such ops behind: ``view``/``reshape`` to
the same shape, ``alias``, ``detach``, full-range ``slice`` / ``slice_scatter``, ``repeat`` by
all ones, ``constant_pad_nd`` by zeros, ``cat`` of one tensor, ``pow(x, 1)``,
``ceil``/``floor``/``round``/``trunc`` of integers, and copies (``clone``, ``_to_copy`` to the same
dtype/device/layout). Each one is a launch on the host-scheduled path, so removing them helps.

An op is removed only when its result has the same shape, strides, dtype and device as the
tensor it would be replaced by (decided without guarding), the result is not a graph output,
and neither tensor is written in place anywhere in the graph (a copy is then unobservable).
"""
from __future__ import annotations

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true, sym_eq

from torchair.passes._base import GraphPass

aten = torch.ops.aten

_SAME_SHAPE_VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}
_IDENTITIES = {aten.alias.default, aten.detach.default, aten.lift_fresh.default,
               aten.clone.default}
_INT_ROUNDING = {aten.ceil.default, aten.floor.default, aten.round.default, aten.trunc.default}
_BIG = 2**62


def _val(node):
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _same_meta(a, b) -> bool:
    """Same shape, strides, dtype and device, decided without guarding: sizes that are unknown
    at compile time (e.g. the unbacked batch dims of gears) count as different unless provably
    equal, so the op is kept."""
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype and a.device == b.device
            and statically_known_true(sym_eq(a.shape, b.shape))
            and statically_known_true(sym_eq(a.stride(), b.stride())))


class RemoveNoOpsPass(GraphPass):
    name = "remove_noops"

    def __call__(self, gm: fx.GraphModule) -> int:
        removed = 0
        for node in list(gm.graph.nodes):
            source = self._source_if_noop(node)
            if source is None:
                continue
            node.replace_all_uses_with(source)
            gm.graph.erase_node(node)
            removed += 1
        return removed

    @staticmethod
    def _source_if_noop(node: fx.Node):
        if node.op != "call_function":
            return None
        source = _candidate(node)
        if not isinstance(source, fx.Node) or _is_output_or_mutated(source, node):
            return None
        if node.target not in _IDENTITIES - {aten.clone.default} and \
                node.target not in _SAME_SHAPE_VIEWS and _reaches_output_through_views(node):
            return None  # a fresh tensor whose view is returned: removing it would alias
        return source if _same_meta(_val(source), _val(node)) else None


def _is_view(node: fx.Node) -> bool:
    target = node.target
    if target in _SAME_SHAPE_VIEWS or target in _IDENTITIES - {aten.clone.default}:
        return True
    schema = getattr(target, "_schema", None)
    return bool(schema and schema.returns and schema.returns[0].alias_info is not None
                and not schema.is_mutable)


def _reaches_output_through_views(node: fx.Node) -> bool:
    """Whether a view (or chain of views) of ``node`` is a graph output."""
    todo, seen = [node], set()
    while todo:
        n = todo.pop()
        for user in n.users:
            if user.op == "output":
                return True
            if user not in seen and user.op == "call_function" and _is_view(user):
                seen.add(user)
                todo.append(user)
    return False


def _arg(node: fx.Node, index: int, name: str, default=None):
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _full_range(node: fx.Node, dim_index: int) -> bool:
    """``slice``-style (dim, start, end, step) arguments that cover the whole dim."""
    start, end, step = (_arg(node, dim_index + 1, "start"), _arg(node, dim_index + 2, "end"),
                        _arg(node, dim_index + 3, "step", 1))
    if start not in (None, 0) or step != 1:
        return False
    if end is None or (isinstance(end, int) and end >= _BIG):
        return True
    val = _val(node)
    dim = _arg(node, dim_index, "dim", 0)
    if not isinstance(val, torch.Tensor) or not isinstance(end, int):
        return False
    return statically_known_true(end >= val.shape[dim])


def _candidate(node: fx.Node):
    """The tensor ``node`` would equal if it is a no-op of its kind (checked further by the
    caller), else None."""
    target, args = node.target, node.args
    first = args[0] if args else None
    if target in _IDENTITIES or target in _SAME_SHAPE_VIEWS:
        return first
    if target is aten._to_copy.default:
        return first if set(node.kwargs) <= {"dtype", "device", "layout", "memory_format"} and \
            node.kwargs.get("memory_format") in (None, torch.preserve_format) else None
    if target is aten.slice.Tensor:
        return first if _full_range(node, 1) else None
    if target is aten.slice_scatter.default:
        src = _arg(node, 1, "src")
        return src if _full_range(node, 2) else None
    if target is aten.repeat.default:
        repeats = _arg(node, 1, "repeats")
        return first if isinstance(repeats, (list, tuple)) and all(
            isinstance(r, int) and r == 1 for r in repeats) else None
    if target is aten.constant_pad_nd.default:
        pad = _arg(node, 1, "pad")
        return first if isinstance(pad, (list, tuple)) and all(
            isinstance(p, int) and p == 0 for p in pad) else None
    if target is aten.cat.default:
        tensors = first
        return tensors[0] if isinstance(tensors, (list, tuple)) and len(tensors) == 1 else None
    if target is aten.pow.Tensor_Scalar:
        exponent = _arg(node, 1, "exponent")
        return first if not isinstance(exponent, bool) and exponent == 1 else None
    if target in _INT_ROUNDING:
        val = _val(first)
        return first if isinstance(val, torch.Tensor) and not (
            val.dtype.is_floating_point or val.dtype.is_complex) else None
    return None


def _is_output_or_mutated(source: fx.Node, node: fx.Node) -> bool:
    """Keep ops whose result is a graph output (AOT tracked its aliasing as it is) and ops next
    to an in-place mutation."""
    if any(user.op == "output" for user in node.users):
        return True
    for user in list(source.users) + list(node.users):
        target = getattr(user, "target", None)
        if isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable:
            return True
    return False
