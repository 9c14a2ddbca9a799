"""Scopes that annotate a region of a compiled function (TorchAir's ``torchair.scope``).

``super_kernel(scope, options="")`` marks the ops of a region for fusion into one SuperKernel;
``npu_stream_switch(stream_tag, stream_priority=0)`` runs a region on another stream and
``npu_wait_tensor(t, dep)`` makes ``t``'s later consumers wait for ``dep``.

``limit_core_num(op_aicore_num, op_vectorcore_num)``, ``op_never_timeout(enable=True)``,
``data_dump()`` and ``profiler_trace(index, mode)`` set Ascend-only op attributes (core limits, op
timeouts, device data-dump ranges, profiler marks): they are checked and recorded in the graph
(dumps show them), and have no effect on CPU/CUDA (see :mod:`torchair.scope._ascend_only`).
"""
from __future__ import annotations

from torchair.scope._ascend_only import data_dump, limit_core_num, op_never_timeout, profiler_trace, scope_attributes
from torchair.scope._stream_switch import npu_stream_switch, npu_wait_tensor
from torchair.scope._super_kernel import super_kernel

__all__ = ["data_dump", "limit_core_num", "npu_stream_switch", "npu_wait_tensor",
           "op_never_timeout", "profiler_trace", "scope_attributes", "super_kernel"]
