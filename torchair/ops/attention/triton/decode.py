"""Triton split-KV (flash-decoding) kernel for canonical decode attention on CUDA.

Implements exactly the interface and semantics of :mod:`torchair.ops.attention.decode` (see its
module doc; the oracle is ``decode_attention_reference``). Registered as the ``"cuda"`` decode
kernel when Triton is importable; importing this module never fails without Triton or without CUDA.

Design (two launches, no host reads of tensor values, so it may run inside a CUDA graph):

* kernel 1, grid ``(B, Nkv, num_splits)``: one program per (sequence, kv head, split). It packs
  the ``G = N // Nkv`` query heads of the group into one ``[G, D]`` tile (padded to powers of
  two, at least 16 for ``tl.dot``), reads ``lengths`` / ``kv_start`` / ``block_table`` / ``mask``
  from device memory, clamps the attended window ``[start, start + length)`` to ``[0, S)`` and
  splits *that window* (from the multiple of ``BLOCK_N`` at or below its start) evenly over the
  ``num_splits`` programs (so the work per program follows the actual lengths while the grid
  depends only on static shapes). Each program walks its part in ``BLOCK_N`` chunks with a
  float32 online softmax (exp2 domain) and writes its partial ``(m, l, acc)``.
* kernel 2, grid ``(B, N)``: merges the splits' partials and writes ``acc / l`` in q's dtype,
  zeros where nothing was attended (``l == 0``).

Contiguous ``[B, Nkv, S, D]`` and paged ``[num_blocks, Nkv, block_size, D]`` caches are addressed
through strides. Chunks start at multiples of ``BLOCK_N``, so when ``BLOCK_N`` divides
``block_size`` (e.g. Ascend's 128) a chunk lies in one block: one block id per chunk and
contiguous rows; smaller blocks take a per-position gather through ``block_table``. int8 KV is
dequantized in registers, ``(x + offset) * scale`` in float32 with per-channel ``[Nkv, D]``
parameters. The two matmuls run on tensor cores in q's dtype (fp16 / bf16) with float32
accumulation; float32 inputs use ``input_precision="ieee"`` (no TF32).

With ``TRITON_INTERPRET=1`` set before triton is imported, the kernels run in Triton's
interpreter, on CPU tensors too; this is how they are tested without a GPU (slow: tiny shapes).
The interpreted kernel differs from the compiled one only in its loop construct (``while``
instead of ``range``, see ``WHILE_LOOP``) and, for bf16, in running the matmuls in float32 (the
interpreter's bf16 ``tl.dot`` is wrong: numpy has no bfloat16). What the interpreter cannot
show, the GPU compilation, is checked without a GPU by :mod:`torchair.ops.toolchain.triton_aot`.
"""
from __future__ import annotations

import math

import torch

from torchair.ops import _device_checks
from torchair.ops.attention.decode import register_decode_kernel

# Triton is optional: without it (HAS_TRITON False) the CUDA decode falls back to the reference.
from torchair.ops.toolchain.triton_utils import HAS_TRITON, interpreted, launch_mode, next_pow2, sm_count, tl, triton

__all__ = ["HAS_TRITON", "choose_launch", "decode_attention_triton", "interpreted"]

# Tile / split heuristics (H100 / H200: 132 SMs, memory bound for decode).
_MIN_DOT = 16          # tl.dot needs every tile dimension >= 16
_PROGRAMS_PER_SM = 4   # aim for >= 4 x SM-count programs in kernel 1 (latency hiding)
_MAX_SPLITS = 128
_MIN_CHUNKS_PER_SPLIT = 2  # at full length every split walks >= 2 BLOCK_N chunks


def choose_launch(batch: int, nkv: int, group: int, seq: int, dim: int, sm_count: int
                  ) -> dict[str, int]:
    """Static launch parameters from shapes only (never from ``lengths`` values).

    ``BLOCK_N`` keeps the K/V tiles of one chunk around 16-32 KiB of registers/shared memory;
    ``num_splits`` targets ``_PROGRAMS_PER_SM * sm_count`` programs in kernel 1, bounded so that a
    full-length sequence gives every split at least ``_MIN_CHUNKS_PER_SPLIT`` chunks.
    """
    block_d = max(_MIN_DOT, next_pow2(dim))
    block_g = max(_MIN_DOT, next_pow2(group))
    if block_d <= 64:
        block_n = 128
    elif block_d <= 128:
        block_n = 64
    else:
        block_n = 32
    block_n = max(_MIN_DOT, min(block_n, next_pow2(max(seq, 1))))
    chunks = max(1, math.ceil(seq / block_n))
    target = _PROGRAMS_PER_SM * sm_count
    splits = math.ceil(target / max(1, batch * nkv))
    splits = max(1, min(splits, _MAX_SPLITS, max(1, chunks // _MIN_CHUNKS_PER_SPLIT)))
    num_warps = 4 if block_g * block_d <= 64 * 128 else 8
    return {"BLOCK_N": block_n, "BLOCK_D": block_d, "BLOCK_G": block_g, "num_splits": splits,
            "num_warps": num_warps, "num_stages": 2}


# ----------------------------------------------------------------------------------------------
# Kernels. Plain functions, jitted below when Triton is importable: compiled, or interpreted when
# TRITON_INTERPRET=1 was set before triton was imported (Triton decides at decoration time).
# ----------------------------------------------------------------------------------------------

def _attend_chunk(q, m_i, l_i, acc, n0, lo, my_hi, K, V, Table, Mask, ks, ko, vs, vo, b64, hk,
                  qk_scale, block_size,
                  stride_kb, stride_kh, stride_ks, stride_kd,
                  stride_vb, stride_vh, stride_vs, stride_vd,
                  stride_tb, stride_mb, stride_ms,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                  PAGED: tl.constexpr, BLOCK_ALIGNED: tl.constexpr, CHECK_LO: tl.constexpr,
                  HAS_MASK: tl.constexpr, HAS_KS: tl.constexpr, HAS_KO: tl.constexpr,
                  HAS_VS: tl.constexpr, HAS_VO: tl.constexpr, DOT_F32: tl.constexpr,
                  PRECISION: tl.constexpr):
    """One BLOCK_N chunk ``[max(n0, lo), min(n0 + BLOCK_N, my_hi))`` of the online softmax, all
    G heads (``n0`` is a multiple of BLOCK_N; positions below ``lo`` are checked only when
    CHECK_LO says the window may start inside a chunk)."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    pos = n0 + offs_n
    n_ok = pos < my_hi
    if CHECK_LO:
        n_ok = n_ok & (pos >= lo)
    if PAGED and BLOCK_ALIGNED:  # the chunk lies in one block: one block id, contiguous slots
        blk = tl.load(Table + b64 * stride_tb + n0 // block_size).to(tl.int64)
        k_base = blk * stride_kb + pos * 0
        v_base = blk * stride_vb + pos * 0
        slot = n0 % block_size + offs_n
    elif PAGED:  # a gather by position through the block table
        blk = tl.load(Table + b64 * stride_tb + pos // block_size, mask=n_ok, other=0)
        k_base = blk.to(tl.int64) * stride_kb
        v_base = blk.to(tl.int64) * stride_vb
        slot = pos % block_size
    else:
        k_base = b64 * stride_kb + pos * 0
        v_base = b64 * stride_vb + pos * 0
        slot = pos
    keep = n_ok
    if HAS_MASK:
        mk = tl.load(Mask + b64 * stride_mb + pos * stride_ms, mask=n_ok, other=1)
        keep = keep & (mk == 0)
    # masked positions are never loaded (other=0): NaN/inf stored there cannot reach the max of
    # the scores nor acc (0 * NaN = NaN)
    kv_ok = keep[:, None] & d_ok[None, :]

    k = tl.load(K + (k_base + hk * stride_kh + slot * stride_ks)[:, None]
                + offs_d[None, :] * stride_kd, mask=kv_ok, other=0)
    if HAS_KS or HAS_KO:  # int8 antiquant in registers: (k + offset) * scale, float32
        kf = k.to(tl.float32)
        if HAS_KO:
            kf = kf + ko[None, :]
        if HAS_KS:
            kf = kf * ks[None, :]
        k = tl.where(kv_ok, kf, 0.0)
    if DOT_F32:
        k = k.to(tl.float32)
    else:
        k = k.to(q.dtype)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [BLOCK_G, BLOCK_N], log2
    s = tl.where(keep[None, :], s, float("-inf"))

    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # all masked so far: no NaN
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)

    v = tl.load(V + (v_base + hk * stride_vh + slot * stride_vs)[:, None]
                + offs_d[None, :] * stride_vd, mask=kv_ok, other=0)
    if HAS_VS or HAS_VO:
        vf = v.to(tl.float32)
        if HAS_VO:
            vf = vf + vo[None, :]
        if HAS_VS:
            vf = vf * vs[None, :]
        v = tl.where(kv_ok, vf, 0.0)
    if DOT_F32:
        v = v.to(tl.float32)
        pv = p
    else:
        v = v.to(q.dtype)
        pv = p.to(q.dtype)
    acc = acc * alpha[:, None] + tl.dot(pv, v, input_precision=PRECISION)
    return m_new, l_i, acc


def _split_kv_kernel(
        Q, K, V, Lengths, Start, Table, Mask, KScale, KOffset, VScale, VOffset,
        MOut, LOut, AccOut,
        qk_scale, seq_len, block_size,
        stride_qb, stride_qh, stride_qd,
        stride_kb, stride_kh, stride_ks, stride_kd,
        stride_vb, stride_vh, stride_vs, stride_vd,
        stride_tb, stride_mb, stride_ms,
        stride_ab, stride_ah, stride_as,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
        BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
        HAS_START: tl.constexpr, PAGED: tl.constexpr, BLOCK_ALIGNED: tl.constexpr,
        HAS_MASK: tl.constexpr,
        HAS_KS: tl.constexpr, HAS_KO: tl.constexpr, HAS_VS: tl.constexpr, HAS_VO: tl.constexpr,
        DOT_F32: tl.constexpr, PRECISION: tl.constexpr, WHILE_LOOP: tl.constexpr):
    b = tl.program_id(0)
    hk = tl.program_id(1)
    split = tl.program_id(2)
    b64 = b.to(tl.int64)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    g_ok = offs_g < GROUP
    d_ok = offs_d < HEAD_DIM
    heads = hk * GROUP + offs_g  # the query heads of this kv head, packed as one tile

    # The attended window [lo, hi) clamped to [0, S), split evenly over NUM_SPLITS programs
    # (device values: the grid is static, the work per program follows lengths). The splits
    # start at a multiple of BLOCK_N at or below lo, so every chunk is BLOCK_N-aligned (and
    # lies in one cache block when BLOCK_N divides block_size).
    length = tl.load(Lengths + b).to(tl.int64)
    if HAS_START:
        start = tl.load(Start + b).to(tl.int64)
    else:
        start = length * 0
    lo = tl.maximum(start, 0)
    hi = tl.minimum(start + length, seq_len)
    hi = tl.maximum(hi, lo)
    lo_aligned = lo // BLOCK_N * BLOCK_N
    per_split = (hi - lo_aligned + NUM_SPLITS - 1) // NUM_SPLITS
    per_split = (per_split + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    my_lo = lo_aligned + split * per_split
    my_hi = tl.minimum(my_lo + per_split, hi)

    q = tl.load(Q + b64 * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=g_ok[:, None] & d_ok[None, :], other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)
    one = tl.full([BLOCK_D], 1.0, tl.float32)  # stand-ins for absent antiquant parameters
    ks = one
    ko = one
    vs = one
    vo = one
    if HAS_KS:
        ks = tl.load(KScale + hk * HEAD_DIM + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    if HAS_KO:
        ko = tl.load(KOffset + hk * HEAD_DIM + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    if HAS_VS:
        vs = tl.load(VScale + hk * HEAD_DIM + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    if HAS_VO:
        vo = tl.load(VOffset + hk * HEAD_DIM + offs_d, mask=d_ok, other=0.0).to(tl.float32)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_G], 0.0, tl.float32)
    acc = tl.full([BLOCK_G, BLOCK_D], 0.0, tl.float32)
    if WHILE_LOOP:
        # Interpreter: ``range`` over a scalar tensor fails with numpy >= 2.4 (scalars are
        # 1-element arrays there; triton issue #9171); ``while`` only needs bool().
        n0 = my_lo
        while n0 < my_hi:
            m_i, l_i, acc = _attend_chunk(
                q, m_i, l_i, acc, n0, lo, my_hi, K, V, Table, Mask, ks, ko, vs, vo, b64, hk,
                qk_scale, block_size, stride_kb, stride_kh, stride_ks, stride_kd,
                stride_vb, stride_vh, stride_vs, stride_vd, stride_tb, stride_mb, stride_ms,
                HEAD_DIM, BLOCK_D, BLOCK_N, PAGED, BLOCK_ALIGNED, HAS_START, HAS_MASK, HAS_KS,
                HAS_KO, HAS_VS, HAS_VO, DOT_F32, PRECISION)
            n0 += BLOCK_N
    else:  # compiled: an scf.for the software pipeliner can overlap loads with compute
        for n0 in range(my_lo, my_hi, BLOCK_N):
            m_i, l_i, acc = _attend_chunk(
                q, m_i, l_i, acc, n0, lo, my_hi, K, V, Table, Mask, ks, ko, vs, vo, b64, hk,
                qk_scale, block_size, stride_kb, stride_kh, stride_ks, stride_kd,
                stride_vb, stride_vh, stride_vs, stride_vd, stride_tb, stride_mb, stride_ms,
                HEAD_DIM, BLOCK_D, BLOCK_N, PAGED, BLOCK_ALIGNED, HAS_START, HAS_MASK, HAS_KS,
                HAS_KO, HAS_VS, HAS_VO, DOT_F32, PRECISION)

    row = b64 * stride_ab + heads.to(tl.int64) * stride_ah + split * stride_as
    tl.store(MOut + row, m_i, mask=g_ok)
    tl.store(LOut + row, l_i, mask=g_ok)
    tl.store(AccOut + (row * BLOCK_D)[:, None] + offs_d[None, :], acc, mask=g_ok[:, None])


def _merge_splits_kernel(
        MIn, LIn, AccIn, Out,
        stride_ob, stride_oh, stride_od,
        stride_ab, stride_ah, stride_as,
        HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
        BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = offs_s < NUM_SPLITS
    row = b * stride_ab + h * stride_ah + offs_s * stride_as
    m = tl.load(MIn + row, mask=s_ok, other=float("-inf"))
    lsum = tl.load(LIn + row, mask=s_ok, other=0.0)
    acc = tl.load(AccIn + (row * BLOCK_D)[:, None] + offs_d[None, :], mask=s_ok[:, None],
                  other=0.0)
    m_max = tl.max(m, 0)
    m_use = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp2(m - m_use)
    total = tl.sum(lsum * w, 0)
    num = tl.sum(acc * w[:, None], 0)
    denom = tl.where(total > 0, total, 1.0)
    out = tl.where(total > 0, num / denom, 0.0)
    tl.store(Out + b * stride_ob + h * stride_oh + offs_d * stride_od,
             out.to(Out.dtype.element_ty), mask=offs_d < HEAD_DIM)


if HAS_TRITON:
    _attend_chunk = triton.jit(_attend_chunk)
    _split_kv_kernel = triton.jit(_split_kv_kernel)
    _merge_splits_kernel = triton.jit(_merge_splits_kernel)


def _per_channel(t: torch.Tensor | None, nkv: int, dim: int) -> torch.Tensor | None:
    if t is None:
        return None
    return t.reshape(nkv, dim).float().contiguous()


def decode_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *,
                            lengths: torch.Tensor, scale: float,
                            kv_start: torch.Tensor | None = None,
                            block_table: torch.Tensor | None = None,
                            mask: torch.Tensor | None = None,
                            k_scale: torch.Tensor | None = None,
                            k_offset: torch.Tensor | None = None,
                            v_scale: torch.Tensor | None = None,
                            v_offset: torch.Tensor | None = None,
                            num_splits: int | None = None,
                            block_n: int | None = None) -> torch.Tensor:
    """Canonical decode attention (see :mod:`torchair.ops.attention.decode`) with Triton split-KV
    kernels.

    ``num_splits`` / ``block_n`` override the static heuristics (``choose_launch``; tests).
    Never reads tensor values on the host: capturable in a CUDA graph.
    """
    batch, heads, dim = q.shape
    nkv = k_cache.shape[1]
    if heads % nkv:
        raise ValueError(f"q heads {heads} not divisible by kv heads {nkv}")
    group = heads // nkv
    if block_table is not None:
        block_size = k_cache.shape[2]
        seq = block_table.shape[1] * block_size
    else:
        block_size = 1
        seq = k_cache.shape[2]
    device = q.device
    if block_table is not None:  # the ids of the columns a window reads (no host read in capture)
        start = kv_start.long() if kv_start is not None else torch.zeros_like(lengths.long())
        lo = start.clamp(0, seq)
        _device_checks.check_block_ids(block_table, lo, (start + lengths.long()).clamp(0, seq),
                                       block_size, k_cache.shape[0])
    interpret = launch_mode(device, "decode_attention_triton")
    cfg = choose_launch(batch, nkv, group, seq, dim, sm_count(device))
    if block_n is not None:
        cfg["BLOCK_N"] = max(_MIN_DOT, next_pow2(block_n))
    splits = int(num_splits) if num_splits is not None else cfg["num_splits"]
    splits = max(1, splits)
    block_d, block_g = cfg["BLOCK_D"], cfg["BLOCK_G"]

    out = torch.empty(batch, heads, dim, dtype=q.dtype, device=device)
    m_part = torch.empty(batch, heads, splits, dtype=torch.float32, device=device)
    l_part = torch.empty_like(m_part)
    acc_part = torch.empty(batch, heads, splits, block_d, dtype=torch.float32, device=device)
    if batch == 0 or heads == 0:
        return out

    lengths_d = lengths.to(device)
    start_d = kv_start.to(device) if kv_start is not None else lengths_d  # dummy when absent
    table = block_table if block_table is not None else lengths_d
    if mask is not None:
        mask_d = (mask if mask.dtype == torch.bool else mask != 0).view(torch.uint8)
        stride_mb, stride_ms = mask_d.stride(0), mask_d.stride(1)
    else:
        mask_d, stride_mb, stride_ms = lengths_d, 0, 0
    ks = _per_channel(k_scale, nkv, dim)
    ko = _per_channel(k_offset, nkv, dim)
    vs = _per_channel(v_scale, nkv, dim)
    vo = _per_channel(v_offset, nkv, dim)
    dummy = m_part
    kv_f32 = torch.float32 in (k_cache.dtype, v_cache.dtype)
    # Matmul operand dtype: q's fp16 / bf16 on tensor cores; float32 ("ieee") for float32 inputs,
    # and for bf16 in the interpreter (its tl.dot mishandles bf16: numpy has no bfloat16).
    dot_f32 = (q.dtype not in (torch.float16, torch.bfloat16) or kv_f32
               or (interpret and q.dtype == torch.bfloat16))

    launch = {} if interpret else {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}
    _split_kv_kernel[(batch, nkv, splits)](
        q, k_cache, v_cache, lengths_d, start_d, table, mask_d,
        ks if ks is not None else dummy, ko if ko is not None else dummy,
        vs if vs is not None else dummy, vo if vo is not None else dummy,
        m_part, l_part, acc_part,
        float(scale) * 1.4426950408889634, seq, block_size,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_cache.stride(3),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), v_cache.stride(3),
        table.stride(0) if block_table is not None else 0, stride_mb, stride_ms,
        m_part.stride(0), m_part.stride(1), m_part.stride(2),
        GROUP=group, HEAD_DIM=dim, NUM_SPLITS=splits,
        BLOCK_G=block_g, BLOCK_D=block_d, BLOCK_N=cfg["BLOCK_N"],
        HAS_START=kv_start is not None, PAGED=block_table is not None,
        BLOCK_ALIGNED=block_table is not None and block_size % cfg["BLOCK_N"] == 0,
        HAS_MASK=mask is not None,
        HAS_KS=ks is not None, HAS_KO=ko is not None, HAS_VS=vs is not None,
        HAS_VO=vo is not None, DOT_F32=dot_f32, PRECISION="ieee" if dot_f32 else "tf32",
        WHILE_LOOP=interpret,
        **launch)
    _merge_splits_kernel[(batch, heads)](
        m_part, l_part, acc_part, out,
        out.stride(0), out.stride(1), out.stride(2),
        m_part.stride(0), m_part.stride(1), m_part.stride(2),
        HEAD_DIM=dim, NUM_SPLITS=splits, BLOCK_S=max(2, next_pow2(splits)), BLOCK_D=block_d,
        **({} if interpret else {"num_warps": 4}))
    return out


if HAS_TRITON:
    register_decode_kernel("cuda")(decode_attention_triton)
