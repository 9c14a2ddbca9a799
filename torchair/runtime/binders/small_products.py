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

Products of the same ``x`` (a layer's q/k/v, its gate/up) then share one
``torchair_native::gemv_cat(x, w0, w1, w2, b0, b1, b2, abi)`` call, whose output holds theirs side
by side (each use reads its columns through ``aten.slice``): one parallel region and one dispatch
for 2-3 products, the same sums (``TORCHAIR_GEMV_GROUPS=0`` keeps one ``gemv`` call each).

Fewer rows (on an Intel CPU with MKL, whose GEMV of 1-3 rows already reads the weight at the
memory's speed) and more (a BLAS's blocked GEMM wins) stay ``mm``. The kernel sums in another order than the BLAS, so a bound
unit's products can differ from eager's in the last bits (as Inductor's fused kernels do);
``TORCHAIR_SMALL_GEMM=0`` keeps ATen's ``mm``. The traced graph is never changed: the binder
returns a rewritten copy.
"""
from __future__ import annotations

import contextlib
import operator
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
    grouped = groups = 0  # products the last call put in gemv_cat calls, and those calls

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
        bound = []
        for old, operands in found:
            node = copies[old]
            x, w_t, bias = (copies[a] if isinstance(a, fx.Node) else a for a in operands)
            with graph.inserting_before(node):
                new = graph.call_function(op, (x, w_t, bias, abi))
            new.meta = dict(node.meta)
            node.replace_all_uses_with(new)
            graph.erase_node(node)
            copies[old] = new  # a later product whose operand this one was reads the new node
            bound.append(new)
        self.grouped, self.groups = (_group(graph, bound) if env_switch(_matmul.GROUP_SWITCH)
                                     else (0, 0))
        return fx.GraphModule(gm, graph), len(found) - self.grouped + self.groups


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


# ops that only reinterpret their one tensor operand (a weight's W.t()): moved up to a group's
# first product when a later member's weight is made after it
_MOVABLE = (torch.ops.aten.permute.default, torch.ops.aten.t.default)
_MAX_GROUP = 3  # gemv_cat takes 2 or 3 weights


def _group(graph: fx.Graph, bound: list[fx.Node]) -> tuple[int, int]:
    """Products of the same ``x`` (a layer's q/k/v, gate/up) become one ``gemv_cat`` call, in
    groups of 2 or 3 in graph order, each member's uses reading its columns
    (``aten.slice``): one parallel region and one dispatch instead of 2-3, the same sums. A
    member stays a ``gemv`` call when its operands cannot all be had before the group's first
    product, when anything between the two may write, or when its uses take views that columns
    of a wider output cannot give (:func:`_fit`). Returns ``(products grouped, gemv_cat
    calls)``."""
    by_x: dict[Any, list[fx.Node]] = {}
    for node in bound:
        if isinstance(node.args[0], fx.Node):
            by_x.setdefault(_same_x(node.args[0]), []).append(node)
    grouped = groups = 0
    for members in by_x.values():
        while len(members) >= 2:
            group = _fit(members[0], members[1:])
            if len(group) >= 2:
                _cat(graph, group)
                grouped, groups = grouped + len(group), groups + 1
            members = [m for m in members if m not in group]
    return grouped, groups


# a linear layer flattens its input with a view of its own: the views of one tensor to one
# shape are the same x
_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default,
          torch.ops.aten.reshape.default)


def _same_x(x: fx.Node) -> Any:
    if x.op == "call_function" and x.target in _VIEWS and isinstance(x.args[0], fx.Node):
        try:
            return ("view", x.args[0], tuple(int(s) for s in x.args[1]))
        except (TypeError, ValueError):
            return x
    return x


def _position(graph: fx.Graph) -> dict[fx.Node, int]:
    return {n: i for i, n in enumerate(graph.nodes)}


def _fit(first: fx.Node, rest: list[fx.Node]) -> list[fx.Node]:
    """``first`` and the members of ``rest`` (up to 3 in all) whose operands can be computed
    before ``first`` (moving a weight's ``W.t()`` up where needed), with nothing between ``first``
    and them that may write, and whose uses take only views the columns allow."""
    group = [first]
    if not _uses_fit(first):
        return group
    for node in rest:
        if len(group) == _MAX_GROUP:
            break
        where = _position(first.graph)
        # anything that may write between the two products (to x, a weight, a bias or any view
        # of them: an in-place op, a copy_ into a slice) and the member keeps its own call
        if any(_may_write(n) for n in first.graph.nodes if where[first] < where[n] < where[node]):
            continue
        if not _uses_fit(node):
            continue
        operands = [a for a in node.args[1:3] if isinstance(a, fx.Node)]  # w_t, bias; x: first's
        late = [a for a in operands if where[a] > where[first]]
        if all(a.op == "call_function" and a.target in _MOVABLE
               and all(where[s] < where[first] for s in a.all_input_nodes) for a in late):
            for a in late:
                first.prepend(a)
            group.append(node)
    return group


def _may_write(node: fx.Node) -> bool:
    """Whether ``node`` may write to a tensor: an operator whose schema has a mutable argument,
    or a call of anything else (``operator.getitem`` only reads)."""
    if node.op != "call_function" or node.target is operator.getitem:
        return False
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return True
    return any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def _is_view(node: fx.Node) -> bool:
    """Whether ``node``'s result is a view of its first operand (the schema says it aliases it,
    or ``_unsafe_view`` / ``reshape``, which alias without saying so)."""
    if node.op != "call_function":
        return False
    if node.target in _VIEWS:
        return True
    schema = getattr(node.target, "_schema", None)
    return bool(schema is not None and schema.returns and schema.returns[0].alias_info is not None
                and not schema.returns[0].alias_info.is_write)


_STRIDED = (torch.ops.aten.as_strided.default, torch.ops.aten.as_strided_.default,
            torch.ops.aten.as_strided_scatter.default)


def _uses_fit(member: fx.Node) -> bool:
    """Whether every view taken of ``member``'s product still holds when the product is columns
    of a wider output (rows ``sum N`` apart): a view that merges rows cannot be taken of them
    (at more than one row), and ``as_strided`` counts its offset from the wider output's start.
    Each view is taken again, on fake tensors, of the columns' layout."""
    val = _val(member)
    mode = getattr(val, "fake_mode", None)
    if not isinstance(val, torch.Tensor) or mode is None:
        return False
    with mode:  # the columns' layout: the product's values, rows 2N apart (any wider output)
        cols = torch.empty_strided((val.shape[0], 2 * val.shape[1]), (2 * val.shape[1], 1),
                                   dtype=val.dtype)[:, :val.shape[1]]
    return _views_hold(member, cols, mode)


def _views_hold(node: fx.Node, val: Any, mode: Any) -> bool:
    for user in node.users:
        if user.target in _STRIDED:
            return False
        if not _is_view(user) or user.args[:1] != (node,):
            continue  # a computation reads any layout
        args = [val, *(_val(a) if isinstance(a, fx.Node) else a for a in user.args[1:])]
        try:
            with mode:
                out = user.target(*args, **user.kwargs)
        except Exception:  # noqa: BLE001 (the view cannot be taken of the columns)
            return False
        if not _views_hold(user, out, mode):
            return False
    return True


def _cat(graph: fx.Graph, group: list[fx.Node]) -> None:
    """One ``gemv_cat`` before ``group[0]``; each member's uses read its columns."""
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    x = group[0].args[0]
    weights = [m.args[1] for m in group] + [None] * (_MAX_GROUP - len(group))
    biases = [m.args[2] for m in group] + [None] * (_MAX_GROUP - len(group))
    op = _matmul.gemv_cat()
    args = (x, *weights, *biases, _native.abi_number(op))
    vals = [_val(a) if isinstance(a, fx.Node) else a for a in args]
    mode = getattr(_val(x), "fake_mode", None)
    meta_mode = mode if mode is not None else contextlib.nullcontext()  # the vals' fake mode
    with graph.inserting_before(group[0]):
        cat = graph.call_function(op, args)
    cat.meta = {k: v for k, v in group[0].meta.items() if k not in ("val", "tensor_meta")}
    with meta_mode:
        whole = op(*vals)
    cat.meta["val"] = whole
    offset = 0
    for member in group:
        n = int(_val(member).shape[1])
        with graph.inserting_after(cat):
            part = graph.call_function(torch.ops.aten.slice.Tensor, (cat, 1, offset, offset + n))
        part.meta = dict(member.meta)
        with meta_mode:
            part.meta["val"] = torch.ops.aten.slice.Tensor(whole, 1, offset, offset + n)
        part.meta["tensor_meta"] = _extract_tensor_metadata(part.meta["val"])
        member.replace_all_uses_with(part)
        own_x = member.args[0]
        graph.erase_node(member)
        if own_x is not x and not own_x.users:  # its own view of x, now unused
            graph.erase_node(own_x)
        offset += n
