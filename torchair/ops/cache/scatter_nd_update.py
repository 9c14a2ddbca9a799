"""``npu_scatter_nd_update_`` / ``npu_scatter_nd_update``: TensorFlow's scatter_nd update, as in
torch_npu.

``npu_scatter_nd_update_(self, indices, updates)`` writes ``self`` in place and returns it;
``npu_scatter_nd_update`` returns a new tensor. With ``K = indices.shape[-1]``::

    self[indices[i0, ..., iq, 0], ..., indices[i0, ..., iq, K-1]] = updates[i0, ..., iq]

``indices`` has rank >= 2 and ``K <= self.dim()``; each of its rows addresses the first K dims of
``self`` and writes the slice ``self.shape[K:]``, so ``updates.shape == indices.shape[:-1] +
self.shape[K:]`` (e.g. self [4, 5, 6], indices [3, 2] -> updates [3, 6]). A paged KV cache
``[num_slots, N, D]`` written with ``indices = slot_mapping[:, None]`` and ``updates`` ``[T, N, D]``
is the usual call.

dtypes (torch_npu): ``self``/``updates`` float32, float16, bfloat16, bool, int64, int8 (one dtype),
ranks 1-8; ``indices`` int32 or int64.

Indices out of range (torch_npu: not supported): an index below 0 or at/after the dim's size is
a ``ValueError`` naming ``indices`` in eager and in compiled graphs that run the kernel (FX
engine, Inductor, CPU static unit); in a CUDA-graph capture, where values cannot be read on the
host, negative indices are mapped past the end so that ``index_put_``'s device-side bounds
assert fires instead of wrapping around. Duplicate rows write one of their updates, which one is
unspecified (TensorFlow's rule too); the reference writes rows in order (the last wins).

Kernels: :func:`scatter_nd_update_reference` (a loop over the index rows, the oracle); the eager
kernels issue one ``index_put_`` (:mod:`torchair.ops.cache.cpu`) on CPU and CUDA.
"""
from __future__ import annotations

import torch

from torchair.ops.cache import cpu as _fast
from torchair.ops.cache._inplace import define_inplace_pair
from torchair.ops.cache.checks import check_write_dtypes

__all__ = ["check_scatter_nd_update_args", "npu_scatter_nd_update", "npu_scatter_nd_update_",
           "scatter_nd_update_reference"]

OP = "npu_scatter_nd_update"
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.bool, torch.int64, torch.int8)

_SCHEMA = f"{OP}(Tensor self, Tensor indices, Tensor updates) -> Tensor"


def check_scatter_nd_update_args(self: torch.Tensor, indices: torch.Tensor,
                                 updates: torch.Tensor, op: str = OP) -> int:
    """Check dtypes, ranks and shapes (never values); return K. Symbolic sizes are compared only
    where both are plain ints (no guard is added)."""
    check_write_dtypes(op, self, indices, updates, DTYPES)
    if not 1 <= self.dim() <= 8:
        raise ValueError(f"{op}: self has rank {self.dim()}; expected 1 to 8 dims")
    if indices.dim() < 2:
        raise ValueError(f"{op}: indices has shape {list(indices.shape)}; expected rank >= 2 "
                         f"[..., K] (K index columns per row; e.g. slots[:, None])")
    k = indices.shape[-1]
    if not isinstance(k, int):
        raise ValueError(f"{op}: the last dim of indices (K) must be static; got {k}")
    if not 1 <= k <= self.dim():
        raise ValueError(f"{op}: indices.shape[-1]={k} must be in [1, self.dim()={self.dim()}] "
                         f"(the number of leading dims of self each row addresses)")
    want = list(indices.shape[:-1]) + list(self.shape[k:])
    got = list(updates.shape)
    if len(got) != len(want) or any(isinstance(g, int) and isinstance(w, int) and g != w
                                    for g, w in zip(got, want)):
        raise ValueError(f"{op}: updates has shape {got}; expected indices.shape[:-1] + "
                         f"self.shape[{k}:] = {want}")
    return k


def check_index_values(self: torch.Tensor, indices: torch.Tensor, op: str = OP) -> None:
    """Index bounds, read on the host (ValueError naming ``indices``)."""
    k = indices.shape[-1]
    idx = indices.reshape(-1, k).to(torch.int64)
    sizes = torch.tensor(list(self.shape[:k]), dtype=torch.int64, device=idx.device)
    bad = ((idx < 0) | (idx >= sizes)).any(dim=1)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ValueError(f"{op}: index row {row} of indices (flattened over its leading dims) is "
                         f"{idx[row].tolist()}, out of range for self.shape[:{k}]="
                         f"{list(self.shape[:k])}; every index must be in [0, size) (negative "
                         f"indices do not wrap)")


def scatter_nd_update_reference(self: torch.Tensor, indices: torch.Tensor,
                                updates: torch.Tensor) -> torch.Tensor:
    """Plain-PyTorch ``npu_scatter_nd_update`` (the oracle): a new tensor, rows in order."""
    k = check_scatter_nd_update_args(self, indices, updates)
    check_index_values(self, indices)
    out = self.clone()
    rows = indices.reshape(-1, k).tolist()
    values = updates.reshape(len(rows), *self.shape[k:])
    for row, value in zip(rows, values):
        out[tuple(row)] = value
    return out


def _write(self, indices, updates) -> None:
    check_scatter_nd_update_args(self, indices, updates)
    capturing = self.is_cuda and torch.cuda.is_current_stream_capturing()
    if not capturing:
        check_index_values(self, indices)
    _fast.scatter_nd_update_into(self, indices, updates, device_checked=capturing)


def _inplace(self, indices, updates):
    _write(self, indices, updates)
    return self


def _functional(self, indices, updates):
    out = self.clone()
    _write(out, indices, updates)
    return out


def _fake(self, indices, updates):
    check_scatter_nd_update_args(self, indices, updates)
    return torch.empty_like(self)


npu_scatter_nd_update, npu_scatter_nd_update_ = define_inplace_pair(
    _SCHEMA, fake=_fake, kernel=_functional, inplace_kernel=_inplace)
