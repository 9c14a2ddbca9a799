"""In-place ops with a functional twin: ``op_(Tensor(a!) self, ...) -> Tensor(a!)`` and ``op``.

An in-place op of the ``npu`` namespace that returns its aliased input cannot go through PyTorch's
``auto_functionalize`` (that only takes ops whose outputs alias nothing). So, as for ATen's
in-place ops, each in-place op here gets a *Functionalize* kernel
(:func:`torchair.ops._functionalize.install_functionalization`): under ``torch.compile`` (AOT's
functionalization) ``op_(x, ...)`` is traced as ``y = op(x, ...)`` and ``x`` is replaced by ``y``;
AOT then ends the graph with ``copy_(x, y)`` when ``x`` is a graph input. torchair's
``reinplace_inputs`` pass turns ``op`` + ``copy_`` back into ``op_`` on the input (a KV cache
written where it is, no copy), and Inductor's reinplace pass is told the same pair.

:func:`define_inplace_pair` defines both ops with :func:`torchair.base.registry.define_op`; the
in-place kernel mutates ``self`` and returns it, its fake kernel returns ``self``.
"""
from __future__ import annotations

import sys
from typing import Callable

import torch

from torchair.base.registry import define_op
from torchair.ops._functionalize import install_functionalization

__all__ = ["define_inplace_pair"]

_PENDING: list[tuple[torch._ops.OpOverload, torch._ops.OpOverload]] = []
_INDUCTOR_REINPLACE = "torch._inductor.fx_passes.reinplace"


def _register_with_inductor() -> None:
    """Let Inductor's reinplace pass write ``op`` + ``copy_`` into a graph input as ``op_`` (its
    table of in-place-able ops). Done once Inductor is imported (importing it here would load
    Dynamo with ``import torchair``): the fake kernels call this while Inductor's AOT traces.
    Without the table (another PyTorch) Inductor copies the result back into the input: correct,
    one copy slower."""
    if not _PENDING or _INDUCTOR_REINPLACE not in sys.modules:
        return
    reinplace = sys.modules[_INDUCTOR_REINPLACE]
    table = getattr(reinplace, "inplaceable_ops", None)
    entry = getattr(reinplace, "InplaceableOp", None)
    if isinstance(table, dict) and entry is not None:
        for functional, inplace in _PENDING:
            table.setdefault(functional, entry(inplace, 0))
    _PENDING.clear()


def define_inplace_pair(functional_schema: str, *, fake: Callable, kernel: Callable,
                        inplace_kernel: Callable
                        ) -> tuple[torch._ops.OpOverloadPacket, torch._ops.OpOverloadPacket]:
    """Define ``name(Tensor self, ...) -> Tensor`` and ``name_(Tensor(a!) self, ...) ->
    Tensor(a!)``. ``fake`` is the functional op's fake kernel (the in-place one returns
    ``self``); ``kernel`` computes a new tensor; ``inplace_kernel`` writes ``self`` in place."""
    name, rest = functional_schema.split("(", 1)
    if not rest.startswith("Tensor self,") or not functional_schema.endswith("-> Tensor"):
        raise ValueError(f"define_inplace_pair: {functional_schema!r} must start with "
                         f"'Tensor self,' and return one Tensor")
    inplace_schema = (f"{name}_(Tensor(a!) self," + rest[len("Tensor self,"):]
                      ).replace("-> Tensor", "-> Tensor(a!)")

    def functional_fake(self, *args, **kwargs):
        _register_with_inductor()
        return fake(self, *args, **kwargs)

    def inplace_fake(self, *args, **kwargs):
        functional_fake(self, *args, **kwargs)  # the same checks
        return self

    def inplace_eager(self, *args, **kwargs):
        inplace_kernel(self, *args, **kwargs)
        return self

    functional = define_op(functional_schema, fake=functional_fake, kernel=kernel)
    inplace = define_op(inplace_schema, fake=inplace_fake, kernel=inplace_eager)
    install_functionalization(name + "_", functional.default, mutated=(0,))
    _PENDING.append((functional.default, inplace.default))
    return functional, inplace
