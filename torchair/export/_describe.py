"""What an export says about itself: ``dynamo.pbtxt`` and the input spec the loader checks.

``dynamo.pbtxt`` is TorchAir's readable text of the exported graph (``GraphDef`` text format,
opens in Netron), rendered here by torchair's own IR dump (:mod:`torchair.plan.dump`): user inputs
are ``Data`` nodes with ``kind: tensor`` (``-1`` for a dynamic dim), weights ``Data`` nodes with
``kind: parameter`` (their values are in the package), collectives appear as
``_c10d_functional.*`` nodes. With ``config.export.experimental.enable_record_nn_module_stack``
every op carries the ``nn_module_stack`` of the module that called it, as in TorchAir.

The input spec (stored in the package's metadata under :data:`SPEC_KEY`) lists, for every leaf
of ``(args, kwargs)``, either a tensor (dtype and per-dim size or ``[min, max]`` range) or the
constant value the package baked in; AOTInductor itself does not check its inputs. Non-tensor
arguments show in ``dynamo.pbtxt`` as ``Data`` nodes of kind ``constant``.
"""
from __future__ import annotations

import json
from typing import Any

import torch
import torch.utils._pytree as pytree

from torchair.plan.dump import render_pbtxt
from torchair.plan.inputs import InputInfo, dtype_name, ir_shape
from torchair.plan.ir import to_ir

__all__ = ["SPEC_KEY", "dumps", "flat_leaves", "input_spec", "render_export_pbtxt"]

SPEC_KEY = "torchair_export"
SPEC_VERSION = 1
_CONSTANT_TYPES = (int, float, bool, str, type(None))


def _kinds(ep) -> dict[str, tuple[str, str]]:
    """placeholder name -> (kind, readable name) from the exported program's signature."""
    from torch.export.graph_signature import InputKind

    out = {}
    for spec in ep.graph_signature.input_specs:
        name = getattr(spec.arg, "name", None)
        if name is None:
            continue
        if spec.kind == InputKind.USER_INPUT:
            out[name] = ("tensor", name)
        else:
            out[name] = ("parameter", spec.target or name)
    return out


def _placeholder_infos(ep) -> list[InputInfo]:
    kinds = _kinds(ep)
    infos = []
    placeholders = [n for n in ep.graph_module.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        kind, name = kinds.get(node.name, ("tensor", node.name))
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            infos.append(InputInfo(i, name, kind, ir_shape(val), dtype_name(val.dtype),
                                   device=str(val.device)))
        elif isinstance(val, torch.SymInt):
            infos.append(InputInfo(i, name, "symint", (), "int64"))
        else:  # a non-tensor argument, baked into the package: a scalar Data node
            infos.append(InputInfo(i, name, "constant", (), type(val).__name__))
    return infos


def _module_stack(node: torch.fx.Node) -> str | None:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    return " / ".join(f"{path}: {getattr(cls, '__qualname__', cls)}"
                      for path, cls in stack.values())


def render_export_pbtxt(ep, *, notes: list[str], record_nn_module_stack: bool) -> str:
    """The text of ``dynamo.pbtxt`` for ``ep``."""
    ir = to_ir(ep.graph_module, _placeholder_infos(ep))
    if record_nn_module_stack:
        by_name = {n.name: n for n in ep.graph_module.graph.nodes}
        for ir_node in ir:
            node = by_name.get(ir_node.name)
            stack = _module_stack(node) if node is not None else None
            if stack:
                ir_node.attrs["nn_module_stack"] = stack
    text = render_pbtxt(ir, graph_id=0, stage="export")
    return "".join(f"# {note}\n" for note in notes) + text


def _dim(d: Any, ranges: dict) -> Any:
    if isinstance(d, int):
        return d
    if isinstance(d, torch.SymInt) and d.node.maybe_as_int() is not None:
        return int(d.node.maybe_as_int())
    vr = ranges.get(d.node.expr) if isinstance(d, torch.SymInt) else None
    low = int(vr.lower) if vr is not None else 0
    return [low, _finite(vr.upper) if vr is not None else None, str(d.node.expr)]


def _finite(bound: Any) -> int | None:
    """A range bound as an int, None for infinity (sympy's oo or torch's int_oo)."""
    if "oo" in str(bound):
        return None
    try:
        return int(bound)
    except (TypeError, ValueError, AttributeError):
        return None


def input_spec(ep, args: tuple, kwargs: dict, *, dynamic: bool, rank: int | None,
               world_size: int | None, weights: str) -> dict:
    """The spec of the package's inputs (see the module doc), JSON-serializable."""
    kinds = _kinds(ep)
    user = [n for n in ep.graph_module.graph.nodes if n.op == "placeholder"
            and kinds.get(n.name, ("tensor",))[0] == "tensor"
            and isinstance(n.meta.get("val"), torch.Tensor)]
    ranges = dict(ep.range_constraints)
    tensors = iter(user)
    leaves = []
    for value in flat_leaves(args, kwargs, ep.call_spec.in_spec):
        if isinstance(value, torch.Tensor):
            node = next(tensors, None)
            val = node.meta.get("val") if node is not None else value
            leaves.append({"tensor": dtype_name(val.dtype),
                           "shape": [_dim(d, ranges) for d in val.shape]})
        elif isinstance(value, _CONSTANT_TYPES):
            leaves.append({"constant": repr(value)})
        else:
            leaves.append({"constant": f"<{type(value).__name__}>"})
    return {"version": SPEC_VERSION, "dynamic": dynamic, "rank": rank, "world_size": world_size,
            "weights": weights, "torch": torch.__version__, "inputs": leaves}


def flat_leaves(args: tuple, kwargs: dict, in_spec) -> list:
    """The leaves of ``(args, kwargs)`` in the package's order (AOTInductor's own order)."""
    from torch.export._tree_utils import reorder_kwargs

    return pytree.tree_leaves((tuple(args), reorder_kwargs(kwargs, in_spec) if kwargs else {}))


def dumps(spec: dict) -> str:
    return json.dumps(spec, sort_keys=True)
