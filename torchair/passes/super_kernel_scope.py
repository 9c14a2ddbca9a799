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

The stream markers of ``npu_stream_switch`` / ``npu_wait_tensor`` are left to the next pass,
:class:`torchair.passes.stream_scope.StreamScopePass` (each pass reports its own count).
"""
from __future__ import annotations

import torch.fx as fx

from torchair.base.log import logger
from torchair.base.meta import OPTIONS_KEY, SCOPE_KEY
from torchair.passes._base import GraphPass
from torchair.scope._markers import BEGIN, is_marker, is_stream_marker
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


class SuperKernelScopePass(GraphPass):
    name = "super_kernel_scope"

    def __init__(self) -> None:
        self.scopes: dict[str, list[str]] = {}

    def __call__(self, gm: fx.GraphModule) -> int:
        self.scopes = {}
        markers = [n for n in gm.graph.nodes if n.op == "call_function" and is_marker(n.target)]
        if not markers:
            return 0
        stack: list[tuple[str | None, str, fx.Node]] = []  # (scope, options, begin node)
        for node in gm.graph.nodes:
            if node.op == "call_function" and is_marker(node.target):
                self._marker(node, stack)
            elif stack and node.op in ("call_function", "call_method", "call_module") \
                    and not (node.op == "call_function" and is_stream_marker(node.target)):
                self._annotate(node, *stack[-1][:2])
        if stack:
            scope, _, begin = stack[-1]
            raise ValueError(f"super_kernel scope {scope!r} is unpaired: its begin marker "
                             f"({begin.name}) has no end marker in this graph; {_WHY}")
        for node in markers:
            gm.graph.erase_node(node)
        return len(markers)

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
