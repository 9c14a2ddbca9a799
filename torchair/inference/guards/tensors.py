"""Dynamo's TENSOR_MATCH on a warm call: a tensor's class, dtype, device, requires_grad, sizes,
strides and dispatch keys, checked in Python (:func:`tensor_check`) or, for the tensors that
passed last time, as one C++ comparison (:class:`TensorMemo`).

:mod:`~torchair.inference.guards.grammar` parses Dynamo's printed ``check_tensor(...)`` and hands
the recorded values here. A tensor's dispatch keys are compared as Dynamo compares them: with the
thread's include set added and its exclude set removed; the thread-local sets are one source
(:data:`DISPATCH_TLS`) read once per call.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Sequence

import torch

from torchair.inference.guards.sources import Fn
from torchair.runtime.tensor_memo import TensorMemo

__all__ = ["DISPATCH_TLS", "TensorMemo", "dispatch_tls", "key_names", "tensor_check"]

DISPATCH_TLS = "<dispatch tls>"  # the source key of the thread-local dispatch key sets


def tensor_check(value: Fn, tls: int, cls_name: str, keys: frozenset, dtype: torch.dtype,
                 device: int, grad: bool | None, size: list | None,
                 stride: list | None) -> Fn:
    """``check_tensor``: whether the tensor ``value`` reads is a ``cls_name`` with dispatch keys
    ``keys`` (under the thread-local sets in slot ``tls``), ``dtype``, ``device`` (as
    ``get_device()``: -1 on CPU), ``grad`` (None: either), and sizes and strides (None entries:
    symbolic, checked by the shape guards)."""
    shape_ok = _dims_check(size)
    stride_ok = _dims_check(stride)
    keys_seen: dict[int, tuple] = {}
    last_type: list = [None]

    def check(values: list) -> bool:
        t = value(values)
        tp = type(t)
        if tp is not last_type[0]:
            if not issubclass(tp, torch.Tensor) or tp.__name__ != cls_name:
                return False
            last_type[0] = tp
        if t.dtype != dtype or t.get_device() != device or (
                grad is not None and t.requires_grad != grad):
            return False
        if not shape_ok(t.shape) or not stride_ok(t.stride()):
            return False
        return _dispatch_keys(t, values[tls], keys_seen) == keys

    return check


def _dims_check(dims: list | None) -> Callable[[Sequence[int]], bool]:
    """A check of sizes or strides against Dynamo's list (None entries: symbolic, not checked
    here)."""
    if dims is None:
        return lambda got: True
    want = tuple(dims)
    if None not in want:
        return lambda got: got == want
    fixed = tuple((d, s) for d, s in enumerate(want) if s is not None)
    ndim = len(want)

    def check(got: Sequence[int]) -> bool:
        if len(got) != ndim:
            return False
        for d, s in fixed:
            if got[d] != s:
                return False
        return True

    return check


def dispatch_tls(_: Any) -> tuple:
    """The thread-local dispatch include / exclude sets (read once per call, as the step of
    the :data:`DISPATCH_TLS` source)."""
    return (torch._C._dispatch_tls_local_include_set(),
            torch._C._dispatch_tls_local_exclude_set())


def key_names(text: str) -> frozenset:
    """The key names of a printed ``DispatchKeySet(CPU, BackendSelect, ...)``."""
    inner = text[text.find("(") + 1:text.rfind(")")]
    return frozenset(k.strip() for k in inner.split(",") if k.strip())


def _dispatch_keys(t: torch.Tensor, tls: tuple, seen: dict) -> frozenset:
    """The tensor's dispatch keys as Dynamo compares them: with the thread-local include set
    added and the exclude set removed. Memoized per tensor (weakly: user tensors are never
    kept alive) and thread-local state."""
    hit = seen.get(id(t))
    if hit is not None and hit[0]() is t and hit[1] == tls:
        return hit[2]
    include, exclude = tls
    names = key_names(str((torch._C._dispatch_keys(t) | include) - exclude))
    if len(seen) > 1024:
        seen.clear()
    seen[id(t)] = (weakref.ref(t), tls, names)
    return names
