"""Scopes that annotate a region of a compiled function (TorchAir's ``torchair.scope``).

``super_kernel(scope, options="")`` marks the ops of a region for fusion into one SuperKernel;
``npu_stream_switch(stream_tag, stream_priority=0)`` runs a region on another stream and
``npu_wait_tensor(t, dep)`` makes ``t``'s later consumers wait for ``dep``.
"""
from __future__ import annotations

from torchair.scope._stream_switch import npu_stream_switch, npu_wait_tensor
from torchair.scope._super_kernel import super_kernel

__all__ = ["npu_stream_switch", "npu_wait_tensor", "super_kernel"]
