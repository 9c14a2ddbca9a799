"""Padding a batch up to a graph batch size: the rule a serving loop needs next to gears.

A graph compiled with batch gears (:func:`torchair.inference.set_dim_gears`) or one graph per
batch size (vllm-ascend's ``graph_batch_sizes``) runs only at those sizes. A serving loop with
``n`` live requests therefore pads its batch up to the smallest graph size ``>= n`` and drops the
padded rows' outputs::

    padded = pad_batch(len(requests), [1, 2, 4, 8], seq_lens=[r.kv_len for r in requests])
    tokens = padded.pad(tokens)                   # [n, ...] -> [padded.size, ...], zeros
    lens = padded.pad(kv_lens, value=1)           # padded rows attend over one position
    out = step(tokens, ..., lens)[padded.mask]    # the real rows' results

``graph_batch_size`` is the rule alone; ``split_batch`` cuts a batch larger than every size into
graph-sized pieces (a loop that would rather refuse calls ``pad_batch``, whose error names the
sizes). Padded rows must not write where real rows read: give them a null block / slot.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

__all__ = ["PaddedBatch", "graph_batch_size", "pad_batch", "split_batch"]


def _sizes(graph_batch_sizes: Sequence[int]) -> list[int]:
    """The sizes, checked and sorted."""
    if isinstance(graph_batch_sizes, (str, bytes)) or not isinstance(graph_batch_sizes, Sequence):
        raise TypeError(f"graph_batch_sizes must be a list of positive ints such as [1, 2, 4, 8], "
                        f"got {graph_batch_sizes!r}")
    if not graph_batch_sizes:
        raise ValueError("graph_batch_sizes is empty: give at least one graph batch size, e.g. "
                         "[1, 2, 4, 8]")
    for size in graph_batch_sizes:
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"graph_batch_sizes must hold positive ints, got {size!r} in "
                             f"{list(graph_batch_sizes)}")
    return sorted(set(graph_batch_sizes))


def _batch(batch: int) -> int:
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"batch must be a positive int (the live requests), got {batch!r}")
    return batch


def graph_batch_size(batch: int, graph_batch_sizes: Sequence[int]) -> int:
    """The smallest of ``graph_batch_sizes`` that is ``>= batch``.

    ValueError when ``batch`` is larger than every size: the message names the sizes and the two
    fixes (a larger graph size, or :func:`split_batch`).
    """
    sizes, batch = _sizes(graph_batch_sizes), _batch(batch)
    for size in sizes:
        if size >= batch:
            return size
    raise ValueError(f"batch {batch} is larger than every graph batch size {sizes}: add a graph "
                     f"batch size >= {batch}, or split the batch with "
                     f"torchair.inference.split_batch (pieces of at most {sizes[-1]})")


def split_batch(batch: int, graph_batch_sizes: Sequence[int]) -> list[int]:
    """Cut ``batch`` rows into pieces that each fit a graph size: as many pieces of the largest
    size as fit, then the rest (padded by :func:`pad_batch` when run). ``[batch]`` when it fits."""
    sizes, batch = _sizes(graph_batch_sizes), _batch(batch)
    largest = sizes[-1]
    pieces = [largest] * (batch // largest)
    if batch % largest:
        pieces.append(batch % largest)
    return pieces


@dataclasses.dataclass(frozen=True, eq=False)
class PaddedBatch:
    """A batch of ``batch`` real rows padded to the graph batch size ``size``.

    ``mask`` is a ``[size]`` bool tensor, True on the real rows (the first ``batch``);
    ``seq_lens`` the given lengths followed by ``pad_len`` for each padded row (None when no
    lengths were given).
    """

    batch: int
    size: int
    mask: torch.Tensor
    seq_lens: list[int] | None

    @property
    def padding(self) -> int:
        """Padded rows."""
        return self.size - self.batch

    def pad(self, t: torch.Tensor, value: float | int = 0) -> torch.Tensor:
        """``t`` (``[batch, ...]``) with ``padding`` rows of ``value`` appended: ``[size, ...]``."""
        if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.shape[0] != self.batch:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"PaddedBatch.pad: expected a tensor with {self.batch} rows (dim 0), "
                             f"got {shape}")
        if not self.padding:
            return t
        fill = t.new_full((self.padding, *t.shape[1:]), value)
        return torch.cat([t, fill])


def pad_batch(batch: int, graph_batch_sizes: Sequence[int], *,
              seq_lens: Sequence[int] | None = None, pad_len: int = 1,
              device: torch.device | str | None = None) -> PaddedBatch:
    """Pad ``batch`` rows to :func:`graph_batch_size`; see :class:`PaddedBatch`.

    ``seq_lens`` (one per real row) are extended with ``pad_len`` (default 1: a padded row
    attends over one position, as vllm-ascend pads ``seq_lens``; 0 would leave its attention
    empty). ``device`` is the mask's. Errors: ValueError for a batch larger than every size
    (:func:`graph_batch_size`), ``seq_lens`` of another length, or a negative ``pad_len``.
    """
    size = graph_batch_size(batch, graph_batch_sizes)
    if not isinstance(pad_len, int) or isinstance(pad_len, bool) or pad_len < 0:
        raise ValueError(f"pad_len must be an int >= 0, got {pad_len!r}")
    lens = None
    if seq_lens is not None:
        lens = [int(n) for n in seq_lens]
        if len(lens) != batch:
            raise ValueError(f"seq_lens has {len(lens)} entries for a batch of {batch}: give one "
                             f"length per real row")
        lens += [pad_len] * (size - batch)
    mask = torch.arange(size, device=device) < batch
    return PaddedBatch(batch=batch, size=size, mask=mask, seq_lens=lens)
