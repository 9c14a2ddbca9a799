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
from typing import Any, Mapping, Sequence

import torch

MIN_GEARS, MAX_GEARS = 2, 100
MAX_COMBINATIONS = 100
POLICIES = ("zip", "product")
_ATTR = "_torchair_dim_gears"


def set_dim_gears(tensor: torch.Tensor, dim_gears: Mapping[int, Sequence[int]]) -> None:
    """Allow ``tensor``'s dims the listed sizes only; one compile serves all of them.

    The tensor's other dims are marked static (a gear is one fixed shape), also under
    ``dynamic=True``.

    Parameters
    ----------
    tensor
        A graph input (call before the first call of the compiled function).
    dim_gears
        ``{dim: [size, ...]}``: ``dim`` an int within the rank (negative counts from the end),
        2 to 100 distinct positive int sizes per dim.

    Setting other gears on a tensor that has gears is an error; setting the same again is not.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"set_dim_gears: tensor must be a torch.Tensor, got "
                        f"{type(tensor).__name__}")
    if not isinstance(dim_gears, Mapping) or not dim_gears:
        raise TypeError(f"set_dim_gears: dim_gears must be a non-empty dict {{dim: [sizes]}}, "
                        f"e.g. {{0: [2, 4]}}; got {dim_gears!r}")
    gears = {}
    for dim, sizes in dim_gears.items():
        d = _check_dim(tensor, dim)
        if d in gears:
            raise ValueError(f"set_dim_gears: dim {dim} names dim {d} again; give each dim once")
        gears[d] = _check_sizes(dim, sizes)
    old = getattr(tensor, _ATTR, None)
    if old is not None and old != gears:
        raise ValueError(f"set_dim_gears: this tensor already has gears {old}; setting other "
                         f"gears {gears} on it is not allowed (use a new tensor, or set the same "
                         f"gears)")
    from torch._dynamo.decorators import mark_unbacked

    for d in range(tensor.dim()):  # the other dims are fixed: each gear is one static shape
        if d in gears:
            mark_unbacked(tensor, d)
        else:
            torch._dynamo.mark_static(tensor, d)
    setattr(tensor, _ATTR, gears)


def get_dim_gears(tensor: Any) -> dict[int, tuple[int, ...]] | None:
    """The gears recorded on ``tensor`` by :func:`set_dim_gears` (None when it has none)."""
    return getattr(tensor, _ATTR, None)


def _check_dim(tensor: torch.Tensor, dim: Any) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"set_dim_gears: dim must be an int, got {dim!r} "
                        f"({type(dim).__name__})")
    rank = tensor.dim()
    if not -rank <= dim < rank:
        raise ValueError(f"set_dim_gears: dim {dim} is out of range for a tensor of rank {rank} "
                         f"(shape {list(tensor.shape)}); expected {-rank} <= dim < {rank}")
    return dim % rank


def _check_sizes(dim: int, sizes: Any) -> tuple[int, ...]:
    if not isinstance(sizes, (list, tuple)):
        raise TypeError(f"set_dim_gears: the gears of dim {dim} must be a list or tuple of ints, "
                        f"got {sizes!r}")
    bad = [s for s in sizes if isinstance(s, bool) or not isinstance(s, int) or s <= 0]
    if bad:
        raise ValueError(f"set_dim_gears: the gears of dim {dim} must be positive ints; "
                         f"got {bad[0]!r} in {list(sizes)}")
    if len(set(sizes)) != len(sizes):
        dup = next(s for s in sizes if list(sizes).count(s) > 1)
        raise ValueError(f"set_dim_gears: the gears of dim {dim} must be distinct; {dup} is "
                         f"repeated in {list(sizes)}")
    if not MIN_GEARS <= len(sizes) <= MAX_GEARS:
        raise ValueError(f"set_dim_gears: dim {dim} has {len(sizes)} gears {list(sizes)}; give "
                         f"{MIN_GEARS} to {MAX_GEARS} sizes (one size: use mark_static instead)")
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
    if policy == "zip":
        lengths = {str(d): len(d.sizes) for d in dims}
        if len(set(lengths.values())) > 1:
            listed = ", ".join(f"{d} has {len(d.sizes)} {list(d.sizes)}" for d in dims)
            raise ValueError(f"dynamic_gears_merge_policy='zip' pairs the i-th gears of every "
                             f"gear dim, so all need the same number of gears: {listed}; give "
                             f"them equal lengths or use the 'product' policy")
        gears = tuple(zip(*(d.sizes for d in dims)))
    else:
        count = 1
        for d in dims:
            count *= len(d.sizes)
        if count > MAX_COMBINATIONS:
            raise ValueError(f"dynamic_gears_merge_policy='product' gives {count} gear "
                             f"combinations ({' x '.join(str(len(d.sizes)) for d in dims)}), more "
                             f"than {MAX_COMBINATIONS}; use fewer gears or the 'zip' policy")
        gears = tuple(itertools.product(*(d.sizes for d in dims)))
    if len(set(gears)) != len(gears):
        raise ValueError(f"the gears of {', '.join(map(str, dims))} repeat a combination "
                         f"under the '{policy}' policy: {list(gears)}")
    return GearTable(tuple(dims), gears, policy)
