"""``npu_interleave_rope``: DeepSeek MLA's rope on one tensor, as in torch_npu.

``npu_interleave_rope(x, cos, sin) -> y`` with ``x [B, N, S, D]`` (BNSD) and ``cos`` / ``sin``
``[B, 1, S, D]`` (N must be 1; S may be 1; here B may also be 1, a broadcast): in float32 with
one rounding to ``x``'s dtype (:func:`torchair.ops.rope.common.interleaved_rope_reference`, the
formula the rope part of ``npu_kv_rmsnorm_rope_cache`` uses too)::

    p1 = cat(x[..., 0::2], x[..., 1::2])      the interleaved pairs, de-interleaved
    p2 = cat(-x[..., 1::2], x[..., 0::2])
    y  = p1 * cos + p2 * sin

(torch_npu documents it as ``q = x.reshape(B, N, S, D/2, 2).transpose(-1, -2).reshape(B, N, S,
D)``, ``y = q * cos + RotateHalf(q) * sin``.) ``y`` has ``x``'s shape and dtype; ``cos`` and
``sin`` share ``x``'s dtype (torch_npu requires it). Ascend limits ``D`` to 64 and the dtypes to
float16 / bfloat16; torchair takes any even ``D`` and float32 too.

Kernels: the reference is the oracle; the eager kernel de-interleaves ``x`` into a new tensor and
rotates it in place with the rotary ops' kernels (Triton on CUDA, the fused PyTorch-op kernel
elsewhere; :func:`torchair.ops.rope.rotary.interleaved_rope_into`). No host reads.
"""
from __future__ import annotations

import torch

from torchair.base.registry import define_op
from torchair.ops.rope.common import check_float, check_rope_table, interleaved_rope_reference
from torchair.ops.rope.rotary import interleaved_rope_into

__all__ = ["check_interleave_rope", "interleave_rope_reference", "npu_interleave_rope"]

_OP = "npu_interleave_rope"
_SCHEMA = f"{_OP}(Tensor x, Tensor cos, Tensor sin) -> Tensor"


def check_interleave_rope(x, cos, sin) -> None:
    """Check a call (ranks, shapes, dtypes; never values)."""
    op = _OP
    for name, t in (("x", x), ("cos", cos), ("sin", sin)):
        check_float(op, name, t)
    if x.dim() != 4:
        raise ValueError(f"{op}: x has shape {list(x.shape)} ({x.dim()}-D); expected 4-D "
                         f"[B, N, S, D] (BNSD); view x as [B, N, S, D]")
    d = x.shape[-1]
    if d % 2 or d == 0:
        raise ValueError(f"{op}: x's last dim (head_dim D) is {d}; the interleaved pairs need a "
                         f"positive even D (DeepSeek MLA: 64)")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dtype != x.dtype:
            raise TypeError(f"{op}: {name} has dtype {t.dtype} but x has {x.dtype}; torch_npu "
                            f"needs one dtype for x, cos and sin; cast {name} to {x.dtype}")
    if tuple(cos.shape) != tuple(sin.shape):
        raise ValueError(f"{op}: sin has shape {list(sin.shape)} but cos has {list(cos.shape)}; "
                         f"they must have one shape")
    check_rope_table(op, "x", x, "cos", cos)
    if cos.shape[1] != 1:
        raise ValueError(f"{op}: cos has shape {list(cos.shape)}; its N dim (dim 1) must be 1 "
                         f"([B, 1, S, D], one table for every head); pass cos[:, :1]")


def interleave_rope_reference(x, cos, sin) -> torch.Tensor:
    """Oracle of ``npu_interleave_rope`` (the module doc's formula), a new tensor."""
    check_interleave_rope(x, cos, sin)
    return interleaved_rope_reference(x, cos, sin)


def _eager(x, cos, sin):
    check_interleave_rope(x, cos, sin)
    return interleaved_rope_into(x, cos, sin)


def _fake(x, cos, sin):
    check_interleave_rope(x, cos, sin)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


npu_interleave_rope = define_op(_SCHEMA, fake=_fake, kernel=_eager)
