"""Device-side pieces of ``npu_incre_flash_attention``: KV gathering, windows, quantization.

Nothing here reads a tensor value on the host or makes a shape depend on one, so every function
may run inside a CUDA graph capture. Shapes follow the canonical ``BNSD`` form of
:mod:`torchair.ops.attention.common`.
"""
from __future__ import annotations

import torch

from torchair.ops import _device_checks
from torchair.ops.attention import common as _common
from torchair.ops.attention.decode import decode_attention
from torchair.ops.attention.ifa_checks import OP, IfaPlan


def checked_block_table(block_table: torch.Tensor, num_blocks: int, plan: IfaPlan
                        ) -> torch.Tensor:
    """``block_table`` after checking every id a sequence reads, then clamped for gathers.

    The columns of each window (:func:`kv_window`) must hold ids in ``[0, num_blocks)``, else a
    ``ValueError`` names ``block_table[b, c]`` (:func:`torchair.ops._device_checks.check_block_ids`:
    read on the host for CPU tensors and outside a CUDA graph capture; a device flag inside one).
    Other columns may hold anything (-1, stale ids): only those are changed by the clamp, and their
    positions are masked.
    """
    window = kv_window(plan)
    if window is None:  # no lengths: every position of every column is read
        lo = torch.zeros(1, dtype=torch.int64, device=block_table.device)
        hi = torch.full_like(lo, plan.dims.kv_len)
    else:
        lo, hi = window
    block_size = plan.dims.kv_len // max(block_table.shape[1], 1)
    _device_checks.check_block_ids(block_table, lo, hi, block_size, num_blocks, op=OP)
    return block_table.clamp(0, max(num_blocks - 1, 0))


def dense_kv(cache: torch.Tensor, plan: IfaPlan, block_table: torch.Tensor | None
             ) -> torch.Tensor:
    """The logical KV ``[B, N_kv, S_kv, D]`` (paged blocks gathered), in the cache's dtype."""
    dims = plan.dims
    if not plan.paged:
        return _common.to_bnsd(cache, plan.layout, dims.num_kv_heads)
    batch = block_table.shape[0]
    blocks = cache[checked_block_table(block_table, cache.shape[0], plan).long()]
    if plan.cache_4d:  # [B, MB, N_kv, bs, D]
        blocks = blocks.permute(0, 2, 1, 3, 4)
        return blocks.reshape(batch, dims.num_kv_heads, dims.kv_len, dims.head_dim)
    # [B, MB, bs, H] -> [B, S_kv, N_kv, D] -> [B, N_kv, S_kv, D]
    return blocks.reshape(batch, dims.kv_len, dims.num_kv_heads, dims.head_dim).transpose(1, 2)


def antiquant_channels(t: torch.Tensor | None, index: int, plan: IfaPlan) -> torch.Tensor | None:
    """Row ``index`` (0 key, 1 value) of an antiquant scale/offset as float32 ``[N_kv, D]``."""
    if t is None:
        return None
    return t[index].reshape(plan.dims.num_kv_heads, plan.dims.head_dim).float()


def dequantize(kv: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
    """``(kv + offset) * scale`` per channel in float32; ``kv`` is ``[B, N_kv, S, D]`` int8."""
    out = kv.float()
    if offset is not None:
        out = out + offset[None, :, None, :]
    return out * scale[None, :, None, :]


def kv_window(plan: IfaPlan) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Per batch ``(start, end)`` int64 of the attended KV rows, or None when all rows count.

    Right padding: ``[0, min(len, S))``. Left padding: ``end = S - max(pad, 0)``,
    ``start = end - len``; a window with ``start < 0`` (or ``end < 0``) is empty (zeros out).
    Shapes ``[B]`` or ``[1]`` (a single length and padding broadcast over the batch).
    """
    lengths, s_kv = plan.lengths, plan.dims.kv_len
    if lengths is None:
        return None
    if plan.kv_padding is None:
        end = lengths.clamp(0, s_kv)
        return torch.zeros_like(end), end
    end = s_kv - plan.kv_padding.clamp_min(0)
    start = end - lengths.clamp_min(0)
    valid = start >= 0  # end >= start, so end < 0 implies start < 0
    return torch.where(valid, start, 0), torch.where(valid, end, 0)


def window_mask(plan: IfaPlan) -> torch.Tensor | None:
    """``[B or 1, 1, 1, S_kv]`` bool, True outside the window of :func:`kv_window`."""
    window = kv_window(plan)
    if window is None:
        return None
    start, end = window
    pos = torch.arange(plan.dims.kv_len, device=start.device)
    outside = (pos[None, :] < start[:, None]) | (pos[None, :] >= end[:, None])
    return outside.view(-1, 1, 1, plan.dims.kv_len)


def quantize_output(out: torch.Tensor, quant_scale2: torch.Tensor,
                    quant_offset2: torch.Tensor | None, plan: IfaPlan) -> torch.Tensor:
    """``clamp(round_half_even(out * quant_scale2 + quant_offset2), -128, 127)`` as int8.

    ``out`` is ``[B, N, S_q, D]``; scale/offset are per tensor (1 element) or per channel
    (``N * D`` elements, channel ``n * D + d``, i.e. the H index of BSH).
    """
    def channels(t: torch.Tensor) -> torch.Tensor:
        t = t.float().reshape(-1)
        if t.numel() == 1:
            return t.view(1, 1, 1, 1)
        return t.view(1, plan.dims.num_heads, 1, plan.dims.head_dim)

    y = out.float() * channels(quant_scale2)
    if quant_offset2 is not None:
        y = y + channels(quant_offset2)
    return torch.round(y).clamp(-128, 127).to(torch.int8)


def decode_eligible(plan: IfaPlan, pse_shift: torch.Tensor | None) -> bool:
    """Whether the call maps onto canonical :func:`decode_attention` (S_q 1, no pse, [B,S] mask)."""
    dims = plan.dims
    mask_ok = plan.mask is None or (plan.mask.shape[1] == 1 and plan.mask.shape[2] == 1)
    return dims.q_len == 1 and dims.kv_len > 0 and pse_shift is None and mask_ok


def canonical_cache(cache: torch.Tensor, plan: IfaPlan) -> torch.Tensor:
    """The cache in the canonical decode form, as a strided view (never a copy: the decode
    kernels address K/V through strides).

    Dense: ``[B, N_kv, S, D]`` (BNSD as is; BSH/BSND viewed with heads and positions swapped).
    Paged: ``[num_blocks, N_kv, block_size, D]``; a (blocknum, blocksize, H) cache viewed so.
    """
    dims = plan.dims
    if not plan.paged:
        return _common.to_bnsd(cache, plan.layout, dims.num_kv_heads)
    if plan.cache_4d:
        return cache
    num_blocks, block_size, _ = cache.shape
    return cache.view(num_blocks, block_size, dims.num_kv_heads, dims.head_dim).permute(0, 2, 1, 3)


def decode_path(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, plan: IfaPlan, *,
                block_table, antiquant_scale, antiquant_offset, scale_value: float
                ) -> torch.Tensor:
    """Attention through :func:`decode_attention`; ``[B, N, 1, D]`` in the query's dtype."""
    dims = plan.dims
    batch, s_kv = dims.batch, dims.kv_len
    q = _common.to_bnsd(query, plan.layout, dims.num_heads)[:, :, 0].contiguous()
    window = kv_window(plan)
    if window is None:
        start = torch.zeros(batch, dtype=torch.int64, device=query.device)
        lengths = torch.full((batch,), s_kv, dtype=torch.int64, device=query.device)
    else:
        start = window[0].expand(batch).contiguous()
        lengths = (window[1] - window[0]).expand(batch).contiguous()
    mask = None
    if plan.mask is not None:
        mask = plan.mask.reshape(plan.mask.shape[0], s_kv).expand(batch, s_kv).contiguous()
    table = None
    if block_table is not None:
        table = checked_block_table(block_table, key.shape[0], plan).contiguous()
    out = decode_attention(
        q, canonical_cache(key, plan), canonical_cache(value, plan), lengths=lengths,
        scale=float(scale_value), kv_start=start if plan.kv_padding is not None else None,
        block_table=table, mask=mask,
        k_scale=antiquant_channels(antiquant_scale, 0, plan),
        k_offset=antiquant_channels(antiquant_offset, 0, plan),
        v_scale=antiquant_channels(antiquant_scale, 1, plan),
        v_offset=antiquant_channels(antiquant_offset, 1, plan))
    return out.unsqueeze(2)
