"""Scopes whose effect exists only on Ascend: ``limit_core_num``, ``op_never_timeout``,
``data_dump`` and ``profiler_trace``.

On Ascend each sets attributes on the ops of its region: the AI Core / Vector Core limits
(``_op_aicore_num``, ``_op_vectorcore_num``), the no-timeout flag (``_op_exec_never_timeout``),
the data-dump range (``torchair_enable_data_dump``) and profiler marks
(``_profiler_trace_index``, ``_profiler_trace_pos``), TorchAir's attribute names. Cores, op
timeouts, device data dumps and the Ascend profiler do not exist on CPU or CUDA, so here the scopes change nothing that runs. They are accepted and checked
as TorchAir checks them, and recorded: the region is bracketed by the side-effecting marker ops
``npu::_scope_attrs_begin(str[] keys, str[] values)`` and ``npu::_scope_attrs_end(str[] keys)``
(no-ops at run time), which Dynamo and AOT keep in order, so graph dumps show them with their
attributes. :func:`scope_attributes` reads a graph's regions (op -> attributes, innermost scope
wins, as TorchAir's attribute stack) and :class:`AscendScopePass` moves them onto the ops (one
``node.meta`` string per attribute, the keys of :data:`ASCEND_ATTRS`, as TorchAir stamps them on
GE ops) and erases the markers.

Values are strings, as in TorchAir (``str(value)``); ``op_never_timeout`` stores ``"True"`` /
``"False"`` (a bool attribute on Ascend).
"""
from __future__ import annotations

import threading
from types import TracebackType
from typing import Any

import torch
import torch.fx as fx

from torchair.base.meta import ASCEND_KEYS
from torchair.base.registry import define_op

__all__ = ["ASCEND_ATTRS", "AscendScopePass", "data_dump", "limit_core_num", "op_never_timeout",
           "profiler_trace", "scope_attributes"]

# the attributes (node.meta keys once AscendScopePass ran; string values); dumps show them
ASCEND_ATTRS = ASCEND_KEYS
PROFILER_MODES = ("begin", "end", "both")


def _noop(keys: list[str], values: list[str] | None = None) -> None:
    return None


_begin = define_op("_scope_attrs_begin(str[] keys, str[] values) -> ()", fake=_noop, kernel=_noop)
_end = define_op("_scope_attrs_end(str[] keys) -> ()", fake=_noop, kernel=_noop)
ATTRS_BEGIN: torch._ops.OpOverload = _begin.default
ATTRS_END: torch._ops.OpOverload = _end.default
for _op in (_begin, _end, ATTRS_BEGIN, ATTRS_END):
    torch.fx.node.has_side_effect(_op)


def is_attrs_marker(target: Any) -> bool:
    return target in (ATTRS_BEGIN, ATTRS_END, _begin, _end)


_profiler = threading.local()  # .open: indices of this thread's profiler_trace regions being run


def _open_traces() -> list[str]:
    if not hasattr(_profiler, "open"):
        _profiler.open = []
    return _profiler.open


class AttributeScope:
    """Context manager: the ops run inside carry ``attrs`` (see the module docstring)."""

    def __init__(self, attrs: dict[str, str]) -> None:
        self.attrs = dict(attrs)

    def __repr__(self) -> str:
        return f"AttributeScope({self.attrs})"

    def _profiled(self) -> bool:
        # eager runs check nesting here; compiled graphs when their regions are read (_walk):
        # Dynamo cannot trace an exception raised in a nested context manager's __enter__
        return "_profiler_trace_index" in self.attrs and not torch.compiler.is_compiling()

    def __enter__(self) -> None:
        if self._profiled():
            if _open_traces():
                raise ValueError("Nested profiler_trace is not allowed")
            _open_traces().append(self.attrs["_profiler_trace_index"])
        ATTRS_BEGIN(list(self.attrs), list(self.attrs.values()))

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        ATTRS_END(list(self.attrs))
        if self._profiled():
            _open_traces().pop()
        return False


def _core_count(name: str, value: Any, low: int) -> str:
    """A core count: an int (or its decimal string, as TorchAir accepts) >= ``low``."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        number = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        raise TypeError(f"limit_core_num() argument '{name}' must be an int (a core count), "
                        f"got {type(value).__name__} {value!r}")
    if number < low:
        what = "at least 1" if low == 1 else "0 or more (0: a chip without Vector Cores)"
        raise ValueError(f"limit_core_num() argument '{name}' must be {what}, got {number}")
    return str(number)


def limit_core_num(op_aicore_num: int, op_vectorcore_num: int) -> AttributeScope:
    """Ascend: the ops of the region use at most ``op_aicore_num`` AI Cores and
    ``op_vectorcore_num`` Vector Cores. No effect on CPU/CUDA (recorded in dumps only).

    ``with torchair.scope.limit_core_num(8, 16): ...``
    """
    return AttributeScope({"_op_aicore_num": _core_count("op_aicore_num", op_aicore_num, 1),
                           "_op_vectorcore_num": _core_count("op_vectorcore_num",
                                                             op_vectorcore_num, 0)})


def op_never_timeout(enable: bool = True) -> AttributeScope:
    """Ascend: the ops of the region never time out (``enable=False`` restores the timeout
    inside an enclosing region). No effect on CPU/CUDA, where ops have no execution timeout."""
    if not isinstance(enable, bool):
        raise TypeError(f"op_never_timeout() argument 'enable' must be bool, but got "
                        f"{type(enable).__name__}.")
    return AttributeScope({"_op_exec_never_timeout": str(enable)})


def data_dump() -> AttributeScope:
    """Ascend: restrict the graph-mode data dump (``dump_config``) to the ops of the region.
    No effect on CPU/CUDA: ``config.debug.data_dump`` dumps ops by its own ``filter``."""
    return AttributeScope({"torchair_enable_data_dump": "True"})


def profiler_trace(index: str, mode: str) -> AttributeScope:
    """Ascend: mark the first op (``mode="begin"``), the last (``"end"``) or both (``"both"``) of
    the region for the Ascend profiler under ``index``. No effect on CPU/CUDA (use
    ``torch.profiler``). Regions do not nest: ``ValueError("Nested profiler_trace is not
    allowed")`` when run eagerly, and when a compiled graph's regions are read."""
    if not isinstance(index, str) or not index:
        raise TypeError(f"profiler_trace() argument 'index' must be a non-empty str, got "
                        f"{type(index).__name__} {index!r}")
    if mode not in PROFILER_MODES:
        raise ValueError(f"profiler_trace() argument 'mode' must be one of {PROFILER_MODES}, got "
                         f"{mode!r}")
    return AttributeScope({"_profiler_trace_index": index, "_profiler_trace_pos": mode})


# ------------------------------------------------------------------------------ graph side

def _marker_lists(node: fx.Node) -> tuple[list[str], list[str]]:
    args = list(node.args) + [node.kwargs[k] for k in ("keys", "values") if k in node.kwargs]
    keys = list(args[0])
    values = list(args[1]) if len(args) > 1 else []
    return keys, values


def _walk(gm: fx.GraphModule) -> dict[fx.Node, dict[str, str]]:
    """The Ascend-only attributes of each op of ``gm`` inside at least one region."""
    stack: list[tuple[dict[str, str], fx.Node]] = []
    found: dict[fx.Node, dict[str, str]] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and is_attrs_marker(node.target):
            keys, values = _marker_lists(node)
            if node.target in (ATTRS_BEGIN, _begin):
                attrs = dict(zip(keys, values))
                if "_profiler_trace_index" in attrs and any(
                        "_profiler_trace_index" in a for a, _ in stack):
                    raise ValueError("Nested profiler_trace is not allowed")
                stack.append((attrs, node))
            elif not stack or list(stack[-1][0]) != keys:
                raise ValueError(f"torchair.scope marker {node.name} closes a region with "
                                 f"attributes {keys} that is not the innermost open one; a "
                                 f"custom pass moved a marker or a graph break split the region")
            else:
                stack.pop()
        elif node.op in ("call_function", "call_method", "call_module") and stack:
            merged: dict[str, str] = {}
            for attrs, _ in stack:
                merged.update(attrs)
            found[node] = merged
    if stack:
        raise ValueError(f"torchair.scope region {stack[-1][0]} (marker {stack[-1][1].name}) is "
                         f"not closed in this graph; a graph break inside the `with` block split "
                         f"it (find it with fullgraph=True)")
    return found


def _profiler_positions(found: dict[fx.Node, dict[str, str]]) -> None:
    """TorchAir's rule: "both" over several ops marks the first "begin" and the last "end";
    "begin" marks only the first op, "end" only the last."""
    regions: dict[tuple[str, str], list[fx.Node]] = {}
    for node, attrs in found.items():
        if "_profiler_trace_index" in attrs:
            key = (attrs["_profiler_trace_index"], attrs["_profiler_trace_pos"])
            regions.setdefault(key, []).append(node)
    for (_, mode), nodes in regions.items():
        marks = {nodes[0]: "begin", nodes[-1]: "end"} if len(nodes) > 1 else {nodes[0]: mode}
        if mode != "both" and len(nodes) > 1:
            marks = {nodes[0] if mode == "begin" else nodes[-1]: mode}
        for node in nodes:
            if node in marks:
                found[node]["_profiler_trace_pos"] = marks[node]
            else:
                for key in ("_profiler_trace_index", "_profiler_trace_pos"):
                    found[node].pop(key)


def _attributes(gm: fx.GraphModule) -> dict[fx.Node, dict[str, str]]:
    found = _walk(gm)
    _profiler_positions(found)
    return {n: a for n, a in found.items() if a}


def scope_attributes(gm: fx.GraphModule) -> dict[str, dict[str, str]]:
    """Op name -> its Ascend-only scope attributes, for the ops of ``gm`` inside
    ``limit_core_num`` / ``op_never_timeout`` / ``data_dump`` / ``profiler_trace`` regions
    (markers in the graph) or annotated by :class:`AscendScopePass`."""
    marked = {n.name: {k: n.meta[k] for k in ASCEND_ATTRS if k in n.meta}
              for n in gm.graph.nodes}
    marked = {name: attrs for name, attrs in marked.items() if attrs}
    return {**marked, **{n.name: a for n, a in _attributes(gm).items()}}


class AscendScopePass:
    """Moves the regions onto the ops (``node.meta[key] = value`` for the keys of
    :data:`ASCEND_ATTRS`, which dumps show as op attributes)
    and erases the markers; ``attributes`` holds the last run's :func:`scope_attributes`. Shaped
    as a ``torchair.passes.GraphPass``: ``pass(gm)`` returns how many markers it erased."""

    name = "ascend_scope"

    def __init__(self) -> None:
        self.attributes: dict[str, dict[str, str]] = {}

    def __call__(self, gm: fx.GraphModule) -> int:
        found = _attributes(gm)
        for node, attrs in found.items():
            node.meta.update(attrs)
        self.attributes = {n.name: dict(a) for n, a in found.items()}
        markers = [n for n in gm.graph.nodes
                   if n.op == "call_function" and is_attrs_marker(n.target)]
        for node in markers:
            gm.graph.erase_node(node)
        return len(markers)
