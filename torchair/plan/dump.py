"""Graph dumps the TorchAir way: readable IR (``txt``), GraphDef text (``pbtxt``), Python (``py``).

:func:`write_dump` writes one file named
``dynamo_{stage}_graph_{graph_id}_rank_{rank}_pid_{pid}_ts_{timestamp}.{fmt}``:

* ``txt``: the IR (see :mod:`torchair.plan.ir`), one node per line, e.g.
  ``addmm = aten.addmm(arg4_1, view, t) {beta=1, alpha=1} -> float32[2, 8]``;
* ``pbtxt``: a TensorFlow ``GraphDef`` in protobuf text format, which Netron opens;
* ``py``: a runnable script that rebuilds the FX graph (``gm``), prints it when run as
  ``__main__`` and offers ``make_inputs()`` for example inputs.
"""
from __future__ import annotations

import datetime
import keyword
import math
import os
from typing import Any, Sequence

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor

from torchair.base.log import logger
from torchair.base.meta import META_ATTRS
from torchair.plan.inputs import InputInfo
from torchair.plan.ir import IRNode, format_value, to_ir

__all__ = ["write_dump", "dump_file_name", "render_txt", "render_pbtxt", "render_py",
           "STAGES", "FORMATS"]

STAGES = ("original", "optimized")
FORMATS = ("txt", "pbtxt", "py")


def _rank() -> int:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return 0


def dump_file_name(stage: str, graph_id: int, fmt: str) -> str:
    ts = datetime.datetime.now().strftime("%Y%m%d%H%M%S%f")
    return f"dynamo_{stage}_graph_{graph_id}_rank_{_rank()}_pid_{os.getpid()}_ts_{ts}.{fmt}"


def write_dump(gm: fx.GraphModule, inputs: Sequence[InputInfo], *, stage: str, fmt: str,
               directory: str | None, graph_id: int, notes: Sequence[str] = ()) -> str:
    """Write one dump of ``gm`` (an ATen FX graph; ``inputs`` describe its placeholders).

    ``stage`` is "original" or "optimized", ``fmt`` "txt", "pbtxt" or "py"; ``directory`` None
    means the working directory (created when missing); ``notes`` become ``#`` comment lines at
    the top (e.g. the gears). Returns the file's path.
    """
    if stage not in STAGES:
        raise ValueError(f"write_dump: stage={stage!r} is not supported; expected one of {STAGES}")
    if fmt not in FORMATS:
        raise ValueError(f"write_dump: fmt={fmt!r} is not supported; expected one of {FORMATS}")
    if fmt == "py":
        text = render_py(gm, inputs, graph_id=graph_id, stage=stage)
    else:
        ir = to_ir(gm, inputs)
        render = render_txt if fmt == "txt" else render_pbtxt
        text = render(ir, graph_id=graph_id, stage=stage)
    text = "".join(f"# {note}\n" for note in notes) + text
    directory = os.getcwd() if directory is None else directory
    make_dump_dir(directory, "debug.graph_dump.path")
    path = os.path.join(directory, dump_file_name(stage, graph_id, fmt))
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as err:
        raise RuntimeError(f"Failed to create file: {path} ({type(err).__name__}: "
                           f"{err.strerror or err}); set config.debug.graph_dump.path to a "
                           f"directory this process can write") from err
    logger.info("dumped the %s graph %d (%s) to %s", stage, graph_id, fmt, path)
    return path


def make_dump_dir(directory: str, option: str) -> None:
    """Create a dump directory, or fail with TorchAir's text naming the option to fix (the
    option checks its path when set; this catches a directory changed since)."""
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as err:
        raise RuntimeError(f"Failed to make directory: {directory} ({type(err).__name__}: "
                           f"{err.strerror or err}); set config.{option} to a directory this "
                           f"process can write") from err


# ------------------------------------------------------------------------------------ txt

def _txt_line(node: IRNode) -> str:
    if node.op == "Data":
        body = ", ".join(f"{k}={format_value(v)}" for k, v in node.attrs.items())
        return f"{node.name} = Data({body})"
    if node.op == "Const":
        parts = [f"{k}={format_value(v)}" for k, v in node.attrs.items()]
        if "value" not in node.attrs and node.shape is not None:
            parts.append(f"shape={format_value(node.shape)}")
        parts.append(f"dtype={node.dtype or '?'}")
        return f"{node.name} = Const({', '.join(parts)})"
    call = f"{node.op}({', '.join(node.inputs)})"
    if node.attrs:
        call += " {" + ", ".join(f"{k}={format_value(v)}" for k, v in node.attrs.items()) + "}"
    if node.op == "NetOutput":
        return call
    if node.shape is not None:
        call += f" -> {node.dtype or '?'}{format_value(node.shape)}"
    elif node.dtype:
        call += f" -> {node.dtype}"
    return f"{node.name} = {call}"


def render_txt(ir: Sequence[IRNode], *, graph_id: int, stage: str) -> str:
    """The readable IR: a header, then one node per line (``-1`` marks a symbolic dim)."""
    lines = [f"# TorchAir IR of graph {graph_id}, stage {stage}: {len(ir)} nodes "
             f"(shapes: -1 = symbolic dim, [] = scalar)"]
    lines += [_txt_line(n) for n in ir]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------- pbtxt

def _quote(text: str) -> str:
    """A protobuf text-format string literal (C escapes, UTF-8 bytes as octal)."""
    out = []
    for byte in text.encode("utf-8"):
        ch = chr(byte)
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif 32 <= byte < 127:
            out.append(ch)
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def _pb_float(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(float(x))


def _pb_scalar(value: Any) -> str | None:
    if isinstance(value, bool):
        return f"b: {'true' if value else 'false'}"
    if isinstance(value, int):
        return f"i: {value}"
    if isinstance(value, float):
        return f"f: {_pb_float(value)}"
    if isinstance(value, str):
        return f"s: {_quote(value)}"
    return None


def _pb_value(value: Any) -> str:
    """The body of an ``AttrValue``: ``i``/``f``/``b``/``s`` or a homogeneous ``list``."""
    scalar = _pb_scalar(value)
    if scalar is not None:
        return scalar
    if isinstance(value, list):
        kinds = {type(v) for v in value}
        if kinds <= {int} or kinds <= {bool} or kinds <= {str} or kinds <= {float, int}:
            items = [_pb_scalar(float(v) if float in kinds else v) for v in value]
            return "list { " + " ".join(items) + (" }" if items else "}")
    return f"s: {_quote(format_value(value))}"


def _pb_shape(shape: list[int] | None) -> str:
    if shape is None:
        return "list { shape { unknown_rank: true } }"
    dims = " ".join(f"dim {{ size: {d} }}" for d in shape)
    return "list { shape { " + dims + (" }" if dims else "}") + " }"


def _pb_attr(key: str, body: str) -> list[str]:
    return ["  attr {", f"    key: {_quote(key)}", "    value {", f"      {body}", "    }", "  }"]


def _pb_node(node: IRNode) -> list[str]:
    lines = ["node {", f"  name: {_quote(node.name)}", f"  op: {_quote(node.op)}"]
    lines += [f"  input: {_quote(i)}" for i in node.inputs]
    attrs = dict(node.attrs)
    for key, alt, value in (("shape", "_output_shape", node.shape), ("dtype", "_output_dtype",
                                                                      node.dtype or "unknown")):
        if key not in attrs:
            attrs[key] = value
        elif attrs[key] != value:
            attrs[alt] = value
    for key, value in attrs.items():
        if key in ("shape", "_output_shape") and value is None:
            lines += _pb_attr(key, f"s: {_quote('unknown')}")
        else:
            lines += _pb_attr(key, _pb_value(value))
    lines += _pb_attr("_output_shapes", _pb_shape(node.shape))
    lines.append("}")
    return lines


def render_pbtxt(ir: Sequence[IRNode], *, graph_id: int, stage: str) -> str:
    """A TensorFlow ``GraphDef`` in protobuf text format (opens in Netron)."""
    lines = [f"# TorchAir IR of graph {graph_id}, stage {stage}: GraphDef text format"]
    for node in ir:
        lines += _pb_node(node)
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------- py

_RESERVED = {"torch", "operator", "math", "builtins", "torchair", "graph", "gm", "root",
             "make_inputs", "DYNAMIC_DIM", "SYMINT_VALUE", "_set_attr", "_shape"}


class _PyWriter:
    """Renders FX targets and arguments as evaluable Python, collecting the imports."""

    def __init__(self, gm: fx.GraphModule):
        self.imports: set[str] = set()
        self.npu = False
        self.var: dict[fx.Node, str] = {}
        used = set(_RESERVED)
        for node in gm.graph.nodes:
            name = node.name if node.name.isidentifier() else \
                "".join(c if c.isalnum() else "_" for c in node.name)
            if not name.isidentifier():
                name = "n_" + name
            while keyword.iskeyword(name) or name in used:
                name += "_"
            used.add(name)
            self.var[node] = name

    def target(self, target: Any) -> str:
        if isinstance(target, torch._ops.OpOverload):
            self.npu |= target.namespace == "npu"
            name = target._schema.name.split("::", 1)[-1]
            return f"torch.ops.{target.namespace}.{name}.{target._overloadname}"
        if isinstance(target, torch._ops.OpOverloadPacket):
            self.npu |= str(target).startswith("torch.ops.npu.")
            return str(target) if str(target).startswith("torch.ops.") else f"torch.ops.{target}"
        if isinstance(target, torch._ops.HigherOrderOperator):
            return f"torch.ops.higher_order.{target.name()}"
        module = getattr(target, "__module__", None) or "builtins"
        qualname = getattr(target, "__qualname__", None) or target.__name__
        if module in ("_operator", "operator"):
            self.imports.add("operator")
            return f"operator.{qualname}"
        if module == "builtins":
            return qualname
        self.imports.add(module)
        return f"{module}.{qualname}"

    def value(self, value: Any) -> str:
        if isinstance(value, fx.Node):
            return self.var[value]
        if value is None or isinstance(value, (bool, int, str)):
            return repr(value)
        if isinstance(value, float):
            return repr(value) if math.isfinite(value) else f"float({str(value)!r})"
        if isinstance(value, (torch.dtype, torch.memory_format, torch.layout)):
            return str(value)  # torch.float16, torch.contiguous_format, torch.strided
        if isinstance(value, torch.device):
            return f"torch.device({str(value)!r})"
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return repr(value.node.hint) if value.node.hint is not None else repr(str(value))
        if isinstance(value, tuple):
            items = [self.value(v) for v in value]
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        if isinstance(value, list):
            return "[" + ", ".join(self.value(v) for v in value) + "]"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k!r}: {self.value(v)}" for k, v in value.items()) + "}"
        if isinstance(value, slice):
            return f"slice({self.value(value.start)}, {self.value(value.stop)}, " \
                   f"{self.value(value.step)})"
        if value is Ellipsis:
            return "..."
        if isinstance(value, torch.Tensor):
            return _tensor_expr(value)
        return repr(value)


def _tensor_expr(t: torch.Tensor) -> str:
    if t.numel() <= 64 and not isinstance(t, FakeTensor):
        return f"torch.tensor({t.detach().cpu().tolist()!r}, dtype={t.dtype})"
    return f"torch.zeros({list(t.shape)!r}, dtype={t.dtype})  # values not dumped ({t.numel()})"


def _comment(node: fx.Node) -> str:
    text = node.format_node() or f"{node.op} {node.name}"
    return "# " + " ".join(text.split())


def _source_line(node: fx.Node) -> str | None:
    """``"model.py", line 12, in forward  <code>`` of the node's innermost user frame."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return None
    return " ".join(trace.split(" File ")[-1].split())


def _fx_meta(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype}{list(value.shape)}{value.device}"
    if isinstance(value, torch.SymInt):
        return f'"Sym({value})"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fx_meta(v) for v in value) + "]"
    return type(value).__name__


def _fx_arg(value: Any) -> str:
    if isinstance(value, fx.Node):
        meta = value.meta.get("val")
        return value.name if meta is None else f"{value.name}: {_fx_meta(meta)}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fx_arg(v) for v in value) + "]"
    return str(value)


def _fx_code(node: fx.Node) -> str:
    """TorchAir's ``## FX Code`` text: ``name: meta = target(arg: meta, ..., k=v)``."""
    args = [_fx_arg(a) for a in node.args] + [f"{k}={_fx_arg(v)}" for k, v in node.kwargs.items()]
    meta = node.meta.get("val")
    head = node.name if meta is None else f"{node.name}: {_fx_meta(meta)}"
    target = node.target if isinstance(node.target, str) else _qualified(node.target)
    return f"{head} = {target}({', '.join(args)})"


def _qualified(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"torch.ops.{target}"
    return getattr(target, "__qualname__", str(target))


def _make_input_expr(info: InputInfo) -> str:
    dtype = getattr(torch, info.dtype, None)
    if info.kind == "symint" or not info.shape and dtype is None:
        if info.dtype.startswith("float"):
            return "float(SYMINT_VALUE)"
        return "True" if info.dtype == "bool" else "SYMINT_VALUE"
    if not isinstance(dtype, torch.dtype):
        dtype = torch.float32
    shape = f"_shape({list(info.shape)!r})"
    device = repr(info.device)
    if dtype.is_complex:
        return f"torch.randn({shape}, dtype={dtype}, device={device})"
    if dtype.is_floating_point:
        return f"torch.randn({shape}, device={device}).to({dtype})"
    return f"torch.zeros({shape}, dtype={dtype}, device={device})"


def render_py(gm: fx.GraphModule, inputs: Sequence[InputInfo], *, graph_id: int,
              stage: str) -> str:
    """A runnable script rebuilding ``gm`` as ``gm``, with ``make_inputs()`` for examples."""
    w = _PyWriter(gm)
    body: list[str] = []
    attrs: list[str] = []
    files_seen: set[str] = set()
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            body.append(_comment(node))
        else:  # TorchAir's layout: the source line once, then "## FX Code: ..." per node
            source = _source_line(node)
            if source is not None and source not in files_seen:
                files_seen.add(source)
                body += ["", f"# File {source}"]
            body.append(f"## FX Code: {_fx_code(node)}")
        var = w.var[node]
        if node.op == "placeholder":
            body.append(f"{var} = graph.placeholder({node.target!r})")
        elif node.op == "output":
            body.append(f"graph.output({w.value(node.args[0] if node.args else None)})")
        elif node.op == "get_attr":
            body.append(f"{var} = graph.get_attr({node.target!r})")
            attrs.append(_attr_line(gm, str(node.target)))
        else:
            args, kwargs = w.value(tuple(node.args)), w.value(dict(node.kwargs))
            if node.op == "call_function":
                target = w.target(node.target)
                body.append(f"{var} = graph.call_function({target}, {args}, {kwargs})")
            else:  # call_method / call_module
                if node.op == "call_module":
                    attrs.append(_attr_line(gm, str(node.target)))
                body.append(f"{var} = graph.{node.op}({node.target!r}, {args}, {kwargs})")
            body += [f"{var}.meta[{key!r}] = {node.meta[key]!r}" for key in META_ATTRS
                     if key in node.meta]
    lines = [f"# TorchAir dump of graph {graph_id}, stage {stage}: the FX graph, rebuilt.",
             "# Run this file to print the graph; make_inputs() builds example inputs.",
             *sorted(f"import {m}" for m in w.imports - {"torch", "torch.fx"}),
             "import torch", "import torch.fx"]
    if w.npu:
        lines.append("import torchair.ops  # registers npu ops")
    lines += ["", "graph = torch.fx.Graph()", "", *body, ""]
    if attrs:
        lines += ["", "def _set_attr(root, target, value):",
                  "    *path, last = target.split('.')",
                  "    for part in path:",
                  "        if not hasattr(root, part):",
                  "            root.add_module(part, torch.nn.Module())",
                  "        root = getattr(root, part)",
                  "    setattr(root, last, value)", "", "",
                  "root = torch.nn.Module()", *attrs,
                  "gm = torch.fx.GraphModule(root, graph)"]
    else:
        lines.append("gm = torch.fx.GraphModule(torch.nn.Module(), graph)")
    lines += _make_inputs_lines(inputs)
    lines += ["", "", 'if __name__ == "__main__":', "    print(gm.graph)", ""]
    return "\n".join(lines)


def _attr_line(gm: fx.GraphModule, target: str) -> str:
    try:
        value: Any = gm
        for part in target.split("."):
            value = getattr(value, part)
    except AttributeError:
        value = None
    if isinstance(value, torch.Tensor):
        return f"_set_attr(root, {target!r}, {_tensor_expr(value)})"
    return f"_set_attr(root, {target!r}, torch.nn.Module())  # {type(value).__name__} not dumped"


def _make_inputs_lines(inputs: Sequence[InputInfo]) -> list[str]:
    lines = ["", "",
             "# Example inputs from the Data shapes: every symbolic dim (-1) becomes DYNAMIC_DIM",
             "# and every SymInt input SYMINT_VALUE (they need not agree with each other);",
             "# floats are random, integers and bools zero.",
             "DYNAMIC_DIM = 2", "SYMINT_VALUE = 3", "", "",
             "def _shape(shape):",
             "    return [DYNAMIC_DIM if d == -1 else d for d in shape]", "", "",
             "def make_inputs():", "    return ["]
    for info in inputs:
        shape = list(info.shape)
        lines.append(f"        {_make_input_expr(info)},  # {info.index} {info.name}: "
                     f"{info.kind} {info.dtype}{shape}")
    lines.append("    ]")
    return lines
