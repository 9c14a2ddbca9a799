"""The canonical plans of the quantization ops: what every kernel (reference, CPU, Triton) reads.

The op modules (:mod:`torchair.ops.quant.quant_matmul`,
:mod:`torchair.ops.quant.dequant_swiglu_quant`) validate their arguments and build these plans;
the kernel modules (:mod:`torchair.ops.quant.cpu`, :mod:`torchair.ops.quant.triton`) only read
them, so no kernel module imports an op module.
"""
from __future__ import annotations

import dataclasses

import torch

__all__ = ["QuantMatmulPlan", "SwigluQuantPlan"]


@dataclasses.dataclass(frozen=True)
class QuantMatmulPlan:
    """The epilogue in canonical form: what every kernel (reference, CPU, Triton) consumes.

    ``scale`` / ``offset`` are float32 ``[1]`` or ``[N]``; ``pertoken`` float32 ``[M]``;
    ``int_bias`` int32 ``[N]`` or ``[B, 1, N]``; ``float_bias`` float32, same shapes.
    """

    out_dtype: torch.dtype
    scale: torch.Tensor
    offset: torch.Tensor | None = None
    pertoken: torch.Tensor | None = None
    int_bias: torch.Tensor | None = None
    float_bias: torch.Tensor | None = None


@dataclasses.dataclass(frozen=True)
class SwigluQuantPlan:
    """Canonical arguments shared by the reference, CPU and Triton kernels.

    ``x`` ``[T, 2H]``; ``weight_scale`` float32 ``[G, 2H]``; ``act_scale`` float32 ``[T]``;
    ``int_bias`` int32 / ``float_bias`` float32 ``[2H]``; ``quant_scale`` float32 ``[G, H]`` or
    ``[G, 1]`` (dynamic: multiplier; static, G == 1: divisor); ``quant_offset`` float32 ``[1, H]``
    or ``[1, 1]``; ``row_group`` int64 ``[T]`` (a row's group, ``num_groups`` = outside every
    group) or None when there is no group_index.
    """

    x: torch.Tensor
    lead_shape: tuple
    dynamic: bool
    activate_left: bool
    num_groups: int = 1
    weight_scale: torch.Tensor | None = None
    act_scale: torch.Tensor | None = None
    int_bias: torch.Tensor | None = None
    float_bias: torch.Tensor | None = None
    quant_scale: torch.Tensor | None = None
    quant_offset: torch.Tensor | None = None
    row_group: torch.Tensor | None = None
