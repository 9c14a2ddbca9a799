"""Gear data shared by every stage: the gear dims of a graph, their combinations, the tensor tag.

:func:`torchair.inference.set_dim_gears` (the user's call) tags a tensor with its allowed sizes
under :data:`DIM_GEARS_ATTR`; the backend reads the tags back (:func:`get_dim_gears`), the
pipeline combines them into a :class:`GearTable` (:func:`merge_gears`) and the runtime selects one
static launch unit per combination. The types live here, at the bottom of the stack, because all
of those layers use them.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Sequence

MAX_COMBINATIONS = 100
POLICIES = ("zip", "product")
DIM_GEARS_ATTR = "_torchair_dim_gears"  # the tag set_dim_gears leaves on a tensor


def get_dim_gears(t: Any) -> dict[int, tuple[int, ...]] | None:
    """The gears recorded on ``t`` by :func:`set_dim_gears` (None when it has none)."""
    return getattr(t, DIM_GEARS_ATTR, None)


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
