"""The eager kernels of the cache-write ops: one ATen ``index_put_`` per call, CPU and CUDA.

These ops are hot in decode (two calls per layer per step) and move only ``B * e`` slots, so the
kernel is a single indexed copy: no Python loop over the batch, no host read of the indices.
``index_put_`` without ``accumulate`` leaves the winner of duplicate targets unspecified (as
Ascend does). On CUDA the same call runs PyTorch's indexing kernel, which already moves the
slots at memory speed: there is no Triton kernel for these ops.
"""
from __future__ import annotations

import torch

__all__ = ["scatter_nd_update_into", "scatter_update_into"]


def scatter_update_into(self: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor, a: int,
                        *, device_checked: bool = False) -> None:
    """``self[batch, ..., start + k, ...] = updates[row, ..., k, ...]`` for every row (see
    :mod:`torchair.ops.cache.scatter_update`); ``a`` is the non-negative axis.

    ``device_checked``: the index values were not checked on the host (CUDA-graph capture);
    negative positions are then sent past the end so that ``index_put_``'s device-side bounds
    assert catches them instead of wrapping around."""
    idx = indices if indices.dtype == torch.int64 else indices.long()
    if idx.device != self.device:
        idx = idx.to(self.device)
    if idx.dim() == 1:
        batch = torch.arange(idx.shape[0], device=self.device).view(-1, 1)
        pos = idx.view(-1, 1)
    else:
        batch, pos = idx[:, :1], idx[:, 1:]
    e = updates.shape[a]
    if e > 1:
        pos = pos + torch.arange(e, device=self.device).view(1, -1)  # [rows, e]
    if device_checked:
        pos = torch.where(pos < 0, self.shape[a], pos)
        batch = torch.where(batch < 0, self.shape[0], batch)
    index: list[torch.Tensor | None] = [None] * (a + 1)  # trailing dims: whole slices
    index[0], index[a] = batch, pos
    # the two advanced indices give [rows, e] in front of the remaining dims (also when a == 1)
    values = updates if a == 1 else updates.movedim(a, 1)
    torch.ops.aten.index_put_.default(self, index, values)


def scatter_nd_update_into(self: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor,
                           *, device_checked: bool = False) -> None:
    """``self[tuple(indices[i])] = updates[i]`` for every index row ``i`` (TensorFlow's
    scatter_nd update; ``indices[..., :K]`` address the first K dims). ``device_checked``: as
    :func:`scatter_update_into` (negative indices are sent past the end, no host tensor is made:
    a host-to-device copy is not allowed while capturing)."""
    idx = indices if indices.dtype == torch.int64 else indices.long()
    if idx.device != self.device:
        idx = idx.to(self.device)
    columns = idx.unbind(-1)
    if device_checked:
        columns = tuple(torch.where(col < 0, self.shape[j], col) for j, col in enumerate(columns))
    self.index_put_(columns, updates)
