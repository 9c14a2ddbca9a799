"""Functionalization of torchair's in-place ops: each runs as its functional twin in graphs.

torch_npu's ``npu_apply_rotary_pos_emb``, ``npu_kv_rmsnorm_rope_cache``, ``scatter_update_`` and
``npu_scatter_nd_update_`` write into their arguments and return them
(``npu_apply_rotary_pos_emb``: ``Tensor(a!)`` arguments and returns; the cache writes: one
``Tensor(a!) self`` returned; ``npu_kv_rmsnorm_rope_cache``: ``Tensor(a!)`` caches and plain
returns, as its four outputs mix the caches with new tensors). PyTorch cannot functionalize a custom op whose returns alias its
inputs by itself, nor call its kernel on graph values, so every such op here has a
*functional twin* (same arguments, returns the new values of the mutated arguments first, then
its other outputs, all fresh tensors) and a ``Functionalize`` kernel installed by
:func:`install_functionalization`: under ``torch.compile`` (AOT autograd) the op becomes a call
of the twin plus, for graph inputs, AOT's usual copy back into the input at the end of the
graph; for intermediates the graph simply uses the twin's outputs. Eager calls (and the FX
engine's op-by-op replay of the twin) never see this kernel.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch._subclasses.functional_tensor import CppFunctionalizeAPI

from torchair.base.registry import NAMESPACE, defined_here

__all__ = ["install_functionalization"]

_lib = torch.library.Library(NAMESPACE, "FRAGMENT")


def install_functionalization(name: str, functional: torch._ops.OpOverloadPacket,
                              mutated: Sequence[int], *, aliased_returns: bool = True) -> None:
    """Run ``npu::<name>`` as ``functional`` under functionalization.

    ``mutated``: positions of the arguments the op writes (positional in its schema), in the
    order the op returns them; ``functional`` returns their new values first, in that order.
    ``aliased_returns``: the schema's returns alias the written arguments (``-> (Tensor(a!),
    ...)``, the arguments are returned; ``-> Tensor(a!)``: the one written argument, and
    ``functional`` returns one tensor); False for a schema with plain returns (PyTorch's
    functionalization rejects a mix of aliased and fresh returns), whose graphs get the new
    values as fresh tensors. Nothing is installed when a real torch_npu defines the op.
    """
    if not defined_here(name):
        return
    mutated = tuple(mutated)

    def functionalize(*args, **kwargs):
        ctx = CppFunctionalizeAPI()
        plain_args = ctx.unwrap_tensors(args)
        plain_kwargs = ctx.unwrap_tensors(kwargs)
        with ctx.redispatch_to_next():
            outs = functional(*plain_args, **plain_kwargs)
        single = isinstance(outs, torch.Tensor)  # `op_(Tensor(a!) self, ...) -> Tensor(a!)`
        if single:
            outs = (outs,)
        for pos, new in zip(mutated, outs):
            ctx.replace(args[pos], new)
            ctx.commit_update(args[pos])
            ctx.sync(args[pos])
        if aliased_returns and single:
            return args[mutated[0]]
        if aliased_returns:
            rest = ctx.wrap_tensors(tuple(outs[len(mutated):]))
            return (*(args[p] for p in mutated), *rest)
        return ctx.wrap_tensors(tuple(outs))

    _lib.impl(name, functionalize, "Functionalize")
