"""SmallProductBinder: a CPU static unit's few-row products bound to ``torchair_native::gemv``.

A decode step's linear layers are ``mm(x, W.t())`` (``addmm`` with a bias) whose ``x`` has as
many rows as the batch: each product streams the whole weight once, and
``torchair_native::gemv`` (:mod:`torchair.ops.matmul.cpu`) does that faster than ATen for
:data:`~torchair.ops.matmul.cpu.MIN_ROWS` to :data:`~torchair.ops.matmul.cpu.MAX_ROWS` rows.
In the graph of a CPU static unit built by the Inductor engine (the FX engine,
``debug.run_eagerly``, keeps eager's kernels; :mod:`torchair.runtime.units` decides), each
float32 ``aten.mm`` / ``aten.addmm`` (``beta = alpha = 1``) with that many rows whose second
operand is a transposed row-major matrix (``W.t()``: a linear layer's weight) becomes a call of
the operator, its last argument the number naming the operator's schema::

    # before
    t = aten.permute.default(w, [1, 0])
    y = aten.addmm.default(b, x, t)                      # x: [8, 4096] float32
    # after
    t = aten.permute.default(w, [1, 0])
    y = torchair_native.gemv.default(x, t, b, <abi>)

Fewer rows (on an Intel CPU with MKL, whose GEMV of 1-3 rows already reads the weight at the
memory's speed) and more (a BLAS's blocked GEMM wins) stay ``mm``. The kernel sums in another order than the BLAS, so a bound
unit's products can differ from eager's in the last bits (as Inductor's fused kernels do);
``TORCHAIR_SMALL_GEMM=0`` keeps ATen's ``mm``. The traced graph is never changed: the binder
returns a rewritten copy.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from torchair.base.log import env_switch
from torchair.ops.matmul import cpu as _matmul
from torchair.ops.toolchain import native as _native

__all__ = ["SmallProductBinder"]


class SmallProductBinder:
    """Binds the few-row float32 products of a CPU static unit's graph to
    ``torchair_native::gemv`` (module doc). ``binder(gm)`` returns ``(graph, count)``: a
    rewritten copy of ``gm`` and how many products it binds, or ``(gm, 0)``, ``gm`` itself,
    when there are none, ``TORCHAIR_SMALL_GEMM`` is 0 or the kernel is not available. ``gm`` is
    never changed."""

    name = "bind_small_products"

    def __call__(self, gm: fx.GraphModule) -> tuple[fx.GraphModule, int]:
        found = [(n, operands) for n in gm.graph.nodes
                 if n.op == "call_function" and (operands := _bindable(n)) is not None]
        if not found or not env_switch(_matmul.ENV_SWITCH) or not _matmul.available():
            return gm, 0
        graph = fx.Graph()
        copies: dict[fx.Node, fx.Node] = {}
        graph.output(graph.graph_copy(gm.graph, copies))
        op = _matmul.gemv()
        abi = _native.abi_number(op)
        for old, operands in found:
            node = copies[old]
            x, w_t, bias = (copies[a] if isinstance(a, fx.Node) else a for a in operands)
            with graph.inserting_before(node):
                new = graph.call_function(op, (x, w_t, bias, abi))
            new.meta = dict(node.meta)
            node.replace_all_uses_with(new)
            graph.erase_node(node)
            copies[old] = new  # a later product whose operand this one was reads the new node
        return fx.GraphModule(gm, graph), len(found)


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _bindable(node: fx.Node) -> tuple | None:
    """``(x, w_t, bias)`` of an ``mm``/``addmm`` node the kernel serves fast, else None."""
    aten = torch.ops.aten
    if node.target is aten.mm.default and len(node.args) == 2 and not node.kwargs:
        bias, (x, w_t) = None, node.args
    elif node.target is aten.addmm.default and len(node.args) == 3:
        if any(node.kwargs.get(k, 1) != 1 for k in ("beta", "alpha")) or (
                set(node.kwargs) - {"beta", "alpha"}):
            return None
        bias, x, w_t = node.args
    else:
        return None
    xv, wv, bv = _val(x), _val(w_t), _val(bias)
    tensors = [t for t in (xv, wv) if isinstance(t, torch.Tensor)]
    if len(tensors) != 2 or any(t.dtype != torch.float32 or t.device.type != "cpu"
                                or t.dim() != 2 for t in tensors):
        return None
    try:
        rows, k, n = int(xv.shape[0]), int(xv.shape[1]), int(wv.shape[1])
        if not _matmul.MIN_ROWS <= rows <= _matmul.MAX_ROWS or wv.shape[0] != k or k < 2:
            return None
        if xv.stride(1) != 1 or wv.stride(0) != 1:
            return None
        if bias is not None:
            if not isinstance(bv, torch.Tensor) or bv.dtype != torch.float32 or bv.dim() != 1 \
                    or int(bv.shape[0]) != n or (n > 1 and bv.stride(0) != 1):
                return None
    except (TypeError, ValueError):  # symbolic sizes: not a static unit's product
        return None
    return x, w_t, bias
