"""SuperKernel segmentation (seed 004): which ops of each scope can run as one launch.

Ops are taken in program order. Within a ``super_kernel`` scope, consecutive fusable ops form a
segment; an op that cannot be fused ends the current segment, is skipped (with the reason) and
fusion resumes after it. An op outside the scope (or in another scope) also ends a segment.
Unfusable here means the op needs the host in the middle of the region:

* it reads tensor data on the host or has a data-dependent output shape (``.item()``,
  ``nonzero``, ...);
* it is a value-dependent op whose values are read on the host (tiling sink off);
* it is a collective (``c10d`` / ``_c10d_functional``);
* it produces a CPU tensor in a graph that runs on CUDA (a captured graph cannot run it).

Tuple element reads (``getitem``) follow the op that produced the tuple. This module only plans;
running each segment as one launch unit is done by the runtime.
"""
from __future__ import annotations

import dataclasses
import operator

import torch
import torch.fx as fx

from torchair.ops._registry import get_value_dependent
from torchair.plan.analysis import HOST_SYNC_OPS
from torchair.plan.ir import SCOPE_KEY

_COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")


@dataclasses.dataclass
class ScopePlan:
    """One scope's segments (node names, program order) and skipped ops with their reasons."""

    segments: list[list[str]] = dataclasses.field(default_factory=list)
    skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)


def unfusable_reason(node: fx.Node, *, tiling_sink: bool, cuda: bool) -> str:
    """Why ``node`` cannot be fused into a segment ("" when it can)."""
    target = node.target
    if target in HOST_SYNC_OPS:
        return "reads tensor data on the host (.item(), .tolist() or a data-dependent shape)"
    entry = get_value_dependent(target)
    if entry is not None and not tiling_sink:
        return (f"reads {', '.join(entry.args)} on the host (set experimental_config."
                f"tiling_schedule_optimize = True to read it on the device)")
    schema = getattr(target, "_schema", None)
    if schema is not None and schema.name.split("::")[0] in _COLLECTIVE_NAMESPACES:
        return "a collective (communication is not fused)"
    if cuda:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.device.type == "cpu":
            return "produces a CPU tensor inside a CUDA graph"
    return ""


def plan_segments(gm: fx.GraphModule, *, tiling_sink: bool, cuda: bool) -> dict[str, ScopePlan]:
    """Segments and skipped ops of every ``super_kernel`` scope of ``gm`` (see module doc)."""
    plans: dict[str, ScopePlan] = {}
    open_scope: str | None = None  # the scope whose segment is open
    status: dict[fx.Node, bool] = {}  # fused or not, for getitem to follow its producer
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        scope = node.meta.get(SCOPE_KEY)
        if scope is None:
            open_scope = None
            continue
        plan = plans.setdefault(scope, ScopePlan())
        if node.target is operator.getitem and isinstance(node.args[0], fx.Node):
            fused = status.get(node.args[0], False)
            reason = "" if fused else "reads an element of a skipped op's result"
        else:
            reason = unfusable_reason(node, tiling_sink=tiling_sink, cuda=cuda)
            fused = not reason
        status[node] = fused
        if not fused:
            plan.skipped.append((node.name, reason))
            open_scope = None
            continue
        if open_scope != scope:
            plan.segments.append([])
            open_scope = scope
        plan.segments[-1].append(node.name)
    return plans
