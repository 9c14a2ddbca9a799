"""FX graph <-> JSON for ``cache_compile``, with no code execution on load.

A graph is saved as data: its nodes in order (opcode, name, target, args, kwargs) plus the tensors
its ``get_attr`` nodes reference. Loading never evals, execs, imports or unpickles anything named
by the file: op targets are resolved from the dispatcher registry
(``torch.ops.<ns>.<op>.<overload>``, only for a registered schema) and from explicit allowlists
of ``operator``, ``math`` and ``torch.sym_*`` functions built at import time; every name that
ends up in the regenerated Python source (node names, placeholder names, attribute paths) must be
an identifier, so a crafted file cannot inject code into the ``GraphModule`` FX generates.
Anything outside that vocabulary raises ``UnserializableGraph``.

Not saved: node ``meta`` (FakeTensor ``val``, stack traces); rerun fake propagation on the
rebuilt graph if a later stage needs it. ``get_attr`` tensors come back as buffers.
"""
from __future__ import annotations

import inspect
import keyword
import math
import operator
from typing import Any

import torch
import torch.fx
from torch.fx.graph import CodeGen, _PyTreeCodeGen, _PyTreeInfo
from torch.utils import _pytree as pytree

from torchair.base.meta import META_ATTRS

__all__ = ["UnserializableGraph", "graph_code", "graph_from_json", "graph_to_json"]

FORMAT = "torchair.fx_graph"
VERSION = 1


class UnserializableGraph(ValueError):
    """The graph (or the JSON describing one) uses something outside the safe vocabulary."""


# ---------------------------------------------------------------------------------------------
# allowlists, built once at import


def _public_functions(module, exclude: frozenset[str] = frozenset()) -> dict[str, Any]:
    return {
        name: fn
        for name, fn in vars(module).items()
        if not name.startswith("_")
        and name not in exclude
        and callable(fn)
        and not inspect.isclass(fn)
    }


# operator.call and the getter/caller factories would let a graph call arbitrary methods
_OPERATOR = _public_functions(operator, exclude=frozenset({"call"}))
_MATH = _public_functions(math)
_SYM = {
    name: getattr(torch, name)
    for name in ("sym_float", "sym_int", "sym_ite", "sym_max", "sym_min", "sym_not", "sym_sqrt",
                 "sym_sum")
    if callable(getattr(torch, name, None))
}
_FUNCTION_TABLES: dict[str, dict[str, Any]] = {"operator": _OPERATOR, "math": _MATH, "torch": _SYM}
_FUNCTION_NAMES: dict[Any, tuple[str, str]] = {}
for _kind, _table in _FUNCTION_TABLES.items():
    for _name, _fn in sorted(_table.items()):
        _FUNCTION_NAMES.setdefault(_fn, (_kind, _name))


def _by_str(kind: type) -> dict[str, Any]:
    return {
        str(v).removeprefix("torch."): v for v in vars(torch).values() if isinstance(v, kind)
    }


_DTYPES = _by_str(torch.dtype)
_LAYOUTS = _by_str(torch.layout)
_MEMORY_FORMATS = _by_str(torch.memory_format)
_NODE_OPS = ("placeholder", "get_attr", "call_function", "output")
_SPEC_TYPES = {"tuple": tuple, "list": list, "dict": dict}
_SPEC_NAMES = {v: k for k, v in _SPEC_TYPES.items()}


def _is_plain_identifier(name: object) -> bool:
    return (
        isinstance(name, str)
        and name.isidentifier()
        and name.isascii()
        and not keyword.iskeyword(name)
        and not name.startswith("__")
    )


def _check_identifier(name: object, what: str) -> str:
    if not _is_plain_identifier(name):
        raise UnserializableGraph(
            f"{what} {name!r} is not a plain Python identifier (dunder names and keywords are "
            f"refused so a crafted file cannot reach Python internals); the file is not a "
            f"torchair graph: delete it"
        )
    return name


def _check_node_name(name: object, what: str) -> str:
    """Node names are local variables of the generated ``forward`` (FX renames ones that would
    shadow builtins or its own globals); dunders are allowed because ops like ``aten::__and__``
    name their nodes ``__and___tensor``."""
    if not (
        isinstance(name, str)
        and name.isidentifier()
        and name.isascii()
        and not keyword.iskeyword(name)
    ):
        raise UnserializableGraph(
            f"{what} {name!r} is not a Python identifier; the file is not a torchair graph: "
            f"delete it"
        )
    return name


def _check_attr_path(path: object, what: str) -> str:
    if not isinstance(path, str):
        raise UnserializableGraph(f"{what} {path!r} is not a string attribute path")
    for part in path.split("."):
        _check_identifier(part, f"{what} {path!r}: component")
    return path


# ---------------------------------------------------------------------------------------------
# encode


def _encode_target(node: torch.fx.Node) -> dict[str, str]:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return {"op": f"{target.namespace}::{target._opname}.{target._overloadname}"}
    try:
        known = _FUNCTION_NAMES.get(target)
    except TypeError:  # unhashable target
        known = None
    if known is not None:
        return {known[0]: known[1]}
    if isinstance(target, torch._ops.OpOverloadPacket):
        hint = "use a specific overload (e.g. torch.ops.aten.add.Tensor), as make_fx does"
    else:
        hint = (
            "only torch op overloads (torch.ops.<ns>.<op>.<overload>), operator/math functions "
            "and torch.sym_* can be saved; trace with make_fx / AOT so the graph holds aten ops"
        )
    raise UnserializableGraph(
        f"node {node.name!r}: call_function target {target!r} cannot be saved: {hint}"
    )


def _encode_value(value: Any, node: torch.fx.Node) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return float(value)
        return {"$float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, torch.fx.Node):
        return {"$node": value.name}
    if isinstance(value, list):
        return [_encode_value(v, node) for v in value]
    if isinstance(value, tuple) and type(value) is tuple:
        return {"$tuple": [_encode_value(v, node) for v in value]}
    if type(value) in (dict, torch.fx.immutable_collections.immutable_dict):
        if not all(isinstance(k, str) for k in value):
            raise UnserializableGraph(
                f"node {node.name!r}: dict argument with non-str keys {list(value)!r} cannot be "
                f"saved"
            )
        return {"$dict": {k: _encode_value(v, node) for k, v in value.items()}}
    if isinstance(value, slice):
        return {"$slice": [_encode_value(v, node) for v in (value.start, value.stop, value.step)]}
    if value is Ellipsis:
        return {"$ellipsis": None}
    if isinstance(value, torch.dtype):
        return {"$dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"$device": str(value)}
    if isinstance(value, torch.layout):
        return {"$layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"$memory_format": str(value).removeprefix("torch.")}
    raise UnserializableGraph(
        f"node {node.name!r} (target {node.target!r}): argument of type {type(value).__name__} "
        f"cannot be saved; only None/bool/int/float/str, lists, tuples, str-keyed dicts, slices, "
        f"Ellipsis, dtypes, devices, layouts, memory formats and node references are supported "
        f"(tensor constants must be graph attributes reached by get_attr)"
    )


def _encode_spec(spec: pytree.TreeSpec | None) -> Any:
    if spec is None:
        return None
    if spec.is_leaf():
        return "*"
    name = _SPEC_NAMES.get(spec.type)
    if name is None:
        raise UnserializableGraph(
            f"graph input/output structure uses {spec.type!r}; only tuples, lists and dicts of "
            f"tensors can be saved"
        )
    context = None
    if spec.type is dict:
        if not all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in spec.context):
            raise UnserializableGraph(
                f"graph input/output dict keys {spec.context!r} must be str/int"
            )
        context = list(spec.context)
    children = [_encode_spec(c) for c in spec.children()]
    return {"type": name, "context": context, "children": children}


def _encode_codegen(graph: torch.fx.Graph) -> Any:
    codegen = graph._codegen
    if type(codegen) is CodeGen:
        return None
    if type(codegen) is _PyTreeCodeGen:
        info = codegen.pytree_info
        return {
            "kind": "pytree",
            "orig_args": list(info.orig_args),
            "in_spec": _encode_spec(info.in_spec),
            "out_spec": _encode_spec(info.out_spec),
        }
    raise UnserializableGraph(f"graph code generator {type(codegen).__name__} cannot be saved")


def _get_attr_tensor(gm: torch.fx.GraphModule, node: torch.fx.Node) -> torch.Tensor:
    obj: Any = gm
    for part in node.target.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, torch.Tensor):
        raise UnserializableGraph(
            f"node {node.name!r}: get_attr {node.target!r} is a {type(obj).__name__}, not a "
            f"tensor; only tensor constants/buffers/parameters can be saved"
        )
    return obj.detach()


# node attributes that change how a graph runs (super_kernel scopes): kept, as plain strings
_KEPT_META = META_ATTRS


def graph_to_json(gm: torch.fx.GraphModule) -> tuple[dict, dict[str, torch.Tensor]]:
    """``gm`` as a JSON-able dict, plus the tensors its ``get_attr`` nodes reference (keyed by
    attribute path). Raises ``UnserializableGraph`` naming the first node that cannot be saved."""
    nodes = []
    tensors: dict[str, torch.Tensor] = {}
    for node in gm.graph.nodes:
        if node.op not in _NODE_OPS:
            raise UnserializableGraph(
                f"node {node.name!r}: opcode {node.op!r} (target {node.target!r}) cannot be "
                f"saved; only {', '.join(_NODE_OPS)} nodes are supported (inline submodules first)"
            )
        if node.op == "call_function":
            target: Any = _encode_target(node)
        else:
            target = node.target
            if node.op == "get_attr":
                _check_attr_path(target, f"node {node.name!r}: get_attr target")
                tensors[target] = _get_attr_tensor(gm, node)
            elif node.op == "placeholder":
                _check_identifier(target, f"node {node.name!r}: placeholder")
        entry = {
            "op": node.op,
            "name": _check_node_name(node.name, "node name"),
            "target": target,
            "args": [_encode_value(a, node) for a in node.args],
            "kwargs": {k: _encode_value(v, node) for k, v in node.kwargs.items()},
        }
        meta = {k: node.meta[k] for k in _KEPT_META if isinstance(node.meta.get(k), str)}
        if meta:
            entry["meta"] = meta
        nodes.append(entry)
    data = {
        "format": FORMAT,
        "version": VERSION,
        "nodes": nodes,
        "attrs": sorted(tensors),
        "codegen": _encode_codegen(gm.graph),
    }
    return data, tensors


# ---------------------------------------------------------------------------------------------
# decode


def _resolve_op(qualified: object, node_name: str) -> torch._ops.OpOverload:
    where = f"node {node_name!r}: op {qualified!r}"
    if not isinstance(qualified, str) or qualified.count("::") != 1:
        raise UnserializableGraph(f"{where} is not of the form 'namespace::op.overload'")
    ns, rest = qualified.split("::")
    name, dot, overload = rest.partition(".")
    if not dot:
        raise UnserializableGraph(f"{where} has no overload (expected 'namespace::op.overload')")
    _check_identifier(ns, f"{where}: namespace")
    _check_identifier(overload, f"{where}: overload")
    # op names may be dunders (aten::__and__): they are looked up in the C++ registry first, and
    # the Python attribute walk below only happens for a registered schema
    if not (isinstance(name, str) and name.isidentifier() and name.isascii()):
        raise UnserializableGraph(f"{where}: op name {name!r} is not an identifier")
    try:
        schema_overload = "" if overload == "default" else overload
        torch._C._dispatch_find_schema_or_throw(f"{ns}::{name}", schema_overload)
    except RuntimeError:
        raise UnserializableGraph(
            f"{where} is not registered in this process; import the library that defines the "
            f"'{ns}' ops before loading the graph (e.g. `import torchair` for npu:: ops)"
        ) from None
    try:
        op = getattr(getattr(getattr(torch.ops, ns), name), overload)
    except (AttributeError, RuntimeError) as e:
        raise UnserializableGraph(f"{where} cannot be resolved: {e}") from None
    if not (
        isinstance(op, torch._ops.OpOverload)
        and (op.namespace, op._opname, op._overloadname) == (ns, name, overload)
    ):
        raise UnserializableGraph(f"{where} does not resolve to that op overload")
    return op


def _decode_target(target: object, node_name: str) -> Any:
    if not isinstance(target, dict) or len(target) != 1:
        raise UnserializableGraph(
            f"node {node_name!r}: call_function target {target!r} must be one of "
            f"{{'op': 'ns::op.overload'}}, {{'operator': name}}, {{'math': name}}, "
            f"{{'torch': name}}"
        )
    (kind, name), = target.items()
    if kind == "op":
        return _resolve_op(name, node_name)
    table = _FUNCTION_TABLES.get(kind)
    if table is None or not isinstance(name, str) or name not in table:
        raise UnserializableGraph(
            f"node {node_name!r}: call_function target {target!r} is not in the allowlist of "
            f"operator/math/torch.sym_* functions"
        )
    return table[name]


def _decode_float(tag: object, node_name: str) -> float:
    values = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}
    if tag not in values:
        raise UnserializableGraph(f"node {node_name!r}: bad float literal {tag!r}")
    return values[tag]


def _decode_from_table(table: dict[str, Any], what: str):
    def decode(tag: object, node_name: str) -> Any:
        if not isinstance(tag, str) or tag not in table:
            raise UnserializableGraph(f"node {node_name!r}: unknown {what} {tag!r}")
        return table[tag]
    return decode


def _decode_device(tag: object, node_name: str) -> torch.device:
    if not isinstance(tag, str):
        raise UnserializableGraph(f"node {node_name!r}: device {tag!r} is not a string")
    try:
        return torch.device(tag)
    except (RuntimeError, ValueError) as e:
        raise UnserializableGraph(f"node {node_name!r}: bad device {tag!r}: {e}") from None


def _decode_value(value: Any, env: dict[str, torch.fx.Node], node_name: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_decode_value(v, env, node_name) for v in value]
    if not isinstance(value, dict) or len(value) != 1:
        raise UnserializableGraph(f"node {node_name!r}: unexpected value {value!r}")
    (tag, body), = value.items()
    if tag == "$node":
        if not isinstance(body, str) or body not in env:
            raise UnserializableGraph(
                f"node {node_name!r} refers to {body!r}, which is not an earlier node"
            )
        return env[body]
    if tag == "$tuple" and isinstance(body, list):
        return tuple(_decode_value(v, env, node_name) for v in body)
    if tag == "$dict" and isinstance(body, dict):
        return {k: _decode_value(v, env, node_name) for k, v in body.items()}
    if tag == "$slice" and isinstance(body, list) and len(body) == 3:
        return slice(*(_decode_value(v, env, node_name) for v in body))
    if tag == "$ellipsis" and body is None:
        return Ellipsis
    decoder = _SCALAR_DECODERS.get(tag)
    if decoder is None:
        raise UnserializableGraph(f"node {node_name!r}: unknown value tag {tag!r}")
    return decoder(body, node_name)


_SCALAR_DECODERS = {
    "$float": _decode_float,
    "$dtype": _decode_from_table(_DTYPES, "dtype"),
    "$layout": _decode_from_table(_LAYOUTS, "layout"),
    "$memory_format": _decode_from_table(_MEMORY_FORMATS, "memory format"),
    "$device": _decode_device,
}


def _decode_spec(data: Any) -> pytree.TreeSpec | None:
    if data is None:
        return None
    if data == "*":
        return pytree.treespec_leaf()
    if not isinstance(data, dict) or set(data) != {"type", "context", "children"}:
        raise UnserializableGraph(f"bad pytree spec {data!r}")
    typ = _SPEC_TYPES.get(data["type"])
    children = data["children"]
    context = data["context"]
    if typ is None or not isinstance(children, list):
        raise UnserializableGraph(f"bad pytree spec type {data['type']!r}")
    if typ is dict:
        if not isinstance(context, list) or len(context) != len(children) or not all(
            isinstance(k, (str, int)) and not isinstance(k, bool) for k in context
        ):
            raise UnserializableGraph(f"bad pytree dict keys {context!r}")
    elif context is not None:
        raise UnserializableGraph(f"bad pytree context {context!r}")
    return pytree.TreeSpec(typ, context, [_decode_spec(c) for c in children])


def _decode_codegen(data: Any) -> CodeGen | None:
    if data is None:
        return None
    if not isinstance(data, dict) or data.get("kind") != "pytree":
        raise UnserializableGraph(f"unknown graph code generator {data!r}")
    orig_args = data.get("orig_args")
    if not isinstance(orig_args, list):
        raise UnserializableGraph(f"bad pytree argument names {orig_args!r}")
    for name in orig_args:
        _check_identifier(name, "graph argument name")
    in_spec, out_spec = _decode_spec(data.get("in_spec")), _decode_spec(data.get("out_spec"))
    info = _PyTreeInfo(orig_args, in_spec, out_spec)
    return _PyTreeCodeGen(info)


def _root_module(attrs: list[str], tensors: dict[str, torch.Tensor]) -> torch.nn.Module:
    if set(tensors) != set(attrs):
        raise UnserializableGraph(
            f"graph attributes {sorted(attrs)} do not match the tensors given "
            f"{sorted(tensors)}; pass the tensors returned by graph_to_json with this graph"
        )
    root = torch.nn.Module()
    for path in attrs:
        if not isinstance(tensors[path], torch.Tensor):
            raise UnserializableGraph(
                f"graph attribute {path!r} is {type(tensors[path]).__name__}, expected a tensor"
            )
        *parents, leaf = path.split(".")
        module = root
        try:
            for part in parents:
                if not hasattr(module, part):
                    module.add_module(part, torch.nn.Module())
                module = getattr(module, part)
                if not isinstance(module, torch.nn.Module):
                    raise KeyError(f"{part!r} is not a module")
            module.register_buffer(leaf, tensors[path])
        except (KeyError, AttributeError) as e:
            raise UnserializableGraph(
                f"graph attribute {path!r} conflicts with another: {e}"
            ) from None
    return root


def graph_from_json(data: dict, tensors: dict[str, torch.Tensor]) -> torch.fx.GraphModule:
    """Rebuild the ``GraphModule`` saved by ``graph_to_json``. Every op, function, name and value
    is checked against the safe vocabulary; nothing named by ``data`` is imported or executed.
    Raises ``UnserializableGraph``."""
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        raise UnserializableGraph(
            f"not a version-{VERSION} {FORMAT} document; it was written by another torchair "
            f"version or is not a graph: rebuild the cache entry"
        )
    nodes = data.get("nodes")
    attrs = data.get("attrs")
    if not isinstance(nodes, list) or not isinstance(attrs, list):
        raise UnserializableGraph("graph document needs a 'nodes' list and an 'attrs' list")
    for path in attrs:
        _check_attr_path(path, "graph attribute")
    if not isinstance(tensors, dict):
        raise UnserializableGraph(
            f"tensors must be a dict[str, Tensor], got {type(tensors).__name__}"
        )
    graph = torch.fx.Graph()
    env: dict[str, torch.fx.Node] = {}
    for i, spec in enumerate(nodes):
        if not isinstance(spec, dict) or not (
                {"op", "name", "target", "args", "kwargs"} <= set(spec)
                <= {"op", "name", "target", "args", "kwargs", "meta"}):
            raise UnserializableGraph(f"graph node #{i} is malformed: {spec!r}")
        op, name, target = spec["op"], spec["name"], spec["target"]
        _check_node_name(name, f"graph node #{i} name")
        if name in env:
            raise UnserializableGraph(f"graph node name {name!r} is used twice")
        if op == "call_function":
            target = _decode_target(target, name)
        elif op == "placeholder":
            _check_identifier(target, f"node {name!r}: placeholder")
        elif op == "get_attr":
            _check_attr_path(target, f"node {name!r}: get_attr target")
            if target not in attrs:
                raise UnserializableGraph(f"node {name!r}: get_attr {target!r} is not in 'attrs'")
        elif op == "output":
            if target != "output":
                raise UnserializableGraph(f"node {name!r}: output target must be 'output'")
        else:
            raise UnserializableGraph(f"node {name!r}: opcode {op!r} is not one of {_NODE_OPS}")
        if not isinstance(spec["args"], list) or not isinstance(spec["kwargs"], dict):
            raise UnserializableGraph(f"node {name!r}: args must be a list and kwargs a dict")
        args = tuple(_decode_value(a, env, name) for a in spec["args"])
        kwargs = {}
        for k, v in spec["kwargs"].items():
            kwargs[_check_identifier(k, f"node {name!r}: keyword")] = _decode_value(v, env, name)
        env[name] = graph.create_node(op, target, args, kwargs, name=name)
        meta = spec.get("meta", {})
        if not isinstance(meta, dict) or not all(
                k in _KEPT_META and isinstance(v, str) for k, v in meta.items()):
            raise UnserializableGraph(f"node {name!r}: meta may only hold {_KEPT_META} strings")
        env[name].meta.update(meta)
    outputs = [n for n in graph.nodes if n.op == "output"]
    if len(outputs) != 1 or outputs[0] is not list(graph.nodes)[-1]:
        raise UnserializableGraph("graph must end with exactly one output node")
    codegen = _decode_codegen(data.get("codegen"))
    if codegen is not None:
        graph.set_codegen(codegen)
    try:
        graph.lint()
    except RuntimeError as e:
        raise UnserializableGraph(f"rebuilt graph is invalid: {e}") from None
    return torch.fx.GraphModule(_root_module(attrs, tensors), graph)


def graph_code(gm: torch.fx.GraphModule) -> str:
    """Readable Python of ``gm`` (what ``readable_cache`` prints)."""
    return gm.code
