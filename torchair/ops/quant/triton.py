"""Triton kernels of ``npu_quant_matmul`` and ``npu_dequant_swiglu_quant`` for CUDA.

Same canonical plans and formulas as the reference kernels (see the op modules). Importing this
module never fails without Triton or without CUDA (``HAS_TRITON`` says which); with
``TRITON_INTERPRET=1`` set before triton is imported the kernels run in Triton's interpreter on
CPU tensors, which is how they are tested without a GPU (tiny shapes).

* quant matmul, grid ``(cdiv(M, BLOCK_M), cdiv(N, BLOCK_N), batch)``: a tiled ``tl.dot`` of int8
  tiles into an int32 accumulator (exact; tensor cores' IMMA on sm80+), then the epilogue in
  registers: int32 bias, ``float32(acc) * scale``, pertoken scale, float bias, and for int8 output
  offset, round half to even and saturation. ``K`` is a compile-time constant (a layer's width),
  ``M`` (tokens) is not, so a new batch size never recompiles.
* dequant swiglu quant, grid ``(T,)``: one program per token row walking ``H`` in ``BLOCK_H``
  chunks; dynamic quantization makes two passes over the row (amax, then quantize), recomputing
  the cheap elementwise chain instead of keeping the row in registers.

Results equal the reference up to the last-ulp differences of ``exp`` / fused multiply-adds
(an int8 output may differ by 1 at a rounding tie). No host reads of tensor values: capturable
in a CUDA graph.
"""
from __future__ import annotations

import math

import torch

from torchair.ops.quant.plans import QuantMatmulPlan, SwigluQuantPlan
from torchair.ops.toolchain.triton_utils import (
    HAS_TRITON,
    interpreted,
    launch_mode,
    next_pow2,
    rint as _rint,
    tl,
    triton,
)

__all__ = ["HAS_TRITON", "check_matmul_blocks", "dequant_swiglu_quant_triton", "interpreted",
           "quant_matmul_triton"]

_MIN_DOT = 16  # every tl.dot tile dimension is >= 16 ...
_MIN_DOT_K_INT8 = 32  # ... and K >= 32 for 8-bit operands (Triton's min_dot_size on NVIDIA)


# ----------------------------------------------------------------------------------------------
# Kernels: plain functions, jitted below when Triton is importable.
# ----------------------------------------------------------------------------------------------

def _quant_matmul_kernel(
        A, B, C, Scale, Offset, Pertoken, IBias, FBias,
        M, N, stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn,
        stride_cb, stride_cm, stride_cn, stride_biasb,
        K: tl.constexpr, SCALE_PER_N: tl.constexpr, HAS_OFFSET: tl.constexpr,
        OFFSET_PER_N: tl.constexpr, HAS_PERTOKEN: tl.constexpr, HAS_IBIAS: tl.constexpr,
        HAS_FBIAS: tl.constexpr, OUT_INT8: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    bat = tl.program_id(2).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    rows = offs_m.to(tl.int64)  # row offsets in int64: M * K or M * N may exceed 2**31
    a_ptr = A + bat * stride_ab + rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptr = B + bat * stride_bb + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + offs_k) < K
        a = tl.load(a_ptr, mask=m_ok[:, None] & k_ok[None, :], other=0)
        b = tl.load(b_ptr, mask=k_ok[:, None] & n_ok[None, :], other=0)
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)  # int8 x int8 -> int32, exact
        a_ptr += BLOCK_K * stride_ak
        b_ptr += BLOCK_K * stride_bk

    if HAS_IBIAS:
        acc += tl.load(IBias + bat * stride_biasb + offs_n, mask=n_ok, other=0)[None, :]
    if SCALE_PER_N:
        scale = tl.load(Scale + offs_n, mask=n_ok, other=0.0)
    else:
        scale = tl.load(Scale + offs_n * 0)
    v = acc.to(tl.float32) * scale[None, :]
    if HAS_PERTOKEN:
        v = v * tl.load(Pertoken + offs_m, mask=m_ok, other=0.0)[:, None]
    if HAS_FBIAS:
        v = v + tl.load(FBias + bat * stride_biasb + offs_n, mask=n_ok, other=0.0)[None, :]
    c_ptr = C + bat * stride_cb + rows[:, None] * stride_cm + offs_n[None, :] * stride_cn
    c_ok = m_ok[:, None] & n_ok[None, :]
    if OUT_INT8:
        if HAS_OFFSET:
            if OFFSET_PER_N:
                v = v + tl.load(Offset + offs_n, mask=n_ok, other=0.0)[None, :]
            else:
                v = v + tl.load(Offset + offs_n * 0)[None, :]
        v = tl.minimum(tl.maximum(_rint(v), -128.0), 127.0)
        tl.store(c_ptr, v.to(tl.int8), mask=c_ok)
    else:
        tl.store(c_ptr, v.to(C.dtype.element_ty), mask=c_ok)


def _swiglu_chunk(X, WS, Act, IBias, FBias, QS, row, g, h0, stride_x, qs_stride,
                  H: tl.constexpr, BLOCK_H: tl.constexpr, HAS_WS: tl.constexpr,
                  HAS_ACT: tl.constexpr, HAS_IBIAS: tl.constexpr, HAS_FBIAS: tl.constexpr,
                  HAS_QS: tl.constexpr, QS_PER_H: tl.constexpr, ACT_LEFT: tl.constexpr,
                  DYNAMIC: tl.constexpr):
    """silu(act) * gate of columns [h0, h0 + BLOCK_H) of one row (dynamic: times quant_scale)."""
    offs = h0 + tl.arange(0, BLOCK_H)
    ok = offs < H
    x_row = X + row * stride_x
    xl = tl.load(x_row + offs, mask=ok, other=0)
    xr = tl.load(x_row + H + offs, mask=ok, other=0)
    if HAS_IBIAS:
        xl += tl.load(IBias + offs, mask=ok, other=0)
        xr += tl.load(IBias + H + offs, mask=ok, other=0)
    dl = xl.to(tl.float32)
    dr = xr.to(tl.float32)
    if HAS_WS:
        ws_row = WS + g * (2 * H)
        dl = dl * tl.load(ws_row + offs, mask=ok, other=0.0)
        dr = dr * tl.load(ws_row + H + offs, mask=ok, other=0.0)
    if HAS_ACT:
        a_s = tl.load(Act + row + offs * 0)
        dl = dl * a_s
        dr = dr * a_s
    if HAS_FBIAS:
        dl = dl + tl.load(FBias + offs, mask=ok, other=0.0)
        dr = dr + tl.load(FBias + H + offs, mask=ok, other=0.0)
    if ACT_LEFT:
        act = dl
        gate = dr
    else:
        act = dr
        gate = dl
    out = act / (tl.exp(-act) + 1.0) * gate
    if DYNAMIC and HAS_QS:
        if QS_PER_H:
            out = out * tl.load(QS + g * qs_stride + offs, mask=ok, other=0.0)
        else:
            out = out * tl.load(QS + g * qs_stride + offs * 0)
    return tl.where(ok, out, 0.0)


def _swiglu_quant_kernel(
        X, WS, Act, IBias, FBias, QS, QO, Gid, Y, Scale, stride_x, qs_stride, num_groups,
        H: tl.constexpr, BLOCK_H: tl.constexpr, HAS_WS: tl.constexpr, HAS_ACT: tl.constexpr,
        HAS_IBIAS: tl.constexpr, HAS_FBIAS: tl.constexpr, HAS_QS: tl.constexpr,
        QS_PER_H: tl.constexpr, HAS_QO: tl.constexpr, QO_PER_H: tl.constexpr,
        HAS_GID: tl.constexpr, ACT_LEFT: tl.constexpr, DYNAMIC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    g = row * 0
    valid = row >= 0
    if HAS_GID:
        gid = tl.load(Gid + row)
        valid = gid < num_groups
        g = tl.minimum(gid, num_groups - 1)
    y_row = Y + row * H
    if DYNAMIC:
        amax = tl.zeros([BLOCK_H], dtype=tl.float32)
        for h0 in range(0, H, BLOCK_H):
            out = _swiglu_chunk(X, WS, Act, IBias, FBias, QS, row, g, h0, stride_x, qs_stride,
                                H, BLOCK_H, HAS_WS, HAS_ACT, HAS_IBIAS, HAS_FBIAS, HAS_QS,
                                QS_PER_H, ACT_LEFT, DYNAMIC)
            amax = tl.maximum(amax, tl.abs(out))
        scale = tl.max(amax, 0) * (1.0 / 127.0)
        div = tl.where(scale == 0.0, 1.0, scale)
        tl.store(Scale + row, tl.where(valid, scale, 0.0))
    else:
        tl.store(Scale + row, 0.0)
    for h0 in range(0, H, BLOCK_H):
        offs = h0 + tl.arange(0, BLOCK_H)
        ok = offs < H
        out = _swiglu_chunk(X, WS, Act, IBias, FBias, QS, row, g, h0, stride_x, qs_stride,
                            H, BLOCK_H, HAS_WS, HAS_ACT, HAS_IBIAS, HAS_FBIAS, HAS_QS, QS_PER_H,
                            ACT_LEFT, DYNAMIC)
        if DYNAMIC:
            out = out / div
        else:
            if HAS_QS:
                if QS_PER_H:
                    out = out / tl.load(QS + offs, mask=ok, other=1.0)
                else:
                    out = out / tl.load(QS + offs * 0)
            if HAS_QO:
                if QO_PER_H:
                    out = out + tl.load(QO + offs, mask=ok, other=0.0)
                else:
                    out = out + tl.load(QO + offs * 0)
            out = tl.where(out != out, 0.0, out)  # noqa: PLR0124 (NaN -> 0)
        q = tl.minimum(tl.maximum(_rint(out), -128.0), 127.0)
        q = tl.where(valid, q, 0.0)
        tl.store(y_row + offs, q.to(tl.int8), mask=ok)


if HAS_TRITON:
    _quant_matmul_kernel = triton.jit(_quant_matmul_kernel)
    _swiglu_chunk = triton.jit(_swiglu_chunk)
    _swiglu_quant_kernel = triton.jit(_swiglu_quant_kernel)


def _matmul_blocks(m: int, n: int, k: int) -> tuple[int, int, int, int]:
    block_m = max(_MIN_DOT, min(128, next_pow2(m)))
    block_n = max(_MIN_DOT, min(128, next_pow2(n)))
    block_k = max(_MIN_DOT_K_INT8, min(128, next_pow2(k)))
    warps = 8 if block_m * block_n >= 128 * 128 else 4
    return block_m, block_n, block_k, warps


def check_matmul_blocks(blocks) -> tuple[int, int, int]:
    """Validate a ``blocks=`` override ``(BLOCK_M, BLOCK_N, BLOCK_K)``: powers of two with
    ``BLOCK_M, BLOCK_N >= 16`` and ``BLOCK_K >= 32`` (an int8 ``tl.dot`` needs K >= 32 on NVIDIA
    GPUs; Triton's ``min_dot_size`` is (1, 1, 32) for 8-bit operands)."""
    rule = (f"blocks must be three powers of two (BLOCK_M, BLOCK_N, BLOCK_K) with BLOCK_M >= "
            f"{_MIN_DOT}, BLOCK_N >= {_MIN_DOT} and BLOCK_K >= {_MIN_DOT_K_INT8} (an int8 tl.dot "
            f"needs K >= {_MIN_DOT_K_INT8} on NVIDIA GPUs)")
    try:
        bm, bn, bk = (int(b) for b in blocks)
    except (TypeError, ValueError):
        raise ValueError(f"quant_matmul_triton: {rule}; got blocks={blocks!r}") from None
    mins = (_MIN_DOT, _MIN_DOT, _MIN_DOT_K_INT8)
    if any(b < lo or b & (b - 1) for b, lo in zip((bm, bn, bk), mins)):
        raise ValueError(f"quant_matmul_triton: {rule}; got blocks={tuple(blocks)!r}")
    return bm, bn, bk


def quant_matmul_triton(x1: torch.Tensor, x2: torch.Tensor, plan: QuantMatmulPlan,
                        blocks: tuple[int, int, int] | None = None) -> torch.Tensor:
    """``npu_quant_matmul`` with the Triton kernel (``blocks``: (BLOCK_M, BLOCK_N, BLOCK_K),
    powers of two with BLOCK_M, BLOCK_N >= 16 and BLOCK_K >= 32 (:func:`check_matmul_blocks`),
    overrides the heuristic; tests)."""
    if blocks is not None:
        blocks = check_matmul_blocks(blocks)
    interpret = launch_mode(x1.device, "quant_matmul_triton")
    batch = torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    m, k = x1.shape[-2:]
    n = x2.shape[-1]
    nb = math.prod(batch)
    out = torch.empty(nb, m, n, dtype=plan.out_dtype, device=x1.device)
    if nb * m * n == 0:
        return out.view(*batch, m, n)
    a = x1.expand(*batch, m, k).reshape(nb, m, k)
    b = x2.expand(*batch, k, n).reshape(nb, k, n)
    bm, bn, bk, warps = _matmul_blocks(m, n, k)
    if blocks is not None:
        bm, bn, bk = blocks
    dev = x1.device
    scale = plan.scale.to(dev, torch.float32).contiguous()
    offset = plan.offset.to(dev, torch.float32).contiguous() if plan.offset is not None else scale
    pertoken = plan.pertoken.to(dev, torch.float32).contiguous() \
        if plan.pertoken is not None else scale
    bias = plan.int_bias if plan.int_bias is not None else plan.float_bias
    stride_bias = 0
    if bias is not None:
        bias = bias.to(dev).reshape(-1, n).contiguous()
        stride_bias = n if bias.shape[0] > 1 else 0
    ibias = bias if plan.int_bias is not None else scale
    fbias = bias if plan.float_bias is not None else scale
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn), nb)
    launch = {} if interpret else {"num_warps": warps, "num_stages": 3}
    _quant_matmul_kernel[grid](
        a, b, out, scale, offset, pertoken, ibias, fbias,
        m, n, a.stride(0), a.stride(1), a.stride(2), b.stride(0), b.stride(1), b.stride(2),
        out.stride(0), out.stride(1), out.stride(2), stride_bias,
        K=k, SCALE_PER_N=scale.numel() > 1, HAS_OFFSET=plan.offset is not None,
        OFFSET_PER_N=offset.numel() > 1, HAS_PERTOKEN=plan.pertoken is not None,
        HAS_IBIAS=plan.int_bias is not None, HAS_FBIAS=plan.float_bias is not None,
        OUT_INT8=plan.out_dtype == torch.int8, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, **launch)
    return out.view(*batch, m, n)


def dequant_swiglu_quant_triton(plan: SwigluQuantPlan, block_h: int | None = None
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """``npu_dequant_swiglu_quant`` with the Triton kernel: ``(y [T, H], scale [T])``
    (``block_h``: a power of two, overrides the chunk width; tests)."""
    x = plan.x
    interpret = launch_mode(x.device, "dequant_swiglu_quant_triton")
    tokens, width = x.shape
    h = width // 2
    dev = x.device
    y = torch.empty(tokens, h, dtype=torch.int8, device=dev)
    scale = torch.empty(tokens, dtype=torch.float32, device=dev)
    if tokens == 0:
        return y, scale
    if x.stride(1) != 1:
        x = x.contiguous()
    block = block_h if block_h is not None else max(16, min(2048, next_pow2(h)))

    def prep(t, dtype=torch.float32):
        return t.to(dev, dtype).contiguous() if t is not None else scale

    qs = plan.quant_scale
    qo = plan.quant_offset
    launch = {} if interpret else {"num_warps": 4 if block <= 1024 else 8}
    _swiglu_quant_kernel[(tokens,)](
        x, prep(plan.weight_scale), prep(plan.act_scale), prep(plan.int_bias, torch.int32),
        prep(plan.float_bias), prep(qs), prep(qo), prep(plan.row_group, torch.int64), y, scale,
        x.stride(0), qs.shape[1] if qs is not None else 0, plan.num_groups,
        H=h, BLOCK_H=block, HAS_WS=plan.weight_scale is not None,
        HAS_ACT=plan.act_scale is not None, HAS_IBIAS=plan.int_bias is not None,
        HAS_FBIAS=plan.float_bias is not None, HAS_QS=qs is not None,
        QS_PER_H=qs is not None and qs.shape[1] > 1, HAS_QO=qo is not None,
        QO_PER_H=qo is not None and qo.shape[1] > 1, HAS_GID=plan.row_group is not None,
        ACT_LEFT=plan.activate_left, DYNAMIC=plan.dynamic, **launch)
    return y, scale
