"""``npu_incre_flash_attention``: incremental (decode-step) flash attention, as in torch_npu.

``out = softmax(scale_value * q k^T + mask) v`` per query head, where query head ``h`` reads kv head
``h // (num_heads // num_key_value_heads)`` (GQA) and masked positions (``atten_mask`` nonzero, or
``position >= actual_seq_lengths[b]``) take no part. The op is value-dependent on
``actual_seq_lengths`` (a host ``SymInt[]``); its tensor twin ``npu_incre_flash_attention_tensor``
takes the lengths as a 1-D int64 device tensor so a static build can read them on the device.

Supported now: layouts BSH / BNSD / BSND, GQA, ``atten_mask``, ``actual_seq_lengths``. Not yet:
``pse_shift``, page attention (``block_table``/``block_size``), antiquant, quant and
``kv_padding_size`` raise ``NotImplementedError``; ``padding_mask`` is reserved (``ValueError``).
"""
from __future__ import annotations

from typing import Sequence

import torch

from torchair.ops import _attention_common as _common
from torchair.ops._registry import define_op, register_value_dependent

__all__ = ["incre_flash_attention_reference", "npu_incre_flash_attention",
           "npu_incre_flash_attention_tensor"]

_OP = "npu_incre_flash_attention"

_SCHEMA = (
    "npu_incre_flash_attention(Tensor query, Tensor key, Tensor value, *, "
    "Tensor? padding_mask=None, Tensor? atten_mask=None, Tensor? pse_shift=None, "
    "SymInt[]? actual_seq_lengths=None, Tensor? antiquant_scale=None, "
    "Tensor? antiquant_offset=None, Tensor? block_table=None, Tensor? dequant_scale1=None, "
    "Tensor? quant_scale1=None, Tensor? dequant_scale2=None, Tensor? quant_scale2=None, "
    "Tensor? quant_offset2=None, Tensor? kv_padding_size=None, int num_heads=1, "
    "float scale_value=1.0, str input_layout=\"BSH\", int num_key_value_heads=0, "
    "int block_size=0, int inner_precise=1) -> Tensor"
)
# The tensor twin: identical except that actual_seq_lengths is a 1-D int64 device tensor.
_TWIN_SCHEMA = (
    _SCHEMA.replace("npu_incre_flash_attention(", "npu_incre_flash_attention_tensor(", 1)
    .replace("SymInt[]? actual_seq_lengths", "Tensor? actual_seq_lengths", 1)
)

# Arguments of a later issue: any non-None value raises NotImplementedError.
_UNSUPPORTED_TENSORS = ("pse_shift", "antiquant_scale", "antiquant_offset", "block_table",
                        "dequant_scale1", "quant_scale1", "dequant_scale2", "quant_scale2",
                        "quant_offset2", "kv_padding_size")


def incre_flash_attention_reference(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
        atten_mask: torch.Tensor | None = None,
        actual_seq_lengths: Sequence[int] | torch.Tensor | None = None,
        num_heads: int = 1, scale_value: float = 1.0, input_layout: str = "BSH",
        num_key_value_heads: int = 0) -> torch.Tensor:
    """Plain-PyTorch incremental flash attention: the oracle of ``npu_incre_flash_attention``.

    Parameters
    ----------
    query, key, value
        ``BSH``: query ``[B, S_q, H]``, key/value ``[B, S_kv, H_kv]``; ``BNSD``: ``[B, N, S_q, D]``
        and ``[B, N_kv, S_kv, D]``; ``BSND``: ``[B, S_q, N, D]`` and ``[B, S_kv, N_kv, D]``.
        ``S_q`` is 1 for a decode step; any ``S_q >= 1`` works.
    atten_mask
        bool/int8/uint8, nonzero = masked out; shape ``[B, S_kv]``, ``[B, S_q, S_kv]`` or
        ``[B, N, S_q, S_kv]`` (each dimension but the last may be 1).
    actual_seq_lengths
        valid kv length per batch (``B`` entries) or for all batches (1 entry): positions
        ``>= length`` are masked. A list of ints or a 1-D int64 tensor on the query's device; a
        tensor is never read on the host, so the call can be captured in a CUDA graph.
    num_heads, num_key_value_heads
        query heads ``N`` and kv heads ``N_kv`` (0 means ``N``); ``N_kv`` divides ``N``.
    scale_value
        multiplies ``q . k`` before the softmax.

    Returns
    -------
    Tensor shaped like ``query`` in ``query.dtype``, computed in float32. A query row whose kv
    positions are all masked gives zeros.
    """
    dims = _common.attention_dims(_OP, query, key, value, num_heads=num_heads,
                                  num_key_value_heads=num_key_value_heads,
                                  input_layout=input_layout)
    _check_dtypes(query, key, value)
    mask = None
    if atten_mask is not None:
        mask = _common.normalize_atten_mask(_OP, atten_mask, dims, query.device)
    lengths = _common.seq_lengths_tensor(_OP, actual_seq_lengths, dims.batch, query.device)
    if dims.kv_len == 0:  # nothing to attend to: every row is fully masked
        return torch.zeros_like(query, memory_format=torch.contiguous_format)
    if lengths is not None:
        mask = _common.combine_masks(mask, _common.length_mask(lengths, dims.kv_len))
    q = _common.to_bnsd(query, input_layout, dims.num_heads)
    k = _common.to_bnsd(key, input_layout, dims.num_kv_heads)
    v = _common.to_bnsd(value, input_layout, dims.num_kv_heads)
    out = _common.masked_attention(q, k, v, mask, scale_value)
    return _common.from_bnsd(out.to(query.dtype), input_layout)


def _check_dtypes(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
    if not query.dtype.is_floating_point:
        raise ValueError(f"{_OP}: query dtype {query.dtype} is not supported; expected a floating "
                         f"dtype (float16, bfloat16 or float32)")
    for name, t in (("key", key), ("value", value)):
        if t.dtype == torch.int8:
            raise NotImplementedError(f"{_OP}: int8 {name} (antiquant) is not supported yet")
        if t.dtype != query.dtype:
            raise ValueError(f"{_OP}: {name} dtype {t.dtype} must equal query dtype {query.dtype}")


def _check_supported(padding_mask, block_size: int, tensors: dict) -> None:
    if padding_mask is not None:
        raise ValueError(f"{_OP}: padding_mask is a reserved argument and must be None")
    for name in _UNSUPPORTED_TENSORS:
        if tensors[name] is not None:
            raise NotImplementedError(f"{_OP}: {name} is not supported yet")
    if block_size != 0:
        raise NotImplementedError(f"{_OP}: block_size={block_size} (page attention) is not "
                                  f"supported yet; pass block_size=0")


def _eager(query, key, value, *, padding_mask=None, atten_mask=None, pse_shift=None,
           actual_seq_lengths=None, antiquant_scale=None, antiquant_offset=None, block_table=None,
           dequant_scale1=None, quant_scale1=None, dequant_scale2=None, quant_scale2=None,
           quant_offset2=None, kv_padding_size=None, num_heads=1, scale_value=1.0,
           input_layout="BSH", num_key_value_heads=0, block_size=0, inner_precise=1):
    """Eager kernel of the op and of its twin (``actual_seq_lengths``: list or tensor)."""
    _check_supported(padding_mask, block_size, {
        "pse_shift": pse_shift, "antiquant_scale": antiquant_scale,
        "antiquant_offset": antiquant_offset, "block_table": block_table,
        "dequant_scale1": dequant_scale1, "quant_scale1": quant_scale1,
        "dequant_scale2": dequant_scale2, "quant_scale2": quant_scale2,
        "quant_offset2": quant_offset2, "kv_padding_size": kv_padding_size})
    return incre_flash_attention_reference(
        query, key, value, atten_mask=atten_mask, actual_seq_lengths=actual_seq_lengths,
        num_heads=num_heads, scale_value=scale_value, input_layout=input_layout,
        num_key_value_heads=num_key_value_heads)


def _fake(query, key, value, *, padding_mask=None, atten_mask=None, pse_shift=None,
          actual_seq_lengths=None, antiquant_scale=None, antiquant_offset=None, block_table=None,
          dequant_scale1=None, quant_scale1=None, dequant_scale2=None, quant_scale2=None,
          quant_offset2=None, kv_padding_size=None, num_heads=1, scale_value=1.0,
          input_layout="BSH", num_key_value_heads=0, block_size=0, inner_precise=1):
    """Fake kernel of the op and its twin: shaped like query; reads no SymInt, adds no guard."""
    _common.check_layout_ranks(_OP, query, key, value, input_layout)
    dtype = torch.int8 if quant_scale2 is not None else query.dtype
    return query.new_empty(query.shape, dtype=dtype)


npu_incre_flash_attention = define_op(_SCHEMA, fake=_fake, kernel=_eager)
npu_incre_flash_attention_tensor = define_op(_TWIN_SCHEMA, fake=_fake, kernel=_eager)
register_value_dependent(npu_incre_flash_attention.default, ["actual_seq_lengths"],
                         npu_incre_flash_attention_tensor.default)
