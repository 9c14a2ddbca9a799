"""The ``npu`` op library: importing this package registers every op under ``torch.ops.npu``.

``torchair.ops.npu_incre_flash_attention`` is ``torch.ops.npu.npu_incre_flash_attention``.
"""
from __future__ import annotations

import torch

from torchair.ops import incre_flash_attention as _incre_flash_attention  # noqa: F401 (registers)
from torchair.ops import fused_infer_attention_score as _fused_infer_attention_score  # noqa: F401 (registers)
from torchair.ops import _decode_cpu  # noqa: F401 (registers the CPU decode kernel)
from torchair.ops import _decode_triton  # noqa: F401 (registers the CUDA kernel if Triton exists)
from torchair.ops import rms_norm as _rms_norm  # noqa: F401 (registers)
from torchair.ops import dynamic_quant as _dynamic_quant  # noqa: F401 (registers)
from torchair.ops import quant_matmul as _quant_matmul  # noqa: F401 (registers)
from torchair.ops import dequant_swiglu_quant as _dequant_swiglu_quant  # noqa: F401 (registers)
from torchair.ops._registry import get_value_dependent, value_dependent_ops

_PUBLIC = ("npu_incre_flash_attention", "npu_fused_infer_attention_score", "npu_rms_norm",
           "npu_add_rms_norm", "npu_add_rms_norm_cast", "npu_dynamic_quant",
           "npu_add_rms_norm_dynamic_quant", "npu_quant_matmul", "npu_dequant_swiglu_quant")

npu_incre_flash_attention = torch.ops.npu.npu_incre_flash_attention
npu_fused_infer_attention_score = torch.ops.npu.npu_fused_infer_attention_score
npu_rms_norm = torch.ops.npu.npu_rms_norm
npu_add_rms_norm = torch.ops.npu.npu_add_rms_norm
npu_add_rms_norm_cast = torch.ops.npu.npu_add_rms_norm_cast
npu_dynamic_quant = torch.ops.npu.npu_dynamic_quant
npu_add_rms_norm_dynamic_quant = torch.ops.npu.npu_add_rms_norm_dynamic_quant
npu_quant_matmul = torch.ops.npu.npu_quant_matmul
npu_dequant_swiglu_quant = torch.ops.npu.npu_dequant_swiglu_quant

__all__ = [*_PUBLIC, "get_value_dependent", "value_dependent_ops"]
