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

from torchair.base.gears import GearDim, GearTable, merge_gears
from torchair.base.log import logger
from torchair.configs.compiler_config import CompilerConfig
from torchair.core import recorder
from torchair.passes import default_passes, run_passes
from torchair.plan import collectives as _collectives
from torchair.plan.analysis import Analysis, analyze
from torchair.plan.inputs import InputInfo, describe_inputs
from torchair.plan.report import GraphReport, add_report, next_graph_id
from torchair.plan.segments import plan_segments
from torchair.plan.sink import SUNK_INPUT_NAME, sink_scalars
from torchair.plan.specialize import gear_inputs, gear_symbols, specialize
from torchair.runtime import segmented, units
from torchair.runtime.engines import fx_engine, inductor_engine
from torchair.runtime.gears import GearUnit


@dataclasses.dataclass(frozen=True)
class GraphSignature:
    """What the backend knows about the inputs beyond AOT's example values."""

    names: tuple[str, ...]
    kinds: tuple[str, ...]  # "tensor" | "symint" | "parameter"
    gear_dims: tuple[tuple[int, int, tuple[int, ...]], ...] = ()  # (input, dim, sizes)


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
    _collectives.check_process_groups(gm)
    graph_id = next_graph_id()
    mutated = mutated_inputs(gm)
    inputs = describe_inputs(example_inputs, signature.names, signature.kinds, mutated)
    table = _gear_table(signature, config) if signature.gear_dims else None
    notes = [f"gears ({table.policy}): " + "; ".join(
        f"({table.describe(g)})" for g in table.gears)] if table else []
    dumps = _dump(gm, inputs, "original", config, graph_id, notes)
    debug_unit = _debug_unit(gm, example_inputs, inputs, config, graph_id, dumps)
    if debug_unit is not None:
        return debug_unit
    _user_pass(config, "post_grad_custom_pre_pass", gm, example_inputs)
    if config.experimental_config.npu_fx_pass.raw:
        _inductor_joint_graph_passes(gm)
    passes = default_passes(config)
    fired = run_passes(gm, passes)
    _user_pass(config, "post_grad_custom_post_pass", gm, example_inputs)
    if table is not None:
        return _boxed(_compile_gears(gm, example_inputs, inputs, table, config, graph_id,
                                     dumps, fired, passes))
    analysis = analyze(gm, inputs,
                       tiling_sink=config.experimental_config.tiling_schedule_optimize.raw)
    report = GraphReport(
        graph_id=graph_id, fx_static=analysis.fx_static, ir_static=analysis.ir_static,
        build_static=analysis.build_static, inputs=inputs,
        value_dependent_ops=[u.op_name for u in analysis.value_dependent],
        reasons=analysis.reasons, consts=_consts(analysis), passes=fired, dumps=dumps,
        patterns=_patterns_fired(passes), scopes=_scopes(passes),
        segments=_segments(gm, inputs, config), scope_attributes=_scope_attributes(passes))
    unit = _segmented_unit(gm, analysis, inputs, config, report)  # None: no segments to launch
    if unit is None and analysis.build_static:
        unit = _static_unit(gm, analysis, inputs, config, report)
    elif unit is None:
        unit = _host_unit(gm, example_inputs, config, report)
    segmented.note_launches(gm, report)
    report.collectives = _describe_collectives(gm, report)
    return _boxed(_publish(report, unit))


def _describe_collectives(gm: fx.GraphModule, report: GraphReport) -> str:
    """Where a graph's collectives run, from how the graph launches."""
    if report.launch.startswith("one launch unit"):
        return _collectives.describe(gm, "inside the launch unit",
                                     captured="CUDA graph" in report.launch)
    return _collectives.describe(gm, f"between the host-scheduled ops ({report.launch})")


def _publish(report: GraphReport, unit: Callable) -> Callable:
    add_report(report)
    if not report.build_static:
        logger.info("graph %d is not static:\n%s", report.graph_id, report)
    else:
        logger.debug("%s", report)
    return unit


def _boxed(unit: Callable) -> Callable:
    rec = recorder.last()

    def run(args: list) -> Sequence[Any]:
        outputs = unit(args)
        args.clear()
        if rec is not None and rec.outputs is None:
            rec.outputs = list(outputs)
        return outputs

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _gear_table(signature: GraphSignature, config: CompilerConfig) -> GearTable:
    dims = [GearDim(i, signature.names[i], d, sizes) for i, d, sizes in signature.gear_dims]
    return merge_gears(dims, config.inference_config.dynamic_gears_merge_policy.raw)


def _compile_gears(gm: fx.GraphModule, example_inputs: Sequence[Any], inputs: list[InputInfo],
                   table: GearTable, config: CompilerConfig, graph_id: int, dumps: list[str],
                   fired: dict[str, int], passes: list) -> Callable:
    """One static launch unit per gear, built at first use (see :mod:`torchair.runtime.gears`)."""
    dims = [(d.input_index, d.dim) for d in table.dims]
    symbols = gear_symbols(example_inputs, dims)
    for d, symbol in zip(table.dims, symbols):
        if symbol is None:
            raise ValueError(f"{d} has gears {list(d.sizes)} but was traced with a fixed size "
                             f"{example_inputs[d.input_index].shape[d.dim]}: gears need the dim "
                             f"traced as a symbol; compile with dynamic=None or dynamic=True (not "
                             f"dynamic=False) and do not mark_static it")

    def plan(k: int) -> tuple[fx.GraphModule, list[InputInfo], Analysis]:
        gear = table.gears[k]
        values: dict = {}
        for d, symbol, size in zip(table.dims, symbols, gear):
            if values.setdefault(symbol, size) != size:
                raise ValueError(f"gear ({table.describe(gear)}) cannot run: the graph requires "
                                 f"{d} to equal another gear dim (e.g. they are added); give such "
                                 f"dims equal gears with the 'zip' policy")
        sgm = specialize(gm, values)
        ginputs = gear_inputs(inputs, dims, gear)
        tiling_sink = config.experimental_config.tiling_schedule_optimize.raw
        return sgm, ginputs, analyze(sgm, ginputs, tiling_sink=tiling_sink)

    _, _, first = plan(0)
    report = GraphReport(
        graph_id=graph_id, fx_static=False, ir_static=first.ir_static,
        build_static=first.build_static, inputs=inputs,
        value_dependent_ops=[u.op_name for u in first.value_dependent], reasons=first.reasons,
        consts=_consts(first), passes=fired, dumps=dumps, patterns=_patterns_fired(passes),
        scopes=_scopes(passes), segments=_segments(gm, inputs, config),
        scope_attributes=_scope_attributes(passes),
        gears=[{"gear": table.describe(g), "built": False, "build_seconds": None}
               for g in table.gears])
    if not first.build_static:
        unit = _host_unit(gm, example_inputs, config, report)
        report.collectives = _describe_collectives(gm, report)
        return _publish(report, unit)

    def build(k: int, pool: Any) -> Callable:
        sgm, ginputs, analysis = plan(k)
        return _static_unit(sgm, analysis, ginputs, config, report, pool=pool,
                            notes=[f"gear {k + 1}/{len(table.gears)}: "
                                   f"{table.describe(table.gears[k])}"])

    rec = recorder.record("gears", gm, report, table=table, build=build)
    unit = GearUnit(table, build, report)
    if rec is not None:
        rec.launch_unit = unit
    report.collectives = _collectives.describe(gm, "inside each gear's launch unit")
    return _publish(report, unit)


def _device_scalar_ok(gm: fx.GraphModule, kept: Sequence[int],
                      inputs: list[InputInfo]) -> set[int]:
    """The 0-d CPU inputs a captured unit may read from a 0-d device tensor instead: not
    written in place, and no op of theirs yields a float16 / bfloat16 tensor (eager reads a CPU
    scalar in the op's float32 math, while a 0-d device tensor is first rounded to the other
    operand's dtype: ``logits_bf16 / temperature`` would change)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    ok = set()
    for node, i in zip(placeholders, kept):
        info = inputs[i]
        if info.kind == "symint" or tuple(info.shape) or info.mutated:
            continue
        low = any(isinstance(v := user.meta.get("val"), torch.Tensor)
                  and v.dtype in (torch.float16, torch.bfloat16) for user in node.users)
        if not low:
            ok.add(i)
    return ok


def _static_unit(gm: fx.GraphModule, analysis: Analysis, inputs: list[InputInfo],
                 config: CompilerConfig, report: GraphReport, pool: Any = None,
                 notes: Sequence[str] = ()) -> units.StaticUnit:
    names = [i.name for i in inputs]
    program = None
    kept = tuple(range(len(inputs)))
    if analysis.host_scalars:
        sunk = sink_scalars(gm, analysis, names)
        gm, program, kept = sunk.gm, sunk.program, sunk.kept_inputs
        report.sunk_inputs = program.used_input_names()
        if len(program) == 0:
            program = None  # scalars unused: nothing to stage
            gm = _drop_placeholder(gm, SUNK_INPUT_NAME)
    device = _device(inputs)
    capture = units.default_capture(device)
    # a 0-d CPU tensor (a Python number Dynamo passes as a tensor, such as a norm's eps) is
    # staged into a 0-d device tensor by the unit (StaticUnit: device scalars), unless the graph
    # writes it or uses it beside a 16-bit float (see _device_scalar_ok); any other CPU tensor
    # cannot be read by a captured graph
    scalars_ok = _device_scalar_ok(gm, kept, inputs) if capture == "cuda" else set()
    host_inputs = [inputs[i] for i in kept if inputs[i].kind != "symint"
                   and torch.device(inputs[i].device).type == "cpu"
                   and (tuple(inputs[i].shape) or i not in scalars_ok)]
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
    report.dumps += _dump(gm, dump_inputs, "optimized", config, report.graph_id, notes)
    borrowed = {i.index for i in inputs if i.kind == "parameter"} | _static_input_indices()
    mutated = {i.index for i in inputs if i.mutated}
    rec = recorder.record("static", gm, report, kept=kept, program=program, engine=engine,
                          capture=capture, borrowed=borrowed, mutated=mutated, names=names)
    unit = units.StaticUnit(gm, kept_inputs=kept, program=program, engine=engine,
                            capture=capture, borrowed=borrowed, mutated=mutated, names=names,
                            report=report, pool=pool)
    if rec is not None:
        rec.launch_unit = unit
    return unit


def _host_unit(gm: fx.GraphModule, example_inputs: Sequence[Any], config: CompilerConfig,
               report: GraphReport) -> units.HostUnit:
    report.launch = "host-scheduled, shape-generic"
    report.dumps += _dump(gm, report.inputs, "optimized", config, report.graph_id)
    if _engine(config) == "inductor":
        engine, report.engine = inductor_engine(gm, example_inputs, f"graph {report.graph_id}")
    else:
        engine, report.engine = fx_engine(gm), "fx"
    rec = recorder.record("host", gm, report)
    unit = units.HostUnit(engine)
    if rec is not None:
        rec.launch_unit = unit
    return unit


def _segmented_unit(gm: fx.GraphModule, analysis: Analysis, inputs: list[InputInfo],
                    config: CompilerConfig, report: GraphReport) -> Callable | None:
    """A graph with super_kernel segments that is not one launch unit already runs each segment
    as one launch unit (see :mod:`torchair.runtime.segmented`); None: the usual unit."""
    device = _device(inputs)
    plan = segmented.plan_launch(gm, inputs, report, build_static=analysis.build_static,
                                 host_scalars=bool(analysis.host_scalars),
                                 capture=units.default_capture(device), device=device)
    if plan is None:
        return None
    report.dumps += _dump(gm, inputs, "optimized", config, report.graph_id, plan.notes)
    rec = recorder.record("host", gm, report)  # a warm cache start runs it host-scheduled
    borrowed = {i.index for i in inputs if i.kind == "parameter"} | _static_input_indices()
    unit = segmented.SegmentedUnit(gm, plan, engine=_engine(config), inputs=inputs,
                                   borrowed_inputs=borrowed, device=device, report=report)
    if rec is not None:
        rec.launch_unit = unit
    return unit


def _static_input_indices() -> set[int]:
    """Inputs AOT knows keep their address (parameters, buffers, mark_static_address)."""
    context = torch._guards.TracingContext.try_get()
    metadata = getattr(context, "fw_metadata", None)
    return set(getattr(metadata, "static_input_indices", None) or ())


def _engine(config: CompilerConfig) -> str:
    if config.debug.run_eagerly.raw or config.mode.raw in ("reduce-overhead",
                                                                 "npugraph_ex"):
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


def _segments(gm: fx.GraphModule, inputs: list[InputInfo], config: CompilerConfig) -> dict:
    plans = plan_segments(gm, tiling_sink=config.experimental_config.tiling_schedule_optimize.raw,
                          cuda=_device(inputs).type == "cuda")
    return {scope: {"segments": plan.segments, "skipped": [list(s) for s in plan.skipped]}
            for scope, plan in plans.items()}


def _scopes(passes: list) -> dict[str, list[str]]:
    return {name: ops for p in passes for name, ops in getattr(p, "scopes", {}).items()}


def _scope_attributes(passes: list) -> dict[str, dict[str, str]]:
    return {op: attrs for p in passes for op, attrs in getattr(p, "attributes", {}).items()}


def _consts(analysis: Analysis) -> dict[str, Any]:
    return {f"{u.node.name}.{name}": value for u in analysis.value_dependent
            for name, value in u.const_args.items()}


def _dump(gm: fx.GraphModule, inputs: list[InputInfo], stage: str, config: CompilerConfig,
          graph_id: int, notes: Sequence[str] = ()) -> list[str]:
    fmt = config.debug.graph_dump.type.raw
    if fmt is None:
        return []
    from torchair.plan.dump import write_dump

    return [write_dump(gm, inputs, stage=stage, fmt=fmt, directory=config.debug.graph_dump.path,
                       graph_id=graph_id, notes=notes)]


def _user_pass(config: CompilerConfig, name: str, gm: fx.GraphModule,
               example_inputs: Sequence[Any]) -> None:
    """Run the user's ``post_grad_custom_pre_pass`` / ``..._post_pass`` as TorchAir calls it:
    ``fn(gm, example_inputs, config)``, in place (its return value is ignored), between
    TorchAir's DEBUG lines ``[forward] before [<hook>] execution, graph is ...`` and
    ``[forward] after [<hook>] execution, graph is ...``.

    An exception from the pass is raised again naming the hook and the pass (its
    ``__qualname__``), of the same type where it can be, with the original as ``__cause__``:
    Dynamo's "backend='...' raised" message shows only the last exception's text."""
    fn = getattr(config, name).raw
    if fn is None:
        return
    # TorchAir's phase for an inference graph is "forward"; this backend compiles only those
    logger.debug("[%s] before [%s] execution, graph is %s", "forward", name, gm.graph)
    try:
        fn(gm, example_inputs, config)
        gm.graph.lint()
    except Exception as err:
        raise _pass_error(err, name, fn) from err
    gm.recompile()
    logger.debug("[%s] after [%s] execution, graph is %s", "forward", name, gm.graph)


def _pass_error(err: Exception, hook: str, fn: Callable) -> Exception:
    """``err`` restated so that it names the custom pass and the hook it was set as."""
    what = getattr(fn, "__qualname__", None) or repr(fn)
    module = getattr(fn, "__module__", None)
    where = f"{module}.{what}" if module and module != "__main__" else what
    message = (f"custom pass {where} (config.{hook}) raised {type(err).__name__}: {err}. The "
               f"error is in this pass, which torchair calls as {what}(gm, example_inputs, "
               f"config) on the inference graph: fix the pass, or set config.{hook} = None")
    cls = type(err)
    try:  # the original type, so a caller's ``except KeyError`` still catches it
        new = cls(message)
        if str(new) == message:
            return new
        # e.g. KeyError quotes its text: a subclass of the same name that does not
        renamed = type(cls.__name__, (cls,), {"__str__": lambda self: message,
                                              "__module__": cls.__module__,
                                              "__qualname__": cls.__qualname__})
        new = renamed(message)
        return new if str(new) == message else RuntimeError(message)
    except Exception:  # a type that cannot be built from one message
        return RuntimeError(message)


def _inductor_joint_graph_passes(gm: fx.GraphModule) -> None:
    """``experimental_config.npu_fx_pass``: Inductor's joint-graph passes (pattern rewrites,
    constant folding of the graph's own constants), as TorchAir runs them."""
    from torch._inductor.fx_passes.joint_graph import joint_graph_passes

    joint_graph_passes(gm)
    gm.recompile()


def _debug_unit(gm: fx.GraphModule, example_inputs: Sequence[Any], inputs: list[InputInfo],
                config: CompilerConfig, graph_id: int, dumps: list[str]) -> Callable | None:
    """``debug.data_dump`` / ``debug.fx_summary`` (with ``skip_compile``): the graph runs op by
    op, unoptimized, as in TorchAir (None: compile as usual)."""
    from torchair.plan import debug_dumps

    summary = config.debug.fx_summary.type.raw
    if summary is not None:
        dumps.append(debug_dumps.write_fx_summary(gm, graph_id, config.debug.fx_summary.path))
    data = config.debug.data_dump.type.raw is not None
    if not data and not (summary is not None and config.debug.fx_summary.skip_compile.raw):
        return None
    report = GraphReport(graph_id=graph_id, fx_static=False, ir_static=False, build_static=False,
                         inputs=inputs, value_dependent_ops=[], reasons=[
                             "debug.data_dump is set: the graph runs op by op, not compiled" if data
                             else "debug.fx_summary.skip_compile: the graph runs op by op"],
                         consts={}, passes={}, dumps=dumps)
    report.engine = "fx"
    if data:
        logger.warning("debug.data_dump.type='npy': graph %d runs op by op (no compilation) and "
                       "saves every op's inputs and outputs each step", graph_id)
        unit = debug_dumps.DataDumpRunner(gm, graph_id, config.debug.data_dump.path,
                                          config.debug.data_dump.filter)
        report.launch = "op by op (debug.data_dump)"
    else:
        unit = units.HostUnit(fx_engine(gm))
        report.launch = "op by op (debug.fx_summary.skip_compile)"
    return _boxed(_publish(report, unit))
