"""Fast kernel of the rotary ops on CPU (and the generic fallback on other devices).

Same contract as :func:`torchair.ops.rope.common.rope_reference`; arguments arrive checked. The
reference builds ``rotate(x)`` (a negation and a stack), four float32 products / sums and a final
cast; this kernel views the last dim as ``(G, 2, W)`` (see the module doc of ``common``) and
computes each half of the pairs straight into one float32 buffer::

    y_a = a * cos_a        then  y_a -= b * sin_a        (torch.mul(out=), addcmul_)
    y_b = b * cos_b        then  y_b += a * sin_b

reading ``x`` (converted to float32 once for float16 / bfloat16) and ``cos`` / ``sin`` (any float
dtype, promoted inside the products) without further temporaries, then rounds ``y`` once into
``out`` (which may be ``x`` itself: the in-place op). ``addcmul`` may fuse its product and sum
(one rounding instead of two), so float32 results are within an ulp or two of the reference's;
float16 / bfloat16 results, rounded from float32, match it (up to a rare tie).
"""
from __future__ import annotations

import torch

from torchair.ops.rope.common import groups

__all__ = ["rope_cpu"]


def rope_cpu(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mode: str,
             out: torch.Tensor) -> torch.Tensor:
    """Write ``x * cos + rotate(x) * sin`` (mode ``mode``) into ``out`` (``x``'s shape and dtype;
    ``out`` may be ``x``). Returns ``out``."""
    g, w = groups(mode, x.shape[-1])
    xv = x.unflatten(-1, (g, 2, w))
    xf = xv if x.dtype == torch.float32 else xv.float()
    cv = cos.unflatten(-1, (g, 2, w))
    sv = sin.unflatten(-1, (g, 2, w))
    y = torch.empty(xf.shape, dtype=torch.float32, device=x.device)
    a, b = xf[..., 0, :], xf[..., 1, :]
    ya, yb = y[..., 0, :], y[..., 1, :]
    torch.mul(a, cv[..., 0, :], out=ya)
    ya.addcmul_(b, sv[..., 0, :], value=-1)
    torch.mul(b, cv[..., 1, :], out=yb)
    yb.addcmul_(a, sv[..., 1, :])
    out.unflatten(-1, (g, 2, w)).copy_(y)
    return out
