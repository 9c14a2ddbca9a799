"""What a ``cache_compile`` entry holds and how a warm start turns it back into a callable.

An entry is JSON plus tensors (never pickles): the final graph of the launch unit (after
passes and scalar sinking), the unit's arguments, the host scalar program (as a tiny graph),
where each graph input comes from (Dynamo's input sources, read by the guard evaluator's small
grammar instead of ``eval``), Dynamo's guards (:mod:`torchair.inference.guards.record`), how AOT
turns the unit's outputs into the graph's (aliases included) and how to build the return value.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from torchair.plan.inputs import InputInfo
from torchair.plan.sink import HostScalarProgram, StepRef


class NotCacheable(Exception):
    """The compiled function cannot be replayed from a cache entry (the message says why)."""


# ------------------------------------------------------------------------- return value

_ALIAS_KINDS = {"OutputType.non_alias": "plain", "OutputType.unsafe_view_alias": "plain",
                "OutputType.is_input": "input", "OutputType.alias_of_input": "alias_input",
                "OutputType.alias_of_intermediate": "alias_intermediate",
                "OutputType.alias_of_intermediate_save_as_output": "alias_intermediate",
                "OutputType.alias_of_intermediate_base_is_user_output": "alias_user"}


def aot_outputs_spec(fw_metadata: Any, n_unit_outputs: int) -> dict:
    """How AOT turns the launch unit's outputs into the graph's outputs (the ones Dynamo's code
    returns): per output, plain, the input itself, or a view regenerated from an input, an
    intermediate or another output. Mirrors AOT's runtime wrapper, for warm starts without
    AOT."""
    if fw_metadata is None:
        raise NotCacheable("AOT's metadata is not available")
    if getattr(fw_metadata, "num_mutated_inp_runtime_indices", 0):
        raise NotCacheable("an input is mutated outside the graph (AOT applies it after the "
                           "graph runs)")
    for info in getattr(fw_metadata, "input_info", []):
        if getattr(info, "mutates_metadata", False):
            raise NotCacheable("an input's metadata is mutated in place (resize_/as_strided_)")
    infos = list(fw_metadata.output_info)
    bases = int(getattr(fw_metadata, "num_intermediate_bases", 0))
    if len(infos) + bases != n_unit_outputs:
        raise NotCacheable(f"the launch unit returns {n_unit_outputs} values, AOT expects "
                           f"{len(infos)} outputs and {bases} intermediate bases")
    kinds = []
    for info in infos:
        kind = _ALIAS_KINDS.get(str(info.output_type))
        if kind is None:
            raise NotCacheable(f"an output of kind {info.output_type} (e.g. a custom "
                               f"autograd.Function view) cannot be rebuilt from a cache entry")
        kinds.append([kind, info.base_idx])
    return {"outputs": kinds, "user": len(infos)}


def regenerate_alias(base: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out`` (an output with the view's size, strides and offset) as a view of ``base``, as
    AOT regenerates aliased outputs: the graph's own view when it already shares ``base``'s
    storage, else ``as_strided`` on ``base`` (through view_as_real / view_as_complex / a dtype
    view when the dtypes differ)."""
    if (out.device == base.device
            and out.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()):
        return out
    if base.is_complex() and not out.is_complex():
        base = torch.view_as_real(base)
    elif out.is_complex() and not base.is_complex():
        base = torch.view_as_complex(base)
    elif base.dtype != out.dtype:
        base = base.view(out.dtype)
    return base.as_strided(out.size(), out.stride(), out.storage_offset())


def graph_outputs(spec: dict, unit_outputs: Sequence[Any], inputs: Sequence[Any]) -> list:
    """The graph's outputs from the unit's (see :func:`aot_outputs_spec`)."""
    user = spec["user"]
    out = []
    for k, (kind, base) in enumerate(spec["outputs"]):
        value = unit_outputs[k]
        if kind == "input":
            value = inputs[base]
        elif kind == "alias_input":
            value = regenerate_alias(inputs[base], value)
        elif kind == "alias_intermediate":
            value = regenerate_alias(unit_outputs[user + base], value)
        elif kind == "alias_user":
            value = regenerate_alias(unit_outputs[base], value)
        out.append(value)
    return out


def output_spec(result: Any, outputs: Sequence[Any], inputs: Sequence[Any],
                may_vary: Callable[[Any], bool]) -> Any:
    """The return value as JSON: graph output ``k`` as {"out": k} (tensors by identity, Python
    numbers by a unique equal value), graph input ``j`` as {"in": j}, constants as {"const": v}.
    A number that matches no output is a constant of the compiled code unless ``may_vary(x)``
    (Dynamo could have rebuilt it from an unspecialized input): then it is not cacheable."""
    tensor_out = {id(o): k for k, o in reversed(list(enumerate(outputs)))
                  if isinstance(o, torch.Tensor)}
    tensor_in = {id(x): j for j, x in reversed(list(enumerate(inputs)))
                 if isinstance(x, torch.Tensor)}

    def number(x: Any) -> dict:
        same = [k for k, o in enumerate(outputs) if type(o) is type(x) and o == x]
        if len(same) == 1:
            return {"out": same[0]}
        if len(same) > 1:
            raise NotCacheable(f"the returned number {x!r} equals several graph outputs; return "
                               f"it as a tensor")
        if may_vary(x):
            raise NotCacheable(f"the returned number {x!r} may depend on the call's inputs "
                               f"(sizes or numbers are symbolic); return it as a tensor")
        return {"const": x}

    def encode(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            if id(x) in tensor_out:
                return {"out": tensor_out[id(x)]}
            if id(x) in tensor_in:
                return {"in": tensor_in[id(x)]}
            raise NotCacheable("a returned tensor is neither a graph output nor a graph input")
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            return number(x)
        if x is None or isinstance(x, (bool, str)):
            return {"const": x}
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return _encode_dataclass(x, encode)
        if isinstance(x, tuple) and not hasattr(x, "_fields"):
            return {"tuple": [encode(v) for v in x]}
        if isinstance(x, list):
            return {"list": [encode(v) for v in x]}
        if isinstance(x, dict) and all(isinstance(k, str) for k in x):
            return {"dict": [[k, encode(v)] for k, v in x.items()]}
        raise NotCacheable(f"the return value holds a {type(x).__name__}, which a cache entry "
                           f"cannot rebuild")

    return encode(result)


# a tensor store's value from ``guards.side_effects`` until :func:`tensor_stores` maps it
TENSOR_STORE = {"stored": "tensor"}


def tensor_stores(writes: list[list], targets: Sequence[Any], outputs: Sequence[Any] | None,
                  inputs: Sequence[Any]) -> None:
    """Each tensor func stored on a module attribute (``self.cos_cached = cos``: a write
    ``[source, attr, TENSOR_STORE]``, whose object the cold frame gave as ``targets[k]``), as
    the graph output or input it is (``{"out": k}`` / ``{"in": j}``, as the return value is
    described), in place: a warm call sets the attribute to that output of its own graph run,
    as Dynamo's code does after the graph."""
    for write, target in zip(writes, targets):
        source, attr, value = write
        if value != TENSOR_STORE:
            continue
        if outputs is None:
            raise NotCacheable("the compiled graph was not called")
        if not isinstance(target, torch.nn.Module):
            raise NotCacheable(f"func stores a tensor on {source}.{attr}, and {source} is a "
                               f"{type(target).__name__}, not an nn.Module")
        stored = getattr(target, attr, None)
        if not isinstance(stored, torch.Tensor):
            raise NotCacheable(f"{source}.{attr} does not hold the tensor func stored there "
                               f"after the call")
        try:
            write[2] = output_spec(stored, outputs, inputs, lambda _: True)
        except NotCacheable:
            raise NotCacheable(f"the tensor func stores on {source}.{attr} is neither a graph "
                               f"output nor a graph input") from None


def _encode_dataclass(x: Any, encode: Callable[[Any], Any]) -> dict:
    cls = type(x)
    if "<locals>" in cls.__qualname__:
        raise NotCacheable(f"the returned dataclass {cls.__qualname__} is defined inside a "
                           f"function; define it at module level so a warm start can import it")
    fields = dataclasses.fields(x)
    if any(not f.init for f in fields):
        raise NotCacheable(f"the returned dataclass {cls.__qualname__} has init=False fields")
    return {"dataclass": [cls.__module__, cls.__qualname__],
            "fields": [[f.name, encode(getattr(x, f.name))] for f in fields]}


def _import_dataclass(module: str, qualname: str) -> type:
    import importlib

    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
        raise NotCacheable(f"{module}.{qualname} is not a dataclass")
    return obj


def build_output(spec: Any, outputs: Sequence[Any], inputs: Sequence[Any] = ()) -> Any:
    if "out" in spec:
        return outputs[spec["out"]]
    if "in" in spec:
        return inputs[spec["in"]]
    if "const" in spec:
        return spec["const"]
    if "tuple" in spec:
        return tuple(build_output(s, outputs, inputs) for s in spec["tuple"])
    if "list" in spec:
        return [build_output(s, outputs, inputs) for s in spec["list"]]
    if "dataclass" in spec:
        cls = _import_dataclass(*spec["dataclass"])
        return cls(**{k: build_output(s, outputs, inputs) for k, s in spec["fields"]})
    return {k: build_output(s, outputs, inputs) for k, s in spec["dict"]}


# ---------------------------------------------------------------- host scalar program

def program_to_graph(program: HostScalarProgram) -> fx.GraphModule:
    """The program as a graph: placeholders = scalar inputs, nodes = steps, output = slots."""
    graph = fx.Graph()
    env = [graph.placeholder(f"in{i}") for i in range(len(program.input_indices))]

    def node_of(a: Any) -> Any:
        return env[a.index] if isinstance(a, StepRef) else a

    for fn, fn_args, fn_kwargs in program.steps:
        env.append(graph.call_function(fn, fx.node.map_aggregate(fn_args, node_of),
                                       fx.node.map_aggregate(fn_kwargs, node_of)))
    graph.output([node_of(s) for s in program.slots])
    return fx.GraphModule(torch.nn.Module(), graph)


def program_from_graph(gm: fx.GraphModule, input_indices: Sequence[int],
                       input_names: Sequence[str]) -> HostScalarProgram:
    index: dict[fx.Node, int] = {}
    steps = []
    slots: list[Any] = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            index[node] = len(index)
        elif node.op == "call_function":
            def ref(n: fx.Node) -> StepRef:
                return StepRef(index[n])
            steps.append((node.target, tuple(fx.node.map_arg(node.args, ref)),
                          dict(fx.node.map_arg(dict(node.kwargs), ref))))
            index[node] = len(index)
        elif node.op == "output":
            slots = [(StepRef(index[a]) if isinstance(a, fx.Node) else a) for a in node.args[0]]
    return HostScalarProgram(tuple(input_indices), tuple(steps), tuple(slots),
                             tuple(input_names))


def info_to_json(info: InputInfo) -> dict:
    return dataclasses.asdict(info)


def info_from_json(data: dict) -> InputInfo:
    return InputInfo(**{**data, "shape": tuple(data["shape"])})
