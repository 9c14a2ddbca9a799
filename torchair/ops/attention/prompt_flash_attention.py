"""``npu_prompt_flash_attention`` (PFA): full (prompt) attention, as in torch_npu.

PFA is the prompt case of :mod:`torchair.ops.attention.fused_infer_attention_score` (FIA); this
op maps its arguments onto FIA's and returns FIA's ``attention_out`` alone (one tensor, shaped and
laid out as ``query``; int8 when ``quant_scale2`` is given). The formula, masks and layouts (BSH,
BNSD, BSND; GQA through ``num_key_value_heads``) are FIA's::

    PFA argument                         FIA argument
    scale_value (default 1.0)            scale
    pre_tokens (default 2147473647)      pre_tokens
    next_tokens (default 0)              next_tokens
    actual_seq_lengths / _kv             actual_seq_lengths / _kv (valid query / KV rows per batch)
    pse_shift, atten_mask, quant_scale2, quant_offset2, num_heads, input_layout,
    num_key_value_heads, sparse_mode     the same names
    deq_scale1, quant_scale1, deq_scale2 dequant_scale1, quant_scale1, dequant_scale2 (the int8
                                         query path: not implemented, as in FIA)

``sparse_mode`` 0 (defaultMask) follows Ascend's rule: without ``atten_mask`` nothing is masked and
``pre_tokens`` / ``next_tokens`` are ignored (so PFA's defaults, ``next_tokens=0``, attend to the
whole KV); with ``atten_mask`` the mask and the band ``i - pre_tokens <= j <= i + next_tokens``
both apply. Modes 1 (allMask, needs ``atten_mask``), 2 (leftUpCausal: ``j <= i``), 3
(rightDownCausal: ``j <= i + Skv_b - Sq_b``) and 4 (band) are FIA's; modes 2-4 take the compressed
``[2048, 2048]`` mask of torch_npu (checked for dtype and rank, the rule is computed).

Defaults are torch_npu's: ``scale_value=1.0`` (pass ``1 / sqrt(D)`` for the usual scaling),
``pre_tokens=2147473647`` (the value torch_npu's schema carries; any value >= S behaves the same),
``next_tokens=0``. The length arguments are ``SymInt[]`` here (torch_npu declares ``int[]``; the
same calls are accepted) so that a compiled graph keeps them symbolic: the op is value-dependent
on ``actual_seq_lengths`` and ``actual_seq_lengths_kv`` with the tensor twin
``npu_prompt_flash_attention_tensor`` (1-D int64 device tensors), as FIA.

Not implemented (``NotImplementedError`` naming the argument): ``padding_mask`` (reserved and
unused by torch_npu), the int8-query path (``deq_scale1``, ``quant_scale1``, ``deq_scale2``).
Errors of the shared checks name this op and its argument names.
"""
from __future__ import annotations

import contextlib
import re
from typing import Iterator

import torch

from torchair.base.registry import define_op, register_value_dependent
from torchair.ops.attention import fused_infer_attention_score as _fia
from torchair.ops.attention.fia_checks import INT_MAX

__all__ = ["npu_prompt_flash_attention", "npu_prompt_flash_attention_tensor",
           "prompt_flash_attention_reference"]

OP = "npu_prompt_flash_attention"
PRE_TOKENS_DEFAULT = 2147473647  # torch_npu's schema default (sic: not INT32_MAX)

_SCHEMA = (
    f"{OP}(Tensor query, Tensor key, Tensor value, *, Tensor? pse_shift=None, "
    "Tensor? padding_mask=None, Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None, "
    "Tensor? deq_scale1=None, Tensor? quant_scale1=None, Tensor? deq_scale2=None, "
    "Tensor? quant_scale2=None, Tensor? quant_offset2=None, int num_heads=1, "
    f"float scale_value=1.0, int pre_tokens={PRE_TOKENS_DEFAULT}, int next_tokens=0, "
    "str input_layout=\"BSH\", int num_key_value_heads=0, SymInt[]? actual_seq_lengths_kv=None, "
    "int sparse_mode=0) -> Tensor"
)
_TWIN_SCHEMA = (_SCHEMA.replace(f"{OP}(", f"{OP}_tensor(", 1)
                .replace("SymInt[]? actual_seq_lengths=", "Tensor? actual_seq_lengths=", 1)
                .replace("SymInt[]? actual_seq_lengths_kv=", "Tensor? actual_seq_lengths_kv=", 1))
_DEFAULTS = dict(pse_shift=None, padding_mask=None, atten_mask=None, actual_seq_lengths=None,
                 deq_scale1=None, quant_scale1=None, deq_scale2=None, quant_scale2=None,
                 quant_offset2=None, num_heads=1, scale_value=1.0,
                 pre_tokens=PRE_TOKENS_DEFAULT, next_tokens=0, input_layout="BSH",
                 num_key_value_heads=0, actual_seq_lengths_kv=None, sparse_mode=0)

# PFA argument -> FIA argument (same name when absent)
_TO_FIA = {"scale_value": "scale", "deq_scale1": "dequant_scale1",
           "deq_scale2": "dequant_scale2"}
_RENAMES = {"dequant_scale1": "deq_scale1", "dequant_scale2": "deq_scale2"}
_RENAME_RE = re.compile(r"\b(" + "|".join(_RENAMES) + r")\b")
_OP_RE = re.compile(r"\bnpu_fused_infer_attention_score\b")


@contextlib.contextmanager
def _pfa_names() -> Iterator[None]:
    """Re-raise FIA's errors with this op's name and argument names."""
    try:
        yield
    except (ValueError, TypeError, NotImplementedError) as e:
        msg = _OP_RE.sub(OP, _RENAME_RE.sub(lambda m: _RENAMES[m.group(1)], str(e)))
        raise type(e)(msg) from None


def _fia_call(kwargs: dict) -> dict:
    """FIA's keyword arguments for PFA's ``kwargs`` (unknown names: TypeError)."""
    unknown = set(kwargs) - set(_DEFAULTS)
    if unknown:
        raise TypeError(f"{OP}: unexpected arguments {sorted(unknown)}; it takes "
                        f"{sorted(_DEFAULTS)}")
    a = {**_DEFAULTS, **kwargs}
    if a["padding_mask"] is not None:
        raise NotImplementedError(f"{OP}: padding_mask is reserved by torch_npu and not used; "
                                  f"pass padding_mask=None (mask with atten_mask)")
    out = {_TO_FIA.get(name, name): value for name, value in a.items() if name != "padding_mask"}
    if a["sparse_mode"] == 0 and a["atten_mask"] is None:
        # defaultMask without a mask: nothing is masked, pre/next are ignored (Ascend's rule)
        out["pre_tokens"], out["next_tokens"] = INT_MAX, INT_MAX
    return out


def _compute(query, key, value, kwargs: dict, *, fake: bool, fast: bool = True) -> torch.Tensor:
    fia_kwargs = _fia_call(kwargs)
    with _pfa_names():
        if fake:
            out, _ = _fia.fia_fake(query, key, value, **fia_kwargs)
        else:
            out, _ = _fia.run_fia(_fia.arguments(query, key, value, fia_kwargs), fast=fast)
    return out


def prompt_flash_attention_reference(query, key, value, **kwargs) -> torch.Tensor:
    """Plain-PyTorch PFA (FIA's dense formula, never a fast kernel); the length arguments may be
    lists or 1-D int64 tensors."""
    return _compute(query, key, value, kwargs, fake=False, fast=False)


def _eager(query, key, value, **kwargs):
    return _compute(query, key, value, kwargs, fake=False)


def _fake(query, key, value, **kwargs):
    return _compute(query, key, value, kwargs, fake=True)


npu_prompt_flash_attention = define_op(_SCHEMA, fake=_fake, kernel=_eager)
npu_prompt_flash_attention_tensor = define_op(_TWIN_SCHEMA, fake=_fake, kernel=_eager)
register_value_dependent(npu_prompt_flash_attention.default,
                         ["actual_seq_lengths", "actual_seq_lengths_kv"],
                         npu_prompt_flash_attention_tensor.default)
