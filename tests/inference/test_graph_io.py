"""Tests for torchair.inference._graph_io: FX graph <-> JSON round trips, refusal of anything
that could execute code on load."""
import copy
import json
import math
import operator

import pytest
import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

import torchair  # noqa: F401  (registers the npu:: ops)
from torchair.inference._graph_io import (
    UnserializableGraph,
    graph_code,
    graph_from_json,
    graph_to_json,
)


def _round_trip(gm):
    data, tensors = graph_to_json(gm)
    text = json.dumps(data, allow_nan=False)  # strict JSON: inf/nan are tagged
    return graph_from_json(json.loads(text), tensors)


def _assert_same(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    else:
        assert a == b


def _check(gm, *inputs):
    gm2 = _round_trip(gm)
    _assert_same(gm(*inputs), gm2(*inputs))
    assert graph_code(gm2) == graph_code(gm)
    return gm2


def _aten_mix(x, y):
    a = x.view(-1, 2).sum(dim=[0], keepdim=True)
    b = torch.clamp(x, min=-math.inf, max=math.inf).to(torch.float16).to(torch.float32)
    c = torch.zeros(3, dtype=torch.int64, device=torch.device("cpu"))
    d = torch.empty_like(y, memory_format=torch.contiguous_format).fill_(0.5)
    vals, idx = torch.topk(y, 2)  # multi-output op: getitem nodes
    e = x[..., 1:3]  # slice / Ellipsis
    f = torch.nn.functional.pad(y, (1, 1), value=float("-inf"))
    return a, b, c, d + y, vals * 2, idx, e, f, torch.where(y > 0, y, float("nan"))


@pytest.mark.parametrize("mode", ["real", "symbolic"])
def test_aten_round_trip(mode):
    x, y = torch.randn(4, 4), torch.randn(4)
    gm = make_fx(_aten_mix, tracing_mode=mode)(x, y)
    targets = {n.target for n in gm.graph.nodes}
    assert operator.getitem in targets
    gm2 = _round_trip(gm)
    _assert_same(gm(x, y)[:-1], gm2(x, y)[:-1])
    assert torch.equal(gm(x, y)[-1].isnan(), gm2(x, y)[-1].isnan())


def test_json_encodes_dtypes_devices_and_tuples():
    x, y = torch.randn(4, 4), torch.randn(4)
    data, _ = graph_to_json(make_fx(_aten_mix)(x, y))
    text = json.dumps(data, allow_nan=False)
    for tag in ('"$dtype": "float16"', '"$device": "cpu"', '"$float": "-inf"', '"$tuple"',
                '"$memory_format": "contiguous_format"', '{"op": "aten::view.default"}',
                '{"operator": "getitem"}'):
        assert tag in text, tag


def test_torchair_op_round_trip():
    def f(x, w):
        out, rstd = torch.ops.npu.npu_rms_norm(x, w, 1e-6)
        return out * 2, rstd

    x, w = torch.randn(2, 8), torch.randn(8)
    gm = make_fx(f)(x, w)
    assert any(n.target is torch.ops.npu.npu_rms_norm.default for n in gm.graph.nodes)
    _check(gm, x, w)


def test_symbolic_shapes_round_trip():
    def f(x, y):
        return x.reshape(x.shape[0] * 2, -1) + y.max(), torch.sym_max(x.shape[0], 3)

    x, y = torch.randn(4, 6), torch.randn(3)
    gm = make_fx(f, tracing_mode="symbolic")(x, y)
    targets = {n.target for n in gm.graph.nodes}
    assert operator.mul in targets and torch.ops.aten.sym_size.int in targets
    gm2 = _check(gm, x, y)
    x2 = torch.randn(6, 6)  # another size: the rebuilt graph is still shape-generic
    _assert_same(gm(x2, y), gm2(x2, y))


def test_get_attr_constants_round_trip():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", torch.tensor([2.0, 3.0]))
            self.sub = torch.nn.Module()
            self.sub.weight = torch.nn.Parameter(torch.randn(2, 2))

        def forward(self, x):
            return x @ self.sub.weight * self.scale

    gm = torch.fx.symbolic_trace(M())
    # symbolic_trace emits call_method/call_function with torch functions; normalize to aten
    x = torch.randn(3, 2)
    gm = make_fx(gm)(x)
    attrs = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    assert attrs, gm.code
    data, tensors = graph_to_json(gm)
    assert set(tensors) == attrs == set(data["attrs"])
    _check(gm, x)


def test_nested_get_attr_round_trip():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    w = graph.get_attr("layer.inner.w")
    graph.output(graph.call_function(torch.ops.aten.mul.Tensor, (x, w)))
    root = torch.nn.Module()
    root.layer = torch.nn.Module()
    root.layer.inner = torch.nn.Module()
    root.layer.inner.register_buffer("w", torch.tensor([1.0, -2.0]))
    gm = torch.fx.GraphModule(root, graph)
    gm2 = _check(gm, torch.ones(2))
    assert torch.equal(gm2.get_buffer("layer.inner.w"), torch.tensor([1.0, -2.0]))


def test_pytree_inputs_and_outputs_round_trip():
    def f(xs, d):
        return [xs[0] + d["a"]], {"o": xs[1]}

    args = ([torch.randn(2), torch.randn(2)], {"a": torch.randn(2)})
    gm = make_fx(f)(*args)
    _check(gm, *args)


# --- rejection on save ------------------------------------------------------------------------


def _graph_calling(target, *args):
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(target, (x, *args)))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def _user_function(x):
    return x


@pytest.mark.parametrize(
    "target, args",
    [(_user_function, ()), (lambda x: x, ()), (torch.ops.aten.add, ()), (getattr, ("shape",)),
     (operator.methodcaller, ()), (eval, ())],
    ids=["function", "lambda", "packet", "getattr", "methodcaller", "eval"],
)
def test_unsupported_targets_rejected(target, args):
    with pytest.raises(UnserializableGraph, match=r"node '.*': call_function target .* cannot"):
        graph_to_json(_graph_calling(target, *args))


def test_tensor_literal_argument_rejected():
    gm = _graph_calling(torch.ops.aten.add.Tensor, torch.ones(1))
    with pytest.raises(UnserializableGraph, match="argument of type Tensor"):
        graph_to_json(gm)


def test_call_module_rejected():
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU()))
    with pytest.raises(UnserializableGraph, match="opcode 'call_module'"):
        graph_to_json(gm)


# --- rejection on load: crafted JSON executes nothing ---------------------------------------


@pytest.fixture
def saved():
    x = torch.randn(2)
    data, tensors = graph_to_json(make_fx(lambda x: x.relu() + 1)(x))
    return data, tensors


def _node(data, opcode="call_function"):
    return next(n for n in data["nodes"] if n["op"] == opcode)


@pytest.fixture
def no_system(monkeypatch):
    """Fail loudly if anything reaches os.system / builtins.__import__ of os-like modules."""
    import builtins
    import os

    calls = []
    monkeypatch.setattr(os, "system", lambda *a: calls.append(a) or 0)
    real_import = builtins.__import__

    def guarded_import(name, *args, **kwargs):
        if name in ("os", "subprocess", "posix"):
            calls.append(("import", name))
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", guarded_import)
    yield calls
    assert calls == []


@pytest.mark.parametrize(
    "target, message",
    [
        ({"op": "os::system.default"}, "not registered.*import the library"),
        ({"op": "npu::no_such_op.default"}, "not registered.*import torchair"),
        ({"op": "aten::__import__.default"}, "not registered"),
        ({"op": "__builtins__::eval.default"}, "namespace"),
        ({"op": "aten::relu.__class__"}, "overload"),
        ({"op": "aten::relu"}, "no overload"),
        ({"op": "aten::re lu.default"}, "not an identifier"),
        ({"operator": "__import__"}, "allowlist"),
        ({"operator": "methodcaller"}, "allowlist"),
        ({"operator": "call"}, "allowlist"),
        ({"math": "__builtins__"}, "allowlist"),
        ({"builtins": "eval"}, "allowlist"),
        ({"torch": "load"}, "allowlist"),
        ("os.system", "must be one of"),
        ({"op": "aten::relu.default", "math": "sqrt"}, "must be one of"),
    ],
)
def test_malicious_targets_rejected(saved, no_system, target, message):
    data, tensors = copy.deepcopy(saved)
    _node(data)["target"] = target
    with pytest.raises(UnserializableGraph, match=message):
        graph_from_json(data, tensors)


_INJECTION = "x; __import__('os').system('touch /tmp/torchair_pwned')"


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: _node(d).update(name="import"), "identifier"),
        (lambda d: _node(d).update(name=_INJECTION), "identifier"),
        (lambda d: _node(d, "placeholder").update(target=_INJECTION), "placeholder"),
        (lambda d: _node(d, "placeholder").update(target="__class__"), "placeholder"),
        (lambda d: _node(d).update(kwargs={_INJECTION: 1}), "keyword"),
        (lambda d: _node(d).update(op="call_method", target="__reduce__"), "opcode"),
        (lambda d: _node(d).update(op="call_module"), "opcode"),
        (lambda d: _node(d).update(args=[{"$eval": "1"}]), "unknown value tag"),
        (lambda d: _node(d).update(args=[{"$dtype": "__class__"}]), "unknown dtype"),
        (lambda d: _node(d).update(args=[{"$node": "later"}]), "not an earlier node"),
        (lambda d: d.update(codegen={"kind": "pytree", "orig_args": [_INJECTION],
                                     "in_spec": None, "out_spec": None}), "argument name"),
        (lambda d: d.update(codegen={"kind": "exec"}), "code generator"),
        (lambda d: d["nodes"].append({"op": "get_attr", "name": "c", "target": "__class__.__init__",
                                      "args": [], "kwargs": {}}), "component"),
        (lambda d: d.update(format="pickle"), "not a version-1"),
        (lambda d: d["nodes"].pop(), "output"),
    ],
)
def test_malicious_documents_rejected(saved, no_system, edit, message):
    data, tensors = copy.deepcopy(saved)
    edit(data)
    with pytest.raises(UnserializableGraph, match=message):
        graph_from_json(data, tensors)


def test_tensors_must_match_attrs():
    graph = torch.fx.Graph()
    graph.output(graph.get_attr("w"))
    root = torch.nn.Module()
    root.register_buffer("w", torch.ones(1))
    data, tensors = graph_to_json(torch.fx.GraphModule(root, graph))
    with pytest.raises(UnserializableGraph, match="do not match the tensors"):
        graph_from_json(data, {})
    with pytest.raises(UnserializableGraph, match="do not match the tensors"):
        graph_from_json(data, {**tensors, "extra": torch.ones(1)})


def test_graph_code_is_readable():
    gm = make_fx(lambda x: x.relu())(torch.randn(2))
    code = graph_code(_round_trip(gm))
    assert "def forward" in code and "torch.ops.aten.relu.default" in code


def test_registered_dunder_op_round_trips():
    """aten has real dunder-named ops (aten::__and__); they resolve through the registry."""
    gm = _graph_calling(torch.ops.aten.__and__.Scalar, True)
    x = torch.tensor([True, False])
    _check(gm, x)


@pytest.mark.parametrize("name", ["torch", "__import__", "__builtins__", "inf", "self"])
def test_shadowing_node_names_are_harmless(saved, no_system, name):
    """A node name that would shadow a global of the generated code is renamed by FX."""
    data, tensors = copy.deepcopy(saved)
    node = _node(data)
    old = node["name"]
    node["name"] = name
    for other in data["nodes"]:
        text = json.dumps(other["args"]).replace(f'"$node": "{old}"', f'"$node": "{name}"')
        other["args"] = json.loads(text)
    gm = graph_from_json(data, tensors)
    x = torch.randn(3)
    assert torch.equal(gm(x), x.relu() + 1)


def test_super_kernel_scope_attributes_round_trip():
    gm = make_fx(lambda x: (x.relu() * 2,))(torch.randn(3))
    relu = next(n for n in gm.graph.nodes if n.op == "call_function")
    relu.meta["_super_kernel_scope"] = "sk1"
    relu.meta["_super_kernel_options"] = "stream-fusion=1"
    data, tensors = graph_to_json(gm)
    back = graph_from_json(json.loads(json.dumps(data)), tensors)
    node = next(n for n in back.graph.nodes if n.op == "call_function")
    assert node.meta["_super_kernel_scope"] == "sk1"
    assert node.meta["_super_kernel_options"] == "stream-fusion=1"
    data["nodes"][1]["meta"] = {"val": "x"}
    with pytest.raises(UnserializableGraph, match="meta may only hold"):
        graph_from_json(data, tensors)
