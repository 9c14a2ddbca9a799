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

Tuple element reads (``getitem``) follow the op that produced the tuple. With ``stream-fusion=0``
(the default) a segment may use at most two streams (``npu_stream_switch``; the main stream
counts): a third is a ``ValueError`` naming the scope and ``stream-fusion=1``.

This module plans; :mod:`torchair.runtime.segmented` runs each segment as one launch unit when its
shapes are static (:func:`symbolic_inputs` says why not), cut out of the graph by
:func:`cut_segment`.
"""
from __future__ import annotations

import dataclasses
import operator
from typing import Iterable

import torch
import torch.fx as fx

from torchair.base.meta import OPTIONS_KEY, SCOPE_KEY, STREAM_KEY, WAITS_KEY
from torchair.base.registry import get_value_dependent
from torchair.plan.analysis import HOST_SYNC_OPS
from torchair.plan.inputs import InputInfo
from torchair.scope._options import parse_options
from torchair.scope._stream_runtime import graph_module

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
    _check_streams(gm, plans)
    return plans


def _check_streams(gm: fx.GraphModule, plans: dict[str, ScopePlan]) -> None:
    """stream-fusion=0: at most two streams per segment (SuperKernel's rule)."""
    nodes = {n.name: n for n in gm.graph.nodes}
    for scope, plan in plans.items():
        for k, segment in enumerate(plan.segments):
            members = [nodes[name] for name in segment]
            streams = list(dict.fromkeys(n.meta.get(STREAM_KEY) for n in members))
            if len(streams) <= 2:
                continue
            options = parse_options(members[0].meta.get(OPTIONS_KEY, ""))
            if options.get("stream-fusion", "0") == "1":
                continue
            names = ", ".join("main" if s is None else repr(s) for s in streams)
            raise ValueError(
                f"super_kernel scope {scope!r}: segment {k + 1} ({_short(segment)}) runs on "
                f"{len(streams)} streams ({names}), but with stream-fusion=0 (the default) a "
                f"SuperKernel holds at most two; pass options 'stream-fusion=1' to "
                f"super_kernel({scope!r}, ...) to allow any number, or move the ops of the extra "
                f"npu_stream_switch region out of the scope")


def _short(names: list[str], limit: int = 4) -> str:
    more = f", ... ({len(names)} ops)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _symbols(value) -> set:
    from torch.fx.experimental.symbolic_shapes import free_symbols

    try:
        return set(free_symbols(value))
    except Exception:  # noqa: BLE001 - values free_symbols does not know hold no symbols
        return set()


def symbolic_inputs(gm: fx.GraphModule, names: list[str], inputs: list[InputInfo]) -> list[str]:
    """Why the ops ``names`` have symbolic shapes, as the graph inputs that carry the symbols
    (``"input 0 (`x`) dim 0 (s0)"``, ``"SymInt input 3 (`n`)"``); [] when every shape and scalar
    they touch is static."""
    nodes = {n.name: n for n in gm.graph.nodes}
    members = [nodes[name] for name in names]
    symbols: set = set()
    for node in members:
        for value in [node] + node.all_input_nodes:
            symbols |= _symbols(value.meta.get("val"))
    if not symbols:
        return []
    found: list[str] = []
    placeholders = gm.graph.find_nodes(op="placeholder")
    pairs = list(zip(placeholders, inputs))
    for node, info in pairs:  # tensor dims first: Dynamo also passes their sizes as SymInts
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            for d, size in enumerate(val.shape):
                hit = _symbols(size) & symbols
                if hit:
                    found.append(f"input {info.index} (`{info.name}`) dim {d} ({size})")
                    symbols -= hit
    for node, info in pairs:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) and _symbols(val) & symbols:
            found.append(f"SymInt input {info.index} (`{info.name}`)")
            symbols -= _symbols(val)
    found += [f"a data-dependent size ({s})" for s in sorted(symbols, key=str)]
    return found


# ------------------------------------------------------------------------------ cutting out

@dataclasses.dataclass
class SegmentCut:
    """A segment cut out of its graph, for the runtime to launch as one unit."""

    gm: fx.GraphModule  # the piece as a graph: inputs -> outputs (a tuple)
    members: set[fx.Node]  # nodes of the original graph it replaces
    anchor: fx.Node  # its last op: the host program launches the piece there
    inputs: list[fx.Node]
    outputs: list[fx.Node]
    mutated: set[int]  # input positions written in place
    escaping: set[int]  # output positions that leave the step (graph outputs, read via views)
    aliases: dict[fx.Node, fx.Node]  # inputs that are views of another node, kept on the host


def cut_segment(gm: fx.GraphModule, nodes: list[fx.Node], *, hoist: bool) -> SegmentCut:
    """Cut ``nodes`` (a contiguous run of ops) out of ``gm``. Tuple reads of its ops join it.
    With ``hoist`` (captured pieces), views of the piece's inputs stay on the host: a captured
    piece would return copies of them, cut off from the inputs they alias."""
    anchor = nodes[-1]
    members = list(nodes)
    for node in nodes:
        members += [u for u in node.users if u.target is operator.getitem and u not in members]
    aliases: dict[fx.Node, fx.Node] = {}  # hoisted view -> the input it views
    if hoist:
        run = set(members)
        for node in members:
            base = node.args[0] if node.args else None
            if (is_view(node) or node.target is operator.getitem) and isinstance(base, fx.Node) \
                    and (base not in run or base in aliases):
                aliases[node] = aliases.get(base, base)
        members = [n for n in members if n not in aliases]
    member_set = set(members)
    if anchor not in member_set:  # the run's last op was hoisted: launch after the last kept op
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        anchor = max(member_set, key=order.__getitem__)
    inputs: list[fx.Node] = []
    for node in members:
        inputs += [i for i in node.all_input_nodes if i not in member_set and i not in inputs]
    outputs = [n for n in members if any(u not in member_set for u in n.users)]
    graph = fx.Graph()
    env = {i: graph.placeholder(i.name) for i in inputs}
    for i, p in zip(inputs, env.values()):
        p.meta.update(i.meta)
    for node in gm.graph.nodes:  # program order
        if node in member_set:
            env[node] = graph.node_copy(node, lambda n: env[n])
            remap_waits(env[node], env)
    graph.output(tuple(env[o] for o in outputs))
    position = {node: j for j, node in enumerate(inputs)}
    mutated = {position[a] for n in members for a in _written(n) if a in position}
    escaping = {j for j, o in enumerate(outputs)
                if any(u not in member_set and _leaks(u) for u in o.users)}
    return SegmentCut(graph_module(gm, graph, {}), member_set, anchor, inputs, outputs,
                mutated, escaping, aliases)


def remap_waits(node: fx.Node, env: dict[fx.Node, fx.Node]) -> None:
    """``npu_wait_tensor`` dependencies of a copied node, in the new graph (those outside it
    are the caller's to wait for)."""
    waits = node.meta.get(WAITS_KEY)
    if waits:
        node.meta[WAITS_KEY] = [env[d] for d in waits if d in env]


def is_view(node: fx.Node) -> bool:
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return False
    return any(r.alias_info is not None and not r.alias_info.is_write
               for r in target._schema.returns)


def _written(node: fx.Node) -> list[fx.Node]:
    """Arguments ``node`` writes in place."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or not target._schema.is_mutable:
        return []
    out = []
    for i, arg in enumerate(target._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            out += [v for v in (value if isinstance(value, (list, tuple)) else [value])
                    if isinstance(v, fx.Node)]
    return out


def _leaks(user: fx.Node) -> bool:
    """A value read by ``user`` outlives the step or aliases it (so a static buffer must not be
    handed over): the graph output, a view, a tuple read, or an op of unknown aliasing."""
    if user.op == "output":
        return True
    if user.op == "call_module":
        return False  # another launch unit: it copies or borrows its inputs
    if user.target is operator.getitem or not isinstance(user.target, torch._ops.OpOverload):
        return True
    return is_view(user)


def count_launches(nodes: Iterable[fx.Node]) -> int:
    """Ops that launch device work: views, tuple reads and host scalar arithmetic do not."""
    count = 0
    for node in nodes:
        if node.op not in ("call_function", "call_method") or node.target is operator.getitem \
                or is_view(node):
            continue
        val = node.meta.get("val")
        values = val if isinstance(val, (list, tuple)) else [val]
        count += any(isinstance(v, torch.Tensor) for v in values)
    return count
