"""Scalar sinking ("tiling sink"): the rewrite that makes a value-dependent graph one launch unit.

The host scalars that feed value-dependent arguments (SymInt inputs, and scalar arithmetic on
them) are removed from the graph. Their values are computed on the host by a tiny
:class:`HostScalarProgram` and copied into one int64 buffer, a new last graph input; each
value-dependent op is rewritten to its tensor twin, reading its slice of that buffer on the device.
The rewritten graph has only fixed-shape tensor inputs, so it can be compiled once with fixed
shapes or captured as a CUDA graph, and new values never recompile.
"""
from __future__ import annotations

import dataclasses
import operator
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from torchair.base.sink_meta import sunk_slots  # noqa: F401 (re-exported: the old path)
from torchair.plan.analysis import Analysis, flatten_args, node_arg

SUNK_INPUT_NAME = "sunk_scalars"


@dataclasses.dataclass(frozen=True)
class StepRef:
    index: int


@dataclasses.dataclass
class HostScalarProgram:
    """Computes the sunk buffer's values from one call's arguments (host side, no FX)."""

    input_indices: tuple[int, ...]  # argument positions of the scalar inputs
    steps: tuple[tuple[Callable, tuple, dict], ...]  # scalar arithmetic and checks, in order
    slots: tuple[Any, ...]  # per buffer element: a StepRef into the values, or a constant int
    input_names: tuple[str, ...] = ()
    # the compiled form of the program (built at the first call; see _compile_program)
    _run: Callable | None = dataclasses.field(default=None, init=False, repr=False,
                                              compare=False)

    def __len__(self) -> int:
        return len(self.slots)

    def used_input_names(self) -> list[str]:
        """Names of the scalar inputs some buffer slot depends on (others are only read)."""
        refs: list[int] = []

        def note(a: Any) -> Any:
            if isinstance(a, StepRef):
                refs.append(a.index)
            return a

        used: set[int] = set()
        pending = [s.index for s in self.slots if isinstance(s, StepRef)]
        n = len(self.input_indices)
        while pending:
            k = pending.pop()
            if k in used:
                continue
            used.add(k)
            if k >= n:
                refs.clear()
                _, fn_args, fn_kwargs = self.steps[k - n]
                fx.node.map_aggregate((fn_args, fn_kwargs), note)
                pending += refs
        return [name for k, name in enumerate(self.input_names) if k in used]

    def copied_inputs(self) -> tuple[int, ...] | None:
        """The argument position each buffer slot copies when the program does nothing else
        (no steps, no constant slots: the common case, lengths passed straight through), else
        None."""
        if self.steps or not all(isinstance(s, StepRef) for s in self.slots):
            return None
        return tuple(self.input_indices[s.index] for s in self.slots)

    def __call__(self, args: Sequence[Any]) -> list[int]:
        run = self._run
        if run is None:
            run = self._run = _compile_program(self)
        return run(args)

    def reference(self, args: Sequence[Any]) -> list[int]:
        """The program interpreted step by step (what :meth:`__call__` computes)."""
        env = [args[i] for i in self.input_indices]

        def resolve(a: Any) -> Any:
            return env[a.index] if isinstance(a, StepRef) else a

        for fn, fn_args, fn_kwargs in self.steps:
            env.append(fn(*fx.node.map_aggregate(fn_args, resolve),
                          **fx.node.map_aggregate(fn_kwargs, resolve)))
        return [int(env[s.index]) if isinstance(s, StepRef) else int(s) for s in self.slots]


def _has_ref(value: Any) -> bool:
    found: list[StepRef] = []
    fx.node.map_aggregate(value, lambda a: found.append(a) if isinstance(a, StepRef) else None)
    return bool(found)


def _argument_reader(value: Any) -> Callable[[list], Any]:
    """``read(env) -> value`` with its references resolved, decided once per argument."""
    if isinstance(value, StepRef):
        return operator.itemgetter(value.index)
    if not _has_ref(value):
        return lambda env: value
    return lambda env: fx.node.map_aggregate(
        value, lambda a: env[a.index] if isinstance(a, StepRef) else a)


def _compile_program(program: HostScalarProgram) -> Callable[[Sequence[Any]], list[int]]:
    """:meth:`HostScalarProgram.reference` with every decision that does not depend on the
    call's values taken once: it runs before every launch of a static unit, so its Python is
    part of each step's host time (the common program, slots that are inputs, is one list
    comprehension)."""
    indices = program.input_indices
    slots = tuple((s.index, 0) if isinstance(s, StepRef) else (None, int(s)) for s in program.slots)
    if not program.steps and all(k is not None for k, _ in slots):
        picks = tuple(indices[k] for k, _ in slots)
        return lambda args: [int(args[p]) for p in picks]
    steps = tuple((fn, tuple(_argument_reader(a) for a in fn_args),
                   tuple((k, _argument_reader(v)) for k, v in fn_kwargs.items()))
                  for fn, fn_args, fn_kwargs in program.steps)

    def run(args: Sequence[Any]) -> list[int]:
        env = [args[i] for i in indices]
        for fn, readers, kw_readers in steps:
            if kw_readers:
                env.append(fn(*[r(env) for r in readers], **{k: r(env) for k, r in kw_readers}))
            else:
                env.append(fn(*[r(env) for r in readers]))
        return [int(env[k]) if k is not None else c for k, c in slots]

    return run


@dataclasses.dataclass
class SinkResult:
    gm: fx.GraphModule  # inputs: the kept inputs in order, then the int64 buffer
    program: HostScalarProgram
    kept_inputs: tuple[int, ...]  # positions of the original arguments the new graph takes


def sink_scalars(gm: fx.GraphModule, analysis: Analysis, input_names: Sequence[str]) -> SinkResult:
    """Rewrite ``gm`` so that its host scalars arrive in one int64 buffer (see module doc)."""
    if not analysis.sinkable:
        raise RuntimeError("sink_scalars: the graph's scalars feed more than value-dependent "
                           "arguments; the analysis reasons say where")
    graph = fx.Graph()
    val_map: dict[fx.Node, fx.Node] = {}
    graph.output(graph.graph_copy(gm.graph, val_map))
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    position = {n: i for i, n in enumerate(placeholders)}
    scalar_inputs = [n for n in analysis.host_scalars if n.op == "placeholder"]
    index = {n: k for k, n in enumerate(scalar_inputs)}
    steps = []
    for node in analysis.host_scalars:
        if node.op == "placeholder":
            continue
        fn_args = fx.node.map_arg(node.args, lambda n: StepRef(index[n]))
        fn_kwargs = fx.node.map_arg(dict(node.kwargs), lambda n: StepRef(index[n]))
        index[node] = len(scalar_inputs) + len(steps)
        steps.append((node.target, tuple(fn_args), fn_kwargs))

    new_placeholders = [val_map[n] for n in placeholders]
    with graph.inserting_after(new_placeholders[-1]):
        buffer = graph.placeholder(SUNK_INPUT_NAME)
    slots: list[Any] = []
    for use in analysis.value_dependent:
        node = val_map[use.node]
        if not use.symbolic_args:
            continue
        # every host-read list argument goes into the buffer, the constant ones ([], or values
        # Dynamo specialized) too: the twin takes tensors there
        for name in use.entry.args:
            if name not in use.symbolic_args and not isinstance(node_arg(use.node, name),
                                                                (list, tuple)):
                continue  # absent (None)
            values = flatten_args(node_arg(use.node, name))
            start = len(slots)
            slots.extend(StepRef(index[v]) if isinstance(v, fx.Node) else int(v) for v in values)
            with graph.inserting_before(node):
                piece = graph.call_function(torch.ops.aten.slice.Tensor,
                                            (buffer, 0, start, len(slots)))
            _set_arg(node, name, piece)
        node.target = use.entry.twin
    for node in reversed(analysis.host_scalars):
        graph.erase_node(val_map[node])
    graph.lint()
    new_gm = fx.GraphModule(gm, graph)
    kept = tuple(position[n] for n in placeholders if n not in index)
    program = HostScalarProgram(tuple(position[n] for n in scalar_inputs), tuple(steps),
                                tuple(slots), tuple(input_names[position[n]] for n in scalar_inputs))
    return SinkResult(new_gm, program, kept)


def _set_arg(node: fx.Node, name: str, value: fx.Node) -> None:
    if name in node.kwargs:
        node.update_kwarg(name, value)
        return
    for i, a in enumerate(node.target._schema.arguments):
        if a.name == name and i < len(node.args):
            node.update_arg(i, value)
            return
    node.update_kwarg(name, value)
