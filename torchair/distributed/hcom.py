"""``patch_for_hcom``: make the in-place ``torch.distributed`` collectives traceable by Dynamo.

Dynamo rewrites a call of an in-place collective ``f`` (``dist.all_reduce(t)``) into the
functional collective ``traceable_collective_remaps[f]`` (``t.copy_(all_reduce(t, "sum", g))``)
and traces that. On PyTorch 2.13 the table already covers ``all_reduce``,
``all_gather_into_tensor``, ``reduce_scatter_tensor``, ``all_to_all_single`` (with split sizes),
``all_gather``, ``_all_gather_base``, ``_reduce_scatter_base``; ``dist.broadcast`` and
``dist.all_to_all`` (tensor lists) are missing and break a ``fullgraph`` compile.

TorchAir's ``patch_for_hcom`` replaces ``torch.distributed.all_reduce`` & co. with its HCCL
graph ops (and, at import on PyTorch >= 2.3.1, adds ``broadcast`` and ``all_to_all`` to the remap
table). Here nothing in ``torch.distributed`` is replaced (eager calls are untouched); instead
``patch_for_hcom()`` edits the remap table, which only Dynamo reads:

- adds ``dist.broadcast`` -> ``broadcast`` (``_c10d_functional.broadcast``; ``src``/``group_src``
  as in eager) and ``dist.all_to_all`` -> one ``all_to_all_single`` over the flattened tensors
  (as TorchAir decomposes it);
- wraps the existing entries so a traced collective with no process group fails with a
  ``RuntimeError`` naming the op and the fix (``init_process_group``) instead of Dynamo's
  ``AssertionError('group cannot be None')``.

Each replacement is also set as an attribute of ``torch.distributed._functional_collectives``
(Dynamo imports remaps from there by name). Calling it again does nothing; ``unpatch_for_hcom()``
restores the table and removes the attributes.
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable

import torch

_lock = threading.Lock()
_saved: dict[Any, Any] | None = None  # the remap table's entries before patching
_added_attrs: list[str] = []
_PREFIX = "_torchair_hcom_"


def _require_group(op: str, group: Any) -> None:
    import torch.distributed as dist

    if group is None and not dist.is_initialized():
        raise RuntimeError(
            f"torch.distributed.{op} in a compiled graph needs a process group, but none exists "
            f"in this process: call torch.distributed.init_process_group(...) (gloo on CPU, nccl "
            f"on CUDA) before compiling, or pass an existing group")


def _broadcast_inplace(tensor, src=None, group=None, async_op=False, group_src=None):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc

    _require_group("broadcast", group)
    if async_op:
        raise AssertionError("Can't remap async version of inplace op to functional collective")
    group = group or dist.group.WORLD
    if group_src is None:
        group_src = src if group is dist.group.WORLD else dist.get_group_rank(group, src)
    return tensor.copy_(fc.broadcast(tensor, group_src, group))


def _all_to_all_inplace(output_tensor_list, input_tensor_list, group=None, async_op=False):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc

    _require_group("all_to_all", group)
    if async_op:
        raise AssertionError("Can't remap async version of inplace op to functional collective")
    if len(output_tensor_list) != len(input_tensor_list):
        raise ValueError(f"dist.all_to_all: {len(output_tensor_list)} output tensors for "
                         f"{len(input_tensor_list)} input tensors; give one of each per rank")
    group = group or dist.group.WORLD
    send = [t.numel() for t in input_tensor_list]
    recv = [t.numel() for t in output_tensor_list]
    flat = torch.cat([t.reshape(-1) for t in input_tensor_list])
    out = fc.all_to_all_single(flat, recv, send, group)
    for dst, part in zip(output_tensor_list, torch.split(out, recv)):
        dst.copy_(part.view(dst.shape))
    return None


def _checked(op: str, remap: Callable) -> Callable:
    @functools.wraps(remap)
    def checked(*args, **kwargs):
        _require_group(op, kwargs.get("group"))
        return remap(*args, **kwargs)

    checked.__name__ = checked.__qualname__ = f"{_PREFIX}checked_{op}"
    checked.__wrapped_remap__ = remap  # type: ignore[attr-defined]
    return checked


def patched_for_hcom() -> bool:
    """Whether :func:`patch_for_hcom` is in effect."""
    return _saved is not None


def patch_for_hcom() -> None:
    """Make ``dist.broadcast`` and ``dist.all_to_all`` traceable and give traced collectives
    without a process group a clear error (see the module docstring). Idempotent."""
    global _saved
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc

    with _lock:
        if _saved is not None:
            return
        table = fc.traceable_collective_remaps
        saved = dict(table)
        new: dict[Any, Callable] = {fn: _checked(fn.__name__, remap) for fn, remap in table.items()
                                    if fn not in (dist.isend, dist.irecv,
                                                  dist.batch_isend_irecv)}
        for fn, impl in ((dist.broadcast, _broadcast_inplace), (dist.all_to_all,
                                                                _all_to_all_inplace)):
            if fn not in table:
                impl.__name__ = impl.__qualname__ = f"{_PREFIX}{fn.__name__}"
                new[fn] = impl
        for remap in new.values():
            setattr(fc, remap.__name__, remap)
            _added_attrs.append(remap.__name__)
        table.update(new)
        _saved = saved


def unpatch_for_hcom() -> None:
    """Undo :func:`patch_for_hcom` (no-op when not patched). Compiled code keeps what it traced;
    call ``torch._dynamo.reset()`` to retrace."""
    global _saved
    import torch.distributed._functional_collectives as fc

    with _lock:
        if _saved is None:
            return
        table = fc.traceable_collective_remaps
        table.clear()
        table.update(_saved)
        for name in _added_attrs:
            if hasattr(fc, name):
                delattr(fc, name)
        _added_attrs.clear()
        _saved = None
