"""Running ``npu_stream_switch`` regions: a graph rewrite that schedules each op on its stream.

:func:`with_streams` takes a graph whose ops carry ``_user_stream_label`` / ``_stream_waits`` (set by
SuperKernelScopePass) and returns a graph that runs the same ops with stream bookkeeping around
them, for the FX engine (op by op, or captured as one CUDA graph):

* at the start every side stream waits for the stream that was current when the graph began (the
  *main* stream; during a CUDA graph capture, the capture stream: the fork);
* before an op, the current stream is switched to the op's stream when it changes;
* an op whose input (or ``npu_wait_tensor`` dependency) was produced on another stream waits for
  the event recorded right after the producer, once per (stream, producer); a crossing tensor is
  also marked used on the consumer's stream (``record_stream``) so the caching allocator does not
  hand its memory out early;
* at the end the main stream is current again and waits for every side stream (the join).

Streams come from one pool per device and tag (priority fixed at the tag's first use). The
:class:`EmulatedStreams` backend runs the same schedule on CPU and records it, for tests.
"""
from __future__ import annotations

import operator
import threading
from typing import Any, ClassVar

import torch
import torch.fx as fx

from torchair.base.meta import PRIORITY_KEY, STREAM_KEY, WAITS_KEY

MAIN = None  # the tag of the main stream


def stream_tags(gm: fx.GraphModule) -> dict[str, int]:
    """The side streams ``gm`` uses: tag -> priority, in order of first use."""
    tags: dict[str, int] = {}
    for node in gm.graph.nodes:
        tag = node.meta.get(STREAM_KEY)
        if tag is not None:
            tags.setdefault(tag, node.meta.get(PRIORITY_KEY, 0))
    return tags


def has_streams(gm: fx.GraphModule) -> bool:
    return any(STREAM_KEY in n.meta for n in gm.graph.nodes if n.op != "placeholder")


# ------------------------------------------------------------------------------ backends

class CudaStreams:
    """One ``torch.cuda.Stream`` per (device, tag), shared by every graph of the process."""

    _pool: ClassVar[dict[tuple[int, str], Any]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)

    def stream(self, tag: str, priority: int) -> Any:
        index = self.device.index if self.device.index is not None else \
            torch.cuda.current_device()
        with self._lock:
            key = (index, tag)
            if key not in self._pool:
                self._pool[key] = torch.cuda.Stream(device=index, priority=priority)
            return self._pool[key]

    def current(self) -> Any:
        return torch.cuda.current_stream(self.device)

    def set_current(self, stream: Any) -> None:
        torch.cuda.set_stream(stream)

    def record(self, stream: Any) -> Any:
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def wait_event(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def wait_stream(self, stream: Any, other: Any) -> None:
        stream.wait_stream(other)

    def keep(self, tensor: torch.Tensor, stream: Any) -> None:
        tensor.record_stream(stream)


class EmulatedStreams:
    """CPU stand-in: streams are names, ops run in program order, ``log`` records the schedule
    as ``("op", stream, node)``, ``("record", stream, event)``, ``("wait", stream, event)``,
    ``("wait_stream", stream, other)``, ``("keep", stream, None)``."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any, Any]] = []
        self._current = "main"
        self._events = 0
        self.priorities: dict[str, int] = {}

    def stream(self, tag: str, priority: int) -> Any:
        self.priorities.setdefault(tag, priority)
        return tag

    def current(self) -> Any:
        return self._current

    def set_current(self, stream: Any) -> None:
        self._current = stream

    def record(self, stream: Any) -> Any:
        self._events += 1
        self.log.append(("record", stream, self._events))
        return self._events

    def wait_event(self, stream: Any, event: Any) -> None:
        self.log.append(("wait", stream, event))

    def wait_stream(self, stream: Any, other: Any) -> None:
        self.log.append(("wait_stream", stream, other))

    def keep(self, tensor: torch.Tensor, stream: Any) -> None:
        self.log.append(("keep", stream, None))


# ------------------------------------------------------------------------------ runtime calls
# Targets of the call_function nodes :func:`with_streams` inserts (plain functions, so FX code
# generation can name them).

class _Run:
    """The streams of one run of the graph: the main stream and the side streams by tag."""

    __slots__ = ("backend", "main", "side")

    def __init__(self, backend: Any, tags: dict[str, int]) -> None:
        self.backend = backend
        self.main = backend.current()
        self.side = {tag: backend.stream(tag, priority) for tag, priority in tags.items()}

    def stream(self, tag: str | None) -> Any:
        return self.main if tag is MAIN else self.side[tag]


def _fork(backend: Any, tags: dict[str, int]) -> _Run:
    run = _Run(backend, tags)
    for stream in run.side.values():
        backend.wait_stream(stream, run.main)
    return run


def _switch(run: _Run, tag: str | None) -> None:
    run.backend.set_current(run.stream(tag))


def _record(run: _Run, tag: str | None) -> Any:
    return run.backend.record(run.stream(tag))


def _wait(run: _Run, tag: str | None, *events: Any) -> None:
    stream = run.stream(tag)
    for event in events:
        run.backend.wait_event(stream, event)


def _keep(run: _Run, tag: str | None, *values: Any) -> None:
    stream = run.stream(tag)
    for value in values:
        for t in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(t, torch.Tensor):
                run.backend.keep(t, stream)


def _join(run: _Run) -> None:
    run.backend.set_current(run.main)
    for stream in run.side.values():
        run.backend.wait_stream(run.main, stream)


def _log_op(backend: Any, name: str) -> None:
    backend.log.append(("op", backend.current(), name))


# ------------------------------------------------------------------------------ the rewrite

def _is_call(node: fx.Node) -> bool:
    return node.op in ("call_function", "call_method", "call_module")


def _streams_of(gm: fx.GraphModule) -> dict[fx.Node, str | None]:
    """Each call node's stream; a tuple element read (getitem) follows its producer."""
    where: dict[fx.Node, str | None] = {}
    for node in gm.graph.nodes:
        if not _is_call(node):
            continue
        if node.target is operator.getitem and isinstance(node.args[0], fx.Node) \
                and node.args[0] in where:
            where[node] = where[node.args[0]]
        else:
            where[node] = node.meta.get(STREAM_KEY, MAIN)
    return where


def _dependencies(node: fx.Node, where: dict) -> list[fx.Node]:
    deps = [n for n in node.all_input_nodes if n in where]
    deps += [n for n in node.meta.get(WAITS_KEY, ()) if n in where and n not in deps]
    return deps


def with_streams(gm: fx.GraphModule, backend: Any) -> fx.GraphModule:
    """``gm`` rescheduled on its streams through ``backend`` (see module doc). A graph without
    stream regions is returned unchanged. With :class:`EmulatedStreams` every op is also logged.
    """
    if not has_streams(gm):
        return gm
    where = _streams_of(gm)
    crossing = {d for n in where for d in _dependencies(n, where) if where[d] != where[n]}
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    events: dict[fx.Node, fx.Node] = {}
    waited: set[tuple[str | None, fx.Node]] = set()
    backend_node = run = None
    current: str | None = MAIN
    log = isinstance(backend, EmulatedStreams)
    for node in gm.graph.nodes:
        if node.op == "output":
            graph.call_function(_join, (run,))
            graph.node_copy(node, lambda n: env[n])
            break
        if node not in where:  # placeholders, get_attr
            env[node] = graph.node_copy(node, lambda n: env[n])
            continue
        if run is None:
            backend_node = graph.get_attr("_torchair_streams")
            run = graph.call_function(_fork, (backend_node, stream_tags(gm)))
        tag = where[node]
        if tag != current and node.target is not operator.getitem:
            graph.call_function(_switch, (run, tag))
            current = tag
        foreign = [d for d in _dependencies(node, where) if where[d] != tag
                   and (tag, d) not in waited]
        if foreign:
            graph.call_function(_wait, (run, tag, *[events[d] for d in foreign]))
            graph.call_function(_keep, (run, tag, *[env[d] for d in foreign]))
            waited.update((tag, d) for d in foreign)
        if log and node.target is not operator.getitem:
            graph.call_function(_log_op, (backend_node, node.name))
        env[node] = graph.node_copy(node, lambda n: env[n])
        if node in crossing:
            events[node] = graph.call_function(_record, (run, where[node]))
    return graph_module(gm, graph, {"_torchair_streams": backend})


def graph_module(source: fx.GraphModule, graph: fx.Graph, extra: dict[str, Any]
                 ) -> fx.GraphModule:
    """A GraphModule for ``graph`` whose attributes and submodules come from ``extra`` or, for
    the others ``graph`` reads, from ``source``."""
    root: dict[str, Any] = {}
    for node in graph.nodes:
        if node.op in ("get_attr", "call_module") and node.target not in root:
            root[node.target] = extra[node.target] if node.target in extra else \
                _fetch(source, node.target)
    return fx.GraphModule(root, graph, class_name=type(source).__name__)


def _fetch(module: Any, target: str) -> Any:
    for part in target.split("."):
        module = getattr(module, part)
    return module
