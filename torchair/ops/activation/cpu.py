"""Fast kernel of ``npu_swiglu`` on CPU (and the generic fallback on other devices).

Same contract as :func:`torchair.ops.activation.swiglu.swiglu_reference`; arguments arrive
checked. The reference converts the whole ``[..., 2H]`` input to float32, then allocates the
silu and the product; this kernel converts only the first half ``A`` (float32 input: one copy of
``A``), applies silu in place on it and multiplies ``B`` in (promoted inside the product), then
rounds once: one float32 buffer of ``H`` per row instead of four. The float32 math is the
reference's (PyTorch's silu, then the product); PyTorch's silu on a contiguous buffer (here) and
on a strided view (the reference's half) may round differently by an ulp of float32, depending
on the PyTorch version, so results are within an ulp of the reference's (equal on torch 2.13).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["swiglu_cpu"]


def swiglu_cpu(x: torch.Tensor, d: int) -> torch.Tensor:
    """``silu(A) * B`` along the (non-negative) dim ``d``, in ``x.dtype``."""
    h = x.shape[d] // 2
    a = x.narrow(d, 0, h).to(torch.float32, memory_format=torch.contiguous_format, copy=True)
    F.silu(a, inplace=True)
    a.mul_(x.narrow(d, h, h))
    return a if x.dtype == torch.float32 else a.to(x.dtype)
