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

from torchair.base.registry import define_op


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


# ------------------------------------------------------------------------------ streams
# ``npu_stream_switch`` and ``npu_wait_tensor`` ride through Dynamo and AOT the same way:
# ``npu::_stream_switch_begin(str tag, int priority) -> ()`` / ``npu::_stream_switch_end(str tag)``
# bracket a region, and ``npu::_wait_tensor(Tensor t, Tensor dep) -> ()`` sits between ``t`` and its
# later consumers with a data edge to ``dep``. SuperKernelScopePass turns them into the node
# attributes below and erases them.

# node.meta keys (torchair.base.meta): STREAM_KEY the tag of the stream the op runs on (absent:
# main), PRIORITY_KEY that stream's priority, WAITS_KEY the nodes whose results the op waits for


def _noop_switch_begin(tag: str, priority: int) -> None:
    return None


def _noop_switch_end(tag: str) -> None:
    return None


def _noop_wait(t: torch.Tensor, dep: torch.Tensor) -> None:
    return None


_switch_begin = define_op("_stream_switch_begin(str tag, int priority) -> ()",
                          fake=_noop_switch_begin, kernel=_noop_switch_begin)
_switch_end = define_op("_stream_switch_end(str tag) -> ()", fake=_noop_switch_end,
                        kernel=_noop_switch_end)
_wait = define_op("_wait_tensor(Tensor t, Tensor dep) -> ()", fake=_noop_wait, kernel=_noop_wait)

STREAM_BEGIN: torch._ops.OpOverload = _switch_begin.default
STREAM_END: torch._ops.OpOverload = _switch_end.default
WAIT: torch._ops.OpOverload = _wait.default

for _op in (_switch_begin, _switch_end, _wait, STREAM_BEGIN, STREAM_END, WAIT):
    torch.fx.node.has_side_effect(_op)


def is_stream_marker(target) -> bool:
    """True for the stream markers (switch begin/end, wait), overload or packet."""
    return target in (STREAM_BEGIN, STREAM_END, WAIT, _switch_begin, _switch_end, _wait)
