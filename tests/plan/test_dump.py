"""Graph dumps: the IR view (Data/Const/op/NetOutput), txt, pbtxt (parsed here) and runnable py."""
from __future__ import annotations

import logging
import operator
import os
import re
import runpy

import pytest
import torch
from torch._functorch.aot_autograd import aot_module_simplified
from torch.fx.experimental.proxy_tensor import make_fx

import torchair.ops  # noqa: F401 (registers npu ops)
from torchair.plan.dump import render_pbtxt, render_txt, write_dump
from torchair.plan.inputs import describe_inputs
from torchair.plan.ir import IRNode, to_ir

# ------------------------------------------------------------------------------ helpers

def _capture(fn, args, *, dynamic: bool):
    """Compile ``fn`` through AOT autograd; return the ATen gm and its InputInfos."""
    captured = []

    def backend(gm, example_inputs):
        def fw_compiler(aten_gm, aten_inputs):
            captured.append((aten_gm, list(aten_inputs)))
            return aten_gm
        return aot_module_simplified(gm, example_inputs, fw_compiler=fw_compiler)

    with torch.no_grad():
        torch.compile(fn, backend=backend, dynamic=dynamic, fullgraph=True)(*args)
    gm, example = captured[-1]
    return gm, _infos(gm, example)


def _infos(gm, example):
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    kinds = ["tensor" if isinstance(x, torch.Tensor) else "symint" for x in example]
    return describe_inputs(example, names, kinds, mutated=set())


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


class _Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 8)

    def forward(self, x, n):
        y = self.lin(x.reshape(-1, 16)).to(torch.float16)
        return y * n, x.shape[0] + n


class _Static(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 8)

    def forward(self, x):
        y = self.lin(x).t().contiguous()
        ones = torch.ones(y.shape, device=x.device, dtype=torch.float16)
        return (torch.relu(y) + ones).sum(dim=0), y.to(torch.float64) * 0.5


@pytest.fixture(scope="module")
def dynamic_graph():
    torch.manual_seed(0)
    return _capture(_Linear(), (torch.randn(2, 4, 16), 3), dynamic=True)


@pytest.fixture(scope="module")
def static_graph():
    torch.manual_seed(0)
    return _capture(_Static(), (torch.randn(4, 16),), dynamic=False)


# ------------------------------------------------------------------ a small pbtxt parser

_TOKEN = re.compile(r'\s+|#[^\n]*|(?P<str>"(?:[^"\\\n]|\\.)*")|(?P<punct>[{}:])|'
                    r'(?P<word>[A-Za-z0-9_.+\-]+)')


def _unescape(literal: str) -> str:
    body, out, i = literal[1:-1], bytearray(), 0
    simple = {"n": 10, "t": 9, "r": 13, "\\": 92, '"': 34, "'": 39}
    while i < len(body):
        if body[i] != "\\":
            out += body[i].encode("utf-8")
            i += 1
        elif body[i + 1] in simple:
            out.append(simple[body[i + 1]])
            i += 2
        else:
            assert re.fullmatch(r"[0-7]{3}", body[i + 1:i + 4]), f"bad escape in {literal}"
            out.append(int(body[i + 1:i + 4], 8))
            i += 4
    return out.decode("utf-8")


def _parse_pbtxt(text: str) -> list:
    """Text proto -> nested [(field, value)] lists; asserts the syntax is valid."""
    tokens, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        assert m, f"unexpected character at {pos}: {text[pos:pos + 20]!r}"
        pos = m.end()
        if m.lastgroup:
            tokens.append((m.lastgroup, m.group(m.lastgroup)))

    def message(i: int, closing: bool):
        fields = []
        while i < len(tokens):
            kind, tok = tokens[i]
            if tok == "}" and kind == "punct":
                assert closing, "unbalanced '}'"
                return fields, i + 1
            assert kind == "word", f"expected a field name, got {tok!r}"
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            if nxt == ("punct", "{"):
                sub, i = message(i + 2, True)
                fields.append((tok, sub))
            else:
                assert nxt == ("punct", ":"), f"expected ':' after {tok!r}"
                kind2, value = tokens[i + 2]
                assert kind2 in ("str", "word"), f"bad value {value!r}"
                fields.append((tok, _unescape(value) if kind2 == "str" else value))
                i += 3
        assert not closing, "unbalanced '{'"
        return fields, i

    fields, _ = message(0, False)
    return fields


def _get(fields, name):
    return [v for k, v in fields if k == name]


def _check_graphdef(text: str) -> dict[str, list]:
    """Every top-level field is a node with one name and one op; inputs name earlier nodes."""
    nodes: dict[str, list] = {}
    for field, node in _parse_pbtxt(text):
        assert field == "node" and isinstance(node, list)
        (name,), (op,) = _get(node, "name"), _get(node, "op")
        assert name and op and name not in nodes
        for inp in _get(node, "input"):
            assert inp in nodes, f"{name}: input {inp!r} is not an earlier node"
        keys = [_get(a, "key")[0] for a in _get(node, "attr")]
        assert len(keys) == len(set(keys)) and {"dtype", "_output_shapes"} <= set(keys)
        assert "shape" in keys or "_output_shape" in keys
        for attr in _get(node, "attr"):
            (value,) = _get(attr, "value")
            assert len(value) == 1 and value[0][0] in ("s", "i", "f", "b", "list")
        nodes[name] = node
    return nodes


def _attr(node, key):
    for attr in _get(node, "attr"):
        if _get(attr, "key") == [key]:
            return _get(attr, "value")[0]
    raise KeyError(key)


# ------------------------------------------------------------------------------ IR view

def test_ir_data_ops_and_netoutput(dynamic_graph):
    gm, infos = dynamic_graph
    ir = to_ir(gm, infos)
    data = [n for n in ir if n.op == "Data"]
    assert [n.name for n in data] == [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    for node, info in zip(data, infos):
        assert node.attrs == {"index": info.index, "name": info.name, "kind": info.kind,
                              "shape": list(info.shape), "dtype": info.dtype}
        assert node.shape == list(info.shape) and node.inputs == []
    assert any(n.attrs["kind"] == "symint" and n.shape == [] and n.dtype == "int64" for n in data)
    assert any(-1 in n.shape for n in data if n.attrs["kind"] == "tensor")
    seen = set()
    for node in ir:
        assert all(i in seen for i in node.inputs), node
        seen.add(node.name)
    addmm = next(n for n in ir if n.op == "aten.addmm")
    assert len(addmm.inputs) == 3 and addmm.attrs == {"beta": 1, "alpha": 1}
    assert addmm.dtype == "float32" and addmm.shape == [-1, 8]
    add = next(n for n in ir if n.op == "operator.add")
    assert add.shape == [] and add.dtype == "int64"
    assert all(next(d for d in data if d.name == i).attrs["kind"] == "symint" for i in add.inputs)
    copy = next(n for n in ir if n.op == "aten._to_copy")
    assert copy.attrs["dtype"] == "float16"
    out = ir[-1]
    assert out.op == "NetOutput" and len(out.inputs) == 2 and add.name in out.inputs


def test_ir_rejects_mismatched_inputs(dynamic_graph):
    gm, infos = dynamic_graph
    with pytest.raises(ValueError, match="placeholders"):
        to_ir(gm, infos[:-1])


def test_ir_without_meta():
    gm = make_fx(lambda x, y: torch.mm(x, y).relu())(torch.randn(2, 3), torch.randn(3, 4))
    infos = _infos(gm, [torch.randn(2, 3), torch.randn(3, 4)])
    for node in gm.graph.nodes:
        node.meta.clear()
    ir = to_ir(gm, infos)
    mm = next(n for n in ir if n.op == "aten.mm")
    assert mm.shape is None and mm.dtype == ""
    assert "aten.relu(mm)" in render_txt(ir, graph_id=0, stage="original")
    _check_graphdef(render_pbtxt(ir, graph_id=0, stage="original"))


# ------------------------------------------------------------------------------ txt

def test_txt_dynamic_dims_and_file_name(dynamic_graph, tmp_path):
    gm, infos = dynamic_graph
    directory = tmp_path / "not" / "yet"
    path = write_dump(gm, infos, stage="original", fmt="txt", directory=str(directory),
                      graph_id=3)
    name = os.path.basename(path)
    assert os.path.dirname(path) == str(directory)
    assert re.fullmatch(rf"dynamo_original_graph_3_rank_0_pid_{os.getpid()}_ts_\d{{20}}\.txt",
                        name), name
    lines = open(path, encoding="utf-8").read().splitlines()
    assert "graph 3" in lines[0] and "original" in lines[0]
    dynamic = next(i for i in infos if i.kind == "tensor" and i.is_dynamic)
    assert (f"{dynamic.name} = Data(index={dynamic.index}, name={dynamic.name}, kind=tensor, "
            f"shape={list(dynamic.shape)}, dtype=float32)") in lines
    assert any(re.fullmatch(r"arg\d+_1 = Data\(index=\d+, name=\w+, kind=symint, shape=\[\], "
                            r"dtype=int64\)", line) for line in lines)
    assert any(re.fullmatch(r"addmm = aten\.addmm\(arg\d+_1, \w+, \w+\) \{beta=1, alpha=1\} "
                            r"-> float32\[-1, 8\]", line) for line in lines)
    assert any(re.fullmatch(r"\w+ = operator\.add\(arg\d+_1, arg\d+_1\) -> int64\[\]", line)
               for line in lines)
    assert re.fullmatch(r"NetOutput\(\w+, \w+\)", lines[-1])


def test_write_dump_defaults_to_cwd_and_logs(static_graph, tmp_path, monkeypatch, torchair_log):
    gm, infos = static_graph
    monkeypatch.chdir(tmp_path)
    path = write_dump(gm, infos, stage="optimized", fmt="pbtxt", directory=None, graph_id=0)
    assert os.path.dirname(path) == str(tmp_path)
    assert os.path.basename(path).startswith("dynamo_optimized_graph_0_rank_0_pid_")
    assert any(path in r.getMessage() and r.levelno == logging.INFO for r in torchair_log)
    with pytest.raises(ValueError, match="stage"):
        write_dump(gm, infos, stage="final", fmt="txt", directory=str(tmp_path), graph_id=0)
    with pytest.raises(ValueError, match="fmt"):
        write_dump(gm, infos, stage="original", fmt="json", directory=str(tmp_path), graph_id=0)


# ------------------------------------------------------------------------------ pbtxt

def test_pbtxt_is_a_valid_graphdef(dynamic_graph, tmp_path):
    gm, infos = dynamic_graph
    path = write_dump(gm, infos, stage="original", fmt="pbtxt", directory=str(tmp_path),
                      graph_id=1)
    assert path.endswith(".pbtxt")
    text = open(path, encoding="utf-8").read()
    nodes = _check_graphdef(text)
    assert list(nodes) == [n.name for n in to_ir(gm, infos)]
    data = [n for n in nodes.values() if _get(n, "op") == ["Data"]]
    dims = [_attr(n, "shape") for n in data]
    assert ("list", [("i", "-1"), ("i", "-1"), ("i", "16")]) in [d[0] for d in dims if d]
    addmm = nodes["addmm"]
    assert _attr(addmm, "beta") == [("i", "1")] and _attr(addmm, "dtype") == [("s", "float32")]
    assert len(_get(addmm, "input")) == 3


def test_pbtxt_escapes_strings_and_renders_lists():
    weird = 'say "hi"\\ \n tab\t é'
    ir = [IRNode("a", "Data", [], {"index": 0, "kind": "tensor", "shape": [2], "dtype": "int8"},
                 [2], "int8"),
          IRNode("b", "my.op", ["a", "a"], {"text": weird, "flag": True, "scale": 0.5,
                                           "ratio": float("inf"), "none": None,
                                           "floats": [1.0, 2], "mixed": ["%a", 3],
                                           "shape": [1, 2]}, [2], "float32")]
    nodes = _check_graphdef(render_pbtxt(ir, graph_id=0, stage="original"))
    b = nodes["b"]
    assert _get(b, "input") == ["a", "a"]
    assert _attr(b, "text") == [("s", weird)]
    assert _attr(b, "flag") == [("b", "true")] and _attr(b, "scale") == [("f", "0.5")]
    assert _attr(b, "ratio") == [("f", "inf")] and _attr(b, "none") == [("s", "None")]
    assert _attr(b, "floats") == [("list", [("f", "1.0"), ("f", "2.0")])]
    assert _attr(b, "mixed") == [("s", "[%a, 3]")]
    # the op's own "shape" argument wins the key; the output shape moves to _output_shape
    assert _attr(b, "shape") == [("list", [("i", "1"), ("i", "2")])]
    assert _attr(b, "_output_shape") == [("list", [("i", "2")])]


# ------------------------------------------------------------------------------ py

def _run_py(path, capsys):
    namespace = runpy.run_path(path, run_name="__main__")
    printed = capsys.readouterr().out
    assert "graph():" in printed
    return namespace


def test_py_dump_rebuilds_the_graph(static_graph, tmp_path, capsys):
    gm, infos = static_graph
    path = write_dump(gm, infos, stage="original", fmt="py", directory=str(tmp_path), graph_id=0)
    assert path.endswith(".py")
    text = open(path, encoding="utf-8").read()
    assert "import torchair.ops" not in text  # no npu op in this graph
    assert "torch.device('cpu')" in text and "torch.contiguous_format" in text
    assert "graph.call_function(torch.ops.aten.addmm.default, (" in text
    # TorchAir's layout: "## FX Code: name: meta = target(arg: meta, ...)" per node
    code = [line for line in text.splitlines() if line.startswith("## FX Code: ")]
    assert len(code) == len(_targets(gm))
    addmm = next(line for line in code if "torch.ops.aten.addmm.default(" in line)
    assert re.match(r"## FX Code: addmm\w*: torch\.float32\[\d+, \d+\]cpu = "
                    r"torch\.ops\.aten\.addmm\.default\(\w+: torch\.float32\[", addmm), addmm
    ns = _run_py(path, capsys)
    rebuilt = ns["gm"]
    assert isinstance(rebuilt, torch.fx.GraphModule)
    assert _targets(rebuilt) == _targets(gm) and len(_targets(gm)) >= 6
    inputs = ns["make_inputs"]()
    assert [tuple(x.shape) for x in inputs] == [tuple(i.shape) for i in infos]
    expected, actual = gm(*inputs), rebuilt(*inputs)
    assert len(expected) == len(actual) == 2
    for e, a in zip(expected, actual):
        assert e.dtype == a.dtype
        torch.testing.assert_close(a, e)


def test_py_dump_with_symints_and_tensor_constants(dynamic_graph, tmp_path, capsys):
    gm, infos = dynamic_graph
    ns = _run_py(write_dump(gm, infos, stage="original", fmt="py", directory=str(tmp_path),
                            graph_id=0), capsys)
    assert _targets(ns["gm"]) == _targets(gm)
    assert operator.add in _targets(gm)
    inputs = ns["make_inputs"]()
    for value, info in zip(inputs, infos):
        if info.kind == "symint":
            assert value == 3
        else:  # -1 dims became 2
            assert list(value.shape) == [2 if d == -1 else d for d in info.shape]

    const = torch.tensor([1.0, -2.0, 3.0])
    gm2 = make_fx(lambda x: x * const + 1)(torch.randn(3))
    assert any(n.op == "get_attr" for n in gm2.graph.nodes)
    infos2 = _infos(gm2, [torch.randn(3)])
    ns2 = _run_py(write_dump(gm2, infos2, stage="optimized", fmt="py", directory=str(tmp_path),
                             graph_id=1), capsys)
    x = torch.randn(3)
    torch.testing.assert_close(ns2["gm"](x), gm2(x))
    assert "Const(target=" in render_txt(to_ir(gm2, infos2), graph_id=1, stage="optimized")


# ------------------------------------------------------------------- value-dependent ops

def _ifa(q, k, v):
    out = torch.ops.npu.npu_incre_flash_attention(q, k, v, actual_seq_lengths=[5, 7],
                                                  num_heads=2, input_layout="BNSD")
    return out + 1


def _ifa_symbolic(q, k, v, n):
    return torch.ops.npu.npu_incre_flash_attention(q, k, v, actual_seq_lengths=[k.shape[2], n + 1],
                                                   num_heads=2, input_layout="BNSD")


def _qkv():
    torch.manual_seed(0)
    return torch.randn(2, 2, 1, 8), torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)


def test_constant_seq_lengths_become_a_const_node(tmp_path, capsys):
    gm, infos = _capture(_ifa, _qkv(), dynamic=False)
    ir = to_ir(gm, infos)
    const = next(n for n in ir if n.op == "Const")
    assert const.attrs == {"value": [5, 7]} and const.dtype == "int64" and const.shape == [2]
    ifa = next(n for n in ir if n.op == "npu.npu_incre_flash_attention")
    assert ifa.inputs[-1] == const.name and len(ifa.inputs) == 4
    assert "actual_seq_lengths" not in ifa.attrs
    assert ifa.attrs["num_heads"] == 2 and ifa.attrs["input_layout"] == "BNSD"
    assert [n.name for n in ir].index(const.name) < [n.name for n in ir].index(ifa.name)

    txt = open(write_dump(gm, infos, stage="original", fmt="txt", directory=str(tmp_path),
                          graph_id=0), encoding="utf-8").read()
    assert f"{const.name} = Const(value=[5, 7], dtype=int64)" in txt.splitlines()
    assert re.search(rf"= npu\.npu_incre_flash_attention\(arg0_1, arg1_1, arg2_1, {const.name}\) "
                     r"\{num_heads=2, ", txt)
    pb = _check_graphdef(open(write_dump(gm, infos, stage="original", fmt="pbtxt",
                                         directory=str(tmp_path), graph_id=0)).read())
    assert _attr(pb[const.name], "value") == [("list", [("i", "5"), ("i", "7")])]
    assert _get(pb[ifa.name], "input")[-1] == const.name

    path = write_dump(gm, infos, stage="original", fmt="py", directory=str(tmp_path), graph_id=0)
    assert "import torchair.ops  # registers npu ops" in open(path).read()
    ns = _run_py(path, capsys)
    assert _targets(ns["gm"]) == _targets(gm)
    inputs = ns["make_inputs"]()
    torch.testing.assert_close(ns["gm"](*inputs), gm(*inputs))


def test_symbolic_seq_lengths_are_op_inputs():
    q, k, v = _qkv()
    gm, infos = _capture(_ifa_symbolic, (q, k, v, 4), dynamic=True)
    ir = to_ir(gm, infos)
    assert not any(n.op == "Const" for n in ir)
    by_name = {n.name: n for n in ir}
    ifa = next(n for n in ir if n.op == "npu.npu_incre_flash_attention")
    scalars = ifa.inputs[3:]
    assert len(scalars) == 2 and "actual_seq_lengths" not in ifa.attrs
    assert by_name[scalars[0]].op == "Data" and by_name[scalars[0]].shape == []
    assert by_name[scalars[1]].op == "operator.add" and by_name[scalars[1]].shape == []
