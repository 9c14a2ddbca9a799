"""What a ``cache_compile`` entry holds and how a warm start turns it back into a callable.

An entry is JSON plus tensors (never pickles): the final graph of the launch unit (after
passes and scalar sinking), the unit's arguments, the host scalar program (as a tiny graph),
how to fetch each graph input from the call's arguments (Dynamo's input sources, parsed by a
small grammar instead of ``eval``), the call signature the graph is valid for, and how to build
the return value from the graph outputs.
"""
from __future__ import annotations

import ast
import dataclasses
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from torchair.plan.inputs import InputInfo
from torchair.plan.sink import HostScalarProgram, _Ref


class NotCacheable(Exception):
    """The compiled function cannot be replayed from a cache entry (the message says why)."""


# --------------------------------------------------------------- input sources (no eval)

_CALLS = ("size", "stride", "storage_offset")


def parse_source(text: str) -> tuple[str, tuple]:
    """``L['x']._modules['q']._parameters['weight']`` -> ("x", (("item", "_modules"), ...)).

    Steps: ("item", key) for ``[key]`` (str / int constants), ("attr", name) for ``.name`` (no
    dunders), ("call", name) for ``.size()`` / ``.stride()`` / ``.storage_offset()``. Anything
    else raises :class:`NotCacheable`.
    """
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError as error:
        raise NotCacheable(f"input source {text!r} is not an expression: {error}") from None
    steps: list[tuple[str, Any]] = []
    while True:
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise NotCacheable(f"input source {text!r}: unsupported key {key!r}")
            steps.append(("item", key))
            node = node.value
        elif isinstance(node, ast.Attribute) and not node.attr.startswith("__"):
            steps.append(("attr", node.attr))
            node = node.value
        elif (isinstance(node, ast.Call) and not node.args and not node.keywords
              and isinstance(node.func, ast.Attribute) and node.func.attr in _CALLS):
            steps.append(("call", node.func.attr))
            node = node.func.value
        else:
            break
    if not (isinstance(node, ast.Name) and node.id == "L" and steps and steps[-1][0] == "item"
            and isinstance(steps[-1][1], str)):
        raise NotCacheable(f"input source {text!r} is not read from the function's arguments")
    root = steps.pop()[1]
    return root, tuple(reversed(steps))


def accessor(text: str) -> Callable[[dict], Any]:
    root, steps = parse_source(text)

    def get(frame: dict) -> Any:
        value = frame[root]
        for kind, key in steps:
            if kind == "item":
                value = value[key]
            elif kind == "attr":
                value = getattr(value, key)
            else:
                value = getattr(value, key)()
        return value

    return get


# --------------------------------------------------------- call signature and return value

def leaf_spec(value: Any, input_shape: tuple | None, guarded: bool) -> dict:
    """What a warm call's argument leaf must look like: tensors by shape (a name: a symbolic
    size), dtype and device; graph-input ints by type; values Dynamo guarded by equality; others
    (never read by the graph) by type only."""
    if isinstance(value, torch.Tensor):
        shape = list(input_shape) if input_shape is not None else list(value.shape)
        return {"t": "tensor", "shape": shape, "dtype": str(value.dtype).replace("torch.", ""),
                "device": value.device.type}
    if input_shape == ():
        return {"t": "int"}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"t": "const", "v": value} if guarded else {"t": "any",
                                                            "type": type(value).__name__}
    raise NotCacheable(f"argument value of type {type(value).__name__} cannot be checked on a "
                       f"warm start")


def leaf_mismatch(spec: dict, value: Any) -> str:
    """Why ``value`` does not fit ``spec`` ("" when it fits)."""
    kind = spec["t"]
    if kind == "tensor":
        if not isinstance(value, torch.Tensor):
            return f"expected a tensor, got {type(value).__name__}"
        want = spec["shape"]
        if len(want) != value.dim() or any(not isinstance(w, str) and w not in (-1, int(v))
                                           for w, v in zip(want, value.shape)):
            return f"shape {list(value.shape)} vs {want} (names: symbolic sizes)"
        dtype = str(value.dtype).replace("torch.", "")
        if dtype != spec["dtype"]:
            return f"dtype {dtype} vs {spec['dtype']}"
        if value.device.type != spec["device"]:
            return f"device {value.device.type} vs {spec['device']}"
        return ""
    if kind == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            return f"expected an int, got {type(value).__name__}"
        if value < spec.get("min", value):
            return f"int {value} < {spec['min']} (Dynamo specializes 0 and 1)"
        return ""
    if kind == "any":
        return "" if type(value).__name__ == spec["type"] else (
            f"expected a {spec['type']}, got {type(value).__name__}")
    if type(value) is not type(spec["v"]) or value != spec["v"]:
        return f"value {value!r} vs {spec['v']!r} (a constant of the compiled graph)"
    return ""


def output_spec(result: Any, outputs: Sequence[Any]) -> Any:
    """The return value as JSON: graph output ``k`` as {"out": k}, constants as {"const": v}."""
    ids = {}
    for k, out in enumerate(outputs):
        if isinstance(out, torch.Tensor):
            ids.setdefault(id(out), k)

    def encode(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            if id(x) not in ids:
                raise NotCacheable("a returned tensor is not an output of the compiled graph "
                                   "(e.g. an input returned as it is, or a view made outside)")
            return {"out": ids[id(x)]}
        if x is None or isinstance(x, (bool, int, float, str)):
            return {"const": x}
        if isinstance(x, tuple) and not hasattr(x, "_fields"):
            return {"tuple": [encode(v) for v in x]}
        if isinstance(x, list):
            return {"list": [encode(v) for v in x]}
        if isinstance(x, dict) and all(isinstance(k, str) for k in x):
            return {"dict": [[k, encode(v)] for k, v in x.items()]}
        raise NotCacheable(f"the return value holds a {type(x).__name__}, which a cache entry "
                           f"cannot rebuild")

    return encode(result)


def build_output(spec: Any, outputs: Sequence[Any]) -> Any:
    if "out" in spec:
        return outputs[spec["out"]]
    if "const" in spec:
        return spec["const"]
    if "tuple" in spec:
        return tuple(build_output(s, outputs) for s in spec["tuple"])
    if "list" in spec:
        return [build_output(s, outputs) for s in spec["list"]]
    return {k: build_output(s, outputs) for k, s in spec["dict"]}


# ---------------------------------------------------------------- host scalar program

def program_to_graph(program: HostScalarProgram) -> fx.GraphModule:
    """The program as a graph: placeholders = scalar inputs, nodes = steps, output = slots."""
    graph = fx.Graph()
    env = [graph.placeholder(f"in{i}") for i in range(len(program.input_indices))]

    def node_of(a: Any) -> Any:
        return env[a.index] if isinstance(a, _Ref) else a

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
            def ref(n: fx.Node) -> _Ref:
                return _Ref(index[n])
            steps.append((node.target, tuple(fx.node.map_arg(node.args, ref)),
                          dict(fx.node.map_arg(dict(node.kwargs), ref))))
            index[node] = len(index)
        elif node.op == "output":
            slots = [(_Ref(index[a]) if isinstance(a, fx.Node) else a) for a in node.args[0]]
    return HostScalarProgram(tuple(input_indices), tuple(steps), tuple(slots),
                             tuple(input_names))


def info_to_json(info: InputInfo) -> dict:
    return dataclasses.asdict(info)


def info_from_json(data: dict) -> InputInfo:
    return InputInfo(**{**data, "shape": tuple(data["shape"])})
