"""Triton kernel of the rotary ops for CUDA: a tile of rows x pairs per program.

Same contract as :func:`torchair.ops.rope.common.rope_reference`; arguments arrive checked.
``x`` and ``out`` are contiguous rows of ``D`` elements (``out`` may be ``x``: the in-place op);
``cos`` / ``sin`` are read through the strides of their broadcast to ``x``'s shape (0 on a
broadcast dim), so they are never expanded in memory. A program loads both elements of its pairs
(``a`` at ``(j // W) * 2W + j % W``, ``b`` at ``+ W``, the ``(G, 2, W)`` view of ``common``)
before it stores either, which makes the in-place update safe. float32 math, one rounding at the
store; no host reads of tensor values (CUDA-graph capturable).

With ``TRITON_INTERPRET=1`` set before triton is imported the kernel runs in Triton's interpreter
on CPU tensors (tests, tiny shapes; numpy has no bfloat16).
"""
from __future__ import annotations

import torch

from torchair.ops.rope.common import groups
from torchair.ops.toolchain.triton_utils import HAS_TRITON, launch_mode, next_pow2, tl, triton

__all__ = ["HAS_TRITON", "MAX_HEAD_DIM", "rope_triton", "supports"]

MAX_HEAD_DIM = 8192  # D of one row held by one program


def _rope_kernel(X, Y, C, S, rows, half, w, L1, L2, cs0, cs1, cs2, cs3, ss0, ss1, ss2, ss3,
                 BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr):
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    j = tl.arange(0, BLOCK_H)
    ok = (r < rows)[:, None] & (j < half)[None, :]
    pa = (j // w) * (2 * w) + j % w
    pb = pa + w
    xrow = (r * (2 * half))[:, None]
    i0 = r // (L1 * L2)
    i1 = (r // L2) % L1
    i2 = r % L2
    crow = (i0 * cs0 + i1 * cs1 + i2 * cs2)[:, None]
    srow = (i0 * ss0 + i1 * ss1 + i2 * ss2)[:, None]
    a = tl.load(X + xrow + pa[None, :], mask=ok, other=0.0).to(tl.float32)
    b = tl.load(X + xrow + pb[None, :], mask=ok, other=0.0).to(tl.float32)
    ca = tl.load(C + crow + (pa * cs3)[None, :], mask=ok, other=0.0).to(tl.float32)
    cb = tl.load(C + crow + (pb * cs3)[None, :], mask=ok, other=0.0).to(tl.float32)
    sa = tl.load(S + srow + (pa * ss3)[None, :], mask=ok, other=0.0).to(tl.float32)
    sb = tl.load(S + srow + (pb * ss3)[None, :], mask=ok, other=0.0).to(tl.float32)
    ya = a * ca - b * sa
    yb = b * cb + a * sb
    tl.store(Y + xrow + pa[None, :], ya.to(Y.dtype.element_ty), mask=ok)
    tl.store(Y + xrow + pb[None, :], yb.to(Y.dtype.element_ty), mask=ok)


if HAS_TRITON:
    _rope_kernel = triton.jit(_rope_kernel)


def supports(x: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether the Triton kernel serves ``x`` -> ``out``: contiguous rows of at most
    ``MAX_HEAD_DIM`` elements, at most 4-D."""
    return (HAS_TRITON and x.is_contiguous() and out.is_contiguous() and x.dim() <= 4
            and x.shape[-1] <= MAX_HEAD_DIM)


def _strides4(t: torch.Tensor, shape4) -> list[int]:
    """Strides of ``t`` broadcast to the 4-D ``shape4`` (0 on broadcast dims)."""
    t4 = t.reshape((1,) * (4 - t.dim()) + tuple(t.shape)) if t.dim() < 4 else t
    return list(t4.expand(shape4).stride())


def rope_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mode: str,
                out: torch.Tensor) -> torch.Tensor:
    """Write ``x * cos + rotate(x) * sin`` into ``out`` with the Triton kernel; returns ``out``."""
    interp = launch_mode(x.device, "the Triton rotary kernel")
    d = x.shape[-1]
    shape4 = (1,) * (4 - x.dim()) + tuple(x.shape)
    rows = x.numel() // d if d else 0
    if rows == 0:
        return out
    half = d // 2
    _, w = groups(mode, d)
    block_h = max(2, next_pow2(half))
    block_r = max(1, min(next_pow2(rows), 2048 // block_h)) if not interp else max(1, min(
        next_pow2(rows), 4))
    cs = _strides4(cos, shape4)
    ss = _strides4(sin, shape4)
    grid = (triton.cdiv(rows, block_r),)
    opts = {} if interp else {"num_warps": 4}
    _rope_kernel[grid](x, out, cos, sin, rows, half, w, shape4[1], shape4[2], *cs, *ss,
                       BLOCK_R=block_r, BLOCK_H=block_h, **opts)
    return out
