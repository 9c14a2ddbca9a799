"""Collectives in a graph: which ``_c10d_functional`` ops it holds, whether their process groups
exist, and where they run (for the GraphReport).

Dynamo traces ``torch.distributed._functional_collectives`` calls, and the in-place
``dist.all_reduce(t)``-style calls it remaps (see :func:`torchair.patch_for_hcom`), into
``torch.ops._c10d_functional.<op>`` nodes followed by ``wait_tensor``. They are ordinary ops for
the plan: not value-dependent, fixed output shapes, so they keep a graph static. On CPU with gloo
they are host calls inside the compiled unit; on CUDA with NCCL they are captured in the CUDA graph.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from torchair.distributed.quiesce import drain_at_exit_for

_NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd")
_NOT_COLLECTIVES = ("wait_tensor",)


def _op_name(node: fx.Node) -> str | None:
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    if target.namespace not in _NAMESPACES:
        return None
    name = target._opname
    return None if name in _NOT_COLLECTIVES else name


def collective_nodes(gm: fx.GraphModule) -> list[tuple[fx.Node, str]]:
    """``(node, op name)`` for each collective in the graph, in graph order (no ``wait_tensor``)."""
    found = []
    for node in gm.graph.nodes:
        name = _op_name(node)
        if name is not None:
            found.append((node, name))
    return found


def _group_name(node: fx.Node) -> str | None:
    names = [a for a in list(node.args) + list(node.kwargs.values()) if isinstance(a, str)]
    return names[-1] if names else None  # the group name is the last string argument


def _resolve(name: str | None):
    from torch.distributed import distributed_c10d as c10d

    try:
        return c10d._resolve_process_group(name)
    except Exception:  # noqa: BLE001 - any failure means the group is not there
        return None


def check_process_groups(gm: fx.GraphModule) -> None:
    """Raise a ``RuntimeError`` naming the first collective whose process group does not exist;
    then :func:`drain_gloo_at_exit`."""
    nodes = collective_nodes(gm)
    if not nodes:
        return
    import torch.distributed as dist

    for node, name in nodes:
        group = _group_name(node)
        if not dist.is_available() or not dist.is_initialized() or _resolve(group) is None:
            raise RuntimeError(
                f"collective `{name}` (node {node.name}) in the compiled graph needs the process "
                f"group {group!r}, but it does not exist in this process: call "
                f"torch.distributed.init_process_group(...) (gloo on CPU, nccl on CUDA) before "
                f"the first call of the compiled function, and pass that group (or None for the "
                f"default group) to the collective")
    drain_gloo_at_exit(gm)


def drain_gloo_at_exit(gm: fx.GraphModule) -> None:
    """Register :func:`~torchair.distributed.quiesce.drain_at_exit` when a collective of the
    graph runs on a gloo group: gloo's workers must be done with the graph's tensors before
    Python finalizes (for compiled graphs and graphs loaded from ``cache_compile`` alike)."""
    for name in backends(gm):
        drain_at_exit_for(name)


def backends(gm: fx.GraphModule) -> list[str]:
    """The process-group backends of the graph's collectives (``gloo``, ``nccl``, ...)."""
    import torch.distributed as dist

    found: list[str] = []
    for node, _ in collective_nodes(gm):
        pg = _resolve(_group_name(node))
        name = str(dist.get_backend(pg)) if pg is not None else "unknown"
        if name not in found:
            found.append(name)
    return found


def describe(gm: fx.GraphModule, where: str, captured: bool = False) -> str:
    """One report line: ``all_reduce x2, all_gather_into_tensor x1 <where> (gloo, host)``;
    ``captured``: the collectives are recorded in a CUDA graph and replayed with it."""
    counts: dict[str, int] = {}
    for _, name in collective_nodes(gm):
        counts[name] = counts.get(name, 0) + 1
    if not counts:
        return ""
    ops = ", ".join(f"{k} x{v}" for k, v in counts.items())
    names = backends(gm)
    kind = "captured in the CUDA graph" if captured else (
        "device" if "nccl" in names else "host")
    return f"{ops} {where} ({', '.join(names)}, {kind})"
