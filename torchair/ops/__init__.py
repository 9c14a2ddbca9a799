"""The ``npu`` op library: importing this package registers every op under ``torch.ops.npu``.

``torchair.ops.npu_incre_flash_attention`` is ``torch.ops.npu.npu_incre_flash_attention`` (the
compute ops, :data:`TORCH_NPU_OPS`, are the ops themselves), except where TorchAir's own form
differs from torch_npu's: ``torchair.ops.npu_fused_infer_attention_score`` takes its lengths as
tensors (:mod:`torchair.ops.attention.fia_graph`). TorchAir's graph utilities are Python
functions over side-effecting ops of the same namespace (TorchAir puts them in ``torch.ops.air``):
``npu_print`` (``torch.ops.npu.npu_print``), the tagged events ``npu_create_tagged_event``,
``npu_tagged_event_record``, ``npu_tagged_event_wait``, ``npu_record_tagged_stream`` (ops of the
same names, taking the event's tag) and ``record`` / ``wait`` (``torch.ops.npu.record`` /
``torch.ops.npu.wait``). Every ``npu_*`` name of ``__all__`` is also a ``torch.ops.npu`` op.

Older TorchAir names kept for its scripts (not in ``__all__``): ``npu_wait_tensor``,
``NpuStreamSwitch`` and ``SuperKernelScope`` (now in :mod:`torchair.scope`).

Layout: one package per op family, each with its op definitions and references at its top and
its kernels per backend beneath (``cpu``, ``triton``): :mod:`torchair.ops.attention`,
:mod:`torchair.ops.norm`, :mod:`torchair.ops.quant`, :mod:`torchair.ops.rope` (rotary embedding,
the MLA cache op), :mod:`torchair.ops.activation` (SwiGLU), :mod:`torchair.ops.cache` (KV-cache
writes), :mod:`torchair.ops.moe` (routing, grouped matmul); :mod:`torchair.ops.toolchain` builds
the native (C/C++, ``toolchain/csrc``) and Triton kernels. Shared here: ``_device_checks``,
``_print``, ``_events``; the registry (``define_op``) is :mod:`torchair.base.registry`.
"""
from __future__ import annotations

import torch

from torchair import scope as _scope
from torchair.base.parity import unsupported_reason as _unsupported_reason
from torchair.base.registry import get_value_dependent, value_dependent_ops
from torchair.ops._events import (
    TaggedEvent,
    npu_create_tagged_event as npu_create_tagged_event,
    npu_record_tagged_stream as npu_record_tagged_stream,
    npu_tagged_event_record as npu_tagged_event_record,
    npu_tagged_event_wait as npu_tagged_event_wait,
    record as record,
    wait as wait,
)
from torchair.ops._print import npu_print as npu_print
from torchair.ops.activation import swiglu as _swiglu  # noqa: F401 (registers)
from torchair.ops.attention import (
    fia_graph as _fia_graph,
    fused_infer_attention_score as _fused_infer_attention_score,  # noqa: F401 (registers)
    fused_infer_attention_score_v2 as _fia_v2,  # noqa: F401 (registers)
    incre_flash_attention as _incre_flash_attention,  # noqa: F401 (registers)
    prompt_flash_attention as _pfa,  # noqa: F401 (registers)
)
from torchair.ops.attention.cpu import decode as _decode_cpu  # noqa: F401 (registers the CPU decode kernel)
from torchair.ops.attention.triton import decode as _decode_triton  # noqa: F401 (registers the CUDA kernel if Triton exists)
from torchair.ops.cache import (
    scatter_nd_update as _scatter_nd_update,  # noqa: F401 (registers)
    scatter_update as _scatter_update,  # noqa: F401 (registers)
)
from torchair.ops.moe import (
    gating as _moe_gating,  # noqa: F401 (registers)
    gating_softmax as _moe_gating_softmax,  # noqa: F401 (registers)
    grouped_matmul as _grouped_matmul,  # noqa: F401 (registers)
    routing as _moe_routing,  # noqa: F401 (registers)
)
from torchair.ops.norm import rms_norm as _rms_norm  # noqa: F401 (registers)
from torchair.ops.quant import (
    dequant_swiglu_quant as _dequant_swiglu_quant,  # noqa: F401 (registers)
    dynamic_quant as _dynamic_quant,  # noqa: F401 (registers)
    quant_matmul as _quant_matmul,  # noqa: F401 (registers)
)
from torchair.ops.rope import (
    interleave_rope as _interleave_rope,  # noqa: F401 (registers)
    kv_rmsnorm_rope_cache as _kv_rmsnorm_rope_cache,  # noqa: F401 (registers)
    rotary as _rotary,  # noqa: F401 (registers)
)

# the compute ops: torchair.ops.<name> is torch.ops.npu.<name>, as torch_npu.<name> on Ascend;
# one tuple per op family (a new family adds its import above and one tuple here)
_ATTENTION_OPS = ("npu_incre_flash_attention", "npu_fused_infer_attention_score",
                  "npu_fused_infer_attention_score_v2", "npu_prompt_flash_attention")
_NORM_OPS = ("npu_rms_norm", "npu_add_rms_norm", "npu_add_rms_norm_cast")
_QUANT_OPS = ("npu_dynamic_quant", "npu_add_rms_norm_dynamic_quant", "npu_quant_matmul",
              "npu_dequant_swiglu_quant")
_CACHE_OPS = ("scatter_update", "scatter_update_", "npu_scatter_nd_update",
               "npu_scatter_nd_update_")
_MOE_OPS = ("npu_moe_gating_top_k", "npu_moe_gating_top_k_softmax", "npu_moe_init_routing",
            "npu_moe_compute_expert_tokens", "npu_moe_finalize_routing", "npu_grouped_matmul")
_ROPE_OPS = ("npu_apply_rotary_pos_emb", "npu_rotary_mul", "npu_kv_rmsnorm_rope_cache",
             "npu_interleave_rope")
_ACTIVATION_OPS = ("npu_swiglu",)
TORCH_NPU_OPS = (_ATTENTION_OPS + _NORM_OPS + _QUANT_OPS + _ROPE_OPS + _ACTIVATION_OPS + _CACHE_OPS
                 + _MOE_OPS)
# TorchAir's graph utilities (Python functions; see the module docstring)
GRAPH_UTILITIES = ("npu_print", "npu_create_tagged_event", "npu_tagged_event_record",
                   "npu_tagged_event_wait", "npu_record_tagged_stream", "record", "wait")

# TorchAir's own forms that differ from torch_npu's op of the same name (torch_npu.<name> stays
# the op): npu_fused_infer_attention_score takes its lengths as tensors (attention/fia_graph.py)
_GRAPH_FORMS = {"npu_fused_infer_attention_score": _fia_graph.npu_fused_infer_attention_score}
globals().update({_name: _GRAPH_FORMS.get(_name) or getattr(torch.ops.npu, _name)
                  for _name in TORCH_NPU_OPS})


def __getattr__(name: str):
    # TorchAir's older names of the scope functions
    legacy = {"npu_wait_tensor": "npu_wait_tensor", "NpuStreamSwitch": "npu_stream_switch",
              "SuperKernelScope": "super_kernel"}
    if name in legacy:
        return getattr(_scope, legacy[name])
    reason = _unsupported_reason(f"torchair.ops.{name}")
    if reason is not None:
        raise AttributeError(f"torchair.ops.{name} is not supported by this torchair: {reason}")
    raise AttributeError(f"module 'torchair.ops' has no attribute {name!r}")


__all__ = [*TORCH_NPU_OPS, *GRAPH_UTILITIES, "GRAPH_UTILITIES", "TORCH_NPU_OPS", "TaggedEvent",
           "get_value_dependent", "value_dependent_ops"]
