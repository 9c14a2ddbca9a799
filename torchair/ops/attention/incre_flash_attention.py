"""``npu_incre_flash_attention``: incremental (decode-step) flash attention, as in torch_npu.

Per batch ``b``, query head ``h`` (reading kv head ``h // (N / N_kv)``, GQA) and query row ``i``::

    k, v   = the logical KV of batch b: key/value in the layout, or for page attention the rows
             k[p] = cache[block_table[b, p // block_size], p % block_size] (either cache layout);
             int8 KV is dequantized per channel: k = (k_int8 + antiquant_offset[0]) *
             antiquant_scale[0], v likewise with index 1
    s[j]   = scale_value * (q[i] . k[j]) + pse_shift[b, h, 0, j]        (pse_shift optional)
    keep j iff atten_mask[b, h, i, j] == 0 and start_b <= j < end_b
             right padding: start_b = 0, end_b = actual_seq_lengths[b] (all S_kv when absent)
             left padding (kv_padding_size and actual_seq_lengths both given):
                 end_b = S_kv - max(pad_b, 0), start_b = end_b - actual_seq_lengths[b];
                 start_b < 0 or end_b < 0 -> nothing kept
    out[i] = sum_j softmax_j(s[j] over kept j) * v[j]       (no kept j -> out[i] = 0)
    int8 output (quant_scale2 given):
        out_int8 = clamp(round_half_even(out * quant_scale2 + quant_offset2), -128, 127)
        (scale/offset per tensor or per channel n * D + d; offset 0 when absent)

Softmax and accumulation run in float32 (``inner_precise`` 0/1 is accepted and changes nothing).
S_kv is the S of key, or ``block_table.shape[1] * block_size`` for page attention. The op is
value-dependent on ``actual_seq_lengths`` (a host ``SymInt[]``); its tensor twin
``npu_incre_flash_attention_tensor`` takes the lengths as a 1-D int64 device tensor, and with
tensor lengths nothing is read on the host (CUDA-graph capturable). The eager kernel sends
decode steps (S_q == 1, no pse_shift, an atten_mask without a per-head or per-row dimension) to
:func:`torchair.ops.attention.decode.decode_attention` (the device's fast kernel) and quantizes its
output there; everything else runs :func:`incre_flash_attention_reference`. The constraints of the
contract are checked in :mod:`torchair.ops.attention.ifa_checks` (``ValueError``); ``padding_mask``
is reserved and must be None; int8 query/key/value together (and with it ``dequant_scale1``,
``quant_scale1``, ``dequant_scale2``) are not supported, as in the contract.
"""
from __future__ import annotations

from typing import Sequence

import torch

from torchair.base.registry import define_op, register_value_dependent
from torchair.ops.attention import common as _common, ifa_compute as _compute, ifa_fast as _fast
from torchair.ops.attention.cpu import launch_library as _launch_library
from torchair.ops.attention.ifa_checks import IfaPlan, validate

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


def incre_flash_attention_reference(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
        padding_mask: torch.Tensor | None = None, atten_mask: torch.Tensor | None = None,
        pse_shift: torch.Tensor | None = None,
        actual_seq_lengths: Sequence[int] | torch.Tensor | None = None,
        antiquant_scale: torch.Tensor | None = None, antiquant_offset: torch.Tensor | None = None,
        block_table: torch.Tensor | None = None, dequant_scale1: torch.Tensor | None = None,
        quant_scale1: torch.Tensor | None = None, dequant_scale2: torch.Tensor | None = None,
        quant_scale2: torch.Tensor | None = None, quant_offset2: torch.Tensor | None = None,
        kv_padding_size: torch.Tensor | None = None, num_heads: int = 1,
        scale_value: float = 1.0, input_layout: str = "BSH", num_key_value_heads: int = 0,
        block_size: int = 0, inner_precise: int = 1) -> torch.Tensor:
    """Plain-PyTorch incremental flash attention: the oracle of ``npu_incre_flash_attention``.

    Computes the formula of the module docstring densely in float32 for any ``S_q >= 1``.

    Parameters
    ----------
    query, key, value
        ``BSH``: query ``[B, S_q, H]``, key/value ``[B, S_kv, H_kv]``; ``BNSD``: ``[B, N, S_q, D]``
        and ``[B, N_kv, S_kv, D]``; ``BSND``: ``[B, S_q, N, D]`` and ``[B, S_kv, N_kv, D]``.
        query float16/bfloat16/float32; key/value the query's dtype, or int8 with
        ``antiquant_scale``. With ``block_table``: the KV cache ``(blocknum, block_size, H_kv)``
        or, for ``BNSD`` only, ``(blocknum, N_kv, block_size, D)``.
    atten_mask
        bool/int8/uint8, nonzero = masked out; ``[B, S_kv]``, ``[B, S_q, S_kv]`` or
        ``[B, N, S_q, S_kv]`` (each dimension but the last may be 1).
    pse_shift
        additive bias in the query's dtype, ``[B or 1, N, 1, S_kv]``; needs ``D % 16 == 0``.
    actual_seq_lengths
        valid kv length per batch (``B`` entries) or for all (1 entry); a list of ints or a 1-D
        int64 tensor on the query's device (never read on the host).
    antiquant_scale, antiquant_offset
        per-channel dequantization of int8 key (index 0) and value (index 1): ``BNSD``
        ``(2, N_kv, 1, D)``, ``BSH`` ``(2, H_kv)``, ``BSND`` ``(2, N_kv, D)``; offset optional.
    block_table, block_size
        page attention: int32 ``[B, max_blocks]``; ``block_size`` a multiple of 16 (32 for int8
        KV); needs ``actual_seq_lengths``.
    quant_scale2, quant_offset2
        int8 output (float32/bfloat16, 1 or ``N * D`` elements); offset optional.
    dequant_scale1, quant_scale1, dequant_scale2
        int8 query/key/value scenario, not supported: must be None.
    kv_padding_size
        int64 ``[1]`` or ``[B]``: KV left padding, active with ``actual_seq_lengths``.
    num_heads, num_key_value_heads
        ``N`` and ``N_kv`` (0 means ``N``); ``N_kv`` divides ``N``, ratio <= 64.
    scale_value, inner_precise, padding_mask
        score scale; 0/1 (no effect); reserved, must be None.

    Returns
    -------
    Tensor shaped like ``query``: int8 when ``quant_scale2`` is given, else ``query.dtype``.
    """
    plan = validate(**_arguments(locals()))
    return _finish(_reference_bnsd(query, key, value, plan, pse_shift=pse_shift,
                                   block_table=block_table, antiquant_scale=antiquant_scale,
                                   antiquant_offset=antiquant_offset, scale_value=scale_value),
                   plan, query.dtype, quant_scale2, quant_offset2)


_ARG_NAMES = ("query", "key", "value", "padding_mask", "atten_mask", "pse_shift",
              "actual_seq_lengths", "antiquant_scale", "antiquant_offset", "block_table",
              "dequant_scale1", "quant_scale1", "dequant_scale2", "quant_scale2", "quant_offset2",
              "kv_padding_size", "num_heads", "scale_value", "input_layout",
              "num_key_value_heads", "block_size", "inner_precise")


def _arguments(scope: dict) -> dict:
    return {name: scope[name] for name in _ARG_NAMES}


def _reference_bnsd(query, key, value, plan: IfaPlan, *, pse_shift, block_table,
                    antiquant_scale, antiquant_offset, scale_value) -> torch.Tensor:
    """The attention of ``plan`` as ``[B, N, S_q, D]`` in float32 (float64 for float64 input)."""
    dims = plan.dims
    compute = torch.promote_types(query.dtype, torch.float32)
    if dims.kv_len == 0:  # nothing to attend to: every row is fully masked
        return query.new_zeros(dims.batch, dims.num_heads, dims.q_len, dims.head_dim,
                               dtype=compute)
    q = _common.to_bnsd(query, plan.layout, dims.num_heads)
    k = _compute.dense_kv(key, plan, block_table)
    v = _compute.dense_kv(value, plan, block_table)
    if plan.kv_int8:
        k = _compute.dequantize(k, _compute.antiquant_channels(antiquant_scale, 0, plan),
                                _compute.antiquant_channels(antiquant_offset, 0, plan))
        v = _compute.dequantize(v, _compute.antiquant_channels(antiquant_scale, 1, plan),
                                _compute.antiquant_channels(antiquant_offset, 1, plan))
    mask = _common.combine_masks(plan.mask, _compute.window_mask(plan))
    return _common.masked_attention(q, k, v, mask, scale_value, bias=pse_shift)


def _finish(out: torch.Tensor, plan: IfaPlan, dtype: torch.dtype, quant_scale2,
            quant_offset2) -> torch.Tensor:
    """``[B, N, S_q, D]`` result -> the query's layout, quantized to int8 or cast to ``dtype``."""
    if quant_scale2 is not None:
        out = _compute.quantize_output(out, quant_scale2, quant_offset2, plan)
    else:
        out = out.to(dtype)
    return _common.from_bnsd(out, plan.layout)


def _eager(query, key, value, *, padding_mask=None, atten_mask=None, pse_shift=None,
           actual_seq_lengths=None, antiquant_scale=None, antiquant_offset=None, block_table=None,
           dequant_scale1=None, quant_scale1=None, dequant_scale2=None, quant_scale2=None,
           quant_offset2=None, kv_padding_size=None, num_heads=1, scale_value=1.0,
           input_layout="BSH", num_key_value_heads=0, block_size=0, inner_precise=1):
    """Eager kernel of the op and of its twin (``actual_seq_lengths``: list or tensor)."""
    if (atten_mask is None and pse_shift is None and antiquant_scale is None
            and quant_scale2 is None and kv_padding_size is None and padding_mask is None
            and antiquant_offset is None and quant_offset2 is None and dequant_scale1 is None
            and quant_scale1 is None and dequant_scale2 is None and inner_precise in (0, 1)):
        out = _fast.call(query, key, value, actual_seq_lengths, block_table, num_heads,
                         scale_value, input_layout, num_key_value_heads, block_size)
        if out is not None:
            return out
    plan = validate(**_arguments(locals()))
    common = dict(block_table=block_table, antiquant_scale=antiquant_scale,
                  antiquant_offset=antiquant_offset, scale_value=scale_value)
    if _compute.decode_eligible(plan, pse_shift):
        out = _compute.decode_path(query, key, value, plan, **common)
    else:
        out = _reference_bnsd(query, key, value, plan, pse_shift=pse_shift, **common)
    return _finish(out, plan, query.dtype, quant_scale2, quant_offset2)


def _fake(query, key, value, *, padding_mask=None, atten_mask=None, pse_shift=None,
          actual_seq_lengths=None, antiquant_scale=None, antiquant_offset=None, block_table=None,
          dequant_scale1=None, quant_scale1=None, dequant_scale2=None, quant_scale2=None,
          quant_offset2=None, kv_padding_size=None, num_heads=1, scale_value=1.0,
          input_layout="BSH", num_key_value_heads=0, block_size=0, inner_precise=1):
    """Fake kernel of the op and its twin: shaped like query; reads no SymInt, adds no guard."""
    if block_table is None:
        _common.check_layout_ranks(_OP, query, key, value, input_layout)
    else:  # a paged cache has its own rank (3 or 4), independent of the layout
        _common.check_layout_ranks(_OP, query, query, query, input_layout)
    dtype = torch.int8 if quant_scale2 is not None else query.dtype
    return query.new_empty(query.shape, dtype=dtype)


npu_incre_flash_attention = define_op(_SCHEMA, fake=_fake, kernel=_eager)
npu_incre_flash_attention_tensor = define_op(_TWIN_SCHEMA, fake=_fake, kernel=_eager)
register_value_dependent(npu_incre_flash_attention.default, ["actual_seq_lengths"],
                         npu_incre_flash_attention_tensor.default)
# the C++ entry of the launch kernels calls the general implementation for the calls it does not
# take (torchair_native::ifa_general[_tensor], defined when the library loads)
_launch_library.set_general(_OP, _SCHEMA, _eager, _fake)
_launch_library.set_general(f"{_OP}_tensor", _TWIN_SCHEMA, _eager, _fake)
