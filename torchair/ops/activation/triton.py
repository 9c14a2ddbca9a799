"""Triton kernel of ``npu_swiglu`` for CUDA.

Same contract as :func:`torchair.ops.activation.swiglu.swiglu_reference`; arguments arrive
checked. The input (made contiguous) is viewed as ``[outer, 2, M]`` (``outer`` = the dims before
``dim``, ``M`` = half of ``dim`` times the dims after it), so ``A = x[o, 0]`` and ``B = x[o, 1]``
are contiguous runs; program ``(o, blk)`` writes ``BLOCK`` elements of row ``o`` of the
``[outer, M]`` output: ``a / (1 + exp(-a)) * b`` in float32, rounded once at the store. No host
reads of tensor values (CUDA-graph capturable). With ``TRITON_INTERPRET=1`` set before triton is
imported it runs in Triton's interpreter on CPU tensors (tests; numpy has no bfloat16).
"""
from __future__ import annotations

import torch

from torchair.ops.toolchain.triton_utils import HAS_TRITON, launch_mode, next_pow2, tl, triton

__all__ = ["HAS_TRITON", "swiglu_triton"]


def _swiglu_kernel(X, Y, M, BLOCK: tl.constexpr):
    o = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < M
    a = tl.load(X + o * (2 * M) + offs, mask=ok, other=0.0).to(tl.float32)
    b = tl.load(X + o * (2 * M) + M + offs, mask=ok, other=0.0).to(tl.float32)
    y = a / (1.0 + tl.exp(-a)) * b
    tl.store(Y + o * M + offs, y.to(Y.dtype.element_ty), mask=ok)


if HAS_TRITON:
    _swiglu_kernel = triton.jit(_swiglu_kernel)


def swiglu_triton(x: torch.Tensor, d: int) -> torch.Tensor:
    """``silu(A) * B`` along the (non-negative) dim ``d`` with the Triton kernel."""
    interp = launch_mode(x.device, "the Triton SwiGLU kernel")
    shape = list(x.shape)
    h = shape[d] // 2
    outer = 1
    for s in shape[:d]:
        outer *= s
    m = h
    for s in shape[d + 1:]:
        m *= s
    shape[d] = h
    y = torch.empty(shape, dtype=x.dtype, device=x.device)
    if outer == 0 or m == 0:
        return y
    block = min(1024, max(16, next_pow2(m))) if not interp else min(64, max(16, next_pow2(m)))
    grid = (outer, triton.cdiv(m, block))
    opts = {} if interp else {"num_warps": 4}
    _swiglu_kernel[grid](x.contiguous(), y, m, BLOCK=block, **opts)
    return y
