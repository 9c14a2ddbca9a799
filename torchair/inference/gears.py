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

import dataclasses
import itertools
import math
from typing import Any, Mapping, Sequence

import torch

MIN_GEARS, MAX_GEARS = 2, 100
MAX_COMBINATIONS = 100
POLICIES = ("zip", "product")
_ATTR = "_torchair_dim_gears"


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
    old = getattr(t, _ATTR, None)
    gears = {dim: _check_sizes(t, dim, sizes) for dim, sizes in dim_gears.items()}
    assert old is None or old == gears, (
        f"Tensor {t} already has set dim gears, and it is not supported to set it again.")
    from torch._dynamo.decorators import mark_unbacked

    for d in range(t.dim()):  # the other dims are fixed: each gear is one static shape
        if d in gears:
            mark_unbacked(t, d)
        else:
            torch._dynamo.mark_static(t, d)
    setattr(t, _ATTR, gears)


def get_dim_gears(t: Any) -> dict[int, tuple[int, ...]] | None:
    """The gears recorded on ``t`` by :func:`set_dim_gears` (None when it has none)."""
    return getattr(t, _ATTR, None)


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


@dataclasses.dataclass(frozen=True)
class GearDim:
    """One gear dim of a graph input: which input, which dim, and its allowed sizes."""

    input_index: int
    input_name: str
    dim: int
    sizes: tuple[int, ...]

    def __str__(self) -> str:
        return f"input {self.input_index} (`{self.input_name}`) dim {self.dim}"


@dataclasses.dataclass(frozen=True)
class GearTable:
    """The gear combinations of one graph: ``gears[k][j]`` is the size of ``dims[j]``."""

    dims: tuple[GearDim, ...]
    gears: tuple[tuple[int, ...], ...]
    policy: str

    def key(self, args: Sequence[Any]) -> tuple[int, ...]:
        return tuple(int(args[d.input_index].shape[d.dim]) for d in self.dims)

    def describe(self, gear: Sequence[int]) -> str:
        return ", ".join(f"{d.input_name}[{d.dim}]={s}" for d, s in zip(self.dims, gear))

    def no_gear_error(self, key: Sequence[int]) -> ValueError:
        """The error for input shapes that match no gear: names the tensor, dim and value."""
        for d, value in zip(self.dims, key):
            if value not in d.sizes:
                return ValueError(f"{d} has size {value}, which is not one of its gears "
                                  f"{list(d.sizes)}; the graph was compiled for these sizes "
                                  f"only (set_dim_gears)")
        combos = "; ".join(f"({self.describe(g)})" for g in self.gears)
        return ValueError(f"the input sizes ({self.describe(key)}) are each allowed but not "
                          f"together under the '{self.policy}' merge policy; allowed: {combos}")


def merge_gears(dims: Sequence[GearDim], policy: str) -> GearTable:
    """Combine the gear dims of one graph into its gear combinations (``zip`` or ``product``)."""
    if policy not in POLICIES:
        raise ValueError(f"dynamic_gears_merge_policy={policy!r}: expected one of {POLICIES}")
    if not dims:
        raise ValueError("gears were expected but no graph input has a gear dim: call "
                         "torchair.inference.set_dim_gears on an input before the first call")
    dims = [dataclasses.replace(d, sizes=tuple(dict.fromkeys(d.sizes))) if policy == "product"
            else d for d in dims]
    if policy == "zip":
        lengths = {str(d): len(d.sizes) for d in dims}
        if len(set(lengths.values())) > 1:
            listed = ", ".join(f"{d} has {len(d.sizes)} {list(d.sizes)}" for d in dims)
            # TorchAir's type and sentence (what its users grep for), then which dims differ
            raise AssertionError(f"when dynamic_gears_merge_policy is zip, input gears len must "
                                 f"same. 'zip' pairs the i-th gears of every gear dim: {listed}; "
                                 f"give them equal lengths or use the 'product' policy")
        gears = tuple(zip(*(d.sizes for d in dims)))
    else:  # sizes are deduplicated per dim, so the product's length is its distinct count
        count = math.prod(len(d.sizes) for d in dims)
        gears = tuple(itertools.product(*(d.sizes for d in dims))) if count <= MAX_COMBINATIONS \
            else ()
    # repeated sizes give repeated combinations: keep the first of each (TorchAir drops them too,
    # in set order; first-seen order keeps the gear numbering stable across runs)
    gears = tuple(dict.fromkeys(gears))
    count = len(gears) if policy == "zip" else count
    if count > MAX_COMBINATIONS:  # TorchAir's type and sentence, then the sizes and the fix
        shape = " x ".join(str(len(d.sizes)) for d in dims)
        fix = "use fewer gears or the 'zip' policy" if policy == "product" else "use fewer gears"
        raise AssertionError(f"The total number of gears set cannot exceed {MAX_COMBINATIONS}, "
                             f"and the current number of gears is: {count} ('{policy}' of "
                             f"{shape} gears); {fix}")
    return GearTable(tuple(dims), gears, policy)
