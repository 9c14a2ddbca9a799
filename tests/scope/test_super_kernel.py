"""torchair.scope.super_kernel: markers survive Dynamo and AOT, become node attributes, show in
the report and the dumps; options are validated; unpaired markers are an error."""
import glob
import pathlib
import runpy

import pytest
import torch
import torch.fx as fx

import torchair
from torchair.passes import SuperKernelScopePass, run_passes
from torchair.scope._markers import BEGIN, END
from torchair.scope._options import OPTIONS, parse_options

SCOPE, OPTS = "_super_kernel_scope", "_super_kernel_options"


def _backend(**dump):
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    for key, value in dump.items():
        setattr(config.debug.graph_dump, key, value)
    return torchair.get_npu_backend(compiler_config=config)


def _compile(fn, *args, **dump):
    out = torch.compile(fn, backend=_backend(**dump), fullgraph=True, dynamic=False)(*args)
    return out, torchair.graph_reports()[-1]


def _nested(x, y):
    a = x + 1
    with torchair.scope.super_kernel("sk1", "stream-fusion=1"):
        b = a * y
        with torchair.scope.super_kernel(None):  # opted out of sk1
            c = b.sin()
        with torchair.scope.super_kernel("sk2", "feed-sync-all=1:strict-scope-check=bypass"):
            d = c.exp()
        e = b.relu() + d
    with torchair.scope.super_kernel("sk1", "stream-fusion=1"):  # same name: same region
        f = e * 2
    return f, a


def _args():
    torch.manual_seed(0)
    return torch.randn(4, 3), torch.randn(4, 3)


# ------------------------------------------------------------------ through Dynamo and AOT

def test_markers_survive_dynamo_and_aot_and_fill_the_report():
    x, y = _args()
    (f, a), report = _compile(_nested, x, y)
    ref_f, ref_a = _nested(x, y)
    assert torch.equal(f, ref_f) and torch.equal(a, ref_a)
    assert report.scopes == {"sk1": ["mul", "relu", "add_1", "mul_1"], "sk2": ["exp"]}
    assert report.passes["super_kernel_scope"] == 8  # 4 begin + 4 end markers erased
    assert "super_kernel scope 'sk1': mul, relu, add_1, mul_1" in str(report)


def test_seed_style_return_inside_the_scope_equals_the_unscoped_model():
    def plain(x, y):
        h = torch.matmul(x, y.t())
        return torch.nn.functional.silu(h), h

    def scoped(x, y):
        with torchair.scope.super_kernel("sp1", ""):
            h = torch.matmul(x, y.t())
            return torch.nn.functional.silu(h), h

    x, y = _args()
    (s0, h0), _ = _compile(plain, x, y)
    (s1, h1), report = _compile(scoped, x, y)
    assert torch.equal(s0, s1) and torch.equal(h0, h1)
    assert list(report.scopes) == ["sp1"] and report.scopes["sp1"]


def test_graph_has_no_markers_and_ops_carry_attributes():
    graphs = []
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    compiler = torchair.get_compiler(config)

    def backend(gm, example_inputs):
        from torch._functorch.aot_autograd import aot_module_simplified

        def fw(aot_gm, aot_inputs):
            out = compiler(aot_gm, aot_inputs)
            graphs.append(aot_gm)
            return out
        return aot_module_simplified(gm, example_inputs, fw_compiler=fw)

    torch.compile(_nested, backend=backend, fullgraph=True)(*_args())
    nodes = {n.name: n for n in graphs[-1].graph.nodes}
    assert not [n for n in nodes.values() if n.target in (BEGIN, END)]
    assert nodes["mul"].meta[SCOPE] == "sk1" and nodes["mul"].meta[OPTS] == "stream-fusion=1"
    assert nodes["exp"].meta[SCOPE] == "sk2"
    assert nodes["exp"].meta[OPTS] == "feed-sync-all=1:strict-scope-check=bypass"
    for name in ("add", "sin"):  # before any scope / opted out with None
        assert SCOPE not in nodes[name].meta and OPTS not in nodes[name].meta


def test_graph_break_inside_a_scope_is_refused_by_dynamo():
    # Dynamo cannot resume inside a user context manager: with fullgraph=True it is an error
    # (without it Dynamo runs the whole function eagerly, so no graph holds half a scope)
    def fn(x):
        with torchair.scope.super_kernel("sk"):
            y = x + 1
            torch._dynamo.graph_break()
            return y * 2

    with pytest.raises(torch._dynamo.exc.Unsupported):
        torch.compile(fn, backend=_backend(), fullgraph=True)(torch.randn(2))


def test_eager_scope_is_a_no_op():
    x, y = _args()
    _, a = _nested(x, y)
    assert torch.equal(a, x + 1)


# ------------------------------------------------------------------------------ the pass

def _hand_graph(*markers):
    """x -> [markers interleaved with ops] -> output; ``markers``: ("b", scope) | ("e", scope)
    | "op"."""
    graph = fx.Graph()
    value = graph.placeholder("x")
    for m in markers:
        if m == "op":
            value = graph.call_function(torch.ops.aten.relu.default, (value,))
        elif m[0] == "b":
            graph.call_function(BEGIN, (m[1], ""))
        else:
            graph.call_function(END, (m[1],))
    graph.output(value)
    return fx.GraphModule(torch.nn.Module(), graph)


def test_pass_on_a_hand_made_graph():
    gm = _hand_graph("op", ("b", "s"), "op", ("b", None), "op", ("e", None), "op", ("e", "s"))
    p = SuperKernelScopePass()
    assert run_passes(gm, [p]) == {"super_kernel_scope": 4}
    assert p.scopes == {"s": ["relu_default_1", "relu_default_3"]}
    assert [n.meta.get(SCOPE) for n in gm.graph.nodes if n.op == "call_function"] == \
        [None, "s", None, "s"]
    assert torch.equal(gm(torch.tensor([-1.0, 2.0])), torch.tensor([0.0, 2.0]))


def test_pass_without_markers_does_nothing():
    gm = _hand_graph("op", "op")
    p = SuperKernelScopePass()
    assert p(gm) == 0 and p.scopes == {}


@pytest.mark.parametrize("markers, match", [
    ((("b", "sk1"), "op"), r"scope 'sk1' is unpaired: its begin marker .* has no end marker"),
    (("op", ("e", "sk1")), r"scope 'sk1' is unpaired: its end marker .* has no begin marker"),
    ((("b", "a"), ("b", "b"), "op", ("e", "a"), ("e", "b")),
     r"scope 'a' is unpaired: .* while scope 'b' .* is still open"),
], ids=["begin-without-end", "end-without-begin", "crossed"])
def test_unpaired_markers_are_an_error(markers, match):
    with pytest.raises(ValueError, match=match) as info:
        SuperKernelScopePass()(_hand_graph(*markers))
    assert "graph break" in str(info.value) and "custom pass" in str(info.value)


# ---------------------------------------------------------------------------- options

def test_options_parse():
    assert parse_options("") == {}
    assert parse_options(" stream-fusion = 1 :feed-sync-all=0:") == \
        {"stream-fusion": "1", "feed-sync-all": "0"}
    assert parse_options("strict-scope-check=abort:preload-code=per-func:early-start=2:"
                         "split-mode=4:func-align=8:debug-dcci-all=1:debug-sync-all=0") == {
        "strict-scope-check": "abort", "preload-code": "per-func", "early-start": "2",
        "split-mode": "4", "func-align": "8", "debug-dcci-all": "1", "debug-sync-all": "0"}
    # kept as the user wrote it, as TorchAir keeps the text
    assert torchair.scope.super_kernel("s", "stream-fusion=1 : ").options == "stream-fusion=1 : "
    assert {"stream-fusion", "feed-sync-all", "strict-scope-check"} <= set(OPTIONS)


@pytest.mark.parametrize("options, match", [
    ("stream-fusion=2", r"stream-fusion='2' is not valid \(stream-fusion expects 0 .* or 1 "),
    ("strict-scope-check=yes", r"expects bypass or abort"),
    ("split-mode=0", r"expects an integer in 1..64"),
    ("func-align=3", r"expects 0 or a power of two"),
    ("stream_fusion=1", (r"unknown option 'stream_fusion' \(valid options: feed-sync-all=0 .*"
                         r"stream-fusion=.*strict-scope-check=bypass or abort")),
    ("stream-fusion", r"'stream-fusion' is not 'name=value'"),
    ("stream-fusion=", r"is not 'name=value'"),
    ("stream-fusion=1:stream-fusion=0", r"option 'stream-fusion' is given twice"),
    ("test_option", r"'test_option' is not 'name=value'"),
])
def test_options_not_understood_are_accepted_and_warned_at_compile(options, match, torchair_log):
    """TorchAir accepts any options string (Ascend's SuperKernel compiler reads it later): so do
    we, in eager mode and at trace time; the parts we do not understand are ignored with a
    warning naming the scope, the options and what was expected."""
    assert torchair.scope.super_kernel("sk", options).options == options
    assert parse_options(options) == ({"stream-fusion": "1"} if "=1:" in options else {})

    def fn(x):
        with torchair.scope.super_kernel("sk", options):
            return x + 1

    out = torch.compile(fn, backend=_backend(), fullgraph=True)(torch.ones(2))
    assert torch.equal(out, torch.full((2,), 2.0))
    warnings = [r.getMessage() for r in torchair_log if r.levelname == "WARNING"]
    assert any(w.startswith(f"super_kernel scope 'sk', options {options!r}: ")
               and "this part is ignored here" in w for w in warnings), warnings
    assert any(__import__("re").search(match, w) for w in warnings), warnings


def test_bad_scope_and_option_types():
    with pytest.raises(TypeError, match="scope must be a str"):
        torchair.scope.super_kernel(1)
    assert torchair.scope.super_kernel("").scope is None  # TorchAir: "" is None (no fusion)
    with pytest.raises(ValueError, match="use at most 255"):
        torchair.scope.super_kernel("s" * 256)
    with pytest.raises(TypeError, match="options must be a str"):
        torchair.scope.super_kernel("sk", {"stream-fusion": 1})


def test_bad_options_still_form_the_region_at_trace_time(torchair_log):
    """Was: a bad value failed at trace time. TorchAir accepts it, so the region forms, the bad
    part is ignored (stream-fusion keeps its default) and a warning says so."""
    def fn(x):
        with torchair.scope.super_kernel("sk", "stream-fusion=2"):
            return x + 1

    out, report = _compile(fn, torch.randn(2))
    assert report.scopes == {"sk": ["add"]}
    assert any("stream-fusion='2' is not valid" in r.getMessage() for r in torchair_log)


# ------------------------------------------------------------------------------- dumps

def _read(directory, pattern):
    (path,) = glob.glob(str(directory / pattern))
    return pathlib.Path(path).read_text()


def test_txt_dump_shows_scope_attributes(tmp_path):
    _compile(_nested, *_args(), type="txt", path=str(tmp_path))
    text = _read(tmp_path, "dynamo_optimized_*.txt")
    assert "mul = aten.mul.Tensor(add, arg1_1) {_super_kernel_scope=sk1, " \
           "_super_kernel_options=stream-fusion=1} -> float32[4, 3]" in text
    assert "_super_kernel_options=feed-sync-all=1:strict-scope-check=bypass" in text
    assert "sin = aten.sin(mul) -> float32[4, 3]" in text  # opted out: no attributes
    original = _read(tmp_path, "dynamo_original_*.txt")
    assert "npu._super_kernel_begin() {scope=sk1, options=stream-fusion=1}" in original


def test_pbtxt_dump_shows_scope_attributes(tmp_path):
    _compile(_nested, *_args(), type="pbtxt", path=str(tmp_path))
    text = _read(tmp_path, "dynamo_optimized_*.pbtxt")
    assert 'key: "_super_kernel_scope"\n    value {\n      s: "sk1"' in text
    assert 'key: "_super_kernel_options"\n    value {\n      s: "stream-fusion=1"' in text


def test_py_dump_keeps_scope_attributes(tmp_path):
    _compile(_nested, *_args(), type="py", path=str(tmp_path))
    path = glob.glob(str(tmp_path / "dynamo_optimized_*.py"))[0]
    assert "mul.meta['_super_kernel_scope'] = 'sk1'" in pathlib.Path(path).read_text()
    gm = runpy.run_path(path, run_name="__main__")["gm"]
    scopes = [(n.target, n.meta.get(SCOPE)) for n in gm.graph.nodes if n.op == "call_function"]
    aten = torch.ops.aten
    assert scopes == [(aten.add.Tensor, None), (aten.mul.Tensor, "sk1"), (aten.sin.default, None),
                      (aten.exp.default, "sk2"), (aten.relu.default, "sk1"),
                      (aten.add.Tensor, "sk1"), (aten.mul.Tensor, "sk1")]


def test_txt_dump_shows_stream_attributes(tmp_path):
    def fn(x):
        with torchair.scope.npu_stream_switch("s1", 3):
            y = x.sin()
        return torchair.scope.npu_wait_tensor(y, x) * 2

    _compile(fn, torch.randn(4), type="txt", path=str(tmp_path))
    text = _read(tmp_path, "dynamo_optimized_*.txt")
    assert "aten.sin(arg0_1) {_user_stream_label=s1, _user_stream_priority=3}" in text, text
