"""Validation of ``npu_incre_flash_attention`` arguments: every constraint of the torch_npu contract.

:func:`validate` checks shapes, dtypes and argument combinations and returns an :class:`IfaPlan`
that the reference and eager kernels follow. Host lists are checked here (negative lengths,
block_table columns and blocknum versus the lengths); tensor lengths (the twin) are checked for
negative values by :mod:`torchair.ops._device_checks` (no host read inside a CUDA graph capture),
and block ids by :func:`torchair.ops.attention.ifa_compute.checked_block_table` the same way. Every
error is a ``ValueError`` that names the argument, the value received and the rule.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from torchair.ops import _device_checks
from torchair.ops.attention import common as _common

OP = "npu_incre_flash_attention"
LENGTH_DTYPES = (torch.int64, torch.int32)
QUANT2_DTYPES = (torch.float32, torch.bfloat16)
# The full-quantization parameters (int8 query/key/value); that scenario is not supported.
FULL_QUANT_ARGS = ("dequant_scale1", "quant_scale1", "dequant_scale2")


@dataclasses.dataclass(frozen=True)
class IfaPlan:
    """What one call computes, derived from its arguments (sizes are Python ints)."""

    dims: _common.AttentionDims  # kv_len: S of key, or max_blocks * block_size when paged
    layout: str
    paged: bool
    cache_4d: bool  # paged cache laid out (blocknum, numKvHeads, blocksize, headDims)
    kv_int8: bool
    lengths: torch.Tensor | None  # int64 [B] or [1] on the query's device
    kv_padding: torch.Tensor | None  # int64 [B] or [1]; only set when left padding is active
    mask: torch.Tensor | None  # bool, broadcastable to [B, N, S_q, S_kv]


def _err(msg: str) -> ValueError:
    return ValueError(f"{OP}: {msg}")


def check_dtypes(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    """Check q/k/v dtypes; return whether key/value are int8 (antiquant)."""
    if query.dtype == key.dtype == value.dtype == torch.int8:
        raise _err("query, key and value all int8 is not supported (the contract excludes the "
                   "all-int8 scenario); pass a float16/bfloat16 query")
    if not query.dtype.is_floating_point:
        raise _err(f"query dtype {query.dtype} is not supported; expected a floating dtype "
                   f"(float16, bfloat16 or float32)")
    if key.dtype != value.dtype:
        raise _err(f"key dtype {key.dtype} and value dtype {value.dtype} must be equal")
    for name, t in (("key", key), ("value", value)):
        if t.dtype not in (query.dtype, torch.int8):
            raise _err(f"{name} dtype {t.dtype} must equal query dtype {query.dtype} or be int8 "
                       f"(with antiquant_scale)")
    return key.dtype == torch.int8


def check_ranks(query, key, value, layout: str, paged: bool) -> None:
    if not paged:
        _common.check_layout_ranks(OP, query, key, value, layout)
        return
    _common.check_layout_ranks(OP, query, query, query, layout)
    if tuple(key.shape) != tuple(value.shape):
        raise _err(f"key and value must have the same shape; got key {list(key.shape)} and "
                   f"value {list(value.shape)}")
    if key.dim() not in (3, 4):
        raise _err(f"with block_table (page attention) the KV cache must be (blocknum, blocksize, "
                   f"H) or (blocknum, numKvHeads, blocksize, headDims); got key shape "
                   f"{list(key.shape)}")
    if key.dim() == 4 and layout != "BNSD":
        raise _err(f"a KV cache laid out (blocknum, numKvHeads, blocksize, headDims) (key shape "
                   f"{list(key.shape)}) needs input_layout='BNSD'; got {layout!r}")


def host_lengths(actual_seq_lengths, batch: int) -> list[int] | None:
    """The lengths as a list of B ints when they are a host sequence, else None."""
    if actual_seq_lengths is None or isinstance(actual_seq_lengths, torch.Tensor):
        return None
    lengths = [int(x) for x in actual_seq_lengths]
    if len(lengths) not in (batch, 1):
        raise _err(f"actual_seq_lengths has {len(lengths)} entries; expected B={batch} "
                   f"(one per batch) or 1 (shared by all batches)")
    for i, x in enumerate(lengths):
        if x < 0:
            raise _device_checks.negative_length_error(OP, "actual_seq_lengths", i, x)
    return lengths * batch if len(lengths) == 1 else lengths


def check_paged(query, key, block_table, block_size: int, actual_seq_lengths, kv_int8: bool,
                 batch: int, num_kv: int, head_dim: int) -> int:
    """Check page attention; return the logical KV length max_blocks * block_size."""
    if actual_seq_lengths is None:
        raise _err("page attention (block_table given) needs actual_seq_lengths: each batch's "
                   "length / block_size is its number of blocks")
    if block_table.dtype != torch.int32:
        raise _err(f"block_table dtype {block_table.dtype} is not supported; expected torch.int32")
    if block_table.dim() != 2:
        raise _err(f"block_table must be 2-D [B, maxBlockNumPerSeq]; got shape "
                   f"{list(block_table.shape)}")
    if block_table.shape[0] != batch:
        raise _err(f"block_table first dim {block_table.shape[0]} must equal the batch B={batch}")
    align = 32 if kv_int8 else 16
    if block_size <= 0 or block_size % align != 0:
        raise _err(f"block_size={block_size} must be a positive multiple of {align} for "
                   f"{'int8' if kv_int8 else str(key.dtype)} key/value in page attention")
    if key.dim() == 3:
        want = [key.shape[0], block_size, num_kv * head_dim]
        form = "(blocknum, blocksize, H = numKvHeads * headDims)"
    else:
        want = [key.shape[0], num_kv, block_size, head_dim]
        form = "(blocknum, numKvHeads, blocksize, headDims)"
    if list(key.shape) != want:
        raise _err(f"paged key shape {list(key.shape)} must be {form} = {want} (block_size="
                   f"{block_size}, num_key_value_heads={num_kv}, D={head_dim})")
    lengths = host_lengths(actual_seq_lengths, batch)
    if lengths is not None:
        check_paged_lengths(lengths, block_table.shape[1], key.shape[0], block_size)
    return block_table.shape[1] * block_size


def check_paged_lengths(lengths: list[int], max_blocks: int, num_blocks: int,
                        block_size: int) -> None:
    """Page attention's value checks of the (non-negative) host lengths: the block table is wide
    enough and the cache has enough blocks for all batches."""
    needed = [-(-x // block_size) for x in lengths]
    if max_blocks < max(needed):
        raise _err(f"block_table second dim {max_blocks} must be >= maxBlockNumPerSeq="
                   f"{max(needed)} (ceil(max(actual_seq_lengths)={max(lengths)} / block_size="
                   f"{block_size}))")
    if num_blocks < sum(needed):
        raise _err(f"KV cache blocknum {num_blocks} must be >= the blocks needed by all "
                   f"batches, sum(ceil(actual_seq_lengths / block_size)) = {sum(needed)}")


def _antiquant_shape(layout: str, num_kv: int, head_dim: int) -> list[int]:
    return {"BNSD": [2, num_kv, 1, head_dim], "BSH": [2, num_kv * head_dim],
            "BSND": [2, num_kv, head_dim]}[layout]


def check_antiquant(kv_int8: bool, antiquant_scale, antiquant_offset, layout: str,
                     num_kv: int, head_dim: int) -> None:
    given = {"antiquant_scale": antiquant_scale, "antiquant_offset": antiquant_offset}
    if not kv_int8:
        for name, t in given.items():
            if t is not None:
                raise _err(f"{name} is only used with int8 key/value (antiquant); key/value are "
                           f"floating, pass {name}=None")
        return
    if antiquant_scale is None:
        raise _err("int8 key/value need antiquant_scale (per-channel dequantization: "
                   "(x + antiquant_offset) * antiquant_scale)")
    want = _antiquant_shape(layout, num_kv, head_dim)
    for name, t in given.items():
        if t is None:
            continue
        if not t.dtype.is_floating_point:
            raise _err(f"{name} dtype {t.dtype} must be floating (float16 or bfloat16)")
        if list(t.shape) != want:
            raise _err(f"{name} shape {list(t.shape)} must be {want} for input_layout="
                       f"{layout!r} (index 0 key, 1 value; per channel)")


def check_quant(tensors: dict, num_heads: int, head_dim: int) -> None:
    for name in FULL_QUANT_ARGS:
        if tensors[name] is not None:
            raise _err(f"{name} must be None: it belongs to the int8 query/key/value scenario, "
                       f"which is not supported (float16 in, int8 out takes quant_scale2 and "
                       f"optionally quant_offset2 only)")
    scale2, offset2 = tensors["quant_scale2"], tensors["quant_offset2"]
    if offset2 is not None and scale2 is None:
        raise _err("quant_offset2 needs quant_scale2 (they are one group; quant_offset2 is the "
                   "optional part)")
    channels = num_heads * head_dim
    for name, t in (("quant_scale2", scale2), ("quant_offset2", offset2)):
        if t is None:
            continue
        if t.dtype not in QUANT2_DTYPES:
            raise _err(f"{name} dtype {t.dtype} is not supported; expected one of "
                       f"{list(QUANT2_DTYPES)}")
        if t.numel() not in (1, channels):
            raise _err(f"{name} has {t.numel()} elements (shape {list(t.shape)}); expected 1 "
                       f"(per-tensor) or N * D = {channels} (per-channel)")


def check_pse(pse_shift, query, dims: _common.AttentionDims) -> None:
    if pse_shift.dtype != query.dtype:
        raise _err(f"pse_shift dtype {pse_shift.dtype} must equal query dtype {query.dtype}")
    if dims.head_dim % 16 != 0:
        raise _err(f"pse_shift needs D divisible by 16 (D-axis alignment); got D={dims.head_dim}")
    target = [dims.batch, dims.num_heads, dims.q_len, dims.kv_len]
    shape = list(pse_shift.shape)
    ok = len(shape) == 4 and shape[-1] == dims.kv_len and all(
        s in (1, t) for s, t in zip(shape[:3], target))
    if not ok:
        raise _err(f"pse_shift shape {shape} does not broadcast to [B, N, S_q, S_kv] = {target}; "
                   f"expected [B or 1, N, 1, S_kv]")


def check_kv_padding(kv_padding_size, batch: int, device) -> None:
    if kv_padding_size.dtype not in LENGTH_DTYPES:
        raise _err(f"kv_padding_size dtype {kv_padding_size.dtype} is not supported; expected "
                   f"torch.int64")
    if kv_padding_size.numel() not in (1, batch) or kv_padding_size.dim() > 1:
        raise _err(f"kv_padding_size shape {list(kv_padding_size.shape)} must be [1] or [B={batch}]")
    if kv_padding_size.device != device:
        raise _err(f"kv_padding_size is on {kv_padding_size.device} but query is on {device}")


def validate(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, padding_mask=None,
             atten_mask=None, pse_shift=None,
             actual_seq_lengths: Sequence[int] | torch.Tensor | None = None,
             antiquant_scale=None, antiquant_offset=None, block_table=None, dequant_scale1=None,
             quant_scale1=None, dequant_scale2=None, quant_scale2=None, quant_offset2=None,
             kv_padding_size=None, num_heads: int = 1, scale_value: float = 1.0,
             input_layout: str = "BSH", num_key_value_heads: int = 0, block_size: int = 0,
             inner_precise: int = 1) -> IfaPlan:
    """Check every argument of ``npu_incre_flash_attention``; return the plan (eager only)."""
    if padding_mask is not None:
        raise _err("padding_mask is a reserved argument and must be None")
    if inner_precise not in (0, 1):
        raise _err(f"inner_precise={inner_precise} must be 0 (high precision) or 1 (high "
                   f"performance)")
    paged = block_table is not None
    check_ranks(query, key, value, input_layout, paged)
    kv_int8 = check_dtypes(query, key, value)
    if paged:
        num_kv = _common.check_head_counts(OP, num_heads, num_key_value_heads)
        batch, q_len, head_dim = _common.query_dims(OP, query, input_layout, num_heads)
        kv_len = check_paged(query, key, block_table, block_size, actual_seq_lengths, kv_int8,
                              batch, num_kv, head_dim)
        dims = _common.AttentionDims(batch, num_heads, num_kv, q_len, kv_len, head_dim)
    else:
        dims = _common.attention_dims(OP, query, key, value, num_heads=num_heads,
                                      num_key_value_heads=num_key_value_heads,
                                      input_layout=input_layout)
    check_antiquant(kv_int8, antiquant_scale, antiquant_offset, input_layout, dims.num_kv_heads,
                     dims.head_dim)
    check_quant({"dequant_scale1": dequant_scale1, "quant_scale1": quant_scale1,
                  "dequant_scale2": dequant_scale2, "quant_scale2": quant_scale2,
                  "quant_offset2": quant_offset2}, dims.num_heads, dims.head_dim)
    if pse_shift is not None:
        check_pse(pse_shift, query, dims)
    host_lengths(actual_seq_lengths, dims.batch)  # negative host lengths
    lengths = _common.seq_lengths_tensor(OP, actual_seq_lengths, dims.batch, query.device)
    padding = None
    if kv_padding_size is not None:
        check_kv_padding(kv_padding_size, dims.batch, query.device)
        if lengths is not None:  # left padding needs both; otherwise right padding (ignored)
            padding = kv_padding_size.reshape(-1).to(torch.int64)
    mask = None
    if atten_mask is not None:
        mask = _common.normalize_atten_mask(OP, atten_mask, dims, query.device)
    return IfaPlan(dims, input_layout, paged, paged and key.dim() == 4, kv_int8, lengths,
                   padding, mask)
