"""``npu_fused_infer_attention_score_v2``: FIA with TorchAir's v2 argument names.

The same computation as :mod:`torchair.ops.attention.fused_infer_attention_score` (see its docstring
for the formula); v2 renames the arguments and adds output layouts::

    v2 argument                         v1 argument
    actual_seq_qlen / actual_seq_kvlen  actual_seq_lengths / actual_seq_lengths_kv
    num_query_heads                     num_heads
    softmax_scale                       scale
    dequant_scale_key / _offset_key     key_antiquant_scale / key_antiquant_offset
    dequant_scale_value / _offset_value value_antiquant_scale / value_antiquant_offset
    key_quant_mode / value_quant_mode   key_antiquant_mode / value_antiquant_mode
    quant_scale_out / quant_offset_out  quant_scale2 / quant_offset2
    return_softmax_lse                  softmax_lse_flag

``input_layout`` is the query layout, or ``"<query>_<output>"`` for an output in another layout:
BSH, BSND, BNSD, NSD (BNSD with B = 1; key and value NSD too unless paged), BNSD_BSND, BSH_BNSD,
BSND_BNSD, BSH_NBSD, BSND_NBSD, BNSD_NBSD. The softmax LSE (``return_softmax_lse=True``) is
float32 ``[B, N, S_q, 1]``; otherwise the second output is an empty float32 tensor ``[0]``.

``actual_seq_qlen`` / ``actual_seq_kvlen`` are int lists (``SymInt[]``) as in torch_npu's
schema (TorchAir's own ``air`` op takes 1-D tensors: pass ``t.tolist()``); the op is
value-dependent on both, with the tensor twin ``npu_fused_infer_attention_score_v2_tensor``.

Not implemented (``NotImplementedError`` naming the argument): the TND/NTD layouts (TND, NTD,
NTD_TND, TND_NTD), query_rope, key_rope, dequant_scale_query (int8 query), query_quant_mode other
than 0, dequant_scale_key_rope, quant_scale_p, learnable_sink, and every ``*_dtype`` argument
(they describe Ascend-only dtypes: int4/fp4/fp8/hifloat8 bit patterns) including out_dtype.
TorchAir's v2 runs only in its max-autotune graphs; this one runs eagerly too.
"""
from __future__ import annotations

import contextlib
import re
from typing import Iterator

import torch

from torchair.base.registry import define_op, register_value_dependent
from torchair.ops.attention import common as _common, fused_infer_attention_score as _v1
from torchair.ops.attention.fia_checks import INT_MAX

__all__ = ["npu_fused_infer_attention_score_v2", "npu_fused_infer_attention_score_v2_tensor",
           "fused_infer_attention_score_v2_reference"]

OP = "npu_fused_infer_attention_score_v2"

_TENSOR_ARGS = ("query_rope", "key_rope", "pse_shift", "atten_mask")
_LATER_TENSOR_ARGS = ("block_table", "dequant_scale_query", "dequant_scale_key",
                      "dequant_offset_key", "dequant_scale_value", "dequant_offset_value",
                      "dequant_scale_key_rope", "quant_scale_out", "quant_offset_out",
                      "quant_scale_p", "learnable_sink")
_DTYPE_ARGS = ("query_dtype", "key_dtype", "value_dtype", "query_rope_dtype", "key_rope_dtype",
               "key_shared_prefix_dtype", "value_shared_prefix_dtype",
               "dequant_scale_query_dtype", "dequant_scale_key_dtype",
               "dequant_scale_value_dtype", "dequant_scale_key_rope_dtype", "out_dtype")
_SCHEMA = (
    f"{OP}(Tensor query, Tensor key, Tensor value, *, "
    + "".join(f"Tensor? {n}=None, " for n in _TENSOR_ARGS)
    + "SymInt[]? actual_seq_qlen=None, SymInt[]? actual_seq_kvlen=None, "
    + "".join(f"Tensor? {n}=None, " for n in _LATER_TENSOR_ARGS)
    + "int num_query_heads=1, int num_key_value_heads=0, float softmax_scale=1.0, "
      "int pre_tokens=2147483647, int next_tokens=2147483647, str input_layout=\"BSH\", "
      "int sparse_mode=0, int block_size=0, int query_quant_mode=0, int key_quant_mode=0, "
      "int value_quant_mode=0, int inner_precise=0, bool return_softmax_lse=False, "
    + ", ".join(f"int? {n}=None" for n in _DTYPE_ARGS)
    + ") -> (Tensor, Tensor)"
)
_TWIN_SCHEMA = (_SCHEMA.replace(f"{OP}(", f"{OP}_tensor(", 1)
                .replace("SymInt[]? actual_seq_qlen=", "Tensor? actual_seq_qlen=", 1)
                .replace("SymInt[]? actual_seq_kvlen=", "Tensor? actual_seq_kvlen=", 1))
DEFAULTS = {**{n: None for n in _TENSOR_ARGS + _LATER_TENSOR_ARGS + _DTYPE_ARGS},
            "actual_seq_qlen": None, "actual_seq_kvlen": None, "num_query_heads": 1,
            "num_key_value_heads": 0, "softmax_scale": 1.0, "pre_tokens": INT_MAX,
            "next_tokens": INT_MAX, "input_layout": "BSH", "sparse_mode": 0, "block_size": 0,
            "query_quant_mode": 0, "key_quant_mode": 0, "value_quant_mode": 0,
            "inner_precise": 0, "return_softmax_lse": False}

# v2 argument -> v1 argument, for the arguments with a v1 counterpart
TO_V1 = {"pse_shift": "pse_shift", "atten_mask": "atten_mask",
         "actual_seq_qlen": "actual_seq_lengths", "actual_seq_kvlen": "actual_seq_lengths_kv",
         "block_table": "block_table", "dequant_scale_key": "key_antiquant_scale",
         "dequant_offset_key": "key_antiquant_offset",
         "dequant_scale_value": "value_antiquant_scale",
         "dequant_offset_value": "value_antiquant_offset", "quant_scale_out": "quant_scale2",
         "quant_offset_out": "quant_offset2", "num_query_heads": "num_heads",
         "num_key_value_heads": "num_key_value_heads", "softmax_scale": "scale",
         "pre_tokens": "pre_tokens", "next_tokens": "next_tokens", "sparse_mode": "sparse_mode",
         "block_size": "block_size", "key_quant_mode": "key_antiquant_mode",
         "value_quant_mode": "value_antiquant_mode", "inner_precise": "inner_precise",
         "return_softmax_lse": "softmax_lse_flag"}
_NOT_IMPLEMENTED = ("query_rope", "key_rope", "dequant_scale_query", "dequant_scale_key_rope",
                    "quant_scale_p", "learnable_sink") + _DTYPE_ARGS

# input_layout -> (query layout, output layout, query rank)
LAYOUTS = {"BSH": ("BSH", "BSH", 3), "BSND": ("BSND", "BSND", 4), "BNSD": ("BNSD", "BNSD", 4),
           "TND": ("TND", "TND", 3), "NTD": ("NTD", "NTD", 3),
           "BNSD_BSND": ("BNSD", "BSND", 4), "BSH_BNSD": ("BSH", "BNSD", 3),
           "BSND_BNSD": ("BSND", "BNSD", 4), "NTD_TND": ("NTD", "TND", 3),
           "BSH_NBSD": ("BSH", "NBSD", 3), "BSND_NBSD": ("BSND", "NBSD", 4),
           "BNSD_NBSD": ("BNSD", "NBSD", 4), "TND_NTD": ("TND", "NTD", 3),
           "NSD": ("NSD", "NSD", 3)}
_VARLEN = ("TND", "NTD")

# v1 names in error messages -> v2 names (longest first, whole words)
_RENAMES = {v1: v2 for v2, v1 in TO_V1.items() if v1 != v2}
_RENAME_RE = re.compile(r"\b(" + "|".join(sorted(map(re.escape, _RENAMES), key=len,
                                                 reverse=True)) + r")\b")
_OP_RE = re.compile(r"\bnpu_fused_infer_attention_score\b(?!_v2)")


@contextlib.contextmanager
def v2_wording() -> Iterator[None]:
    """Re-raise the v1 checks' errors with the v2 op and argument names."""
    try:
        yield
    except (ValueError, TypeError, NotImplementedError) as e:
        msg = _OP_RE.sub(OP, _RENAME_RE.sub(lambda m: _RENAMES[m.group(1)], str(e)))
        raise type(e)(msg) from None


def _args(kwargs: dict) -> dict:
    unknown = set(kwargs) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"{OP}: unexpected arguments {sorted(unknown)}; it takes "
                        f"{sorted(DEFAULTS)}")
    return {**DEFAULTS, **kwargs}


def _check(query: torch.Tensor, a: dict) -> tuple[str, str]:
    """TorchAir's v2 checks (layout, heads) and the arguments torchair does not implement;
    returns ``(query layout, output layout)``. Reads shapes only (safe in fake kernels)."""
    heads = a["num_query_heads"]
    if heads <= 0:
        raise ValueError(f"numHeads should be greater than 0, but got {heads}! "
                         f"({OP}: pass num_query_heads >= 1)")
    layout = a["input_layout"]
    if layout not in LAYOUTS:
        raise ValueError(f"Layout {layout} is not supported! ({OP}: input_layout must be one of "
                         f"{sorted(LAYOUTS)})")
    q_layout, out_layout, rank = LAYOUTS[layout]
    if query.dim() != rank:
        raise ValueError(f"Layout {q_layout}, queryDims({query.dim()}) must be {rank}! ({OP}: "
                         f"query must be {rank}-D for input_layout={layout!r})")
    if q_layout in _VARLEN or out_layout in _VARLEN:
        raise NotImplementedError(f"{OP}: input_layout={layout!r} (a TND/NTD variable-length "
                                  f"layout) is not implemented by torchair; use BSH, BSND, BNSD "
                                  f"or NSD with actual_seq_qlen / actual_seq_kvlen")
    for name in _NOT_IMPLEMENTED:
        if a[name] is not None:
            raise NotImplementedError(f"{OP}: {name} is not implemented by torchair; pass "
                                      f"{name}=None")
    if a["query_quant_mode"] != 0:
        raise NotImplementedError(f"{OP}: query_quant_mode={a['query_quant_mode']} (an int8 "
                                  f"query) is not implemented by torchair; pass "
                                  f"query_quant_mode=0")
    if q_layout == "NSD" and a["block_table"] is not None:
        raise NotImplementedError(f"{OP}: input_layout='NSD' with block_table (page attention) "
                                  f"is not implemented by torchair; use BSH, BSND or BNSD")
    return q_layout, out_layout


def _v1_call(query, key, value, a: dict, q_layout: str) -> tuple[tuple, dict]:
    """v1's ``(query, key, value)`` and keyword arguments for the v2 arguments ``a``."""
    kwargs = {v1: a[v2] for v2, v1 in TO_V1.items()}
    kwargs["input_layout"] = q_layout
    if q_layout == "NSD":  # one batch of BNSD
        kwargs["input_layout"] = "BNSD"
        query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
    return (query, key, value), kwargs


def _to_output_layout(out: torch.Tensor, q_layout: str, out_layout: str,
                      heads: int) -> torch.Tensor:
    """v1's result (in the query layout; BNSD for NSD) in ``out_layout``."""
    if q_layout == "NSD":
        return out.squeeze(0)
    if out_layout == q_layout:
        return out
    bnsd = _common.to_bnsd(out, q_layout, heads)
    if out_layout == "NBSD":
        return bnsd.permute(1, 0, 2, 3).contiguous()
    return _common.from_bnsd(bnsd, out_layout)


def _compute(query, key, value, kwargs: dict, *, fake: bool, fast: bool = True):
    a = _args(kwargs)
    q_layout, out_layout = _check(query, a)
    (q, k, v), v1_kwargs = _v1_call(query, key, value, a, q_layout)
    with v2_wording():
        if fake:
            out, lse = _v1.fia_fake(q, k, v, **v1_kwargs)
        else:
            out, lse = _v1.run_fia(_v1.arguments(q, k, v, v1_kwargs), fast=fast)
    return _to_output_layout(out, q_layout, out_layout, a["num_query_heads"]), lse


def fused_infer_attention_score_v2_reference(query, key, value, **kwargs):
    """Plain-PyTorch v2 (the dense formula, never the decode kernel); the length arguments may
    be lists or 1-D int64 tensors."""
    return _compute(query, key, value, kwargs, fake=False, fast=False)


def _eager(query, key, value, **kwargs):
    return _compute(query, key, value, kwargs, fake=False)


def _fake(query, key, value, **kwargs):
    return _compute(query, key, value, kwargs, fake=True)


npu_fused_infer_attention_score_v2 = define_op(_SCHEMA, fake=_fake, kernel=_eager)
npu_fused_infer_attention_score_v2_tensor = define_op(_TWIN_SCHEMA, fake=_fake, kernel=_eager)
register_value_dependent(npu_fused_infer_attention_score_v2.default,
                         ["actual_seq_qlen", "actual_seq_kvlen"],
                         npu_fused_infer_attention_score_v2_tensor.default)
