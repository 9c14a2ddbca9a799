"""Rotation modes, argument checks and the fp32 reference rotation of the rotary-embedding ops.

A rotation mode pairs the ``D`` elements of the last dim into ``D / 2`` pairs ``(a, b)`` and
rotates each pair by an angle whose cosine / sine the caller supplies per element::

    y_a = a * cos_a - b * sin_a
    y_b = b * cos_b + a * sin_b

i.e. ``y = x * cos + rotate(x) * sin`` with ``rotate`` putting ``-b`` where ``a`` was and ``a``
where ``b`` was. The modes differ in which elements pair up (torch_npu's ``rotary_mode``):

* ``"half"`` (GPT-NeoX): ``a = x[..., :D/2]``, ``b = x[..., D/2:]``; ``rotate(x) = cat(-x2, x1)``.
* ``"quarter"``: the rotate-half of each half: quarters ``q1..q4``, ``rotate(x) = cat(-q2, q1,
  -q4, q3)``.
* ``"interleave"`` (GPT-J): ``a = x[..., 0::2]``, ``b = x[..., 1::2]``; ``rotate(x)`` holds
  ``(-x[2i+1], x[2i])`` at ``(2i, 2i+1)``.

All three are one shape: the last dim viewed as ``(G, 2, W)`` (half ``(1, 2, D/2)``, quarter
``(2, 2, D/4)``, interleave ``(D/2, 2, 1)``), ``a = [..., g, 0, w]`` and ``b = [..., g, 1, w]``;
the kernels use that view. Math is float32; the result is rounded once to the input's dtype.
"""
from __future__ import annotations

import torch

__all__ = ["FLOAT_DTYPES", "MODES", "check_float", "check_rope_table", "deinterleave", "groups",
           "interleaved_rope_reference", "rope_reference", "rotate"]

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MODES = ("half", "quarter", "interleave")


def groups(mode: str, d) -> tuple:
    """``(G, W)`` of the ``(G, 2, W)`` view of the last dim for ``mode`` (``d`` = its size)."""
    if mode == "half":
        return 1, d // 2
    if mode == "quarter":
        return 2, d // 4
    return d // 2, 1


def check_mode(op: str, mode: str, d, arg: str = "rotary_mode") -> None:
    """``mode`` is a known rotary mode and the last dim ``d`` splits into its pairs."""
    if mode not in MODES:
        raise ValueError(f"{op}: {arg}={mode!r} is not supported; expected one of "
                         f"{', '.join(repr(m) for m in MODES)} ('half' rotates the two halves of "
                         f"the last dim, 'interleave' the even/odd pairs)")
    div = 4 if mode == "quarter" else 2
    if d % div != 0 or d == 0:
        raise ValueError(f"{op}: the last dim (head_dim D) is {d}; {arg}={mode!r} needs a "
                         f"positive D divisible by {div}; pad the head dim or choose another mode")


def check_float(op: str, name: str, t: torch.Tensor) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {name} has dtype {t.dtype}; expected float16, bfloat16 or float32; "
                        f"cast {name} to one of them")


def check_rope_table(op: str, x_name: str, x: torch.Tensor, name: str,
                     table: torch.Tensor) -> None:
    """``table`` (cos or sin) has ``x``'s rank and broadcasts to ``x`` (each dim 1 or equal)."""
    if table.dim() != x.dim():
        raise ValueError(f"{op}: {name} has shape {list(table.shape)} ({table.dim()}-D) but "
                         f"{x_name} is {x.dim()}-D {list(x.shape)}; {name} must have {x_name}'s "
                         f"rank, each dim 1 (broadcast) or equal to {x_name}'s; unsqueeze {name}")
    for i, (t, s) in enumerate(zip(table.shape, x.shape)):
        if not (t == 1 or t == s) or (i == x.dim() - 1 and t != s):
            raise ValueError(f"{op}: {name} has shape {list(table.shape)}, which does not "
                             f"broadcast to {x_name} {list(x.shape)} (dim {i}: {t} vs {s}; the "
                             f"last dim must equal head_dim, the others be 1 or equal); pass "
                             f"{name} shaped like {x_name} with broadcast dims of size 1")


def rotate(x: torch.Tensor, mode: str) -> torch.Tensor:
    """``rotate(x)`` of the module doc: ``-b`` at the places of ``a``, ``a`` at those of ``b``."""
    g, w = groups(mode, x.shape[-1])
    v = x.unflatten(-1, (g, 2, w))
    return torch.stack((-v[..., 1, :], v[..., 0, :]), dim=-2).flatten(-3)


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   mode: str = "half") -> torch.Tensor:
    """The oracle of one rotation: ``round_to(x.dtype)(x * cos + rotate(x) * sin)`` in float32.

    ``cos`` / ``sin`` broadcast to ``x``; returns a new tensor of ``x``'s shape and dtype.
    """
    xf = x.float()
    return (xf * cos.float() + rotate(xf, mode) * sin.float()).to(x.dtype)


def deinterleave(r: torch.Tensor) -> torch.Tensor:
    """``cat(r[..., 0::2], r[..., 1::2])``: the even elements of the last dim, then the odd ones
    (a new contiguous tensor)."""
    return torch.cat((r[..., 0::2], r[..., 1::2]), dim=-1)


def interleaved_rope_reference(r: torch.Tensor, cos: torch.Tensor,
                               sin: torch.Tensor) -> torch.Tensor:
    """The oracle of DeepSeek MLA's rope (``npu_interleave_rope``, the rope part of
    ``npu_kv_rmsnorm_rope_cache``): an interleaved RoPE whose output is stored de-interleaved::

        p1 = cat(r[..., 0::2], r[..., 1::2])
        p2 = cat(-r[..., 1::2], r[..., 0::2])
        y  = round_to(r.dtype)(p1 * cos + p2 * sin)        in float32

    i.e. ``rope_reference(deinterleave(r), cos, sin, "half")``: ``y[:D/2] + i * y[D/2:] =
    (r_even + i * r_odd) * e^(i theta)`` for ``cos = cat(cos theta, cos theta)``.
    """
    return rope_reference(deinterleave(r), cos, sin, "half")
