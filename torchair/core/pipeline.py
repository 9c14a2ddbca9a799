"""The pipeline driver: one ATen inference graph in, one launch unit out, plus its report.

    ATen graph (from AOT) -> passes -> analysis (FX / IR / build static, reasons)
        -> static: sink scalars, StaticUnit (one launch)   |   dynamic: HostUnit
        -> GraphReport (+ dumps)
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from torchair.configs.compiler_config import CompilerConfig
from torchair.core.utils import logger
from torchair.passes import default_passes, run_passes
from torchair.plan.analysis import Analysis, analyze
from torchair.plan.inputs import InputInfo, describe_inputs
from torchair.plan.report import GraphReport, add_report, next_graph_id
from torchair.plan.sink import SUNK_INPUT_NAME, sink_scalars
from torchair.runtime import units
from torchair.runtime.engines import fx_engine, inductor_engine


@dataclasses.dataclass(frozen=True)
class GraphSignature:
    """What the backend knows about the inputs beyond AOT's example values."""

    names: tuple[str, ...]
    kinds: tuple[str, ...]  # "tensor" | "symint" | "parameter"


def mutated_inputs(gm: fx.GraphModule) -> set[int]:
    """Inputs written in place: AOT keeps them as ``copy_(input, new_value)`` nodes."""
    placeholders = {n: i for i, n in enumerate(gm.graph.find_nodes(op="placeholder"))}
    return {placeholders[n.args[0]] for n in gm.graph.find_nodes(
        op="call_function", target=torch.ops.aten.copy_.default) if n.args[0] in placeholders}


def _default_signature(example_inputs: Sequence[Any], gm: fx.GraphModule) -> GraphSignature:
    names = tuple(n.name for n in gm.graph.find_nodes(op="placeholder"))
    kinds = tuple("tensor" if isinstance(x, torch.Tensor) else "symint" for x in example_inputs)
    return GraphSignature(names, kinds)


def compile_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], config: CompilerConfig,
                  signature: GraphSignature | None = None) -> Callable:
    """Compile one AOT inference graph; returns a boxed callable ``fn(args: list)``."""
    signature = signature or _default_signature(example_inputs, gm)
    if len(signature.names) != len(example_inputs):
        signature = _default_signature(example_inputs, gm)
    graph_id = next_graph_id()
    mutated = mutated_inputs(gm)
    inputs = describe_inputs(example_inputs, signature.names, signature.kinds, mutated)
    dumps = _dump(gm, inputs, "original", config, graph_id)
    passes = default_passes(config)
    fired = run_passes(gm, passes)
    analysis = analyze(gm, inputs,
                       tiling_sink=config.experimental_config.tiling_schedule_optimize)
    report = GraphReport(
        graph_id=graph_id, fx_static=analysis.fx_static, ir_static=analysis.ir_static,
        build_static=analysis.build_static, inputs=inputs,
        value_dependent_ops=[u.op_name for u in analysis.value_dependent],
        reasons=analysis.reasons, consts=_consts(analysis), passes=fired, dumps=dumps,
        patterns=_patterns_fired(passes))
    if analysis.build_static:
        unit = _static_unit(gm, analysis, inputs, config, report)
    else:
        unit = _host_unit(gm, example_inputs, config, report)
    add_report(report)
    if not report.build_static:
        logger.info("graph %d is not static:\n%s", graph_id, report)
    else:
        logger.debug("%s", report)

    def run(args: list) -> Sequence[Any]:
        outputs = unit(args)
        args.clear()
        return outputs

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _static_unit(gm: fx.GraphModule, analysis: Analysis, inputs: list[InputInfo],
                 config: CompilerConfig, report: GraphReport) -> units.StaticUnit:
    names = [i.name for i in inputs]
    program = None
    kept = tuple(range(len(inputs)))
    if analysis.host_scalars:
        sunk = sink_scalars(gm, analysis, names)
        gm, program, kept = sunk.gm, sunk.program, sunk.kept_inputs
        report.sunk_inputs = list(program.input_names)
        if len(program) == 0:
            program = None  # scalars unused: nothing to stage
            gm = _drop_placeholder(gm, SUNK_INPUT_NAME)
    device = _device(inputs)
    capture = units.default_capture(device)
    host_inputs = [inputs[i] for i in kept if inputs[i].kind != "symint"
                   and torch.device(inputs[i].device).type == "cpu"]
    if capture == "cuda" and host_inputs:
        capture = None
        report.build_static = False
        report.reasons += [f"input {i.index} (`{i.name}`) is a CPU tensor in a CUDA graph: a "
                           f"captured graph cannot read host memory; move it to the GPU"
                           for i in host_inputs]
    engine = _engine(config)
    report.engine = engine
    report.launch = {"cuda": "one launch unit: CUDA graph replay",
                     "emulate": "one launch unit: captured replay (CPU emulation)"}.get(
        capture, "one launch unit: one fixed-shape compiled call" if device.type == "cpu" else
        "fixed shapes, launched op by op (not captured)")
    dump_inputs = [inputs[i] for i in kept]
    if program is not None:
        dump_inputs.append(InputInfo(len(dump_inputs), SUNK_INPUT_NAME, "tensor",
                                     (len(program),), "int64", device=str(device)))
    report.dumps += _dump(gm, dump_inputs, "optimized", config, report.graph_id)
    borrowed = {i.index for i in inputs if i.kind == "parameter"} | _static_input_indices()
    return units.StaticUnit(gm, kept_inputs=kept, program=program, engine=engine,
                            capture=capture, borrowed=borrowed,
                            mutated={i.index for i in inputs if i.mutated}, names=names,
                            report=report)


def _host_unit(gm: fx.GraphModule, example_inputs: Sequence[Any], config: CompilerConfig,
               report: GraphReport) -> units.HostUnit:
    report.launch = "host-scheduled, shape-generic"
    report.dumps += _dump(gm, report.inputs, "optimized", config, report.graph_id)
    if _engine(config) == "inductor":
        engine, report.engine = inductor_engine(gm, example_inputs, f"graph {report.graph_id}")
    else:
        engine, report.engine = fx_engine(gm), "fx"
    return units.HostUnit(engine)


def _static_input_indices() -> set[int]:
    """Inputs AOT knows keep their address (parameters, buffers, mark_static_address)."""
    context = torch._guards.TracingContext.try_get()
    metadata = getattr(context, "fw_metadata", None)
    return set(getattr(metadata, "static_input_indices", None) or ())


def _engine(config: CompilerConfig) -> str:
    if config.debug.run_eagerly or config.mode == "reduce-overhead":
        return "fx"
    return "inductor"


def _device(inputs: list[InputInfo]) -> torch.device:
    devices = [torch.device(i.device) for i in inputs if i.kind != "symint"]
    return next((d for d in devices if d.type != "cpu"), torch.device("cpu"))


def _drop_placeholder(gm: fx.GraphModule, name: str) -> fx.GraphModule:
    for node in gm.graph.find_nodes(op="placeholder"):
        if node.name == name and not node.users:
            gm.graph.erase_node(node)
    gm.recompile()
    return gm


def _patterns_fired(passes: list) -> dict[str, int]:
    return {name: count for p in passes for name, count in getattr(p, "fired", {}).items()}


def _consts(analysis: Analysis) -> dict[str, Any]:
    return {f"{u.node.name}.{name}": value for u in analysis.value_dependent
            for name, value in u.const_args.items()}


def _dump(gm: fx.GraphModule, inputs: list[InputInfo], stage: str, config: CompilerConfig,
          graph_id: int) -> list[str]:
    fmt = config.debug.graph_dump.type
    if fmt is None:
        return []
    from torchair.plan.dump import write_dump

    return [write_dump(gm, inputs, stage=stage, fmt=fmt, directory=config.debug.graph_dump.path,
                       graph_id=graph_id)]
