"""SuperKernelScopePass: turn ``torchair.scope.super_kernel`` markers into node attributes.

``super_kernel`` leaves a begin and an end marker op around its region (see
:mod:`torchair.scope._markers`). This pass walks the graph in order with a stack of open scopes,
sets ``node.meta["_super_kernel_scope"]`` and ``node.meta["_super_kernel_options"]`` on every op
inside a named scope (the innermost scope wins; ops under ``super_kernel(None)`` get neither), and
erases the markers, so later passes and the engines never see them. ``scopes`` holds, for the
report, the ops of each scope of the last run (a name used twice is one region).

Markers must pair up like brackets. An end without a begin, a begin without an end or crossed
scopes mean a custom pass moved or removed a marker or the region was not traced as one graph;
that is a ``ValueError`` naming the scope.

The stream markers of ``npu_stream_switch`` / ``npu_wait_tensor`` are handled the same way, with
their own bracket stack: ops inside a stream region get ``node.meta["_user_stream_label"]`` and
``["_user_stream_priority"]`` (innermost region wins), and each later consumer of ``t`` in
``npu_wait_tensor(t, dep)`` gets ``dep`` in ``node.meta["_stream_waits"]``. A tag used with two
priorities is a ``ValueError``.
"""
from __future__ import annotations

import torch.fx as fx

from torchair.core.utils import logger
from torchair.passes._base import GraphPass
from torchair.plan.ir import OPTIONS_KEY, SCOPE_KEY
from torchair.scope._markers import (BEGIN, PRIORITY_KEY, STREAM_BEGIN, STREAM_KEY, WAIT,
                                     WAITS_KEY, is_marker, is_stream_marker)
from torchair.scope._options import check_options

_WHY = ("a custom pass moved or removed a marker, or the region was split across graphs by a "
        "graph break inside the `with torchair.scope.super_kernel(...)` block (find it with "
        "fullgraph=True or TORCH_LOGS=graph_breaks and move it out of the region)")


def _marker_scope(node: fx.Node) -> str | None:
    return node.args[0] if node.args else node.kwargs.get("scope")


def _marker_options(node: fx.Node, scope: str | None) -> str:
    """The options as the user wrote them (TorchAir keeps the text); parts not understood
    are logged as a warning and ignored."""
    options = node.args[1] if len(node.args) > 1 else node.kwargs.get("options", "")
    for problem in check_options(options)[1]:
        logger.warning("super_kernel scope %r, options %r: %s; this part is ignored here",
                       scope, options, problem)
    return options


_STREAM_WHY = _WHY.replace("torchair.scope.super_kernel", "torchair.scope.npu_stream_switch")


class SuperKernelScopePass(GraphPass):
    name = "super_kernel_scope"

    def __init__(self) -> None:
        self.scopes: dict[str, list[str]] = {}

    def __call__(self, gm: fx.GraphModule) -> int:
        self.scopes = {}
        markers = [n for n in gm.graph.nodes if n.op == "call_function"
                   and (is_marker(n.target) or is_stream_marker(n.target))]
        if not markers:
            return 0
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        stack: list[tuple[str | None, str, fx.Node]] = []  # (scope, options, begin node)
        streams: list[tuple[str, int, fx.Node]] = []  # (tag, priority, begin node)
        priorities: dict[str, tuple[int, fx.Node]] = {}
        for node in gm.graph.nodes:
            if node.op == "call_function" and is_marker(node.target):
                self._marker(node, stack)
            elif node.op == "call_function" and is_stream_marker(node.target):
                self._stream_marker(node, streams, priorities, order)
            elif node.op in ("call_function", "call_method", "call_module"):
                if stack:
                    self._annotate(node, *stack[-1][:2])
                if streams:
                    node.meta[STREAM_KEY], node.meta[PRIORITY_KEY] = streams[-1][:2]
        if stack:
            scope, _, begin = stack[-1]
            raise ValueError(f"super_kernel scope {scope!r} is unpaired: its begin marker "
                             f"({begin.name}) has no end marker in this graph; {_WHY}")
        if streams:
            tag, _, begin = streams[-1]
            raise ValueError(f"npu_stream_switch {tag!r} is unpaired: its begin marker "
                             f"({begin.name}) has no end marker in this graph; {_STREAM_WHY}")
        for node in markers:
            gm.graph.erase_node(node)
        return len(markers)

    def _stream_marker(self, node: fx.Node, streams: list, priorities: dict,
                       order: dict[fx.Node, int]) -> None:
        args = list(node.args) + [node.kwargs[k] for k in ("tag", "priority", "t", "dep")
                                  if k in node.kwargs]
        if node.target in (WAIT, WAIT.overloadpacket):
            t, dep = args[:2]
            for user in t.users:
                if order[user] > order[node] and not (user.op == "call_function" and (
                        is_marker(user.target) or is_stream_marker(user.target))):
                    user.meta.setdefault(WAITS_KEY, []).append(dep)
            return
        tag = args[0]
        if node.target in (STREAM_BEGIN, STREAM_BEGIN.overloadpacket):
            priority = args[1] if len(args) > 1 else 0
            first = priorities.setdefault(tag, (priority, node))
            if first[0] != priority:
                raise ValueError(f"npu_stream_switch {tag!r} is used with priority {first[0]} "
                                 f"({first[1].name}) and priority {priority} ({node.name}); a tag "
                                 f"names one stream with one priority: use one priority per tag")
            streams.append((tag, priority, node))
            return
        if not streams:
            raise ValueError(f"npu_stream_switch {tag!r} is unpaired: its end marker "
                             f"({node.name}) has no begin marker before it in this graph; "
                             f"{_STREAM_WHY}")
        if streams[-1][0] != tag:
            raise ValueError(f"npu_stream_switch {tag!r} is unpaired: its end marker "
                             f"({node.name}) closes while {streams[-1][0]!r} (begun at "
                             f"{streams[-1][2].name}) is still open; regions must nest; "
                             f"{_STREAM_WHY}")
        streams.pop()

    def _marker(self, node: fx.Node, stack: list) -> None:
        scope = _marker_scope(node)
        if node.target in (BEGIN, BEGIN.overloadpacket):
            stack.append((scope, _marker_options(node, scope), node))
            if scope is not None:
                self.scopes.setdefault(scope, [])
            return
        if not stack:
            raise ValueError(f"super_kernel scope {scope!r} is unpaired: its end marker "
                             f"({node.name}) has no begin marker before it in this graph; {_WHY}")
        if stack[-1][0] != scope:
            raise ValueError(f"super_kernel scope {scope!r} is unpaired: its end marker "
                             f"({node.name}) closes while scope {stack[-1][0]!r} (begun at "
                             f"{stack[-1][2].name}) is still open; scopes must nest; {_WHY}")
        stack.pop()

    def _annotate(self, node: fx.Node, scope: str | None, options: str) -> None:
        if scope is None:  # super_kernel(None): kept out of any enclosing scope
            node.meta.pop(SCOPE_KEY, None)
            node.meta.pop(OPTIONS_KEY, None)
            return
        node.meta[SCOPE_KEY] = scope
        node.meta[OPTIONS_KEY] = options
        self.scopes[scope].append(node.name)
