"""What PyTorch's ``TensorGuards`` compares, remembered for the tensors that last passed a check.

Both ``cache_compile``'s per-call tensor checks (:mod:`torchair.inference.guards`) and a launch
unit's own input check (:mod:`torchair.runtime.input_layout`) run on every served call; when a
call's tensors have exactly the metadata of the last call's, one C++ comparison stands for the
checks' Python.
"""
from __future__ import annotations

import operator
from typing import Any, Callable, Sequence

import torch

__all__ = ["TensorMemo", "pick_slots"]


def pick_slots(slots: Sequence[int]) -> Callable[[Sequence[Any]], tuple]:
    """``values -> tuple(values[k] for k in slots)`` as one C call."""
    slots = tuple(slots)
    if len(slots) == 1:
        k = slots[0]
        return lambda values: (values[k],)
    if not slots:
        return lambda values: ()
    return operator.itemgetter(*slots)


class TensorMemo:
    """The tensors that last passed some per-call tensor checks, remembered as one C++ check
    (PyTorch's ``TensorGuards``, what Dynamo's guards compare: Python type, dispatch keys with
    the thread's include/exclude sets, dtype, device, requires_grad, sizes, strides). When the
    call's tensors match them exactly, the checks (which look at a subset of that) hold without
    running their Python, one call instead of a few per tensor, each run with the caches the
    step's weights evicted. Otherwise the caller runs its checks and, when they hold,
    :meth:`remember` s the new tensors. Without ``TensorGuards`` (another PyTorch) it never
    holds.

    ``check`` (the C++ check of the remembered tensors, None when none are) and ``misses``
    (consecutive calls it did not hold) are public for the generated per-call check
    (:mod:`~torchair.inference.guards.codegen`), which calls ``check`` itself on a hit and
    resets ``misses`` as :meth:`holds` does."""

    _factory: Any = getattr(getattr(getattr(torch._C, "_dynamo", None), "guards", None),
                            "TensorGuards", None)

    MAX_MISSES = 8  # consecutive misses after which it stops remembering (shapes that vary)

    def __init__(self, slots: Sequence[int]) -> None:
        self.slots = tuple(slots)
        # the tensors of ``slots`` as a tuple, one C call (not a Python loop per call)
        self.pick: Callable[[Sequence[Any]], tuple] = pick_slots(self.slots)
        self.check: Callable[..., bool] | None = None
        self.misses = 0

    def holds(self, values: Sequence[Any]) -> bool:
        """Whether the tensors in ``slots`` of ``values`` are exactly the remembered ones'
        metadata."""
        check = self.check
        if check is None:
            return False
        try:
            held = bool(check(*self.pick(values)))
        except Exception:  # noqa: BLE001 - not a tensor any more: the checks say why
            held = False
        self.misses = 0 if held else self.misses + 1
        return held

    def remember(self, values: Sequence[Any]) -> None:
        """Remember the metadata of the tensors in ``slots`` of ``values`` (which passed)."""
        if self.misses >= self.MAX_MISSES:
            return  # metadata that changes call after call: building it again would not pay
        tensors = list(self.pick(values))
        self.check = None
        if self._factory is None or not self.slots or not all(
                isinstance(t, torch.Tensor) for t in tensors) or any(
                t.is_nested or t.layout != torch.strided for t in tensors):
            return  # (a nested tensor would abort the process inside TensorGuards)
        try:
            # the keywords must be passed (its constructor reads them from the keyword dict)
            self.check = self._factory(*tensors, dynamic_dims_sizes=None,
                                       dynamic_dims_strides=None).check
        except Exception:  # noqa: BLE001 - a tensor it cannot describe: keep the Python checks
            self.check = None
