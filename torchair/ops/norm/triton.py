"""Triton kernels of the RMS-norm and dynamic-quant ops for CUDA: one row per program.

Same contracts as the references in :mod:`torchair.ops.norm.rms_norm` and
:mod:`torchair.ops.quant.dynamic_quant` (see their module docs); arguments arrive already checked.
Importing this module never fails without Triton or without CUDA (``HAS_TRITON`` says whether the
kernels exist); the ops use them for CUDA tensors when Triton is importable and the row fits one
block (``MAX_WIDTH`` elements), else their references.

* ``_rms_norm_kernel``: ``npu_rms_norm`` / ``npu_add_rms_norm`` / ``npu_add_rms_norm_cast``
  (``HAS_X2``: add and store the rounded sum first; ``WRITE_F32``: also store ``y`` as float32).
* ``_quant_kernel``: ``npu_dynamic_quant`` (``NORM`` False; ``GROUPED``: the row's expert is found
  on the device from the cumulative ``group_index``) and ``npu_add_rms_norm_dynamic_quant``
  (``NORM`` True; the normalized row stays in registers as float32 and feeds one or two
  quantizations, ``WANT1`` / ``WANT2``).

A program holds its whole row (``BLOCK = next_pow2(n)``) in registers: the row is read once and
every output written once; no host reads of tensor values (CUDA-graph capturable). Float32 math
uses correctly rounded division and square root (``div_rn`` / ``sqrt_rn``) like the references;
round half to even is the shared :func:`torchair.ops.toolchain.triton_utils.rint` (exact for every
float32).

With ``TRITON_INTERPRET=1`` set before triton is imported the kernels run in Triton's interpreter
on CPU tensors (tests, tiny shapes); numpy has no bfloat16, so bfloat16 is tested on GPUs only.
"""
from __future__ import annotations

import torch

from torchair.ops.norm.cpu import rstd_shape
from torchair.ops.toolchain.triton_utils import HAS_TRITON, interpreted, launch_mode, next_pow2, rint, tl, triton

__all__ = ["HAS_TRITON", "MAX_WIDTH", "add_rms_norm_dynamic_quant_triton", "add_rms_norm_triton",
           "dynamic_quant_triton", "group_index_on", "interpreted", "rms_norm_triton"]

MAX_WIDTH = 65536  # elements of one row held by one program


def _num_warps(block: int) -> int:
    if block >= 32768:
        return 32
    if block >= 8192:
        return 16
    if block >= 2048:
        return 8
    return 4


# ----------------------------------------------------------------------------------------------
# Kernels: plain functions, jitted below when Triton is importable (compiled, or interpreted when
# TRITON_INTERPRET=1 was set before triton was imported).
# ----------------------------------------------------------------------------------------------

def _add_and_round(X1, X2, XOut, base, offs, ok):
    """x1 + x2 in float32, stored rounded to x_out's dtype; returns the rounded sum as float32."""
    x = tl.load(X1 + base + offs, mask=ok, other=0.0).to(tl.float32)
    x = x + tl.load(X2 + base + offs, mask=ok, other=0.0).to(tl.float32)
    xr = x.to(XOut.dtype.element_ty)
    tl.store(XOut + base + offs, xr, mask=ok)
    return xr.to(tl.float32)


def _inv_rms(x, n, eps):
    """1 / sqrt(sum(x ** 2) / n + eps) of a float32 row (masked lanes hold 0)."""
    ms = tl.math.div_rn(tl.sum(x * x, 0), n * 1.0)  # n may arrive as a constexpr 1
    return tl.math.div_rn(1.0, tl.sqrt_rn(ms + eps))


def _quantize_store(v, Y, Scale, row, base, offs, ok):
    """Per-row symmetric int8 of the float32 row ``v``: stores y and scale (y = 0 if scale = 0)."""
    amax = tl.max(tl.where(ok, tl.abs(v), 0.0), 0)
    scale = tl.math.div_rn(amax, 127.0)
    safe = tl.where(scale > 0, scale, 1.0)
    q = tl.math.div_rn(v, safe)
    q = rint(q)  # round half to even; |q| <= 127 (1 + 2 eps): no clamp needed
    tl.store(Y + base + offs, q.to(tl.int8), mask=ok)
    tl.store(Scale + row, scale)


def _rms_norm_kernel(X1, X2, G, Y, YF32, Rstd, XOut, n, eps,
                     HAS_X2: tl.constexpr, WRITE_F32: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < n
    base = row * n
    if HAS_X2:
        x = _add_and_round(X1, X2, XOut, base, offs, ok)
    else:
        x = tl.load(X1 + base + offs, mask=ok, other=0.0).to(tl.float32)
    rstd = _inv_rms(x, n, eps)
    g = tl.load(G + offs, mask=ok, other=0.0).to(tl.float32)
    y = ((x * rstd) * g).to(Y.dtype.element_ty)
    tl.store(Y + base + offs, y, mask=ok)
    if WRITE_F32:
        tl.store(YF32 + base + offs, y.to(tl.float32), mask=ok)
    tl.store(Rstd + row, rstd)


def _smooth_row(S, row, n, GIdx, n_experts, offs, ok, GROUPED: tl.constexpr,
                BLOCK_E: tl.constexpr):
    """The float32 smooth scales of ``row``: S [n], or S[e] of [E, n] with e from group_index."""
    if GROUPED:
        offs_e = tl.arange(0, BLOCK_E)
        ends = tl.load(GIdx + offs_e, mask=offs_e < n_experts, other=0).to(tl.int64)
        hit = (ends <= row) & (offs_e < n_experts)
        e = tl.minimum(tl.sum(hit.to(tl.int64), 0), n_experts - 1)
        return tl.load(S + e * n + offs, mask=ok, other=0.0).to(tl.float32)
    return tl.load(S + offs, mask=ok, other=0.0).to(tl.float32)


def _quant_kernel(X1, X2, G, Beta, S1, S2, GIdx, Y1, Y2, XOut, Scale1, Scale2, n, n_experts, eps,
                  NORM: tl.constexpr, HAS_BETA: tl.constexpr, HAS_S1: tl.constexpr,
                  HAS_S2: tl.constexpr, GROUPED: tl.constexpr, WANT1: tl.constexpr,
                  WANT2: tl.constexpr, BLOCK: tl.constexpr, BLOCK_E: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < n
    base = row * n
    if NORM:
        x = _add_and_round(X1, X2, XOut, base, offs, ok)
        g = tl.load(G + offs, mask=ok, other=0.0).to(tl.float32)
        y = (x * _inv_rms(x, n, eps)) * g  # float32, not rounded to the input dtype
        if HAS_BETA:
            y = y + tl.load(Beta + offs, mask=ok, other=0.0).to(tl.float32)
    else:
        y = tl.load(X1 + base + offs, mask=ok, other=0.0).to(tl.float32)
    if WANT1:
        v1 = y
        if HAS_S1:
            v1 = y * _smooth_row(S1, row, n, GIdx, n_experts, offs, ok, GROUPED, BLOCK_E)
        _quantize_store(v1, Y1, Scale1, row, base, offs, ok)
    if WANT2:
        v2 = y
        if HAS_S2:
            v2 = y * _smooth_row(S2, row, n, GIdx, n_experts, offs, ok, False, BLOCK_E)
        _quantize_store(v2, Y2, Scale2, row, base, offs, ok)


if HAS_TRITON:
    _add_and_round = triton.jit(_add_and_round)
    _inv_rms = triton.jit(_inv_rms)
    _quantize_store = triton.jit(_quantize_store)
    _smooth_row = triton.jit(_smooth_row)
    _rms_norm_kernel = triton.jit(_rms_norm_kernel)
    _quant_kernel = triton.jit(_quant_kernel)


def _launch_options(x: torch.Tensor, block: int) -> dict:
    if launch_mode(x.device, "the Triton norm kernels"):
        return {}
    return {"num_warps": _num_warps(block)}


def _float_row(t: torch.Tensor | None, n: int) -> torch.Tensor | None:
    return t.reshape(n).contiguous() if t is not None else None


def rms_norm_triton(x: torch.Tensor, gamma: torch.Tensor, epsilon: float
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``npu_rms_norm`` with the Triton kernel: ``(y, rstd)``."""
    y, rstd, _, _ = _rms_norm_family(x, None, gamma, epsilon, want_f32=False)
    return y, rstd


def add_rms_norm_triton(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, epsilon: float,
                        *, want_f32: bool = False) -> tuple[torch.Tensor, ...]:
    """``npu_add_rms_norm`` with the Triton kernel: ``(y, rstd, x_out)`` (+ ``y_f32``)."""
    y, rstd, x_out, y_f32 = _rms_norm_family(x1, x2, gamma, epsilon, want_f32=want_f32)
    return (y, rstd, x_out, y_f32) if want_f32 else (y, rstd, x_out)


def _rms_norm_family(x1, x2, gamma, epsilon, *, want_f32):
    n = gamma.numel()
    block = max(16, next_pow2(n))
    opts = _launch_options(x1, block)
    x1c = x1.contiguous()
    x2c = x2.contiguous() if x2 is not None else x1c
    rows = x1c.numel() // n if n else 0
    y = torch.empty_like(x1c)
    x_out = torch.empty_like(x1c) if x2 is not None else None
    y_f32 = torch.empty(x1c.shape, dtype=torch.float32, device=x1.device) if want_f32 else None
    rstd = torch.empty(rstd_shape(x1, gamma), dtype=torch.float32, device=x1.device)
    if rows:
        _rms_norm_kernel[(rows,)](
            x1c, x2c, _float_row(gamma, n), y, y_f32 if want_f32 else y, rstd,
            x_out if x_out is not None else y, n, float(epsilon),
            HAS_X2=x2 is not None, WRITE_F32=want_f32, BLOCK=block, **opts)
    return y, rstd, x_out, y_f32


def group_index_on(group_index: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``group_index`` contiguous on ``device`` (the kernel reads it there).

    A ``group_index`` on another device (typically a CPU tensor of cumulative row ends with a
    CUDA input) is copied to ``device`` (a small host-to-device copy; keep it on the input's
    device to stay CUDA-graph capturable), as the CPU kernel and the reference accept one on any
    device. Handing Triton the CPU pointer instead would fault or read garbage.
    """
    return group_index.to(device).contiguous()


def dynamic_quant_triton(x: torch.Tensor, smooth_scales: torch.Tensor | None,
                         group_index: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``npu_dynamic_quant`` (int8) with the Triton kernel: ``(y, scale)``."""
    n = x.shape[-1]
    block = max(16, next_pow2(n))
    opts = _launch_options(x, block)
    xc = x.contiguous()
    rows = xc.numel() // n
    y = torch.empty(x.shape, dtype=torch.int8, device=x.device)
    scale = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    smooth = smooth_scales.contiguous() if smooth_scales is not None else None
    experts = group_index.shape[0] if group_index is not None else 1
    gidx = group_index_on(group_index, x.device) if group_index is not None else scale
    if rows:
        _quant_kernel[(rows,)](
            xc, xc, xc, xc, smooth if smooth is not None else xc, xc, gidx, y, y, xc, scale,
            scale, n, experts, 0.0,
            NORM=False, HAS_BETA=False, HAS_S1=smooth is not None, HAS_S2=False,
            GROUPED=group_index is not None, WANT1=True, WANT2=False, BLOCK=block,
            BLOCK_E=max(2, next_pow2(experts)), **opts)
    return y, scale


def add_rms_norm_dynamic_quant_triton(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, *,
                                      smooth_scale1: torch.Tensor | None,
                                      smooth_scale2: torch.Tensor | None,
                                      beta: torch.Tensor | None, epsilon: float, want1: bool,
                                      want2: bool) -> tuple[torch.Tensor, ...]:
    """``npu_add_rms_norm_dynamic_quant`` with the Triton kernel: ``(y1, y2, x_out, scale1,
    scale2)``; a quantization not wanted gives empty ``[0]`` outputs."""
    n = x1.shape[-1]
    block = max(16, next_pow2(n))
    opts = _launch_options(x1, block)
    x1c, x2c = x1.contiguous(), x2.contiguous()
    rows = x1c.numel() // n
    dev = x1.device
    x_out = torch.empty_like(x1c)
    outs = [(torch.empty(x1.shape, dtype=torch.int8, device=dev),
             torch.empty(x1.shape[:-1], dtype=torch.float32, device=dev)) if want else
            (torch.empty(0, dtype=torch.int8, device=dev),
             torch.empty(0, dtype=torch.float32, device=dev)) for want in (want1, want2)]
    (y1, sc1), (y2, sc2) = outs
    s1, s2, bt = (_float_row(t, n) for t in (smooth_scale1, smooth_scale2, beta))
    if rows:
        _quant_kernel[(rows,)](
            x1c, x2c, _float_row(gamma, n), bt if bt is not None else x1c,
            s1 if s1 is not None else x1c, s2 if s2 is not None else x1c, x1c, y1, y2, x_out,
            sc1, sc2, n, 1, float(epsilon),
            NORM=True, HAS_BETA=bt is not None, HAS_S1=s1 is not None, HAS_S2=s2 is not None,
            GROUPED=False, WANT1=want1, WANT2=want2, BLOCK=block, BLOCK_E=2, **opts)
    return y1, y2, x_out.view(x1.shape), sc1, sc2
