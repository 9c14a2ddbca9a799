"""StreamScopePass: turn ``npu_stream_switch`` / ``npu_wait_tensor`` markers into node attributes.

``torchair.scope.npu_stream_switch(tag, priority)`` leaves a begin and an end marker around its
region, ``npu_wait_tensor(t, dep)`` one wait marker (see :mod:`torchair.scope._markers`). This pass
walks the graph in order with a stack of open regions: ops inside a region get
``node.meta["_user_stream_label"]`` and ``["_user_stream_priority"]`` (the innermost region wins),
each later consumer of ``t`` gets ``dep`` in ``node.meta["_stream_waits"]``; the markers are
erased. Regions must nest like brackets (a ``ValueError`` naming the tag otherwise), and a tag
names one stream with one priority.

Before (``with npu_stream_switch("s", 1): y = x + 1``)::

    stream_begin("s", 1); add = aten.add(x, 1); stream_end("s")

After::

    add = aten.add(x, 1)        meta: _user_stream_label="s", _user_stream_priority=1
"""
from __future__ import annotations

import torch.fx as fx

from torchair.base.meta import PRIORITY_KEY, STREAM_KEY, WAITS_KEY
from torchair.passes._base import GraphPass
from torchair.scope._markers import STREAM_BEGIN, WAIT, is_marker, is_stream_marker

_WHY = ("a custom pass moved or removed a marker, or the region was split across graphs by a "
        "graph break inside the `with torchair.scope.npu_stream_switch(...)` block (find it with "
        "fullgraph=True or TORCH_LOGS=graph_breaks and move it out of the region)")


def _is_any_marker(node: fx.Node) -> bool:
    return node.op == "call_function" and (is_marker(node.target) or is_stream_marker(node.target))


class StreamScopePass(GraphPass):
    name = "stream_scope"

    def __call__(self, gm: fx.GraphModule) -> int:
        markers = [n for n in gm.graph.nodes
                   if n.op == "call_function" and is_stream_marker(n.target)]
        if not markers:
            return 0
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        streams: list[tuple[str, int, fx.Node]] = []  # (tag, priority, begin node)
        priorities: dict[str, tuple[int, fx.Node]] = {}
        for node in gm.graph.nodes:
            if node.op == "call_function" and is_stream_marker(node.target):
                self._marker(node, streams, priorities, order)
            elif streams and node.op in ("call_function", "call_method", "call_module") \
                    and not _is_any_marker(node):
                node.meta[STREAM_KEY], node.meta[PRIORITY_KEY] = streams[-1][:2]
        if streams:
            tag, _, begin = streams[-1]
            raise ValueError(f"npu_stream_switch {tag!r} is unpaired: its begin marker "
                             f"({begin.name}) has no end marker in this graph; {_WHY}")
        for node in markers:
            gm.graph.erase_node(node)
        return len(markers)

    def _marker(self, node: fx.Node, streams: list, priorities: dict,
                order: dict[fx.Node, int]) -> None:
        args = list(node.args) + [node.kwargs[k] for k in ("tag", "priority", "t", "dep")
                                  if k in node.kwargs]
        if node.target in (WAIT, WAIT.overloadpacket):
            t, dep = args[:2]
            for user in t.users:
                if order[user] > order[node] and not _is_any_marker(user):
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
                             f"({node.name}) has no begin marker before it in this graph; {_WHY}")
        if streams[-1][0] != tag:
            raise ValueError(f"npu_stream_switch {tag!r} is unpaired: its end marker "
                             f"({node.name}) closes while {streams[-1][0]!r} (begun at "
                             f"{streams[-1][2].name}) is still open; regions must nest; {_WHY}")
        streams.pop()
