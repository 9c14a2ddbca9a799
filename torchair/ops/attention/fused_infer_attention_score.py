"""``npu_fused_infer_attention_score`` (FIA): prompt and incremental attention, as in torch_npu.

Returns ``(attention_out, softmax_lse)``. Per batch ``b``, query head ``h`` (reading kv head
``h // (N / N_kv)``, GQA), query row ``i`` in ``[0, S_q)`` and logical KV position ``p``::

    k, v    the logical KV of batch b as in npu_incre_flash_attention: key/value in the layout,
            or page attention (block_table, block_size; both cache layouts); int8 KV dequantized
            k = (k_int8 + offset_k) * scale_k, v likewise, where the key/value parameters are
            antiquant_scale/antiquant_offset[0 / 1] (mode antiquant_mode) or
            key_antiquant_* / value_antiquant_* (modes key_/value_antiquant_mode):
              mode 0 per channel [N_kv, D] (shapes as IFA's antiquant_scale; any shape with
                     N_kv * D elements for the key_/value_ ones)
              mode 1 per token, scale[b, p]: [2, B, S_kv] combined, [1, B, S_kv] or [B, S_kv]
    window  [start_b, end_b) of the KV positions, exactly IFA's with actual_seq_lengths_kv as its
            actual_seq_lengths (right padding, or left padding with kv_padding_size)
    Sq_b    actual_seq_lengths[b] (all S_q when absent; one entry means all batches)
    Skv_b   end_b - start_b (S_kv when actual_seq_lengths_kv is absent)
    j       p - start_b, the position relative to the window
    s       scale * (q[i] . k[p]) + pse_shift[b, h, i, p]            (pse_shift optional)
    keep p iff start_b <= p < end_b and i < Sq_b and the sparse rule holds:
        sparse_mode 0 (defaultMask): with atten_mask: atten_mask[b, h, i, p] == 0 and
                      i - pre_tokens <= j <= i + next_tokens           (top-left aligned band);
                      without: nothing masked, pre/next ignored (Ascend's sparse-mode doc)
        sparse_mode 1 (allMask):     atten_mask[b, h, i, p] == 0 (required); pre/next ignored
        sparse_mode 2 (leftUpCausal):   j <= i
        sparse_mode 3 (rightDownCausal): j <= i + (Skv_b - Sq_b)
        sparse_mode 4 (band):  -pre_tokens <= j - (i + Skv_b - Sq_b) <= next_tokens
        modes 2-4 compute their rule; an atten_mask (the compressed [2048, 2048] mask of
        torch_npu) is accepted, checked for dtype and rank only, and ignored. Other modes:
        NotImplementedError.
    out[i]  = sum_p softmax_p(s over kept p) * v[p]; nothing kept (a fully masked row, or
              i >= Sq_b) -> out[i] = 0, also for int8 output (the offset is not added)
    lse[i]  = logsumexp_p(s over kept p), float32 [B, N, S_q, 1]; nothing kept -> -inf
              (the log of an empty sum). With softmax_lse_flag=False the second output is an
              empty float32 tensor of shape [0].
    int8 output (quant_scale2, optional quant_offset2): as IFA, clamp(round_half_even(out *
              quant_scale2 + quant_offset2), -128, 127).

atten_mask shapes (bool/int8/uint8, 1 = masked out): ``[B, S_kv]`` (incremental, S_q == 1) or
``[S_q, S_kv]`` (prompt, S_q > 1) for 2-D; ``[B, S_q, S_kv]``; ``[B, N, S_q, S_kv]``; each
dimension but the last may be 1. Layouts BSH, BNSD, BSND. Softmax in float32.

Shared KV prefix (``key_shared_prefix``/``value_shared_prefix`` ``[1, ...]`` in the layout,
``actual_shared_prefix_len``): every batch's KV is the prefix's first P positions followed by its
own KV, the masks, pse and sparse rules indexing that sequence (:mod:`.fia_prefix`).

Not implemented (``NotImplementedError`` naming the argument): query_padding_size, query_rope,
key_rope, key_rope_antiquant_scale, and the int8-query scenario (dequant_scale1, quant_scale1,
dequant_scale2); antiquant modes other than 0/1. ``inner_precise`` 0-3 changes nothing.

The op is value-dependent on ``actual_seq_lengths``, ``actual_seq_lengths_kv`` and
``actual_shared_prefix_len``; its tensor twin ``npu_fused_infer_attention_score_tensor`` takes
them as 1-D int64 device tensors and then reads nothing on the host (TorchAir's graph-mode
``torchair.ops.npu_fused_infer_attention_score`` calls it: :mod:`.fia_graph`). Incremental calls
(S_q == 1) without pse_shift, without a per-head mask, with per-channel antiquant and
softmax_lse_flag=False go to the device's fast decode kernel
(:func:`torchair.ops.attention.decode.decode_attention`, via IFA's decode path; a shared prefix
is resolved first, so it reaches that kernel as ordinary KV); the rest runs the dense reference.
"""
from __future__ import annotations

import dataclasses

import torch

from torchair.base.registry import define_op, register_value_dependent
from torchair.ops.attention import common as _common, ifa_compute as _compute
from torchair.ops.attention.fia_checks import INT_MAX, OP, FiaPlan, KvQuant, ifa_errors_as_fia, validate
from torchair.ops.attention.fia_prefix import resolve_shared_prefix

__all__ = ["fused_infer_attention_score_reference", "npu_fused_infer_attention_score",
           "npu_fused_infer_attention_score_tensor"]

_SCHEMA = (
    "npu_fused_infer_attention_score(Tensor query, Tensor key, Tensor value, *, "
    "Tensor? pse_shift=None, Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None, "
    "SymInt[]? actual_seq_lengths_kv=None, Tensor? dequant_scale1=None, "
    "Tensor? quant_scale1=None, Tensor? dequant_scale2=None, Tensor? quant_scale2=None, "
    "Tensor? quant_offset2=None, Tensor? antiquant_scale=None, Tensor? antiquant_offset=None, "
    "Tensor? key_antiquant_scale=None, Tensor? key_antiquant_offset=None, "
    "Tensor? value_antiquant_scale=None, Tensor? value_antiquant_offset=None, "
    "Tensor? block_table=None, Tensor? query_padding_size=None, Tensor? kv_padding_size=None, "
    "Tensor? key_shared_prefix=None, Tensor? value_shared_prefix=None, "
    "SymInt[]? actual_shared_prefix_len=None, Tensor? query_rope=None, Tensor? key_rope=None, "
    "Tensor? key_rope_antiquant_scale=None, int num_heads=1, float scale=1.0, "
    "int pre_tokens=2147483647, int next_tokens=2147483647, str input_layout=\"BSH\", "
    "int num_key_value_heads=0, int sparse_mode=0, int inner_precise=0, int block_size=0, "
    "int antiquant_mode=0, int key_antiquant_mode=0, int value_antiquant_mode=0, "
    "bool softmax_lse_flag=False) -> (Tensor, Tensor)"
)
_TWIN_SCHEMA = (
    _SCHEMA.replace(f"{OP}(", f"{OP}_tensor(", 1)
    .replace("SymInt[]? actual_seq_lengths=", "Tensor? actual_seq_lengths=", 1)
    .replace("SymInt[]? actual_seq_lengths_kv=", "Tensor? actual_seq_lengths_kv=", 1)
    .replace("SymInt[]? actual_shared_prefix_len=", "Tensor? actual_shared_prefix_len=", 1)
)
DEFAULTS = dict(  # every keyword argument's default
    pse_shift=None, atten_mask=None, actual_seq_lengths=None, actual_seq_lengths_kv=None,
    dequant_scale1=None, quant_scale1=None, dequant_scale2=None, quant_scale2=None,
    quant_offset2=None, antiquant_scale=None, antiquant_offset=None, key_antiquant_scale=None,
    key_antiquant_offset=None, value_antiquant_scale=None, value_antiquant_offset=None,
    block_table=None, query_padding_size=None, kv_padding_size=None, key_shared_prefix=None,
    value_shared_prefix=None, actual_shared_prefix_len=None, query_rope=None, key_rope=None,
    key_rope_antiquant_scale=None, num_heads=1, scale=1.0, pre_tokens=INT_MAX,
    next_tokens=INT_MAX, input_layout="BSH", num_key_value_heads=0, sparse_mode=0,
    inner_precise=0, block_size=0, antiquant_mode=0, key_antiquant_mode=0,
    value_antiquant_mode=0, softmax_lse_flag=False)


def arguments(query, key, value, kwargs: dict) -> dict:
    """Every argument of a call, by name: ``kwargs`` over :data:`DEFAULTS` (TypeError for a
    name the op does not take)."""
    unknown = set(kwargs) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"{OP}: unexpected arguments {sorted(unknown)}")
    return {"query": query, "key": key, "value": value, **DEFAULTS, **kwargs}


# ------------------------------------------------------------------------------ masks (device)

def _rel_positions(plan: FiaPlan, device):
    """``(j, skv)``: positions relative to the window start ``[B|1, 1, S_kv]`` and the window
    lengths ``[B|1, 1, 1]`` (int64, on the device; None/ints when no lengths are given)."""
    dims = plan.ifa.dims
    pos = torch.arange(dims.kv_len, device=device)
    window = _compute.kv_window(plan.ifa)
    if window is None:
        return pos.view(1, 1, -1), dims.kv_len
    start, end = window
    return pos.view(1, 1, -1) - start.view(-1, 1, 1), (end - start).view(-1, 1, 1)


def _row_mask(plan: FiaPlan, device) -> torch.Tensor | None:
    """``[B|1, 1, S_q, 1]`` bool, True for query rows past ``actual_seq_lengths``."""
    if plan.q_lengths is None:
        return None
    rows = torch.arange(plan.ifa.dims.q_len, device=device)
    return (rows.view(1, -1) >= plan.q_lengths.view(-1, 1)).view(-1, 1, plan.ifa.dims.q_len, 1)


def _sparse_mask(plan: FiaPlan, device) -> torch.Tensor | None:
    """``[B|1, 1, S_q, S_kv]`` bool of the sparse rule (True = masked), or None (nothing)."""
    mode, pre, nxt = plan.sparse_mode, plan.pre_tokens, plan.next_tokens
    dims = plan.ifa.dims
    if mode == 1 or (mode == 0 and pre >= INT_MAX and nxt >= INT_MAX):
        return None
    i = torch.arange(dims.q_len, device=device).view(1, -1, 1)
    j, skv = _rel_positions(plan, device)
    if mode == 0:
        out = (j < i - pre) | (j > i + nxt)
    elif mode == 2:
        out = j > i
    else:
        sq = dims.q_len if plan.q_lengths is None else plan.q_lengths.view(-1, 1, 1)
        d = j - (i + (skv - sq))
        out = d > 0 if mode == 3 else (d < -pre) | (d > nxt)
    return out.unsqueeze(1)


def _masks(plan: FiaPlan, device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(masked, rows)``: the union of atten_mask, sparse rule, KV window and invalid query rows
    (broadcastable to [B, N, S_q, S_kv]), and the invalid-row mask alone."""
    rows = _row_mask(plan, device)
    return _common.combine_masks(plan.atten_mask, _sparse_mask(plan, device),
                                 _compute.window_mask(plan.ifa), rows), rows


# ------------------------------------------------------------------------------ compute

def _dequant(kv: torch.Tensor, q: KvQuant | None) -> torch.Tensor:
    if q is None:
        return kv
    if q.mode == 0:
        return _compute.dequantize(kv, q.scale, q.offset)
    out = kv.float()  # per token: [B, S_kv] broadcast over heads and channels
    if q.offset is not None:
        out = out + q.offset[:, None, :, None]
    return out * q.scale[:, None, :, None]


def _scores_lse(q, k, masked, scale: float, bias) -> torch.Tensor:
    """float32 ``[B, N, S_q, 1]``: logsumexp of the scaled, biased, masked scores (-inf if none)."""
    b, n, s_q, d = q.shape
    n_kv, s_kv = k.shape[1], k.shape[2]
    compute = torch.promote_types(q.dtype, torch.float32)
    scores = torch.matmul(q.to(compute).reshape(b, n_kv, (n // n_kv) * s_q, d),
                          k.to(compute).transpose(-1, -2)).view(b, n, s_q, s_kv) * scale
    if bias is not None:
        scores = scores + bias.to(compute)
    if masked is not None:
        scores = scores.masked_fill(masked, float("-inf"))
    return torch.logsumexp(scores, dim=-1, keepdim=True).float()


def _reference(a: dict, plan: FiaPlan, want_lse: bool):
    """``([B, N, S_q, D] float32, lse or None)`` by the dense formula."""
    query, dims = a["query"], plan.ifa.dims
    masked, _ = _masks(plan, query.device)
    compute = torch.promote_types(query.dtype, torch.float32)
    if dims.kv_len == 0:
        out = query.new_zeros(dims.batch, dims.num_heads, dims.q_len, dims.head_dim,
                              dtype=compute)
        lse = torch.full((dims.batch, dims.num_heads, dims.q_len, 1), float("-inf"),
                         device=query.device)
        return out, (lse if want_lse else None)
    q = _common.to_bnsd(query, plan.ifa.layout, dims.num_heads)
    k = _dequant(_compute.dense_kv(a["key"], plan.ifa, a["block_table"]), plan.k_quant)
    v = _dequant(_compute.dense_kv(a["value"], plan.ifa, a["block_table"]), plan.v_quant)
    out = _common.masked_attention(q, k, v, masked, a["scale"], bias=a["pse_shift"])
    lse = _scores_lse(q, k, masked, a["scale"], a["pse_shift"]) if want_lse else None
    return out, lse


def _stack(x, y, like):
    if x is None and y is None:
        return None
    return torch.stack([torch.zeros_like(like) if x is None else x,
                        torch.zeros_like(like) if y is None else y])


def _decode(a: dict, plan: FiaPlan):
    """The fast decode path for eligible incremental calls, or None when not eligible."""
    dims = plan.ifa.dims
    if dims.q_len != 1 or a["softmax_lse_flag"] or any(
            q is not None and q.mode != 0 for q in (plan.k_quant, plan.v_quant)):
        return None
    query = a["query"]
    masked = _common.combine_masks(plan.atten_mask, _sparse_mask(plan, query.device),
                                   _row_mask(plan, query.device))
    if masked is not None:
        masked = masked.expand(masked.shape[0], masked.shape[1], 1, dims.kv_len)
    ifa = dataclasses.replace(plan.ifa, mask=masked)
    if not _compute.decode_eligible(ifa, a["pse_shift"]):
        return None
    kq, vq = plan.k_quant, plan.v_quant
    scale = offset = None
    if kq is not None:
        scale = _stack(kq.scale, vq.scale, kq.scale)
        offset = _stack(kq.offset, vq.offset, kq.scale)
    return _compute.decode_path(query, a["key"], a["value"], ifa, block_table=a["block_table"],
                                antiquant_scale=scale, antiquant_offset=offset,
                                scale_value=a["scale"])


def _finish(out: torch.Tensor, a: dict, plan: FiaPlan) -> torch.Tensor:
    """``[B, N, S_q, D]`` -> the query's layout; int8 or the query's dtype; invalid rows 0."""
    if a["quant_scale2"] is not None:
        out = _compute.quantize_output(out, a["quant_scale2"], a["quant_offset2"], plan.ifa)
    else:
        out = out.to(a["query"].dtype)
    rows = _row_mask(plan, out.device)
    if rows is not None:
        out = out.masked_fill(rows, 0)
    return _common.from_bnsd(out, plan.ifa.layout)


def _empty_lse(query: torch.Tensor) -> torch.Tensor:
    return query.new_empty((0,), dtype=torch.float32)


def run_fia(a: dict, *, fast: bool):
    a = resolve_shared_prefix(a)  # a call with a shared prefix as the same call without one
    plan = validate(a)
    want_lse = bool(a["softmax_lse_flag"])
    with ifa_errors_as_fia():  # block ids are checked by IFA's compute helpers: errors under this op's name
        out = _decode(a, plan) if fast else None
        lse = None
        if out is None:
            out, lse = _reference(a, plan, want_lse)
    return _finish(out, a, plan), (lse if want_lse else _empty_lse(a["query"]))


def fused_infer_attention_score_reference(query, key, value, **kwargs):
    """Plain-PyTorch FIA (the dense formula of the module docstring, never the decode kernel).

    Takes the schema's keyword arguments; the length arguments may be lists or 1-D int64 tensors.
    Returns ``(attention_out, softmax_lse)`` as the op does.
    """
    return run_fia(arguments(query, key, value, kwargs), fast=False)


def _eager(query, key, value, **kwargs):
    """Eager kernel of the op and of its twin (length arguments: lists or tensors)."""
    return run_fia(arguments(query, key, value, kwargs), fast=True)


def fia_fake(query, key, value, **kwargs):
    """Fake kernel of the op and its twin: shapes only; reads no SymInt, adds no guard."""
    a = arguments(query, key, value, kwargs)
    layout = a["input_layout"]
    if a["block_table"] is None:
        _common.check_layout_ranks(OP, query, key, value, layout)
    else:
        _common.check_layout_ranks(OP, query, query, query, layout)
    dtype = torch.int8 if a["quant_scale2"] is not None else query.dtype
    out = query.new_empty(query.shape, dtype=dtype)
    if not a["softmax_lse_flag"]:
        return out, _empty_lse(query)
    if layout == "BSH":
        shape = (query.shape[0], a["num_heads"], query.shape[1], 1)
    elif layout == "BNSD":
        shape = (query.shape[0], query.shape[1], query.shape[2], 1)
    else:
        shape = (query.shape[0], query.shape[2], query.shape[1], 1)
    return out, query.new_empty(shape, dtype=torch.float32)


npu_fused_infer_attention_score = define_op(_SCHEMA, fake=fia_fake, kernel=_eager)
npu_fused_infer_attention_score_tensor = define_op(_TWIN_SCHEMA, fake=fia_fake, kernel=_eager)
register_value_dependent(npu_fused_infer_attention_score.default,
                         ["actual_seq_lengths", "actual_seq_lengths_kv",
                          "actual_shared_prefix_len"],
                         npu_fused_infer_attention_score_tensor.default)
