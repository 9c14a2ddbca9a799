"""Decode attention in canonical form: the interface every fast decode kernel implements.

One query token per sequence attends to its valid KV positions::

    q            [B, N, D]            float16 / bfloat16 / float32
    k_cache,     dense [B, Nkv, S, D] (block_table None), or paged
    v_cache      [num_blocks, Nkv, block_size, D] with block_table [B, max_blocks] int32: position p
                 of sequence b lives in block block_table[b, p // block_size], slot p % block_size;
                 the logical length is S = max_blocks * block_size. dtype: q's, or int8 with
                 per-channel antiquant (k = (k_int8 + k_offset) * k_scale, scales [Nkv, D]); any
                 strides: a BSH cache comes as a transposed view, never a copy
    lengths      int64 [B] on q's device: how many positions are attended
    kv_start     int64 [B] or None: first attended position (KV left padding); default 0
    mask         bool [B, S] or None: True = masked out
    scale        float: multiplies q.k

Query head h reads kv head h // (N // Nkv) (GQA). Softmax and accumulation in float32; a row
with nothing attended gives zeros. Output [B, N, D] in q's dtype.

``decode_attention_reference`` is the oracle (plain PyTorch, float32, dense); it never reads
tensor values on the host, so it may run inside a CUDA graph capture. ``decode_attention``
dispatches to the fastest kernel registered for the device (``register_decode_kernel``;
``registered_decode_kernel`` says which, if any).
"""
from __future__ import annotations

from typing import Callable

import torch

from torchair.ops import _device_checks

_kernels: dict[str, Callable] = {}


def register_decode_kernel(device_type: str) -> Callable[[Callable], Callable]:
    """Register ``fn`` as the decode kernel of ``device_type`` ("cpu", "cuda"); once per device."""
    def wrap(fn: Callable) -> Callable:
        if device_type in _kernels:
            raise RuntimeError(f"a decode kernel for {device_type!r} is already registered")
        _kernels[device_type] = fn
        return fn

    return wrap


def registered_decode_kernel(device_type: str) -> Callable | None:
    """The decode kernel registered for ``device_type`` ("cpu", "cuda"), or None: then
    :func:`decode_attention` runs the reference there."""
    return _kernels.get(device_type)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *,
                     lengths: torch.Tensor, scale: float, kv_start: torch.Tensor | None = None,
                     block_table: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                     k_scale: torch.Tensor | None = None, k_offset: torch.Tensor | None = None,
                     v_scale: torch.Tensor | None = None, v_offset: torch.Tensor | None = None
                     ) -> torch.Tensor:
    """Canonical decode attention on the fastest kernel for ``q``'s device (see module doc)."""
    kernel = _kernels.get(q.device.type, decode_attention_reference)
    return kernel(q, k_cache, v_cache, lengths=lengths, scale=scale, kv_start=kv_start,
                  block_table=block_table, mask=mask, k_scale=k_scale, k_offset=k_offset,
                  v_scale=v_scale, v_offset=v_offset)


def dense_kv(cache: torch.Tensor, block_table: torch.Tensor | None,
             scale: torch.Tensor | None, offset: torch.Tensor | None) -> torch.Tensor:
    """The logical float32 KV of every sequence, [B, Nkv, S, D]: paged blocks gathered, int8
    dequantized. Block ids are clamped into the cache for the gather: the caller has checked the
    ids of the columns its windows read (:func:`torchair.ops._device_checks.check_block_ids`),
    so only unused columns (any value, e.g. -1) are clamped, and their positions are masked."""
    if block_table is not None:
        batch, max_blocks = block_table.shape
        ids = block_table.long().clamp(0, max(cache.shape[0] - 1, 0))
        blocks = cache[ids.reshape(-1)]  # [B * max_blocks, Nkv, bs, D]
        _, nkv, block_size, dim = blocks.shape
        cache = blocks.reshape(batch, max_blocks, nkv, block_size, dim).permute(0, 2, 1, 3, 4)
        cache = cache.reshape(batch, nkv, max_blocks * block_size, dim)
    out = cache.float()
    if offset is not None:
        out = out + offset.float()[None, :, None, :]
    if scale is not None:
        out = out * scale.float()[None, :, None, :]
    return out


def decode_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *,
                               lengths: torch.Tensor, scale: float,
                               kv_start: torch.Tensor | None = None,
                               block_table: torch.Tensor | None = None,
                               mask: torch.Tensor | None = None,
                               k_scale: torch.Tensor | None = None,
                               k_offset: torch.Tensor | None = None,
                               v_scale: torch.Tensor | None = None,
                               v_offset: torch.Tensor | None = None) -> torch.Tensor:
    """The oracle of :func:`decode_attention` (see module doc).

    Masked positions are never read into the result: their scores are replaced (so a NaN/inf K
    never reaches the max) and their V rows are replaced by zeros before the weighted sum.
    """
    start = kv_start.long() if kv_start is not None else torch.zeros_like(lengths)
    if block_table is not None:
        seq = block_table.shape[1] * k_cache.shape[2]
        lo = start.clamp(0, seq)
        _device_checks.check_block_ids(block_table, lo, (start + lengths.long()).clamp(0, seq),
                                       k_cache.shape[2], k_cache.shape[0])
    k = dense_kv(k_cache, block_table, k_scale, k_offset)
    v = dense_kv(v_cache, block_table, v_scale, v_offset)
    batch, heads, dim = q.shape
    nkv, kv_len = k.shape[1], k.shape[2]
    group = heads // nkv
    qf = q.float().reshape(batch, nkv, group, dim)
    scores = torch.einsum("bhgd,bhsd->bhgs", qf, k) * scale  # [B, Nkv, G, S]
    positions = torch.arange(kv_len, device=q.device)
    keep = (positions[None, :] >= start[:, None]) & \
        (positions[None, :] < (start + lengths.long())[:, None])  # [B, S]
    if mask is not None:
        keep = keep & ~mask.bool()
    scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
    peak = scores.amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).min)
    weights = torch.exp(scores - peak)
    total = weights.sum(-1, keepdim=True)
    v = v.masked_fill(~keep[:, None, :, None], 0.0)  # 0 * NaN would be NaN
    out = torch.einsum("bhgs,bhsd->bhgd", weights, v) / total.clamp_min(1e-30)
    return out.reshape(batch, heads, dim).to(q.dtype)
