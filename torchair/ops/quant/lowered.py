"""Quantization ops as plain ATen formulas for a fixed-shape Inductor build.

A static launch unit compiled by Inductor would call ``npu_dynamic_quant``,
``npu_add_rms_norm_dynamic_quant``, ``npu_quant_matmul`` and ``npu_dequant_swiglu_quant`` as
opaque custom ops, whose CPU
kernels are Python (argument checks, the plan, the epilogue: 40-90 µs per call at decode sizes on
2 cores, against a few µs of arithmetic). :func:`torchair.runtime.engines.lower_to_formulas`
replaces them with the functions here, which Inductor traces with the unit's fixed shapes: the
checks run once, at build time, and the arithmetic becomes generated code fused with its
neighbours (the norm and the quantization of ``npu_add_rms_norm_dynamic_quant`` in one loop).

Per-expert smooth scales (``npu_dynamic_quant``'s ``group_index``) and token groups
(``npu_dequant_swiglu_quant``'s) map rows to experts with tensor ops (``searchsorted`` over the
cumulative ends, read at run time), so those calls are lowered too.

The formulas are the references of the op modules (``dynamic_quant_reference``,
``add_rms_norm_dynamic_quant_reference``, ``dequant_swiglu_quant_reference``, used as they are),
with one change, :func:`quant_matmul_formula`: the int8 product of
``npu_quant_matmul`` is exact int32 either way, through ``torch._int_mm`` where the CPU kernel
chose it for the shape (:func:`decide_int8_gemm`, timed before tracing) or float32 slices of K.
Fused float arithmetic may round differently from the eager kernels in the last bit, so an int8
output can differ by one step where a value sits on a rounding boundary.
"""
from __future__ import annotations

import torch

from torchair.ops.quant import cpu as _cpu
from torchair.ops.quant.quant_matmul import prepare_quant_matmul, quant_matmul_epilogue_reference

__all__ = ["decide_int8_gemm", "quant_matmul_formula"]


def decide_int8_gemm(x1_shape, x2_shape) -> None:
    """Time, once per shape, whether ``torch._int_mm`` beats the float32 slices (the eager
    kernel's choice, made by :func:`torchair.ops.quant.cpu.int8_matmul_cpu` on int8 operands of
    the call's shapes); the formula traced later reads the choice."""
    _cpu.int8_matmul_cpu(torch.zeros(x1_shape, dtype=torch.int8),
                         torch.zeros(x2_shape, dtype=torch.int8))


def quant_matmul_formula(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None,
                         output_dtype=None, **extras):
    plan = prepare_quant_matmul(x1, x2, scale, offset=offset, pertoken_scale=pertoken_scale,
                                bias=bias, output_dtype=output_dtype, **extras)
    batch = torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    acc = _cpu.int8_matmul_cpu(x1, x2, timed=False).reshape(*batch, x1.shape[-2], x2.shape[-1])
    return quant_matmul_epilogue_reference(acc, plan)
