"""Ascend-only scopes (issue 17, item 2): limit_core_num, op_never_timeout, data_dump and
profiler_trace are checked as TorchAir checks them, change no result, survive Dynamo and AOT as
marker ops that graph dumps show, and their regions read back per op (scope_attributes,
AscendScopePass, GraphReport.scope_attributes); npu_stream_switch takes enable_inner_parallel."""
import copy
import glob

import pytest
import torch

import torchair
from torchair.core import recorder
from torchair.plan.report import GraphReport
from torchair.scope._ascend_only import ASCEND_ATTRS, AscendScopePass, scope_attributes


def _config(dump_dir=None, fmt="py"):
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    if dump_dir is not None:
        config.debug.graph_dump.type = fmt
        config.debug.graph_dump.path = str(dump_dir)
    return config


def _model(x, y):
    with torchair.scope.limit_core_num(4, 8):
        a = x.sin()
        with torchair.scope.op_never_timeout(True):
            b = a * y
    with torchair.scope.data_dump():
        c = b + 1
    with torchair.scope.profiler_trace("p1", "both"):
        d = c.cos()
        e = d * 2
    return e - x


def _aot_graph(fn, *args, config=None):
    """The ATen graph given to the torchair compiler (a copy: its passes rewrite the graph in
    place), and the compiled output."""
    graphs = []
    compiler = torchair.get_compiler(config or _config())

    def backend(gm, example_inputs):
        from torch._functorch.aot_autograd import aot_module_simplified

        def fw(aot_gm, aot_inputs):
            graphs.append(copy.deepcopy(aot_gm))
            return compiler(aot_gm, aot_inputs)
        return aot_module_simplified(gm, example_inputs, fw_compiler=fw)

    out = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return graphs[-1], out


def _args():
    g = torch.Generator().manual_seed(0)
    return torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)


def test_validation_as_torchair():
    for bad in (1, "True", None):
        with pytest.raises(TypeError, match=f"op_never_timeout\\(\\) argument 'enable' must be "
                                            f"bool, but got {type(bad).__name__}."):
            torchair.scope.op_never_timeout(bad)
    assert torchair.scope.limit_core_num("1", "2").attrs == {"_op_aicore_num": "1",
                                                             "_op_vectorcore_num": "2"}
    assert torchair.scope.limit_core_num(24, 0).attrs["_op_vectorcore_num"] == "0"
    with pytest.raises(ValueError, match="'op_aicore_num' must be at least 1, got 0"):
        torchair.scope.limit_core_num(0, 4)
    with pytest.raises(TypeError, match="'op_vectorcore_num' must be an int"):
        torchair.scope.limit_core_num(4, 2.5)
    with pytest.raises(ValueError, match="'mode' must be one of"):
        torchair.scope.profiler_trace("p", "middle")
    with pytest.raises(TypeError, match="enable_inner_parallel must be a bool"):
        torchair.scope.npu_stream_switch("s", 0, enable_inner_parallel="yes")
    switch = torchair.scope.npu_stream_switch("s", 0, enable_inner_parallel=True)
    assert switch.enable_inner_parallel is True
    assert torchair.scope.op_never_timeout().attrs == {"_op_exec_never_timeout": "True"}


def test_eager_results_unchanged():
    x, y = _args()
    with torchair.scope.limit_core_num(1, 1), torchair.scope.op_never_timeout(False), \
            torchair.scope.data_dump(), torchair.scope.profiler_trace("p", "begin"):
        z = x * y
    torch.testing.assert_close(z, x * y)


def test_compiled_regions_are_recorded_per_op(tmp_path):
    x, y = _args()
    gm, out = _aot_graph(_model, x, y, config=_config(tmp_path))
    torch.testing.assert_close(out, _model(x, y))
    by_op = {name: attrs for name, attrs in scope_attributes(gm).items()}
    cores = {"_op_aicore_num": "4", "_op_vectorcore_num": "8"}
    assert by_op["sin"] == cores
    assert by_op["mul"] == {**cores, "_op_exec_never_timeout": "True"}
    assert by_op["add"] == {"torchair_enable_data_dump": "True"}
    assert by_op["cos"] == {"_profiler_trace_index": "p1", "_profiler_trace_pos": "begin"}
    assert by_op["mul_1"] == {"_profiler_trace_index": "p1", "_profiler_trace_pos": "end"}
    assert "sub" not in by_op
    # the original py dump shows the markers with their attributes
    dump = open(glob.glob(str(tmp_path / "dynamo_original_*.py"))[0]).read()
    assert ("torch.ops.npu._scope_attrs_begin.default, (['_op_aicore_num', "
            "'_op_vectorcore_num'], ['4', '8'])") in dump
    assert "['_op_exec_never_timeout'], ['True']" in dump
    # the pipeline's AscendScopePass moved them onto the ops: the optimized dump shows them there
    optimized = open(glob.glob(str(tmp_path / "dynamo_optimized_*.py"))[0]).read()
    assert "_scope_attrs" not in optimized
    assert "mul.meta['_op_exec_never_timeout'] = 'True'" in optimized
    assert "cos.meta['_profiler_trace_pos'] = 'begin'" in optimized

    # the pass moves the regions onto the ops and erases the 8 markers
    ascend_pass = AscendScopePass()
    assert ascend_pass(gm) == 8 and ascend_pass.attributes == by_op
    assert gm.graph.nodes and all(n.meta.get(k) == by_op.get(n.name, {}).get(k)
                                  for n in gm.graph.nodes for k in ASCEND_ATTRS)
    assert not [n for n in gm.graph.nodes if "scope_attrs" in str(n.target)]
    assert scope_attributes(gm) == by_op


def test_pipeline_reports_the_attributes_and_results_are_unchanged():
    x, y = _args()
    with recorder.recording() as records:
        out = torch.compile(_model, backend=torchair.get_npu_backend(compiler_config=_config()),
                            fullgraph=True)(x, y)
    torch.testing.assert_close(out, _model(x, y))
    report = records[0].report
    assert report.passes.get("ascend_scope") == 8
    assert report.scope_attributes["sin"] == {"_op_aicore_num": "4", "_op_vectorcore_num": "8"}
    assert report.scope_attributes["mul_1"] == {"_profiler_trace_index": "p1",
                                                "_profiler_trace_pos": "end"}
    assert "sub" not in report.scope_attributes
    assert "Ascend-only scope (torchair_enable_data_dump=True; no effect here): add" in str(report)


def test_txt_dump_shows_the_marker_attributes(tmp_path):
    def fn(x):
        with torchair.scope.limit_core_num(2, 3):
            return x.exp()

    torch.compile(fn, backend=torchair.get_npu_backend(compiler_config=_config(tmp_path, "txt")),
                  fullgraph=True)(torch.ones(2))
    text = open(glob.glob(str(tmp_path / "dynamo_original_*.txt"))[0]).read()
    assert "npu._scope_attrs_begin() {keys=[_op_aicore_num, _op_vectorcore_num], " \
           "values=[2, 3]}" in text
    text = open(glob.glob(str(tmp_path / "dynamo_optimized_*.txt"))[0]).read()
    assert "aten.exp(arg0_1) {_op_aicore_num=2, _op_vectorcore_num=3}" in text
    assert "_scope_attrs" not in text


def test_nested_profiler_trace_is_refused():
    def fn(x):
        with torchair.scope.profiler_trace("a", "end"):
            y = x + 1
            with torchair.scope.profiler_trace("b", "begin"):
                return y * 2

    with pytest.raises(ValueError, match="Nested profiler_trace is not allowed"):
        fn(torch.ones(2))
    x = torch.ones(2)  # nothing was left open: a later region works
    with torchair.scope.profiler_trace("c", "both"):
        x = x + 1
    # compiled: refused when the pipeline reads the regions (Dynamo wraps the compiler's error)
    with pytest.raises(Exception, match="Nested profiler_trace is not allowed") as info:
        _aot_graph(fn, torch.ones(2))
    assert isinstance(getattr(info.value, "inner_exception", info.value), ValueError)


def test_report_field_renders():
    report = GraphReport(0, True, True, True, [], [], [], scope_attributes={
        "sin": {"_op_aicore_num": "4"}, "cos": {"_op_aicore_num": "4"},
        "add": {"torchair_enable_data_dump": "True"}})
    text = str(report)
    assert "Ascend-only scope (_op_aicore_num=4; no effect here): sin, cos" in text
    assert "Ascend-only scope (torchair_enable_data_dump=True; no effect here): add" in text
