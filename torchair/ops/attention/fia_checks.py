"""Validation of ``npu_fused_infer_attention_score`` arguments, producing a :class:`FiaPlan`.

The checks shared with incremental flash attention (ranks, dtypes, head counts, page attention,
int8 output, pse_shift, kv_padding_size) are the ones of :mod:`torchair.ops.attention.ifa_checks`,
called here with the fused op's name in their messages. Device tensor values are never read: the
only value checks (negative lengths, query lengths above S_q, block_table versus the lengths) run
when the lengths are host lists. Errors are ``ValueError`` naming the argument; features that
torchair does not implement raise ``NotImplementedError`` naming the argument.
"""
from __future__ import annotations

import contextlib
import dataclasses
import re

import torch

from torchair.ops.attention import common as _common, ifa_checks as _ifa
from torchair.ops.attention.ifa_checks import IfaPlan

OP = "npu_fused_infer_attention_score"
SPARSE_MODES = (0, 1, 2, 3, 4)
ANTIQUANT_MODES = (0, 1)  # 0 per-channel, 1 per-token
INT_MAX = 2147483647
# Arguments of the schema that torchair does not implement (anything but None is refused).
NOT_IMPLEMENTED = ("query_padding_size", "query_rope", "key_rope", "key_rope_antiquant_scale",
                   "dequant_scale1", "quant_scale1", "dequant_scale2")
# The shared KV prefix: resolved into an ordinary call first (fia_prefix.resolve_shared_prefix).
_PREFIX_ARGS = ("key_shared_prefix", "value_shared_prefix", "actual_shared_prefix_len")


@dataclasses.dataclass(frozen=True)
class KvQuant:
    """Dequantization of int8 key or value: ``(x + offset) * scale``, float32.

    mode 0 (per channel): scale/offset ``[N_kv, D]``; mode 1 (per token): ``[B, S_kv]``.
    """

    mode: int
    scale: torch.Tensor
    offset: torch.Tensor | None


@dataclasses.dataclass(frozen=True)
class FiaPlan:
    """What one call computes. ``ifa`` carries dims, layout, page attention and the KV window
    (its ``lengths`` are ``actual_seq_lengths_kv``); its ``mask`` is None."""

    ifa: IfaPlan
    q_lengths: torch.Tensor | None  # int64 [B] or [1]: valid query rows per batch
    atten_mask: torch.Tensor | None  # bool, broadcastable to [B, N, S_q, S_kv] (modes 0 and 1)
    sparse_mode: int
    pre_tokens: int
    next_tokens: int
    k_quant: KvQuant | None
    v_quant: KvQuant | None


_PLAIN_LENGTHS = re.compile(r"actual_seq_lengths(?!_kv)")


def as_fia_message(msg: str, kv_lengths: bool = False) -> str:
    """An IFA check's error text as this op words it (and, for checks given
    ``actual_seq_lengths_kv`` as IFA's ``actual_seq_lengths``, under that name)."""
    msg = msg.replace(_ifa.OP, OP)
    if kv_lengths:
        msg = _PLAIN_LENGTHS.sub("actual_seq_lengths_kv", msg)
    return msg


@contextlib.contextmanager
def ifa_errors_as_fia(kv_lengths: bool = False):
    """Re-raise the ValueErrors of the shared IFA checks under this op's name
    (:func:`as_fia_message`)."""
    try:
        yield
    except ValueError as e:
        raise ValueError(as_fia_message(str(e), kv_lengths)) from None


def _err(msg: str) -> ValueError:
    return ValueError(f"{OP}: {msg}")


def _check_not_implemented(args: dict) -> None:
    for name in _PREFIX_ARGS:
        if args.get(name) is not None:  # never ignored: the caller resolves the prefix first
            raise RuntimeError(f"{OP}: {name} reached the checks of a call without a shared "
                               f"prefix; resolve it with fia_prefix.resolve_shared_prefix first")
    for name in NOT_IMPLEMENTED:
        if args.get(name) is not None:
            raise NotImplementedError(f"{OP}: {name} is not implemented by torchair; pass "
                                      f"{name}=None")
    if args["query"].dtype == torch.int8:
        raise NotImplementedError(f"{OP}: an int8 query (full quantization with dequant_scale1/"
                                  f"quant_scale1/dequant_scale2) is not implemented by torchair")


def _check_scalars(sparse_mode: int, inner_precise: int, pre_tokens: int, next_tokens: int,
                   atten_mask) -> None:
    if sparse_mode not in SPARSE_MODES:
        raise NotImplementedError(f"{OP}: sparse_mode={sparse_mode} is not implemented; torchair "
                                  f"supports sparse_mode in {list(SPARSE_MODES)}")
    if inner_precise not in (0, 1, 2, 3):
        raise _err(f"inner_precise={inner_precise} must be 0, 1, 2 or 3")
    if sparse_mode == 1 and atten_mask is None:
        raise _err("sparse_mode=1 (allMask) needs atten_mask")
    if sparse_mode == 4 and pre_tokens + next_tokens < 0:
        raise _err(f"sparse_mode=4 needs pre_tokens + next_tokens >= 0; got pre_tokens="
                   f"{pre_tokens}, next_tokens={next_tokens} (an empty band)")


def check_host_q_lengths(lengths, q_len: int) -> None:
    """Query lengths given as a host list must lie in ``[0, S_q]`` (FIA's ValueError)."""
    for i, x in enumerate(lengths):
        if not 0 <= int(x) <= q_len:
            raise _err(f"actual_seq_lengths[{i}]={int(x)} must be in [0, S_q={q_len}] "
                       f"(the valid query rows of batch {i})")


def _q_lengths(actual_seq_lengths, dims: _common.AttentionDims, device) -> torch.Tensor | None:
    if actual_seq_lengths is None:
        return None
    if not isinstance(actual_seq_lengths, torch.Tensor):
        check_host_q_lengths(actual_seq_lengths, dims.q_len)
    return _common.seq_lengths_tensor(OP, actual_seq_lengths, dims.batch, device)


def _kv_lengths(actual_seq_lengths_kv, dims: _common.AttentionDims, device):
    with ifa_errors_as_fia(kv_lengths=True):
        _ifa.host_lengths(actual_seq_lengths_kv, dims.batch)
    try:
        return _common.seq_lengths_tensor(OP, actual_seq_lengths_kv, dims.batch, device)
    except ValueError as e:
        raise ValueError(_PLAIN_LENGTHS.sub("actual_seq_lengths_kv", str(e))) from None


def _atten_mask(atten_mask, sparse_mode: int, dims: _common.AttentionDims, device):
    """The mask of modes 0/1 as bool broadcastable to [B, N, S_q, S_kv]; None for modes 2-4."""
    if atten_mask is None:
        return None
    if atten_mask.dtype not in _common.MASK_DTYPES:
        raise _err(f"atten_mask dtype {atten_mask.dtype} is not supported; expected one of "
                   f"{list(_common.MASK_DTYPES)} (nonzero = masked out)")
    if sparse_mode >= 2:  # the compressed causal/band mask: accepted, the rule is computed
        if atten_mask.dim() not in (2, 4):
            raise _err(f"sparse_mode={sparse_mode} takes the compressed mask [2048, 2048] "
                       f"(or [1, 1, 2048, 2048]); got atten_mask shape {list(atten_mask.shape)}")
        return None
    mask = atten_mask
    if mask.dim() == 2 and dims.q_len > 1:  # prompt: [S_q, S_kv]
        mask = mask.view(1, 1, *mask.shape)
    return _common.normalize_atten_mask(OP, mask, dims, device)


def _quant_tensor(name: str, t: torch.Tensor, mode: int, dims, per_channel_shape=None):
    if not t.dtype.is_floating_point:
        raise _err(f"{name} dtype {t.dtype} must be floating (float16, bfloat16 or float32)")
    if mode == 0:
        if t.numel() != dims.num_kv_heads * dims.head_dim:
            raise _err(f"{name} shape {list(t.shape)} has {t.numel()} elements; per-channel "
                       f"(mode 0) needs N_kv * D = {dims.num_kv_heads * dims.head_dim}")
        return t.reshape(dims.num_kv_heads, dims.head_dim).float()
    want = [dims.batch, dims.kv_len]
    if list(t.shape[-2:]) != want or t.numel() != dims.batch * dims.kv_len:
        raise _err(f"{name} shape {list(t.shape)} must be [1, B, S_kv] or [B, S_kv] = {want} "
                   f"for per-token antiquant (mode 1)")
    return t.reshape(dims.batch, dims.kv_len).float()


def _antiquant(a: dict, plan: IfaPlan) -> tuple[KvQuant | None, KvQuant | None]:
    dims, layout = plan.dims, plan.layout
    combined = {n: a[n] for n in ("antiquant_scale", "antiquant_offset")}
    separate = {n: a[n] for n in ("key_antiquant_scale", "key_antiquant_offset",
                                  "value_antiquant_scale", "value_antiquant_offset")}
    given = [n for n, t in {**combined, **separate}.items() if t is not None]
    if not plan.kv_int8:
        if given:
            raise _err(f"{given[0]} is only used with int8 key/value (antiquant); key/value are "
                       f"floating, pass {given[0]}=None")
        return None, None
    for name in ("antiquant_mode", "key_antiquant_mode", "value_antiquant_mode"):
        if a[name] not in ANTIQUANT_MODES:
            raise NotImplementedError(f"{OP}: {name}={a[name]} is not implemented; torchair "
                                      f"supports 0 (per-channel) and 1 (per-token)")
    if combined["antiquant_scale"] is not None:
        if any(t is not None for t in separate.values()):
            raise _err("pass either antiquant_scale/antiquant_offset (key and value together) or "
                       "key_antiquant_*/value_antiquant_* (separately), not both")
        mode = a["antiquant_mode"]
        scale, offset = combined["antiquant_scale"], combined["antiquant_offset"]
        if mode == 0:
            with ifa_errors_as_fia():
                _ifa.check_antiquant(True, scale, offset, layout, dims.num_kv_heads,
                                      dims.head_dim)
        for name, t in combined.items():
            if t is not None and (t.dim() < 1 or t.shape[0] != 2):
                raise _err(f"{name} shape {list(t.shape)} must have first dim 2 (0 key, 1 value)")
        out = []
        for i in (0, 1):
            s = _quant_tensor("antiquant_scale", scale[i], mode, dims)
            o = None if offset is None else _quant_tensor("antiquant_offset", offset[i], mode, dims)
            out.append(KvQuant(mode, s, o))
        return out[0], out[1]
    if combined["antiquant_offset"] is not None:
        raise _err("antiquant_offset needs antiquant_scale")
    out = []
    for kind in ("key", "value"):
        scale, offset = separate[f"{kind}_antiquant_scale"], separate[f"{kind}_antiquant_offset"]
        mode = a[f"{kind}_antiquant_mode"]
        if scale is None:
            raise _err(f"int8 key/value need antiquant_scale, or key_antiquant_scale and "
                       f"value_antiquant_scale; {kind}_antiquant_scale is missing")
        s = _quant_tensor(f"{kind}_antiquant_scale", scale, mode, dims)
        o = None if offset is None else _quant_tensor(f"{kind}_antiquant_offset", offset, mode,
                                                      dims)
        out.append(KvQuant(mode, s, o))
    return out[0], out[1]


def validate(a: dict) -> FiaPlan:
    """Check every argument (a dict of the schema's names); return the plan (eager only)."""
    query, key, value = a["query"], a["key"], a["value"]
    _check_not_implemented(a)
    _check_scalars(a["sparse_mode"], a["inner_precise"], a["pre_tokens"], a["next_tokens"],
                   a["atten_mask"])
    layout, block_table = a["input_layout"], a["block_table"]
    paged = block_table is not None
    with ifa_errors_as_fia():
        _ifa.check_ranks(query, key, value, layout, paged)
        kv_int8 = _ifa.check_dtypes(query, key, value)
        if paged:
            num_kv = _common.check_head_counts(OP, a["num_heads"], a["num_key_value_heads"])
            batch, q_len, head_dim = _common.query_dims(OP, query, layout, a["num_heads"])
            with ifa_errors_as_fia(kv_lengths=True):
                kv_len = _ifa.check_paged(query, key, block_table, a["block_size"],
                                           a["actual_seq_lengths_kv"], kv_int8, batch, num_kv,
                                           head_dim)
            dims = _common.AttentionDims(batch, a["num_heads"], num_kv, q_len, kv_len, head_dim)
        else:
            dims = _common.attention_dims(OP, query, key, value, num_heads=a["num_heads"],
                                          num_key_value_heads=a["num_key_value_heads"],
                                          input_layout=layout)
        _ifa.check_quant({n: a[n] for n in ("dequant_scale1", "quant_scale1", "dequant_scale2",
                                             "quant_scale2", "quant_offset2")},
                          dims.num_heads, dims.head_dim)
        if a["pse_shift"] is not None:
            _ifa.check_pse(a["pse_shift"], query, dims)
    kv_lengths = _kv_lengths(a["actual_seq_lengths_kv"], dims, query.device)
    padding = None
    if a["kv_padding_size"] is not None:
        with ifa_errors_as_fia():
            _ifa.check_kv_padding(a["kv_padding_size"], dims.batch, query.device)
        if kv_lengths is not None:
            padding = a["kv_padding_size"].reshape(-1).to(torch.int64)
    ifa = IfaPlan(dims, layout, paged, paged and key.dim() == 4, kv_int8, kv_lengths, padding,
                  None)
    k_quant, v_quant = _antiquant(a, ifa)
    pre, nxt = int(a["pre_tokens"]), int(a["next_tokens"])
    if a["sparse_mode"] == 0 and a["atten_mask"] is None:
        pre = nxt = INT_MAX  # Ascend: defaultMask without a mask masks nothing, the band ignored
    return FiaPlan(ifa, _q_lengths(a["actual_seq_lengths"], dims, query.device),
                   _atten_mask(a["atten_mask"], a["sparse_mode"], dims, query.device),
                   a["sparse_mode"], pre, nxt, k_quant, v_quant)
