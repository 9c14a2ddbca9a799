"""Fast kernel of the rotary ops on CPU (and the generic fallback on other devices).

Same contract as :func:`torchair.ops.rope.common.rope_reference`; arguments arrive checked.
``rotate(x)`` is the pair-swapped ``x`` times a sign: with the last dim viewed as ``(G, 2, W)``
(see :mod:`torchair.ops.rope.common`), ``rotate(x) = flip(x, pair dim) * (-1, +1)``. The sign goes
onto ``sin`` (``sin_signed``: as small as the table, typically ``N`` times smaller than ``x``), so
a call is five passes over ``x``-sized data and a handful of dispatcher calls::

    xf  = float32(x)                       (no copy for a float32 x)
    rot = flip(xf, pair dim)               one copy
    y   = xf * float32(cos)                (a small table; mixed-dtype broadcasts are slow)
    y  += rot * sin_signed                 addcmul_
    out = round(y)                         copy_ into out (may be x: the in-place op)

where the reference spends a negation, a stack, three products / sums and converts the tables.
At decode sizes the dispatcher calls dominate, so the count of calls matters as much as the
passes (``bench/bench_rope_swiglu.py`` measures both against the reference). ``addcmul`` may fuse
its product and sum (one rounding instead of two), so float32 results are within an ulp or two of
the reference's; float16 / bfloat16 results, rounded from float32, match it (up to a rare tie).
"""
from __future__ import annotations

import torch

from torchair.ops.rope.common import groups

__all__ = ["rope_cpu"]

_signs: dict[torch.device, torch.Tensor] = {}


def _sign(device: torch.device) -> torch.Tensor:
    """``[[-1], [1]]`` float32 on ``device``: the sign of ``rotate`` over the pair dim."""
    sign = _signs.get(device)
    if sign is None:
        sign = _signs[device] = torch.tensor([[-1.0], [1.0]], device=device)
    return sign


def rope_cpu(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mode: str,
             out: torch.Tensor) -> torch.Tensor:
    """Write ``x * cos + rotate(x) * sin`` (mode ``mode``) into ``out`` (``x``'s shape and dtype;
    ``out`` may be ``x``). Returns ``out``."""
    g, w = groups(mode, x.shape[-1])
    xf = x if x.dtype == torch.float32 else x.float()
    rot = xf.unflatten(-1, (g, 2, w)).flip(-2).flatten(-3)
    sin_signed = (sin.unflatten(-1, (g, 2, w)) * _sign(x.device)).flatten(-3)
    y = xf * (cos if cos.dtype == torch.float32 else cos.float())  # a mixed-dtype broadcast
    y.addcmul_(rot, sin_signed)
    return out.copy_(y)
