"""RemoveNoOpsPass: drop ops that return their input unchanged.

Functionalization and decompositions leave such ops behind (``view``/``reshape`` to the same
shape, ``alias``, ``detach``). Each one is a launch on the host-scheduled path, so removing them
helps. Copies (``clone``, ``_to_copy``) are kept: whether one is needed depends on aliasing that a
later view or in-place write can make visible, and a wrong removal returns shared memory.
"""
from __future__ import annotations

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true, sym_eq

from torchair.passes._base import GraphPass

aten = torch.ops.aten

_SAME_SHAPE_VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}
_IDENTITIES = {aten.alias.default, aten.detach.default, aten.lift_fresh.default}


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
        if node.op != "call_function" or not node.args or not isinstance(node.args[0], fx.Node):
            return None
        source = node.args[0]
        if _is_output_or_mutated(source, node):
            return None
        if node.target in _IDENTITIES:
            return source if _same_meta(_val(source), _val(node)) else None
        if node.target in _SAME_SHAPE_VIEWS:
            return source if _same_meta(_val(source), _val(node)) else None
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
