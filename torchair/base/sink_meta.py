"""The graph vocabulary of sunk scalars: how a graph marks an argument that was a host list.

Scalar sinking (:mod:`torchair.plan.sink`) replaces each host-read list argument of a
value-dependent op with ``aten.slice(buffer, 0, start, end)`` of the unit's int64 buffer, a node
with no traced value. Code below the planner reads graphs in that form (the attention ops' host
list checks, the static-unit binders), so the one function that recognizes such a slice lives
here, at the bottom of the stack, and the planner imports it from here too.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

__all__ = ["sunk_slots"]


def sunk_slots(node: Any) -> tuple[int, int] | None:
    """``(start, end)`` in the sunk buffer when ``node`` is an argument
    :func:`torchair.plan.sink.sink_scalars` replaced (``aten.slice(buffer, 0, start, end)``, no
    traced value: the host list it held had ``end - start`` entries), else None."""
    if (isinstance(node, fx.Node) and node.target is torch.ops.aten.slice.Tensor
            and len(node.args) == 4 and all(isinstance(a, int) for a in node.args[1:])
            and not isinstance(node.meta.get("val"), torch.Tensor)):
        return node.args[2], node.args[3]
    return None
