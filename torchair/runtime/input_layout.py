"""A static CPU unit's own input check, in place of Inductor's per-input asserts.

Inductor's generated entry asserts each input's sizes and strides on every call. In its C++
wrapper each of those asserts builds an error-message string and a string stream whether or not
it fails: about 0.35 us per input on our 2-core machines, 18 us per call for a decode step's 50
weights and inputs, more than everything else a served call does. A unit whose inputs are all
plain tensors compiles without them (``size_asserts=False``) and checks its inputs itself with
:class:`InputLayout`: one C++ comparison of every input's metadata against the last call's
(:class:`~torchair.runtime.tensor_memo.TensorMemo`, about 40 ns per input), and a Python check
against the layout the unit was compiled for only when that comparison does not hold. An input
whose dtype, device, sizes or strides differ from the compiled ones raises, as Inductor's assert
would, naming the input: the generated code would otherwise read out of bounds.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from torchair.runtime.tensor_memo import TensorMemo

__all__ = ["InputLayout", "InputLayoutError", "plain_tensors"]


class InputLayoutError(RuntimeError):
    """A launch unit's input does not have the layout the unit was compiled for (raised before
    anything ran)."""


def plain_tensors(args: Sequence[Any]) -> bool:
    """Whether every argument is a plain strided tensor (what :class:`InputLayout` checks)."""
    return all(type(a) in (torch.Tensor, torch.nn.Parameter) and a.layout == torch.strided
               and not a.is_nested for a in args)


def _describe(dtype: torch.dtype, device: torch.device, size: tuple, stride: tuple) -> str:
    return (f"{str(dtype).removeprefix('torch.')}{list(size)} with strides {list(stride)} on "
            f"{device}")


class InputLayout:
    """The layout a unit was compiled for (its first call's ``args``): dtype, device, sizes and
    strides per input. :meth:`check` costs one C++ call while the inputs' metadata is the last
    call's."""

    def __init__(self, what: str, args: Sequence[torch.Tensor], names: Sequence[str]) -> None:
        self.what = what
        self.names = list(names)
        self.specs = [(a.dtype, a.device, tuple(a.shape), a.stride()) for a in args]
        self.memo = TensorMemo(range(len(self.specs)))
        self.memo.remember(args)

    def check(self, args: Sequence[Any]) -> None:
        """Raise :class:`InputLayoutError` naming the first input whose dtype, device, sizes or strides
        differ from the compiled layout (a size-1 dimension's stride, or any stride of an empty
        tensor, is not compared, as Inductor's assert does not)."""
        if self.memo.holds(args):
            return
        if len(args) != len(self.specs):
            raise InputLayoutError(f"{self.what}: the launch unit takes {len(self.specs)} inputs, "
                               f"got {len(args)}")
        for k, (arg, spec) in enumerate(zip(args, self.specs)):
            why = _differs(arg, spec)
            if why:
                name = self.names[k] if k < len(self.names) else f"#{k}"
                raise InputLayoutError(f"{self.what}: launch unit input `{name}` is {why}, the unit "
                                   f"was compiled for {_describe(*spec)}; compile again for "
                                   f"this layout (e.g. call .contiguous() on it)")
        self.memo.remember(args)


def _differs(arg: Any, spec: tuple) -> str:
    dtype, device, size, stride = spec
    if not isinstance(arg, torch.Tensor):
        return f"a {type(arg).__name__}"
    got = (arg.dtype, arg.device, tuple(arg.shape), arg.stride())
    if (got[0] == dtype and got[1] == device and got[2] == size
            and (0 in size or all(s == t or n <= 1 for s, t, n in zip(got[3], stride, size)))):
        return ""
    return _describe(*got)
