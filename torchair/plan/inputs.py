"""Graph inputs as the IR sees them ("Data" nodes): name, kind, IR shape, dtype.

A tensor input's symbolic dim is written ``-1``; a SymInt input is a scalar Data of shape ``[]``
(its value is runtime data, so it does not make the IR graph dynamic).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch


@dataclasses.dataclass(frozen=True)
class InputInfo:
    """One graph input. ``shape`` is the IR shape: ``-1`` for a symbolic dim, ``[]`` for a SymInt."""

    index: int
    name: str
    kind: str  # "tensor" | "symint" | "parameter"
    shape: tuple[int, ...]
    dtype: str
    mutated: bool = False
    device: str = "cpu"

    @property
    def is_dynamic(self) -> bool:
        return -1 in self.shape

    def __str__(self) -> str:
        shape = list(self.shape)
        extra = " (mutated in place)" if self.mutated else ""
        return f"input {self.index} `{self.name}`: {self.kind} {self.dtype}{shape}{extra}"


def is_symbolic(x: Any) -> bool:
    """True for a SymInt/SymFloat/SymBool whose value is not a compile-time constant."""
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return x.node.maybe_as_int() is None if isinstance(x, torch.SymInt) else True
    return False


def ir_shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(-1 if is_symbolic(d) else int(d) for d in t.shape)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def describe_inputs(example_inputs: Sequence[Any], names: Sequence[str], kinds: Sequence[str],
                    mutated: set[int]) -> list[InputInfo]:
    """Build the Data view of the graph's inputs from AOT's example inputs."""
    infos = []
    for i, (value, name, kind) in enumerate(zip(example_inputs, names, kinds)):
        if isinstance(value, torch.Tensor):
            infos.append(InputInfo(i, name, kind, ir_shape(value), dtype_name(value.dtype),
                                   i in mutated, str(value.device)))
        elif isinstance(value, (torch.SymInt, int)):
            infos.append(InputInfo(i, name, "symint", (), "int64"))
        elif isinstance(value, (torch.SymFloat, float)):
            infos.append(InputInfo(i, name, "symint", (), "float64"))
        else:
            infos.append(InputInfo(i, name, "symint", (), type(value).__name__))
    return infos
