"""The CPU decode attention kernel: flash-decoding over KV chunks.

Same contract as :func:`torchair.ops.attention.decode.decode_attention_reference` (see
``torchair.ops.attention.decode``'s module doc); registered as the ``"cpu"`` kernel of
:func:`torchair.ops.attention.decode.decode_attention`.

Two implementations behind one entry point, the same preparation (windows read on the host,
block ids checked, q in float32 with int8 antiquant folded in) and the same epilogue (V antiquant,
empty rows as zeros):

* the native C kernel (``_decode_native``, register tiles, K/V read once and converted in
  registers, threads over (row, split) work items), used whenever it takes the arguments; it is
  built on first use with the host C compiler (``torchair.ops.toolchain.native``);
* the BLAS path below, for everything else (no compiler, head dim not a multiple of 16, ...).

How the BLAS path runs (one call):

* The lengths / starts are read on the host (a CPU kernel never runs inside a CUDA graph) to find
  the window ``[lo, hi)`` of positions any sequence attends; the rest of the cache is never read.
  Positions of that window a row does not attend (its own window, the mask) get ``-inf`` scores
  and zero V rows, so NaN/inf stored there never reaches the result.
* The window is walked in chunks of ``C`` positions (a Python loop over chunks only; batch and
  heads are batch dimensions of every op). Per chunk, for all ``B * Nkv`` (batch, kv head) pairs
  at once: ``scores = K_chunk @ q^T`` (``torch.bmm``: ``q`` is viewed as ``[B * Nkv, G, D]``,
  so each kv head is read once for its ``G`` query heads), masking, an online softmax update
  (running max / sum in float32) and ``acc += P^T @ V_chunk`` (``baddbmm_``).
* float32 contiguous caches are used in place (views, no copy). fp16/bf16/int8 chunks are
  converted into a reused float32 buffer of one chunk; int8 antiquant is folded into the query
  (``q . ((k + o) * s) = (q * s) . k + (q * s) . o``) and into the output
  (``sum p (v + o) * s / sum p = (acc / l + o) * s``), so the chunk is only converted.
* Paged caches: only the blocks of the window are gathered, one chunk of whole blocks at a
  time, into ``[Nkv, B, C, D]`` (kv-head-major batch order, one gather copy per chunk).

``CHUNK_SIZE`` (None: automatic, ~``_CHUNK_BYTES`` of float32 K per chunk when read in place,
~``_CONVERT_CHUNK_BYTES`` per float32 buffer when converted) fixes the number of positions per
chunk; tests set it small to cross chunk boundaries.
"""
from __future__ import annotations

import torch

from torchair.ops import _device_checks
from torchair.ops.attention.cpu import native as _decode_native
from torchair.ops.attention.decode import register_decode_kernel

CHUNK_SIZE: int | None = None
# Automatic chunk: float32 K of one chunk (all rows) ~_CHUNK_BYTES when the cache is read in place;
# ~_CONVERT_CHUNK_BYTES per float32 conversion buffer when chunks are converted, so that the
# converted K and V chunks stay in cache (L3) until both matmuls have read them (measured on a
# 2-core Zen 5, B=8 bf16 32k: 4 MiB buffers 1.5x (1 thread) to 1.7x (2 threads) faster than
# 16 MiB ones).
_CHUNK_BYTES = 16 * 2**20
_CONVERT_CHUNK_BYTES = 4 * 2**20
_MIN_CHUNK, _MIN_CONVERT_CHUNK, _MAX_CHUNK = 256, 64, 8192
_NEG_BIG = torch.finfo(torch.float32).min


def _chunk_positions(rows: int, dim: int, block_size: int, converted: bool = False) -> int:
    if CHUNK_SIZE is not None:
        chunk = int(CHUNK_SIZE)
    else:
        target, low = ((_CONVERT_CHUNK_BYTES, _MIN_CONVERT_CHUNK) if converted
                       else (_CHUNK_BYTES, _MIN_CHUNK))
        chunk = target // max(1, rows * dim * 4)
        chunk = max(low, min(_MAX_CHUNK, chunk))
    return max(block_size, chunk // block_size * block_size)  # whole blocks when paged


@register_decode_kernel("cpu")
def decode_attention_cpu(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *,
                         lengths: torch.Tensor, scale: float,
                         kv_start: torch.Tensor | None = None,
                         block_table: torch.Tensor | None = None,
                         mask: torch.Tensor | None = None,
                         k_scale: torch.Tensor | None = None,
                         k_offset: torch.Tensor | None = None,
                         v_scale: torch.Tensor | None = None,
                         v_offset: torch.Tensor | None = None) -> torch.Tensor:
    """Canonical decode attention on CPU (see the module doc and
    ``torchair.ops.attention.decode``)."""
    batch, heads, dim = q.shape
    nkv = k_cache.shape[1]
    group = heads // nkv
    paged = block_table is not None
    if paged:
        block_size = k_cache.shape[2]
        seq = block_table.shape[1] * block_size
    else:
        block_size = 1
        seq = k_cache.shape[2]

    # Host view of the attended windows: [start_b, end_b) clipped to [0, S).
    lens = lengths.detach().to("cpu", torch.long)
    starts = kv_start.detach().to("cpu", torch.long) if kv_start is not None \
        else torch.zeros_like(lens)
    lo_b = starts.clamp(0, seq)
    hi_b = (starts + lens).clamp(0, seq)
    if not bool((hi_b > lo_b).any()):
        return torch.zeros(batch, heads, dim, dtype=q.dtype)
    mask_b = mask.detach().to("cpu").bool() if mask is not None else None
    if paged:
        _device_checks.check_block_ids(block_table.detach().to("cpu"), lo_b, hi_b, block_size,
                                       k_cache.shape[0])

    # native kernel when it takes these arguments: rows b-major; else BLAS (paged rows h-major)
    h_major = False
    qf, score_bias = _query_rows(q, nkv, k_scale, k_offset, h_major)
    q_bf16 = q.dtype == torch.bfloat16 and k_scale is None  # qf holds bf16 values exactly
    result = _decode_native.decode(qf, score_bias, scale, k_cache, v_cache, block_table, lo_b,
                                   hi_b, mask_b, q_bf16=q_bf16)
    if result is None:
        h_major = paged
        if h_major:
            qf, score_bias = _query_rows(q, nkv, k_scale, k_offset, h_major)
        result = _blas_decode(qf * scale, None if score_bias is None else score_bias * scale,
                              k_cache, v_cache, block_table, lo_b, hi_b, mask_b)
    out, l_sum = result  # [rows, G, D] normalized, [rows, G] softmax sums (0: nothing attended)
    if v_offset is not None or v_scale is not None:
        if v_offset is not None:
            out = out + _per_row(v_offset, batch, h_major)[:, None, :]
        if v_scale is not None:
            out = out * _per_row(v_scale, batch, h_major)[:, None, :]
        out = out.masked_fill((l_sum == 0)[:, :, None], 0.0)  # nothing attended: zeros
    if h_major:
        out = out.reshape(nkv, batch, group, dim).transpose(0, 1)
    return out.reshape(batch, heads, dim).to(q.dtype)


def _query_rows(q: torch.Tensor, nkv: int, k_scale: torch.Tensor | None,
                k_offset: torch.Tensor | None, h_major: bool
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q as float32 ``[rows, G, D]`` (int8 K: times ``k_scale``; not yet times the softmax
    scale), rows b-major or, with ``h_major``, kv-head-major; and the score bias
    ``(q * s) . k_offset`` ``[rows, G, 1]``."""
    batch, heads, dim = q.shape
    qf = q.detach().float().reshape(batch, nkv, heads // nkv, dim)
    if k_scale is not None:
        qf = qf * k_scale.float()[None, :, None, :]
    if h_major:
        qf = qf.transpose(0, 1)
    qf = qf.reshape(batch * nkv, heads // nkv, dim).contiguous()
    if k_offset is None:
        return qf, None
    return qf, torch.bmm(qf, _per_row(k_offset, batch, h_major)[:, :, None])


def _blas_decode(qf: torch.Tensor, score_bias: torch.Tensor | None, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, block_table: torch.Tensor | None, lo_b: torch.Tensor,
                 hi_b: torch.Tensor, mask_b: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked BLAS path (module doc); ``qf`` and ``score_bias`` already times the softmax
    scale, rows b-major, or h-major when paged."""
    rows, group, dim = qf.shape
    batch = lo_b.shape[0]
    nkv = rows // batch
    paged = block_table is not None
    block_size = k_cache.shape[2] if paged else 1
    seq = block_table.shape[1] * block_size if paged else k_cache.shape[2]
    nonempty = hi_b > lo_b
    lo = int(lo_b[nonempty].min()) // block_size * block_size
    hi = int(hi_b[nonempty].max())
    full_lo, full_hi = int(lo_b.max()), int(hi_b.min())  # positions every row attends
    convert_k = k_cache.dtype != torch.float32
    convert_v = v_cache.dtype != torch.float32
    chunk = _chunk_positions(rows, dim, block_size, convert_k or convert_v)
    k_buf = torch.empty(rows * chunk * dim, dtype=torch.float32) if convert_k else None
    v_buf = torch.empty(rows * chunk * dim, dtype=torch.float32) if convert_v else None
    if paged:
        k_heads = k_cache.transpose(0, 1)  # [Nkv, num_blocks, bs, D]
        v_heads = v_cache.transpose(0, 1)
        # ids of the windows' columns are checked; other columns may hold anything (-1, stale
        # ids): clamped for the gather, their positions are masked and their V rows zeroed
        table = block_table.detach().to("cpu", torch.long).clamp(0, k_cache.shape[0] - 1)

    m = torch.full((rows, group), float("-inf"))
    m_new = torch.empty(rows, group)  # the running max and its update swap buffers per chunk
    alpha = torch.empty(rows, group)
    part = torch.empty(rows, group)  # per-chunk max, then per-chunk sum
    l_sum = torch.zeros(rows, group)
    acc = torch.zeros(rows, group, dim)
    for c0 in range(lo, hi, chunk):
        c1 = min(c0 + chunk, hi) if not paged else min(c0 + chunk, seq)
        if paged:
            c1 = min(c1, -(-hi // block_size) * block_size)
            ids = table[:, c0 // block_size:c1 // block_size]
            kc = k_heads[:, ids]  # [Nkv, B, nb, bs, D]
            vc = v_heads[:, ids]
        else:
            kc = k_cache[:, :, c0:c1]  # [B, Nkv, C, D] view
            vc = v_cache[:, :, c0:c1]
        width = c1 - c0
        kc = _as_rows(kc, rows, width, dim, k_buf)
        vc = _as_rows(vc, rows, width, dim, v_buf)

        s = torch.bmm(qf, kc.transpose(1, 2))  # [rows, G, C]: softmax along contiguous C
        if score_bias is not None:
            s.add_(score_bias)
        if not (full_lo <= c0 and c1 <= full_hi and mask_b is None):
            pos = torch.arange(c0, c1)[None, :]
            drop = (pos < lo_b[:, None]) | (pos >= hi_b[:, None])  # [B, C]
            if mask_b is not None:
                drop |= mask_b[:, c0:c1]
            # [rows, C] in the chunk's row order
            drop_rows = (drop[None] if paged else drop[:, None]).expand(
                *((nkv, batch) if paged else (batch, nkv)), width).reshape(rows, width)
            s.masked_fill_(drop_rows[:, None, :], float("-inf"))
            # masked V rows must not reach acc (0 * NaN = NaN): zeros, in place in our buffer
            if v_buf is not None:
                vc.masked_fill_(drop_rows[:, :, None], 0.0)
            else:  # a view of the cache: never written
                vc = vc.masked_fill(drop_rows[:, :, None], 0.0)
        # online softmax update, small ops into preallocated buffers (no per-chunk allocation)
        torch.amax(s, 2, out=part)
        torch.maximum(m, part, out=m_new).clamp_min_(_NEG_BIG)
        torch.sub(m, m_new, out=alpha).exp_()
        s.sub_(m_new[:, :, None]).exp_()
        l_sum.mul_(alpha).add_(torch.sum(s, 2, out=part))
        acc.mul_(alpha[:, :, None]).baddbmm_(s, vc)
        m, m_new = m_new, m
    return acc / l_sum.clamp_min(1e-30)[:, :, None], l_sum


def _per_row(t: torch.Tensor, batch: int, paged: bool) -> torch.Tensor:
    """A per-kv-head ``[Nkv, D]`` tensor as float32 ``[rows, D]`` in the chunks' row order."""
    t = t.detach().float()
    return t.repeat_interleave(batch, 0) if paged else t.repeat(batch, 1)


def _as_rows(chunk: torch.Tensor, rows: int, width: int, dim: int,
             buf: torch.Tensor | None) -> torch.Tensor:
    """The chunk ([B, Nkv, C, D] or [Nkv, B, nb, bs, D]) as float32 ``[rows, width, D]``: a view
    when it is float32 with mergeable strides, else one converting copy into ``buf``."""
    if buf is None:
        return chunk.reshape(rows, width, dim)
    out = buf[:rows * width * dim]
    out.view(chunk.shape).copy_(chunk)  # any strides, any source dtype, no temporary
    return out.view(rows, width, dim)
