"""The marker ops that carry a SuperKernel scope through Dynamo and AOT autograd.

``npu::_super_kernel_begin(str? scope, str options) -> ()`` and ``npu::_super_kernel_end(str?
scope) -> ()`` take no tensors and return nothing; they are registered as side-effecting
(``torch.fx.node.has_side_effect``), so neither Dynamo's nor AOT's dead-code elimination drops
them, and AOT's functionalization keeps them in program order. Their kernels do nothing: in eager
mode a scope costs two no-op dispatches. :class:`torchair.passes.SuperKernelScopePass` turns them
into node attributes and erases them before anything runs the graph.
"""
from __future__ import annotations

import torch

from torchair.ops._registry import define_op


def _noop_begin(scope: str | None, options: str) -> None:
    return None


def _noop_end(scope: str | None) -> None:
    return None


_begin = define_op("_super_kernel_begin(str? scope, str options) -> ()",
                   fake=_noop_begin, kernel=_noop_begin)
_end = define_op("_super_kernel_end(str? scope) -> ()", fake=_noop_end, kernel=_noop_end)

BEGIN: torch._ops.OpOverload = _begin.default
END: torch._ops.OpOverload = _end.default

for _op in (_begin, _end, BEGIN, END):
    torch.fx.node.has_side_effect(_op)


def is_marker(target) -> bool:
    """True for either marker op (overload or packet)."""
    return target in (BEGIN, END, _begin, _end)
