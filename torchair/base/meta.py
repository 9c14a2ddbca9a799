"""The ``node.meta`` keys every stage shares: scopes write them, passes and the runtime read them.

A scope pass (``super_kernel``, ``npu_stream_switch``, the Ascend-only scopes) turns its markers
into these entries on the nodes inside the scope; dumps show :data:`META_ATTRS` as op attributes,
the planner splits segments by :data:`STREAM_KEY`, the runtime runs waits from :data:`WAITS_KEY`.
An import leaf: the keys are plain strings, so any layer may name them.
"""
from __future__ import annotations

# node.meta entries shown as op attributes (set by SuperKernelScopePass)
SCOPE_KEY = "_super_kernel_scope"  # node.meta keys set by the super_kernel scope pass
OPTIONS_KEY = "_super_kernel_options"
STREAM_KEY = "_user_stream_label"  # ... by npu_stream_switch (TorchAir's names): the op's stream
# (absent: main) and its priority
PRIORITY_KEY = "_user_stream_priority"
# ... and by AscendScopePass: the Ascend-only scope attributes (torchair.scope.limit_core_num etc.)
ASCEND_KEYS = ("_op_aicore_num", "_op_vectorcore_num", "_op_exec_never_timeout",
               "torchair_enable_data_dump", "_profiler_trace_index", "_profiler_trace_pos")
META_ATTRS = (SCOPE_KEY, OPTIONS_KEY, STREAM_KEY, PRIORITY_KEY) + ASCEND_KEYS  # shown in dumps
WAITS_KEY = "_stream_waits"  # ... by the stream scope pass: nodes whose results the op must wait for

__all__ = ["ASCEND_KEYS", "META_ATTRS", "OPTIONS_KEY", "PRIORITY_KEY", "SCOPE_KEY", "STREAM_KEY",
           "WAITS_KEY"]
