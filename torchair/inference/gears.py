"""Dynamic gears (seed 001, part 1): one Dynamo trace serves a fixed set of input shapes.

``set_dim_gears(t, dim_gears={0: [1, 2, 4, 8]})`` records the sizes a dim may take and marks the
dim *unbacked* for Dynamo: Dynamo then traces it as a symbol without guarding on its value, so
it neither specializes sizes 0/1 nor recompiles for another gear, and the backend builds one
static launch unit per gear (:mod:`torchair.runtime.gears`). The gears of all inputs combine by
``inference_config.dynamic_gears_merge_policy``: ``"zip"`` pairs the i-th sizes of every gear dim,
``"product"`` takes every combination.

Because a gear dim is unbacked, the model must not branch on its value in Python (``if
x.size(0) == 1``): Dynamo reports such code as a data-dependent guard.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from torchair.base.gears import (
    DIM_GEARS_ATTR,
    MAX_COMBINATIONS,
    POLICIES,
    GearDim,
    GearTable,
    get_dim_gears,
    merge_gears,
)

MIN_GEARS, MAX_GEARS = 2, 100


def set_dim_gears(t: torch.Tensor, dim_gears: Mapping[int, Sequence[int]]) -> None:
    """Allow ``t``'s dims the listed sizes only; one compile serves all of them.

    The tensor's other dims are marked static (a gear is one fixed shape), also under
    ``dynamic=True``.

    Parameters (TorchAir's names)
    -----------------------------
    t
        A graph input (call before the first call of the compiled function).
    dim_gears
        ``{dim: [size, ...]}``: ``dim`` an int in ``[0, t.dim() - 1]``, 2 to 100 positive int
        sizes per dim. A size may repeat (the combinations are deduplicated, see
        :func:`merge_gears`).

    Argument errors are ``AssertionError`` with TorchAir's texts (checked in TorchAir's order,
    a size of 0 included); negative sizes are refused too here (TorchAir does not check).
    Setting other gears on a tensor that has gears is an error; setting the same again is not.
    """
    assert isinstance(t, torch.Tensor), (
        f"set_dim_gears: t must be a torch.Tensor, but got {type(t)}.")
    assert isinstance(dim_gears, Mapping) and dim_gears, (
        f"set_dim_gears: dim_gears must be a non-empty dict {{dim: [sizes]}}, e.g. "
        f"{{0: [2, 4]}}, but got {dim_gears!r}.")
    old = getattr(t, DIM_GEARS_ATTR, None)
    gears = {dim: _check_sizes(t, dim, sizes) for dim, sizes in dim_gears.items()}
    assert old is None or old == gears, (
        f"Tensor {t} already has set dim gears, and it is not supported to set it again.")
    from torch._dynamo.decorators import mark_unbacked

    for d in range(t.dim()):  # the other dims are fixed: each gear is one static shape
        if d in gears:
            mark_unbacked(t, d)
        else:
            torch._dynamo.mark_static(t, d)
    setattr(t, DIM_GEARS_ATTR, gears)


def _check_sizes(t: torch.Tensor, dim: Any, sizes: Any) -> tuple[int, ...]:
    """One ``dim: sizes`` entry, checked in TorchAir's order with TorchAir's texts."""
    assert isinstance(dim, int) and not isinstance(dim, bool), (
        f"Dim index in dim_gears must be an integer, but got {type(dim)}.")
    assert 0 <= dim < t.dim(), (
        f"Dim index in dim_gears must be in range [0, {t.dim() - 1}], but got {dim}.")
    assert isinstance(sizes, (list, tuple)), (
        f"Gears for dim index {dim} in dim_gears must be a list or tuple, but got {type(sizes)}.")
    for index, size in enumerate(sizes):
        assert isinstance(size, int) and not isinstance(size, bool), (
            f"Element at index {index} of value for dim index {dim} in dim_gears must be an "
            f"integer, but got {type(size)}.")
        assert size != 0, (f"Gear value at index {index} for dim index {dim} must not be 0, but "
                           f"got {size}.")
    assert MIN_GEARS <= len(sizes) <= MAX_GEARS, (
        f"Length of gears for dim index {dim} in dim_gears must be in range [{MIN_GEARS}, "
        f"{MAX_GEARS}], but got {len(sizes)}.")
    bad = [s for s in sizes if s < 0]  # TorchAir does not check: a negative size never matches
    assert not bad, (f"set_dim_gears: the gears of dim index {dim} must be positive; got "
                     f"{bad[0]} in {list(sizes)}")
    return tuple(sizes)


__all__ = ["MAX_COMBINATIONS", "MAX_GEARS", "MIN_GEARS", "POLICIES", "GearDim", "GearTable",
           "get_dim_gears", "merge_gears", "set_dim_gears"]
