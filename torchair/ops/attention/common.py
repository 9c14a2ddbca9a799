"""Helpers shared by the attention ops: layouts, shape validation, masks and the softmax core.

Everything here works in the canonical ``BNSD`` layout: query ``[B, N, S_q, D]``, key/value
``[B, N_kv, S_kv, D]``. The device-side helpers (:func:`length_mask`, :func:`masked_attention`)
never read tensor values on the host, so they may run inside a CUDA graph capture.
"""
from __future__ import annotations

import dataclasses

import torch

from torchair.ops import _device_checks

LAYOUT_RANKS = {"BSH": 3, "BNSD": 4, "BSND": 4}
MASK_DTYPES = (torch.bool, torch.int8, torch.uint8)
MAX_GQA_RATIO = 64


@dataclasses.dataclass(frozen=True)
class AttentionDims:
    """The sizes of one attention call, read from the shapes of query and key."""

    batch: int
    num_heads: int
    num_kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int


def check_layout_ranks(op: str, query, key, value, input_layout: str) -> None:
    """Check the layout string and the tensor ranks; never guards on sizes (safe in fake kernels)."""
    if input_layout not in LAYOUT_RANKS:
        raise ValueError(f"{op}: input_layout={input_layout!r} is not supported; "
                         f"expected one of {sorted(LAYOUT_RANKS)}")
    rank = LAYOUT_RANKS[input_layout]
    ranks = {"query": query.dim(), "key": key.dim(), "value": value.dim()}
    if any(r != rank for r in ranks.values()):
        raise ValueError(f"{op}: input_layout={input_layout!r} needs {rank}-D query, key and value; "
                         f"got ranks {ranks}. Use 'BSH' for 3-D inputs and 'BNSD'/'BSND' for 4-D")


def check_head_counts(op: str, num_heads: int, num_key_value_heads: int) -> int:
    """Validate ``num_heads`` / ``num_key_value_heads``; return ``N_kv`` (0 means ``N``)."""
    if num_heads < 1:
        raise ValueError(f"{op}: num_heads={num_heads} must be >= 1")
    if num_key_value_heads < 0:
        raise ValueError(f"{op}: num_key_value_heads={num_key_value_heads} must be >= 0 "
                         f"(0 means the same as num_heads)")
    num_kv = num_key_value_heads or num_heads
    if num_heads % num_kv != 0:
        raise ValueError(f"{op}: num_key_value_heads={num_kv} must divide num_heads={num_heads}")
    if num_heads // num_kv > MAX_GQA_RATIO:
        raise ValueError(f"{op}: num_heads / num_key_value_heads = {num_heads}/{num_kv} = "
                         f"{num_heads // num_kv} exceeds the maximum ratio {MAX_GQA_RATIO}")
    return num_kv


def query_dims(op: str, query: torch.Tensor, input_layout: str,
               num_heads: int) -> tuple[int, int, int]:
    """``(B, S_q, D)`` of ``query`` in ``input_layout``; checks its N against ``num_heads``."""
    if input_layout == "BSH":
        batch, q_len, hidden = query.shape
        if hidden % num_heads != 0:
            raise ValueError(f"{op}: input_layout='BSH' needs query H={hidden} divisible by "
                             f"num_heads={num_heads}")
        return batch, q_len, hidden // num_heads
    if input_layout == "BNSD":
        batch, q_heads, q_len, head_dim = query.shape
    else:  # BSND
        batch, q_len, q_heads, head_dim = query.shape
    if q_heads != num_heads:
        raise ValueError(f"{op}: num_heads={num_heads} must equal the N of query "
                         f"{list(query.shape)} ({input_layout}), which is {q_heads}")
    return batch, q_len, head_dim


def attention_dims(op: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                   num_heads: int, num_key_value_heads: int, input_layout: str) -> AttentionDims:
    """Validate the shapes of query/key/value against the layout and head counts (eager only)."""
    check_layout_ranks(op, query, key, value, input_layout)
    if tuple(key.shape) != tuple(value.shape):
        raise ValueError(f"{op}: key and value must have the same shape; got key "
                         f"{list(key.shape)} and value {list(value.shape)}")
    num_kv = check_head_counts(op, num_heads, num_key_value_heads)
    batch, q_len, head_dim = query_dims(op, query, input_layout, num_heads)
    if input_layout == "BSH":
        kv_batch, kv_len, kv_hidden = key.shape
        if kv_hidden != num_kv * head_dim:
            raise ValueError(f"{op}: key H={kv_hidden} must equal num_key_value_heads * D = "
                             f"{num_kv} * {head_dim} = {num_kv * head_dim} (D = query H / num_heads)")
        kv_dim = head_dim
    else:
        if input_layout == "BNSD":
            kv_batch, kv_heads, kv_len, kv_dim = key.shape
        else:  # BSND
            kv_batch, kv_len, kv_heads, kv_dim = key.shape
        if kv_heads != num_kv:
            raise ValueError(f"{op}: key N={kv_heads} must equal num_key_value_heads={num_kv} "
                             f"(key shape {list(key.shape)}, {input_layout})")
    if kv_dim != head_dim:
        raise ValueError(f"{op}: key D={kv_dim} must equal query D={head_dim}")
    if kv_batch != batch:
        raise ValueError(f"{op}: key batch B={kv_batch} must equal query batch B={batch}")
    return AttentionDims(batch, num_heads, num_kv, q_len, kv_len, head_dim)


def to_bnsd(x: torch.Tensor, input_layout: str, heads: int) -> torch.Tensor:
    """View ``x`` (query, key or value in ``input_layout``) as ``[B, heads, S, D]``."""
    if input_layout == "BSH":
        b, s, h = x.shape
        return x.reshape(b, s, heads, h // heads).transpose(1, 2)
    if input_layout == "BSND":
        return x.transpose(1, 2)
    return x


def from_bnsd(x: torch.Tensor, input_layout: str) -> torch.Tensor:
    """Bring a ``[B, N, S, D]`` result back to ``input_layout`` (a contiguous tensor)."""
    if input_layout == "BSH":
        b, n, s, d = x.shape
        return x.transpose(1, 2).reshape(b, s, n * d)
    if input_layout == "BSND":
        return x.transpose(1, 2).contiguous()
    return x.contiguous()


def normalize_atten_mask(op: str, atten_mask: torch.Tensor, dims: AttentionDims,
                         device: torch.device) -> torch.Tensor:
    """``atten_mask`` as a bool tensor broadcastable to ``[B, N, S_q, S_kv]``; True = masked out.

    Accepted ranks: 2 (``[B, S_kv]``), 3 (``[B, S_q, S_kv]``) and 4 (``[B, N, S_q, S_kv]``); every
    dimension but the last may also be 1.
    """
    if atten_mask.dtype not in MASK_DTYPES:
        raise ValueError(f"{op}: atten_mask dtype {atten_mask.dtype} is not supported; expected one "
                         f"of {list(MASK_DTYPES)} (nonzero = masked out)")
    if atten_mask.device != device:
        raise ValueError(f"{op}: atten_mask is on {atten_mask.device} but query is on {device}; "
                         f"move it to the query's device")
    shape = list(atten_mask.shape)
    if atten_mask.dim() == 2:
        mask = atten_mask.view(shape[0], 1, 1, shape[1])
    elif atten_mask.dim() == 3:
        mask = atten_mask.view(shape[0], 1, shape[1], shape[2])
    elif atten_mask.dim() == 4:
        mask = atten_mask
    else:
        raise ValueError(f"{op}: atten_mask must be 2-D [B, S], 3-D [B, S_q, S] or 4-D "
                         f"[B, N, S_q, S]; got shape {shape}")
    target = (dims.batch, dims.num_heads, dims.q_len, dims.kv_len)
    ok = mask.shape[-1] == dims.kv_len and all(m in (1, t) for m, t in zip(mask.shape[:3], target))
    if not ok:
        raise ValueError(f"{op}: atten_mask shape {shape} does not broadcast to [B, N, S_q, S_kv] = "
                         f"{list(target)}; its last dimension must be S_kv={dims.kv_len} and the "
                         f"others the full size or 1")
    return mask.to(torch.bool) if mask.dtype != torch.bool else mask


def seq_lengths_tensor(op: str, lengths, batch: int, device: torch.device) -> torch.Tensor | None:
    """``actual_seq_lengths`` (list of ints or a 1-D integer tensor) as an int64 device tensor.

    The count is checked here; a tensor's values must be >= 0, checked by
    :func:`torchair.ops._device_checks.check_nonnegative_lengths` (a CPU tensor is read on the
    host; a CUDA tensor inside a graph capture is checked by a device flag, never read there).
    """
    if lengths is None:
        return None
    if isinstance(lengths, torch.Tensor):
        if lengths.dim() != 1 or lengths.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"{op}: actual_seq_lengths must be a 1-D int64 tensor; got shape "
                             f"{list(lengths.shape)} and dtype {lengths.dtype}")
        if lengths.device != device:
            raise ValueError(f"{op}: actual_seq_lengths is on {lengths.device} but query is on "
                             f"{device}; move it to the query's device")
        count = lengths.shape[0]
    else:
        lengths = list(lengths)
        count = len(lengths)
    if count not in (batch, 1):
        raise ValueError(f"{op}: actual_seq_lengths has {count} entries; expected B={batch} "
                         f"(one per batch) or 1 (shared by all batches)")
    if isinstance(lengths, torch.Tensor):
        _device_checks.check_nonnegative_lengths(op, "actual_seq_lengths", lengths)
        return lengths.to(torch.int64)
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        # a host list inside someone else's CUDA graph capture (torch.compile's
        # mode="reduce-overhead" records one graph per set of lengths): a copy from pageable
        # memory cannot be captured, one from pinned memory can; the graph reads that memory
        # at each replay, so it is kept for the life of the process
        host = torch.tensor(lengths, dtype=torch.int64, pin_memory=True)
        _CAPTURED_HOST_LISTS.append(host)
        return host.to(device, non_blocking=True)
    return torch.tensor(lengths, dtype=torch.int64, device=device)


# host lists copied inside a CUDA graph capture (seq_lengths_tensor): their pinned memory stays
_CAPTURED_HOST_LISTS: list[torch.Tensor] = []


def length_mask(lengths: torch.Tensor, kv_len: int) -> torch.Tensor:
    """``[B or 1, 1, 1, S_kv]`` bool mask, True where position >= the batch's length (device-only)."""
    positions = torch.arange(kv_len, device=lengths.device)
    return (positions[None, :] >= lengths[:, None]).view(-1, 1, 1, kv_len)


def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """The union of the given bool masks (None entries are skipped)."""
    present = [m for m in masks if m is not None]
    if not present:
        return None
    out = present[0]
    for m in present[1:]:
        out = out | m
    return out


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     masked: torch.Tensor | None, scale: float,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """``softmax(q k^T * scale + bias, masked -> -inf) v`` in float32 (float64 for float64 inputs).

    ``q`` is ``[B, N, S_q, D]``, ``k``/``v`` ``[B, N_kv, S_kv, D]`` with ``N % N_kv == 0`` (query
    head ``h`` reads kv head ``h // (N // N_kv)``), ``masked`` and the additive ``bias`` (e.g. a
positional ``pse_shift``) broadcast to ``[B, N, S_q, S_kv]``.
    A row with every position masked yields zeros. Returns ``[B, N, S_q, D]`` in the compute dtype.

    Masked positions are never read into the result: their scores are replaced (``masked_fill``,
    so a NaN/inf key or bias there never reaches the max), and the value rows of positions that
    every query row and head of a kv group masks (KV window, lengths, padding, unused blocks,
    a per-batch mask) are replaced by zeros before ``probs @ v`` (0 * NaN would be NaN). A
    position some row of the group keeps is data of the batch and is used as it is.
    """
    b, n, s_q, d = q.shape
    n_kv, s_kv = k.shape[1], k.shape[2]
    group = n // n_kv
    compute = torch.promote_types(q.dtype, torch.float32)
    # Heads h = kv * group + g, so [B, N, S_q] regroups as [B, N_kv, group * S_q] without a copy
    # of key/value (each kv head serves its group of query heads in one matmul).
    qf = q.to(compute).reshape(b, n_kv, group * s_q, d)
    scores = torch.matmul(qf, k.to(compute).transpose(-1, -2)) * scale
    scores = scores.view(b, n, s_q, s_kv)
    if bias is not None:
        scores = scores + bias.to(compute)
    if masked is not None:
        scores = scores.masked_fill(masked, float("-inf"))
    # clamp: a fully masked row has max -inf; exp(-inf - finite) = 0 keeps it NaN-free.
    row_max = scores.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(compute).min)
    probs = torch.exp(scores - row_max)
    # Any row with an unmasked position has sum >= 1 (its max contributes exp(0) = 1); a fully
    # masked row has sum 0 and, divided by 1, stays all zeros.
    probs = probs / probs.sum(dim=-1, keepdim=True).clamp_min(1.0)
    if masked is not None:
        v = v.masked_fill(_dead_positions(masked, n_kv, s_kv)[..., None], 0)
    out = torch.matmul(probs.view(b, n_kv, group * s_q, s_kv), v.to(compute))
    return out.view(b, n, s_q, d)



def _dead_positions(masked: torch.Tensor, n_kv: int, s_kv: int) -> torch.Tensor:
    """``[B or 1, N_kv or 1, S_kv]`` bool: positions ``masked`` (broadcastable to
    ``[B, N, S_q, S_kv]``) masks for every query row and every head of the kv group."""
    m = masked.expand(*masked.shape[:-1], s_kv)
    batch, heads, rows = m.shape[:3]
    if heads == 1:
        return m.all(dim=2)
    return m.reshape(batch, n_kv, (heads // n_kv) * rows, s_kv).all(dim=2)
