"""ReinplaceInputsPass: write input mutations (KV-cache updates) in place again.

AOT functionalizes ``cache.index_copy_(1, pos, k)`` into ``new = index_copy(cache, 1, pos, k)``
plus a final ``copy_(cache, new)``: run op by op that copies the whole cache twice per step. This
pass turns such a chain back into in-place ops on the input and drops the final ``copy_``, when
that is invisible: every other reader of the input runs before the first write, and no view of it
outlives that point. Supported links: any ATen or ``npu`` op with an in-place twin of the same
arguments (``index_copy`` -> ``index_copy_``, ``index_put`` -> ``index_put_``, ``mul`` -> ``mul_``,
``npu.scatter_update`` -> ``npu.scatter_update_`` ...) and ``slice_scatter`` /
``select_scatter`` (-> ``copy_`` into a ``slice`` / ``select`` view). Anything else stays
functional.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from torchair.base.meta import META_ATTRS
from torchair.passes._base import GraphPass

aten = torch.ops.aten

_SCATTER_VIEWS = {aten.slice_scatter.default: aten.slice.Tensor,
                  aten.select_scatter.default: aten.select.int}


def _inplace_twin(target) -> torch._ops.OpOverload | None:
    if not isinstance(target, torch._ops.OpOverload) or target._schema.is_mutable:
        return None
    # ATen's twins, and those of the op library (npu.scatter_update -> npu.scatter_update_)
    namespace = getattr(torch.ops, target.namespace, None)
    packet = getattr(namespace, target.__name__.split(".")[0] + "_", None)
    twin = getattr(packet, target._overloadname, None) if packet is not None else None
    if twin is None:
        return None
    plain = [str(a.type) for a in target._schema.arguments]
    inplace = [str(a.type) for a in twin._schema.arguments]
    return twin if plain == inplace else None


def _same_tensor_meta(a: fx.Node, b: fx.Node) -> bool:
    va, vb = a.meta.get("val"), b.meta.get("val")
    return (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor) and va.shape == vb.shape
            and va.dtype == vb.dtype and va.stride() == vb.stride())


def _is_view(node: fx.Node) -> bool:
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return node.op == "call_function"  # unknown function: assume it may alias
    return any(r.alias_info is not None for r in target._schema.returns)


class ReinplaceInputsPass(GraphPass):
    name = "reinplace_inputs"

    def __call__(self, gm: fx.GraphModule) -> int:
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        rewrites = 0
        for copy in list(gm.graph.find_nodes(op="call_function", target=aten.copy_.default)):
            chain = self._chain(copy, order)
            if chain:
                self._rewrite(gm, copy, chain)
                rewrites += len(chain)
        return rewrites

    def _chain(self, copy: fx.Node, order: dict[fx.Node, int]) -> list[fx.Node] | None:
        """The functional updates from the input to the copied-back value, or None."""
        base, value = copy.args[0], copy.args[1]
        if base.op != "placeholder" or copy.users or not isinstance(value, fx.Node):
            return None
        chain = []
        node = value
        while node is not base:
            if node.op != "call_function" or not node.args or not isinstance(node.args[0],
                                                                              fx.Node):
                return None
            if not (_inplace_twin(node.target) or node.target in _SCATTER_VIEWS):
                return None
            if not _same_tensor_meta(node, base):
                return None
            chain.append(node)
            node = node.args[0]
        chain.reverse()
        previous = base
        for link in chain:
            if not self._old_value_dead(previous, link, copy, order):
                return None
            previous = link
        return chain or None

    @staticmethod
    def _old_value_dead(value: fx.Node, writer: fx.Node, copy: fx.Node,
                        order: dict[fx.Node, int]) -> bool:
        """True when nothing reads ``value``'s old contents once ``writer`` overwrites them in
        place: its other readers (and readers of its views) run before ``writer``, and
        ``writer`` does not also read it through another argument or a view."""
        at = order[writer]
        pending = [u for u in value.users if u is not writer and u is not copy]
        while pending:
            user = pending.pop()
            if user is writer or user.op == "output" or order[user] > at:
                return False
            if _is_view(user):
                pending.extend(user.users)
        refs: list[fx.Node] = []
        fx.node.map_arg((writer.args, writer.kwargs), refs.append)
        return refs.count(value) == 1

    @staticmethod
    def _rewrite(gm: fx.GraphModule, copy: fx.Node, chain: list[fx.Node]) -> None:
        graph = gm.graph
        base = copy.args[0]
        for link in chain:
            args = (base,) + tuple(link.args[1:])
            with graph.inserting_before(link):
                if link.target in _SCATTER_VIEWS:
                    src, rest = args[1], args[2:]
                    view = graph.call_function(_SCATTER_VIEWS[link.target], (base,) + rest)
                    new = [view, graph.call_function(aten.copy_.default, (view, src))]
                else:
                    new = [graph.call_function(_inplace_twin(link.target), args,
                                               dict(link.kwargs))]
            for node in new:  # the write stays in the op's super_kernel scope and stream
                node.meta.update((k, link.meta[k]) for k in META_ATTRS if k in link.meta)
            link.replace_all_uses_with(base)
        graph.erase_node(copy)
        for link in reversed(chain):
            graph.erase_node(link)
