"""``scatter_update_`` / ``scatter_update``: write KV-cache slots at per-batch positions, as in
torch_npu.

``scatter_update_(self, indices, updates, axis)`` writes ``self`` in place and returns it;
``scatter_update`` returns a new tensor and leaves ``self`` unchanged. With ``a`` the axis
(negative counts from the end; it may not be dim 0, the batch dim) and ``e = updates.shape[a]``
(the number of slots written per row)::

    indices [B]     (1-D, one start position per batch; B == self.shape[0] == updates.shape[0])
        self[b, ..., indices[b] + k, ...] = updates[b, ..., k, ...]         k in [0, e)
    indices [M, 2]  (2-D, rows of (batch, start position); M == updates.shape[0])
        self[indices[m, 0], ..., indices[m, 1] + k, ...] = updates[m, ..., k, ...]

``updates`` has ``self``'s rank and, but for dim 0 (2-D indices) and dim ``a``, its sizes;
``e <= self.shape[a]``. A KV cache ``[B, S, N, D]`` takes axis 1 (or -3), ``[B, N, S, D]`` axis 2
(or -2); a decode step writes ``updates`` ``[B, 1, N, D]`` at ``indices = positions``; page
attention writes ``[num_tokens, 1, H]`` tokens into a ``[num_blocks, block_size, H]`` cache with
``indices = stack([slot // block_size, slot % block_size], 1)`` and axis -2.

dtypes (torch_npu): ``self``/``updates`` int8, int32, float16, bfloat16, float32, one dtype;
``indices`` int32 or int64; ranks 2-8; no empty tensors.

Indices out of range: torch_npu neither supports nor checks them. Here a start position below 0,
a window past ``self.shape[a]`` (``indices + e > self.shape[a]``) or a batch id outside
``[0, self.shape[0])`` is a ``ValueError`` naming ``indices`` in eager, and in every compiled
graph that runs the op's kernel (the FX engine, Inductor and the CPU static unit call it). Inside
a CUDA-graph capture the values cannot be read on the host: there a negative position is mapped
past the end, so that PyTorch's device-side bounds assert of ``index_put_`` fires ("index out of
bounds"; it ends the CUDA context). Nothing writes out of bounds silently. Duplicate targets (2-D
indices naming one slot twice) write one of the updates, which one is unspecified (as on Ascend
and CUDA); the reference writes them in order (the last wins).

Kernels: :func:`scatter_update_reference` loops over the rows in plain PyTorch (the oracle);
the eager kernels issue one ``index_put_`` (:mod:`torchair.ops.cache.cpu`), on CPU and CUDA
alike (a memory-bound copy of ``B * e`` slots: a Triton kernel would not beat it).
"""
from __future__ import annotations

import torch

from torchair.ops.cache import cpu as _fast
from torchair.ops.cache._inplace import define_inplace_pair
from torchair.ops.cache.checks import check_write_dtypes

__all__ = ["check_scatter_update_args", "scatter_update", "scatter_update_",
           "scatter_update_reference"]

OP = "scatter_update"
DTYPES = (torch.int8, torch.int32, torch.float16, torch.bfloat16, torch.float32)

_SCHEMA = f"{OP}(Tensor self, Tensor indices, Tensor updates, int axis) -> Tensor"


def _known(x) -> bool:
    return isinstance(x, int)


def check_scatter_update_args(self: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor,
                              axis: int, op: str = OP) -> int:
    """Check dtypes, ranks and shapes (never values); return the axis as a non-negative dim.
    Sizes that are symbolic are not compared (no guard is added)."""
    check_write_dtypes(op, self, indices, updates, DTYPES)
    rank = self.dim()
    if not 2 <= rank <= 8:
        raise ValueError(f"{op}: self has rank {rank} (shape {list(self.shape)}); expected 2 to "
                         f"8 dims")
    if updates.dim() != rank:
        raise ValueError(f"{op}: updates has rank {updates.dim()} but self has rank {rank}; "
                         f"updates must have self's rank (e.g. [B, 1, N, D] for a [B, S, N, D] "
                         f"cache)")
    if not -rank <= axis < rank:
        raise ValueError(f"{op}: axis={axis} is out of range for self of rank {rank}; expected "
                         f"an axis in [-{rank}, {rank})")
    a = axis % rank
    if a == 0:
        raise ValueError(f"{op}: axis={axis} is dim 0, the batch dim that indices address; "
                         f"pass the sequence axis (1 or -3 for [B, S, N, D], 2 or -2 for "
                         f"[B, N, S, D])")
    if indices.dim() == 1:
        rows, what = self.shape[0], "self.shape[0] (1-D indices: one start position per batch)"
    elif indices.dim() == 2:
        if _known(indices.shape[1]) and indices.shape[1] != 2:
            raise ValueError(f"{op}: indices has shape {list(indices.shape)}; 2-D indices must be "
                             f"[M, 2] rows of (batch, start position)")
        rows, what = indices.shape[0], "indices.shape[0] (2-D indices: one row per update)"
    else:
        raise ValueError(f"{op}: indices has rank {indices.dim()}; expected 1-D [B] (start "
                         f"positions) or 2-D [M, 2] (batch, start position)")
    if _known(indices.shape[0]) and _known(updates.shape[0]) and indices.shape[0] != \
            updates.shape[0]:
        raise ValueError(f"{op}: updates.shape[0]={updates.shape[0]} but indices has "
                         f"{indices.shape[0]} rows; one update row per index row")
    if _known(rows) and _known(updates.shape[0]) and rows != updates.shape[0]:
        raise ValueError(f"{op}: updates.shape[0]={updates.shape[0]} must equal {what} = {rows}")
    for d in range(1, rank):
        u, s = updates.shape[d], self.shape[d]
        if not (_known(u) and _known(s)):
            continue
        if d == a and u > s:
            raise ValueError(f"{op}: updates.shape[{d}]={u} slots along axis {axis} do not fit "
                             f"self.shape[{d}]={s}")
        if d != a and u != s:
            raise ValueError(f"{op}: updates has shape {list(updates.shape)} and self "
                             f"{list(self.shape)}; they must agree on every dim but 0 and the "
                             f"axis {a}")
    if indices.numel() == 0 or updates.numel() == 0 or self.numel() == 0:
        raise ValueError(f"{op}: empty tensors are not supported (self {list(self.shape)}, "
                         f"indices {list(indices.shape)}, updates {list(updates.shape)})")
    return a


def _targets(indices: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(batch ids or None for 1-D indices, start positions), int64."""
    idx = indices.to(torch.int64)
    if idx.dim() == 1:
        return None, idx
    return idx[:, 0], idx[:, 1]


def check_index_values(self: torch.Tensor, indices: torch.Tensor, a: int, e: int,
                       op: str = OP) -> None:
    """The bounds of the index values, read on the host (ValueError naming ``indices``): one
    min/max reduction, the offending row is looked for only on failure."""
    size = self.shape[a]
    if indices.dim() == 1:
        lo, hi = (int(x) for x in torch.aminmax(indices))
        ok = lo >= 0 and hi + e <= size
    else:
        lo, hi = (x.tolist() for x in torch.aminmax(indices, dim=0))
        ok = lo[0] >= 0 and hi[0] < self.shape[0] and lo[1] >= 0 and hi[1] + e <= size
    if ok:
        return
    batch, start = _targets(indices)
    bad = (start < 0) | (start + e > size)
    if batch is not None:
        bad = bad | (batch < 0) | (batch >= self.shape[0])
    row = int(bad.nonzero()[0, 0])
    got = indices[row].tolist()
    where = f"a batch id in [0, {self.shape[0]}) and " if batch is not None else ""
    raise ValueError(f"{op}: indices[{row}]={got} is out of range; expected {where}a start "
                     f"position p with 0 <= p and p + {e} <= self.shape[{a}]={size} "
                     f"(updates write {e} slot(s) along axis {a})")


def scatter_update_reference(self: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor,
                             axis: int) -> torch.Tensor:
    """Plain-PyTorch ``scatter_update`` (the oracle): a new tensor, rows written in order."""
    a = check_scatter_update_args(self, indices, updates, axis)
    e = updates.shape[a]
    check_index_values(self, indices, a, e)
    out = self.clone()
    batch, start = _targets(indices)
    for row in range(updates.shape[0]):
        b = row if batch is None else int(batch[row])
        out.select(0, b).narrow(a - 1, int(start[row]), e).copy_(updates.select(0, row))
    return out


def _write(self: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor, axis: int) -> None:
    a = check_scatter_update_args(self, indices, updates, axis)
    e = updates.shape[a]
    capturing = self.is_cuda and torch.cuda.is_current_stream_capturing()
    if not capturing:
        check_index_values(self, indices, a, e)
    _fast.scatter_update_into(self, indices, updates, a, device_checked=capturing)


def _inplace(self, indices, updates, axis):
    _write(self, indices, updates, axis)
    return self


def _functional(self, indices, updates, axis):
    out = self.clone()
    _write(out, indices, updates, axis)
    return out


def _fake(self, indices, updates, axis):
    check_scatter_update_args(self, indices, updates, axis)
    return torch.empty_like(self)


scatter_update, scatter_update_ = define_inplace_pair(_SCHEMA, fake=_fake, kernel=_functional,
                                                      inplace_kernel=_inplace)
