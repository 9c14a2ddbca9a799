"""The shared KV prefix of ``npu_fused_infer_attention_score``: ``key_shared_prefix``,
``value_shared_prefix`` and ``actual_shared_prefix_len``.

Every batch's KV is the shared prefix followed by the batch's own KV: with ``P`` the prefix's
valid length (``actual_shared_prefix_len[0]``, or its whole S) and ``L_b`` the batch's own valid
length (``actual_seq_lengths_kv[b]`` clipped to S_kv, or S_kv), batch ``b`` attends to the
logical sequence ``prefix[0:P] ++ kv_b[0:L_b]`` of ``P + L_b`` positions. ``atten_mask`` (sparse
modes 0/1) and ``pse_shift`` index that sequence by their last dimension, which must hold at
least ``P + S_kv`` positions (prefix first, as torch_npu documents); the sparse modes' rules (and
their ``Skv_b``) count ``P + L_b`` positions. The rest of the op is unchanged.

:func:`resolve_shared_prefix` turns a call with a prefix into the same call without one: key and
value become the logical sequences ``[B, S_prefix + S_kv]`` (in the layout; positions past
``P + L_b`` are outside every window), ``actual_seq_lengths_kv`` becomes ``P + L_b`` (a device
tensor) and the mask / pse are cut or padded to the new length. Both the dense reference and the
fast decode path then see an ordinary call, so neither can ignore the prefix. ``P`` may be a
device tensor (the tensor twin, path 4's sunk buffer): it is never read on the host there.

Constraints (torch_npu's; ``ValueError`` naming the argument): both prefixes or none; batch 1,
the key's dtype and its N/D (H for BSH); no page attention (``block_table``) and no left padding
(``kv_padding_size``); ``actual_shared_prefix_len`` one entry in ``[0, S_prefix]``. Per-token
antiquant (mode 1) with a prefix has no scale for the prefix tokens: ``NotImplementedError``.
"""
from __future__ import annotations

import torch

from torchair.ops import _device_checks
from torchair.ops.attention import common as _common
from torchair.ops.attention.fia_checks import OP, validate

__all__ = ["PREFIX_ARGS", "has_shared_prefix", "resolve_shared_prefix"]

PREFIX_ARGS = ("key_shared_prefix", "value_shared_prefix", "actual_shared_prefix_len")
_S_DIM = {"BSH": 1, "BNSD": 2, "BSND": 1}


def _err(msg: str) -> ValueError:
    return ValueError(f"{OP}: {msg}")


def has_shared_prefix(a: dict) -> bool:
    return any(a.get(name) is not None for name in PREFIX_ARGS)


def _check_prefixes(a: dict) -> tuple[torch.Tensor, torch.Tensor]:
    kp, vp, key = a["key_shared_prefix"], a["value_shared_prefix"], a["key"]
    if kp is None or vp is None:
        given = [n for n in PREFIX_ARGS if a[n] is not None]
        raise _err(f"{' and '.join(given)} given without "
                   f"{'key_shared_prefix' if kp is None else 'value_shared_prefix'}; pass "
                   f"key_shared_prefix and value_shared_prefix together (or none of them)")
    if a["block_table"] is not None:
        raise _err("key_shared_prefix is not supported with page attention (block_table given); "
                   "write the prefix into the paged cache instead, or pass dense key/value")
    if a["kv_padding_size"] is not None:
        raise _err("key_shared_prefix is not supported with kv_padding_size (left padding); "
                   "right-pad key/value and pass actual_seq_lengths_kv")
    layout = a["input_layout"]
    for name, t in (("key_shared_prefix", kp), ("value_shared_prefix", vp)):
        if t.dtype != key.dtype:
            raise _err(f"{name} dtype {t.dtype} must equal the key dtype {key.dtype}")
        if t.device != key.device:
            raise _err(f"{name} is on {t.device} but key is on {key.device}; move it there")
        s = _S_DIM[layout]
        want = [1, *key.shape[1:s], "S_prefix", *key.shape[s + 1:]]
        if t.dim() != key.dim() or t.shape[0] != 1 or any(
                x != y for i, (x, y) in enumerate(zip(t.shape, key.shape)) if i not in (0, s)):
            raise _err(f"{name} shape {list(t.shape)} must be {want} ({layout}: batch 1, the "
                       f"key's other dimensions, any prefix length S_prefix)")
    if tuple(kp.shape) != tuple(vp.shape):
        raise _err(f"key_shared_prefix {list(kp.shape)} and value_shared_prefix "
                   f"{list(vp.shape)} must have the same shape")
    if key.dtype == torch.int8:
        modes = ([a["antiquant_mode"]] if a["antiquant_scale"] is not None
                 else [a["key_antiquant_mode"], a["value_antiquant_mode"]])
        if 1 in modes:
            raise NotImplementedError(f"{OP}: key_shared_prefix with per-token antiquant (mode 1) "
                                      f"is not implemented: the prefix tokens have no per-token "
                                      f"scale; use per-channel antiquant (mode 0)")
    return kp, vp


def _length_error(value: int, s_prefix: int) -> ValueError:
    return _err(f"actual_shared_prefix_len[0]={value} must be in [0, S_prefix={s_prefix}] (the "
                f"valid positions of key_shared_prefix/value_shared_prefix)")


def _prefix_length(length, s_prefix: int, device) -> tuple[torch.Tensor, int | None]:
    """``(P as int64 [1] on the device, P on the host or None when it is a device tensor)``."""
    if length is None:
        return torch.full((1,), s_prefix, dtype=torch.int64, device=device), s_prefix
    if isinstance(length, torch.Tensor):
        if length.dim() != 1 or length.shape[0] != 1 or length.dtype not in (torch.int64,
                                                                             torch.int32):
            raise _err(f"actual_shared_prefix_len must be a 1-D int64 tensor of one entry; got "
                       f"shape {list(length.shape)} and dtype {length.dtype}")
        if length.device != device:
            raise _err(f"actual_shared_prefix_len is on {length.device} but query is on "
                       f"{device}; move it to the query's device")
        length = length.to(torch.int64)
        _device_checks.require_none((length < 0) | (length > s_prefix),
                                    lambda i: _length_error(int(length[i]), s_prefix))
        return length, None
    values = [int(x) for x in length]
    if len(values) != 1:
        raise _err(f"actual_shared_prefix_len has {len(values)} entries; expected 1 (the prefix "
                   f"is shared by every batch)")
    if not 0 <= values[0] <= s_prefix:
        raise _length_error(values[0], s_prefix)
    return torch.tensor(values, dtype=torch.int64, device=device), values[0]


def _resize(t: torch.Tensor, width: int, fill) -> torch.Tensor:
    """``t`` with its last dimension cut or padded (with ``fill``) to ``width``."""
    have = t.shape[-1]
    if have >= width:
        return t[..., :width]
    return torch.cat([t, t.new_full((*t.shape[:-1], width - have), fill)], dim=-1)


def _fit_positions(name: str, t, p: torch.Tensor, p_host: int | None, s_kv: int, total: int,
                   fill):
    """``atten_mask`` / ``pse_shift`` over the logical sequence: at least ``P + S_kv`` columns
    (checked), cut or padded to ``S_prefix + S_kv``."""
    if t is None or t.dim() == 0:
        return t
    width = t.shape[-1]

    def error(_i: int = 0, value: int | None = None) -> ValueError:
        shown = int(p[0]) if value is None else value
        return _err(f"{name} last dimension {width} must be >= actual_shared_prefix_len + S_kv "
                    f"= {shown} + {s_kv}: it indexes the shared prefix's positions, then the "
                    f"key's")
    if p_host is not None:
        if width < p_host + s_kv:
            raise error(value=p_host)
    else:
        _device_checks.require_none(p > width - s_kv, error)
    return _resize(t, total, fill)


def _logical_kv(kv: torch.Tensor, prefix: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``[B, N_kv, S_prefix + S_kv, D]``: position ``l`` is ``prefix[l]`` for ``l < P`` and
    ``kv[l - P]`` after (positions past ``P + S_kv`` repeat the last row: outside every window)."""
    batch, heads, s_kv, dim = kv.shape
    s_prefix = prefix.shape[2]
    pos = torch.arange(s_prefix + s_kv, device=kv.device)
    if s_kv == 0:
        return prefix.index_select(2, pos).expand(batch, heads, -1, dim)
    own = kv.index_select(2, (pos - p).clamp(0, s_kv - 1))
    if s_prefix == 0:
        return own
    shared = prefix.index_select(2, pos.clamp(max=s_prefix - 1))
    return torch.where((pos < p).view(1, 1, -1, 1), shared, own)


def resolve_shared_prefix(a: dict) -> dict:
    """The arguments ``a`` (the schema's names) of a call with a shared prefix as those of the
    equivalent call without one (module doc); ``a`` itself when it has none."""
    if not has_shared_prefix(a):
        return a
    # the call without its prefix (and without the mask / pse, whose widths count the prefix)
    # checks every other argument with the caller's shapes and lengths
    plain = validate({**a, **{n: None for n in PREFIX_ARGS}, "atten_mask": None,
                      "pse_shift": None, "sparse_mode": 0})
    kp, vp = _check_prefixes(a)
    layout, dims = a["input_layout"], plain.ifa.dims
    s_prefix = kp.shape[_S_DIM[layout]]
    p, p_host = _prefix_length(a["actual_shared_prefix_len"], s_prefix, a["query"].device)
    total = s_prefix + dims.kv_len
    kv = [_common.from_bnsd(_logical_kv(_common.to_bnsd(t, layout, dims.num_kv_heads),
                                        _common.to_bnsd(pre, layout, dims.num_kv_heads), p),
                            layout)
          for t, pre in ((a["key"], kp), (a["value"], vp))]
    own = plain.ifa.lengths
    own = dims.kv_len if own is None else own.clamp(0, dims.kv_len)
    mask = a["atten_mask"]
    if a["sparse_mode"] in (0, 1):
        mask = _fit_positions("atten_mask", mask, p, p_host, dims.kv_len, total, True)
    pse = _fit_positions("pse_shift", a["pse_shift"], p, p_host, dims.kv_len, total, 0)
    return {**a, **{n: None for n in PREFIX_ARGS}, "key": kv[0], "value": kv[1],
            "actual_seq_lengths_kv": p + own, "atten_mask": mask, "pse_shift": pse}
