"""SuperKernel segments as launch units inside a host-scheduled graph (seed 004, issue 7).

A graph that already runs as one static launch unit (a CPU fixed-shape compiled call, a CUDA
graph of the whole step) holds its ``super_kernel`` scopes inside that one launch: splitting it
would only add launches, so it is left alone and the report says so. A graph scheduled from the
host (a value-dependent op reading its values on the host, a host-synchronizing op, symbolic
shapes) runs here instead, as a *host program*:

* each segment of :func:`torchair.plan.segments.plan_segments` whose shapes are static becomes
  one launch unit: its ops cut out as a sub-graph (:func:`torchair.plan.segments.cut_segment`),
  compiled with the graph's engine (CPU: one compiled callable) and, on CUDA, captured once as a
  CUDA graph and replayed;
* a segment with symbolic shapes runs unfused (op by op), with a warning that names the scope and
  the symbolic input and dim;
* skipped ops and ops outside scopes run as they are, op by op, between the segments.

Stream regions (``npu_stream_switch``) are scheduled on their streams when the graph runs on CUDA
(see :mod:`torchair.scope._stream_runtime`): in the host program and inside each captured
segment. A static CUDA graph with stream regions runs here as one multi-stream CUDA graph.
On CPU streams change nothing and never route a graph here.

Captured segments keep their inputs and outputs in static buffers: an input produced by another
captured segment, a parameter, a constant or an input mutated in place is used where it lies
(captured once per set of addresses, like :class:`torchair.runtime.units.StaticUnit`); other
inputs are copied in. Outputs are copied out only where they leave the step (graph outputs, or
read through a view).
"""
from __future__ import annotations

import dataclasses
import operator
import threading
import time
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx
from torch.utils._python_dispatch import _disable_current_modes

from torchair.base.log import logger
from torchair.plan.inputs import InputInfo
from torchair.plan.report import GraphReport
from torchair.plan.segments import SegmentCut, count_launches, cut_segment, remap_waits, symbolic_inputs
from torchair.runtime import capture as _capture
from torchair.runtime.engines import Engine, fx_engine, inductor_engine
from torchair.runtime.staging import InputStager
from torchair.scope import _stream_runtime as _streams

MAX_CAPTURES = 8  # per segment: captures for distinct addresses of its borrowed inputs

_KIND = {"cuda": "CUDA graph replay", "emulate": "captured replay (CPU emulation)"}


@dataclasses.dataclass
class Piece:
    """One launch unit cut out of the graph: a scope's segment, or the whole graph."""

    label: str  # "sk1 segment 1" | "whole graph"
    names: list[str]  # its ops, program order
    scope: str | None = None
    index: int = 0  # the segment's position in its scope's plan


@dataclasses.dataclass
class LaunchPlan:
    pieces: list[Piece]
    capture: str | None  # "cuda" | "emulate" | None (one compiled callable per piece)
    streams: bool  # schedule npu_stream_switch regions on their streams
    notes: list[str] = dataclasses.field(default_factory=list)  # for the optimized dump


# ------------------------------------------------------------------------------ the decision

def plan_launch(gm: fx.GraphModule, inputs: list[InputInfo], report: GraphReport, *,
                build_static: bool, host_scalars: bool, capture: str | None,
                device: torch.device) -> LaunchPlan | None:
    """How ``gm`` runs when it has scopes or stream regions; None: its usual launch unit.

    Fills ``report.segments[scope]["launch"]`` for segments that cannot be launch units (and
    logs the symbolic-shape warning); the others are filled when the unit is built.
    """
    segmented = any(plan["segments"] for plan in report.segments.values())
    streams = _streams.has_streams(gm) and capture in ("cuda", "emulate")
    if not segmented and not streams:
        return None
    cpu_inputs = [i for i in inputs if i.kind != "symint" and i.device.startswith("cpu")]
    uncapturable = build_static and capture == "cuda" and bool(cpu_inputs)
    if build_static and not uncapturable:
        if streams and not host_scalars:
            names = [n.name for n in gm.graph.nodes if _is_call(n)]
            return LaunchPlan([Piece("whole graph", names)], capture, streams)
        if streams:
            logger.warning("graph %d: npu_stream_switch regions run on the main stream: a static "
                           "graph with sunk scalars (tiling sink) is captured as one "
                           "single-stream launch unit", report.graph_id)
        return None
    pieces = _launchable(gm, inputs, report)
    if not pieces and not streams:
        return None
    if uncapturable:  # as the static unit would say: the whole graph cannot be captured
        report.build_static = False
        report.reasons += [f"input {i.index} (`{i.name}`) is a CPU tensor in a CUDA graph: a "
                           f"captured graph cannot read host memory; move it to the GPU"
                           for i in cpu_inputs]
    return LaunchPlan(pieces, capture, streams,
                      notes=[f"launch unit: {p.label} ({', '.join(p.names)})" for p in pieces])


def _launchable(gm: fx.GraphModule, inputs: list[InputInfo], report: GraphReport) -> list[Piece]:
    """Segments with static shapes; the others are reported unfused, with one warning per
    scope naming the symbolic inputs."""
    pieces = []
    for scope, plan in report.segments.items():
        launch = plan.setdefault("launch", [""] * len(plan["segments"]))
        why: list[str] = []
        for k, names in enumerate(plan["segments"]):
            symbolic = symbolic_inputs(gm, names, inputs)
            if symbolic:
                launch[k] = f"unfused, op by op: symbolic shapes ({'; '.join(symbolic)})"
                why += [s for s in symbolic if s not in why]
            else:
                pieces.append(Piece(f"{scope} segment {k + 1}", list(names), scope, k))
        if why:
            logger.warning("graph %d: super_kernel scope %r has symbolic shapes (%s); SuperKernel "
                           "needs static shapes, so the scope runs unfused, op by op: call "
                           "torch._dynamo.mark_static on those inputs or compile with "
                           "dynamic=False", report.graph_id, scope, "; ".join(why))
    order = {n.name: i for i, n in enumerate(gm.graph.nodes)}
    return sorted(pieces, key=lambda p: order[p.names[0]])  # program order


def note_launches(gm: fx.GraphModule, report: GraphReport) -> None:
    """For a graph that kept its usual launch unit: launches per step and, per scope segment,
    where it runs (inside the one launch unit, or op by op)."""
    one = report.launch.startswith("one launch unit")
    if report.launches_per_step is None:
        if one:
            report.launches_per_step = 1
        elif report.engine == "fx" or "op by op" in report.launch:
            report.launches_per_step = count_launches(gm.graph.nodes)
    where = f"inside the graph's {report.launch}" if one else f"op by op ({report.launch})"
    for plan in report.segments.values():
        launch = plan.setdefault("launch", [""] * len(plan["segments"]))
        plan["launch"] = [text or where for text in launch]


# ------------------------------------------------------------------------------ the unit

class SegmentedUnit:
    """A host program whose pieces (see :class:`LaunchPlan`) are launch units (module doc)."""

    def __init__(self, gm: fx.GraphModule, plan: LaunchPlan, *, engine: str,
                 inputs: list[InputInfo], borrowed_inputs: set[int], device: torch.device,
                 report: GraphReport) -> None:
        self.report = report
        self.plan = plan
        self.streams = None  # the stream backend, when streams are scheduled
        if plan.streams:
            self.streams = _streams.EmulatedStreams() if plan.capture == "emulate" else \
                _streams.CudaStreams(device)
        self.pool = None
        if plan.capture == "cuda":
            self.pool = torch.cuda.graph_pool_handle()
        placeholders = gm.graph.find_nodes(op="placeholder")
        borrowed_nodes = {placeholders[i] for i in borrowed_inputs if i < len(placeholders)}
        borrowed_nodes |= {placeholders[i.index] for i in inputs if i.mutated}
        self.launchers: dict[int, SegmentLauncher] = {}  # by piece
        program = self._program(gm, engine, borrowed_nodes)
        if self.streams is not None:
            program = _streams.with_streams(program, self.streams)
        self.program = program
        report.engine = engine if engine == "fx" else f"{engine} (segments) + fx (host)"
        self._describe(gm)
        # one call at a time: captured pieces stage inputs into, and pass results through,
        # static buffers shared by every call (as StaticUnit)
        self._lock = threading.RLock()

    def __call__(self, args: list) -> Sequence[Any]:
        with self._lock:
            return self.program(*args)

    # -- building the host program

    def _program(self, gm: fx.GraphModule, engine: str, borrowed: set[fx.Node]) -> fx.GraphModule:
        nodes = {n.name: n for n in gm.graph.nodes}
        cuts: dict[int, SegmentCut] = {}
        claimed: set[fx.Node] = set()
        for k, piece in enumerate(self.plan.pieces):
            members = [nodes[name] for name in piece.names if nodes[name] not in claimed]
            if members:
                cuts[k] = cut_segment(gm, members, hoist=self.plan.capture is not None)
                claimed |= cuts[k].members
            elif piece.scope is not None:  # a tuple read that joined its producer's piece
                self._note(piece, "joined the launch unit of the op it reads")
        owner = {n: k for k, cut in cuts.items() for n in cut.members}
        anchor = {cut.anchor: k for k, cut in cuts.items()}
        graph = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        modules: dict[str, torch.nn.Module] = {}
        for node in gm.graph.nodes:
            if node in anchor:
                k = anchor[node]
                cut = cuts[k]
                name = f"launch_unit_{k}"
                modules[name] = _LaunchModule(self._launcher(k, cut, engine, borrowed, owner))
                call = graph.call_module(name, tuple(env[i] for i in cut.inputs))
                call.meta[_streams.WAITS_KEY] = [
                    env[d] for n in cut.members for d in n.meta.get(_streams.WAITS_KEY, ())
                    if d not in cut.members and d in env]
                for n in cut.members:
                    env[n] = call  # ops inside the piece: waiting for them waits for the piece
                for j, out in enumerate(cut.outputs):
                    env[out] = graph.call_function(operator.getitem, (call, j))
                    env[out].meta["val"] = out.meta.get("val")
            elif node not in owner:
                env[node] = graph.node_copy(node, lambda n: env[n])
                remap_waits(env[node], env)
        return _streams.graph_module(gm, graph, modules)

    def _launcher(self, k: int, cut: SegmentCut, engine: str, borrowed: set[fx.Node],
                  owner: dict[fx.Node, int]) -> SegmentLauncher:
        piece = self.plan.pieces[k]
        captured = self.plan.capture is not None
        capture = self.plan.capture
        cpu = [i.name for i in cut.inputs if _device_type(i) == "cpu"]
        if capture == "cuda" and cpu:
            capture = None  # a captured graph cannot read host memory
        keep = set()
        for j, node in enumerate(cut.inputs):
            node = cut.aliases.get(node, node)  # a view of a stable tensor is stable too
            producer = self.launchers.get(owner.get(node, -1))
            stable = node in borrowed or node.op == "get_attr" or (
                producer is not None and producer.capture is not None
                and not producer.escapes(node))
            if stable:
                keep.add(j)
        piece_engine = engine
        sub = cut.gm
        if self.streams is not None and _streams.has_streams(sub):
            if engine != "fx":
                logger.info("graph %d: %s has npu_stream_switch regions: built with the FX "
                            "engine so that its ops run on their streams", self.report.graph_id,
                            piece.label)
            piece_engine = "fx"
            sub = _streams.with_streams(sub, self.streams)
        launcher = SegmentLauncher(
            sub, label=piece.label, engine=piece_engine, capture=capture, borrowed=keep,
            mutated=cut.mutated, names=[i.name for i in cut.inputs],
            escaping=cut.escaping if captured else set(), pool=self.pool,
            graph_id=self.report.graph_id, on_build=lambda unit, k=k: self._built(k, unit))
        launcher.outputs = cut.outputs
        if capture is None and captured and cpu:
            launcher.note = f"not captured: CPU tensor input {cpu[0]}"
        self.launchers[k] = launcher
        return launcher

    # -- the report

    def _describe(self, gm: fx.GraphModule) -> None:
        report = self.report
        host_ops = count_launches(self.program.graph.nodes)
        n = len(self.launchers)
        report.launches_per_step = n + host_ops
        kinds = sorted({lau.kind() for lau in self.launchers.values()})
        streams = len(_streams.stream_tags(gm)) + 1 if self.streams is not None else 1
        with_streams = f" on {streams} streams" if streams > 1 else ""
        if self.plan.pieces and self.plan.pieces[0].scope is None:
            report.launch = f"one launch unit: {kinds[0]}{with_streams}"
        elif not n:
            report.launch = f"host-scheduled, op by op{with_streams}"
        else:
            report.launch = (f"host-scheduled: {n} super_kernel segment(s) as launch units "
                             f"({', '.join(kinds) or '-'}), {host_ops} other ops op by op"
                             f"{with_streams}")
        for k, lau in self.launchers.items():
            self._built(k, lau)

    def _built(self, k: int, launcher: SegmentLauncher) -> None:
        self._note(self.plan.pieces[k], f"one launch unit: {launcher.kind()}" + (
            f" ({launcher.note})" if launcher.note else ""))

    def _note(self, piece: Piece, text: str) -> None:
        """How ``piece`` runs, in its scope's ``report.segments[scope]["launch"]``."""
        if piece.scope is None:
            return
        plan = self.report.segments[piece.scope]
        plan.setdefault("launch", [""] * len(plan["segments"]))[piece.index] = text


class _LaunchModule(torch.nn.Module):
    """The host program calls a launch unit as a submodule (FX names it ``launch_unit_<k>``)."""

    def __init__(self, launcher: SegmentLauncher) -> None:
        super().__init__()
        self.launcher = launcher

    def forward(self, *args: Any) -> Sequence[Any]:
        return self.launcher(list(args))


# ------------------------------------------------------------------------------ one launch unit

@dataclasses.dataclass
class _Captured:
    stager: InputStager
    replay: Callable[[], None]
    outputs: list
    groups: list[list[int]]


class SegmentLauncher:
    """One piece as one launch unit, built at its first call from the real inputs: the engine's
    compiled callable, and on CUDA (or its CPU emulation) a captured replay of it."""

    def __init__(self, gm: fx.GraphModule, *, label: str, engine: str, capture: str | None,
                 borrowed: set[int], mutated: set[int], names: list[str], escaping: set[int],
                 pool: Any, graph_id: int, on_build: Callable[[SegmentLauncher], None]) -> None:
        self.gm = gm
        self.label = label
        self.engine_name = engine
        self.capture = capture
        self.borrowed = borrowed
        self.mutated = mutated
        self.names = names
        self.escaping = escaping  # output positions copied out of the static buffers
        self.pool = pool
        self.graph_id = graph_id
        self.on_build = on_build
        self.note = ""
        self.outputs: list[fx.Node] = []
        self.launches = 0  # calls so far (diagnostics, tests)
        self.build_seconds: float | None = None
        self.run: Callable[[list], Sequence[Any]] | None = None
        self._captures: dict[tuple[int, ...], _Captured] = {}
        self._warned = False

    def kind(self) -> str:
        if self.capture is not None:
            return _KIND[self.capture]
        return f"one compiled call ({self.engine_name} engine)"

    def escapes(self, node: fx.Node) -> bool:
        return self.outputs.index(node) in self.escaping

    def __call__(self, args: list) -> Sequence[Any]:
        self.launches += 1
        if self.run is None:
            return self._build(args)
        return self.run(args)

    def _build(self, args: list) -> Sequence[Any]:
        start = time.perf_counter()
        what = f"graph {self.graph_id} {self.label}"
        if self.engine_name == "inductor":
            with _disable_current_modes():  # AOT's runtime may have a dispatch mode active
                engine, self.engine_name = inductor_engine(self.gm, args, what)
        else:
            engine = fx_engine(self.gm)
        if self.capture is None:
            self.run = engine
            outputs = engine(args)
        else:
            self.run = self._captured(engine)
            outputs = self.run(args)
        self.build_seconds = time.perf_counter() - start
        logger.info("%s: built launch unit (%s) in %.2f s", what, self.kind(), self.build_seconds)
        self.on_build(self)
        return outputs

    def _captured(self, engine: Engine) -> Callable[[list], list]:
        keyed = sorted(self.borrowed | self.mutated)

        def run(args: list) -> list:
            key = tuple(args[i].data_ptr() if isinstance(args[i], torch.Tensor) else 0
                        for i in keyed)
            cap = self._captures.get(key)
            if cap is None:
                if len(self._captures) >= MAX_CAPTURES:
                    if not self._warned:
                        self._warned = True
                        logger.warning("graph %d %s: more than %d distinct addresses for its "
                                       "borrowed inputs; further ones run uncaptured",
                                       self.graph_id, self.label, MAX_CAPTURES)
                    return engine(args)
                cap = self._capture_one(engine, args)
                self._captures[key] = cap
                return self._result(cap)
            pending = cap.stager.stage(args)
            try:
                cap.replay()
            finally:
                cap.stager.finish(args, pending)
            return self._result(cap)

        return run

    def _capture_one(self, engine: Engine, args: list) -> _Captured:
        stager = InputStager(args, borrowed=self.borrowed, mutated=self.mutated, names=self.names)
        if self.capture == "cuda":
            replay, static, first = _capture.capture_cuda(engine, stager.static, self.pool,
                                                          _device_of(stager.static))
        else:
            replay, static, first = _capture.capture_emulated(engine, stager.static)
        for buf, value in zip(static, first):  # this call's results, in the static buffers
            if isinstance(buf, torch.Tensor) and buf is not value:
                buf.copy_(value)
        return _Captured(stager, replay, static, _capture.storage_groups(static))

    def _result(self, cap: _Captured) -> list:
        """The static outputs; fresh copies of those that leave the step."""
        if not self.escaping:
            return list(cap.outputs)
        shared = {i for group in cap.groups for i in group}
        result = [o.clone() if i in self.escaping and i not in shared else o
                  for i, o in enumerate(cap.outputs)]
        for group in cap.groups:
            if self.escaping.intersection(group):
                copies = _capture.copy_outputs([cap.outputs[i] for i in group], [list(
                    range(len(group)))])
                for i, value in zip(group, copies):
                    result[i] = value
        return result


def _is_call(node: fx.Node) -> bool:
    return node.op in ("call_function", "call_method", "call_module")


def _device_type(node: fx.Node) -> str | None:
    val = node.meta.get("val")
    return val.device.type if isinstance(val, torch.Tensor) else None


def _device_of(args: Sequence[Any]) -> torch.device:
    devices = [a.device for a in args if isinstance(a, torch.Tensor)]
    return next((d for d in devices if d.type != "cpu"), torch.device("cpu"))
