"""Value checks of tensors that may live on a device, without a host read inside a CUDA graph.

:func:`require_none` raises ``error(i)`` for the first flat index ``i`` where a bool tensor is
True. Where it reads:

* CPU tensors: at once on the host (reading a CPU tensor is not a device sync);
* CUDA tensors outside a capture: at once (one small device-to-host read);
* CUDA tensors while the current stream is capturing (``torch.cuda.is_current_stream_capturing``),
  and any tensor under a dispatch mode that emulates a capture (``emulates_capture``, the
  runtime's CPU stand-in ``NoHostSync``): nothing is read. A device summary ``[any, first index]`` is computed by capturable ops and kept
  with the error builder; :func:`raise_captured_errors` reads the summaries of every check
  captured so far (after a replay, outside the capture) and raises the first error. The runtime's
  CUDA-graph replay (``torchair.runtime.capture.capture_cuda``) calls it after each replay of a
  graph that captured checks (one small read per replay, after it), and the emulated replay
  likewise, so a bad value raises the same ``ValueError`` as in eager. Checks captured outside
  :func:`collect` (a capture of one's own) are read by ``raise_captured_errors()``.

Also the messages shared by the attention ops: :func:`block_id_error`, :func:`negative_length_error`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Callable, Iterator

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

__all__ = ["block_id_error", "check_block_ids", "check_nonnegative_lengths", "collect",
           "host_checked", "negative_length_error", "raise_captured_errors", "require_none"]


@dataclasses.dataclass(frozen=True)
class _Captured:
    """One check captured into a CUDA graph: ``summary`` int64 ``[2]`` = (any, first index)."""

    summary: torch.Tensor
    error: Callable[[int], ValueError]


_captured: list[_Captured] = []


_MAX_UNCOLLECTED = 256  # checks captured outside collect() (a user's own capture) kept for reading


_emulation = threading.local()


@contextlib.contextmanager
def emulating_capture() -> Iterator[None]:
    """Inside the block, checks behave as inside a CUDA graph capture. The runtime's
    ``NoHostSync`` runs each op under it: a dispatch mode is off while it handles an op, so an
    op's own Python kernel (a custom op's checks) would not see the mode on the stack."""
    _emulation.depth = getattr(_emulation, "depth", 0) + 1
    try:
        yield
    finally:
        _emulation.depth -= 1


def _capturing(t: torch.Tensor) -> bool:
    """A CUDA capture of the current stream, or a dispatch mode that emulates one (the runtime's
    ``NoHostSync`` sets ``emulates_capture`` and runs each op :func:`emulating_capture`): no host
    read allowed."""
    if t.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return True
    if getattr(_emulation, "depth", 0):
        return True
    return any(getattr(mode, "emulates_capture", False)
               for mode in _get_current_dispatch_mode_stack())


def require_none(bad: torch.Tensor, error: Callable[[int], ValueError]) -> None:
    """Raise ``error(flat index of the first True of bad)`` if ``bad`` has a True (module doc)."""
    flat = bad.reshape(-1)
    if flat.numel() == 0 or flat.device.type == "meta":  # meta: shapes only, no values to check
        return
    if _capturing(flat):
        summary = torch.stack([flat.any().long(), flat.to(torch.int8).argmax()])
        _captured.append(_Captured(summary, error))
        del _captured[:-_MAX_UNCOLLECTED]
        return
    if bool(flat.any()):
        raise error(int(flat.to(torch.int8).argmax()))


@contextlib.contextmanager
def collect() -> Iterator[list[_Captured]]:
    """The checks captured inside the block (a CUDA graph capture), as a list filled on exit."""
    start = len(_captured)
    found: list[_Captured] = []
    try:
        yield found
    finally:
        found.extend(_captured[start:])
        del _captured[start:]


def raise_captured_errors(checks: list[_Captured] | None = None, *,
                          summaries: torch.Tensor | None = None) -> None:
    """Read the summaries of ``checks`` (default: every check captured outside :func:`collect`)
    and raise the first failing one's error. Call it outside any capture, after a replay.
    ``summaries``: the checks' summaries concatenated (by the capture), read at once."""
    checks = _captured if checks is None else checks
    if summaries is not None:
        values = summaries.tolist()
        for k, check in enumerate(checks):
            if values[2 * k]:
                raise check.error(values[2 * k + 1])
        return
    for check in checks:
        flag, index = (int(x) for x in check.summary.tolist())
        if flag:
            raise check.error(index)


def block_id_error(op: str | None, table: torch.Tensor, b: int, c: int, num_blocks: int,
                   lo: int, hi: int) -> ValueError:
    """The error for ``table[b, c]``, a block that sequence ``b`` reads (positions [lo, hi))
    but that is not a block of the cache."""
    prefix = f"{op}: " if op else ""
    return ValueError(f"{prefix}block_table[{b}, {c}] = {int(table[b, c])} is not a block of the "
                      f"KV cache (it has {num_blocks} blocks, ids 0..{num_blocks - 1}), but "
                      f"sequence {b} reads positions [{lo}, {hi}) of it; fix the block table")


def check_block_ids(block_table: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
                    block_size: int, num_blocks: int, op: str | None = None) -> None:
    """Every block a sequence reads (columns of its window ``[lo_b, hi_b)``) must exist.

    ``lo`` / ``hi``: int64 ``[B]`` (or ``[1]``, broadcast) on the table's device. Columns outside
    a window may hold anything (-1, stale ids): they are not checked.
    """
    col = torch.arange(block_table.shape[1], device=block_table.device)[None, :]
    lo, hi = lo.reshape(-1, 1), hi.reshape(-1, 1)
    used = (col >= lo // block_size) & (col < -(-hi // block_size)) & (hi > lo)
    table = block_table.long()
    bad = used & ((table < 0) | (table >= num_blocks))
    width = block_table.shape[1]

    def error(i: int) -> ValueError:
        b, c = divmod(i, width)
        lo_b, hi_b = (int(x[b if x.shape[0] > 1 else 0]) for x in (lo, hi))
        return block_id_error(op, block_table, b, c, num_blocks, lo_b, hi_b)

    require_none(bad, error)


def negative_length_error(op: str, name: str, index: int, value: int) -> ValueError:
    """The error for a negative sequence length ``name[index] = value``."""
    return ValueError(f"{op}: {name}[{index}]={value} must be >= 0")


# per thread: (buffer, slot ranges) whose values the host checks before every launch
_host_checked = threading.local()


@contextlib.contextmanager
def host_checked(buffer: torch.Tensor, slots: frozenset[tuple[int, int]]) -> Iterator[None]:
    """Inside the block, a captured length check of ``buffer[start:end]`` for a ``(start, end)``
    in ``slots`` is not captured: the caller checks those values on the host before every
    launch (a static unit's sunk scalars, :mod:`torchair.ops.attention.sunk_checks`), so the
    replay needs no device flag for them and no device-to-host read after it."""
    stack = _host_checked.__dict__.setdefault("stack", [])
    stack.append((buffer, slots))
    try:
        yield
    finally:
        stack.pop()


def _checked_on_host(lengths: torch.Tensor) -> bool:
    for buffer, slots in getattr(_host_checked, "stack", ()):
        if (lengths.dim() == 1 and lengths.dtype == buffer.dtype and lengths.stride(0) == 1
                and lengths.device == buffer.device
                and lengths.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()):
            start = lengths.storage_offset() - buffer.storage_offset()
            if (start, start + lengths.numel()) in slots:
                return True
    return False


def check_nonnegative_lengths(op: str, name: str, lengths: torch.Tensor) -> None:
    """Every entry of the 1-D ``lengths`` tensor must be >= 0 (module doc: where it reads;
    :func:`host_checked`: where nothing is captured)."""
    if getattr(_host_checked, "stack", None) and _capturing(lengths) and _checked_on_host(lengths):
        return
    require_none(lengths < 0, lambda i: negative_length_error(op, name, i, int(lengths[i])))
