"""Mirrors of TorchAir's system tests (``tests/st/*_st.py`` in Ascend/torchair) whose checks a
user can see here too: scope attributes on the compiled graph's ops, the DEBUG lines around the
user's custom passes, the ``## FX Code`` lines of a py dump. Each test names the peer test it
mirrors. TorchAir checks its GE graph's op attributes; here the same attributes are the
``node.meta`` entries of the optimized FX graph (shown by graph dumps and the report)."""
import os
import re

import torch

import torchair
from torchair.configs.compiler_config import CompilerConfig


def _optimized_graph(model, *args, config=None):
    """The FX graph the torchair compiler optimized (its passes rewrite it in place), and the
    compiled output."""
    from torch._functorch.aot_autograd import aot_module_simplified

    config = config or CompilerConfig()
    config.debug.run_eagerly = True
    compiler = torchair.get_compiler(config)
    graphs = []

    def backend(gm, example_inputs):
        def fw(aot_gm, aot_inputs):
            graphs.append(aot_gm)
            return compiler(aot_gm, aot_inputs)
        return aot_module_simplified(gm, example_inputs, fw_compiler=fw)

    out = torch.compile(model, backend=backend, dynamic=False)(*args)
    return graphs[-1], out


def _ops(gm, name):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.name.startswith(name)]


def _attr(node, key):
    value = node.meta.get(key)
    return "" if value is None else str(value)


# ------------------------------------------------------------------ torchair_scope_st.py

def test_super_kernel_scope():
    """torchair_scope_st.py::test_super_kernel_scope: any options string is accepted and kept."""
    class Model(torch.nn.Module):
        def forward(self, in1, in2):
            with torchair.scope.super_kernel('test_scope', 'test_option'):
                mm_result = torch.mm(in1, in2)
            return mm_result

    in1, in2 = torch.randn(2, 2), torch.randn(2, 2)
    gm, out = _optimized_graph(Model(), in1, in2)
    (mm,) = _ops(gm, "mm")
    assert _attr(mm, "_super_kernel_scope") == "test_scope"
    assert _attr(mm, "_super_kernel_options") == "test_option"
    torch.testing.assert_close(out, in1 @ in2)


def test_super_kernel_scope_none():
    """torchair_scope_st.py::test_super_kernel_scope_none: super_kernel(None) inside a scope takes
    its ops out of it (scope and options both empty)."""
    class Model(torch.nn.Module):
        def forward(self, in1, in2):
            with torchair.scope.super_kernel('test_scope', 'test_option'):
                mm_result = torch.mm(in1, in2)
                with torchair.scope.super_kernel(None):
                    add_result = torch.add(in1, in2)
            with torchair.scope.super_kernel(None):
                sub_result = torch.sub(in1, in2)
            return mm_result, add_result, sub_result

    gm, _ = _optimized_graph(Model(), torch.randn(2, 2), torch.randn(2, 2))
    (mm,), (add,), (sub,) = _ops(gm, "mm"), _ops(gm, "add"), _ops(gm, "sub")
    assert _attr(mm, "_super_kernel_scope") == "test_scope"
    assert _attr(mm, "_super_kernel_options") == "test_option"
    for node in (add, sub):
        assert _attr(node, "_super_kernel_scope") == ""
        assert _attr(node, "_super_kernel_options") == ""


def test_nested_scope():
    """torchair_scope_st.py::test_nested_scope: a stream region inside a super_kernel scope; its
    ops carry both (TorchAir's attribute names)."""
    class Model(torch.nn.Module):
        def forward(self, in1, in2, in3, in4):
            with torchair.scope.super_kernel('1', '2'):
                mm_result = torch.mm(in3, in4)
                with torchair.scope.npu_stream_switch('5', 6):
                    add_result = torch.add(in1, in2)
            return add_result, mm_result

    gm, _ = _optimized_graph(Model(), *[torch.randn(2, 2) for _ in range(4)])
    (mm,), (add,) = _ops(gm, "mm"), _ops(gm, "add")
    assert (_attr(mm, "_super_kernel_scope"), _attr(mm, "_super_kernel_options")) == ("1", "2")
    assert (_attr(add, "_super_kernel_scope"), _attr(add, "_super_kernel_options")) == ("1", "2")
    assert _attr(add, "_user_stream_label") == "5"
    assert _attr(add, "_user_stream_priority") == "6"


def test_ge_data_dump(tmp_path, monkeypatch):
    """torchair_scope_st.py::test_ge_data_dump, as far as it exists here: dump_config (Ascend's
    device dump) is accepted with the same values, and the data_dump() region's ops carry
    TorchAir's attribute. On purpose, no ge_dump_data_json/dump_options_*.json is written: that
    file is read only by Ascend's ACL runtime (aclmdlSetDump); use debug.data_dump here."""
    class Network(torch.nn.Module):
        def forward(self, data0):
            add_01 = torch.add(data0, data0)
            with torchair.scope.data_dump():
                add_02 = torch.add(data0, data0)
            return add_01, add_02

    monkeypatch.chdir(tmp_path)
    config = torchair.CompilerConfig()
    config.dump_config.enable_dump = True
    config.dump_config.dump_layer = " Test1 Test2 Test3 "
    gm, _ = _optimized_graph(Network(), torch.randn(2, 2), config=config)
    add_01, add_02 = _ops(gm, "add")
    assert _attr(add_01, "torchair_enable_data_dump") == ""
    assert _attr(add_02, "torchair_enable_data_dump") == "True"
    assert not (tmp_path / "ge_dump_data_json").exists()


# ------------------------------------------------------------------------ torchair_st.py

def test_post_grad_custom_fn(torchair_log):
    """torchair_st.py::test_post_grad_custom_fn: TorchAir's DEBUG lines before and after each
    custom pass (what its users grep for)."""
    class Model(torch.nn.Module):
        def forward(self, x):
            mm = torch.mm(x, x)
            abs1 = torch.abs(x)
            add = torch.add(x, 1)
            sub = torch.sub(abs1, add)
            return torch.add(mm, sub)

    def _custom_pre_fn(gm, example_inputs, compile_config: torchair.CompilerConfig):
        return None

    def _custom_post_fn(gm, example_inputs, compile_config: torchair.CompilerConfig):
        return None

    custom_config = CompilerConfig()
    custom_config.debug.run_eagerly = True
    custom_config.post_grad_custom_pre_pass = _custom_pre_fn
    custom_config.post_grad_custom_post_pass = _custom_post_fn
    npu_custom_backend = torchair.get_npu_backend(compiler_config=custom_config)
    opt_model = torch.compile(Model(), backend=npu_custom_backend, dynamic=True)
    opt_model(torch.randn(2, 2))

    output = [f"{r.levelname}:{r.name}:{r.getMessage()}" for r in torchair_log]
    for line in ("[forward] before [post_grad_custom_pre_pass] execution",
                 "[forward] after [post_grad_custom_pre_pass] execution",
                 "[forward] before [post_grad_custom_post_pass] execution",
                 "[forward] after [post_grad_custom_post_pass] execution"):
        assert any(line in log and log.startswith("DEBUG:torchair:") for log in output), \
            (line, output)
    before = next(log for log in output if "before [post_grad_custom_pre_pass]" in log)
    assert ", graph is graph():" in before  # then the FX graph, as TorchAir prints it


def test_dump_node_info(tmp_path, monkeypatch):
    """torchair_st.py::test_dump_node_info: the py dump of the original graph has a ``## FX Code``
    line per op, each node with its dtype, shape and device, and the path option reads back as
    its real path. (TorchAir's test expects the symbol
    s0: PyTorch >= 2.6 names symbols by a hash of their source, s77 and the like, TorchAir too.)"""
    class Model(torch.nn.Module):
        def forward(self, x, y, z):
            return torch.add(input=x, other=y, alpha=z)

    monkeypatch.chdir(tmp_path)
    test_config = torchair.CompilerConfig()
    test_config.debug.run_eagerly = True
    test_config.debug.graph_dump.type = "py"
    test_config.debug.graph_dump.path = "./test_dump_node_info/graphs"
    os.makedirs("./test_dump_node_info/graphs")
    test_model = torch.compile(Model(), backend=torchair.get_npu_backend(
        compiler_config=test_config), dynamic=True)
    test_model(torch.randn(4, 4), torch.randn(4, 4), 1)

    path = test_config.debug.graph_dump.path
    assert path == os.path.realpath("./test_dump_node_info/graphs")  # TorchAir stores realpath
    dump_file_path = [f for f in os.listdir(path) if f.endswith(".py") and "original" in f][0]
    with open(os.path.join(path, dump_file_path), "r") as dump_file:
        dump_line = [line for line in dump_file.readlines() if line.startswith("## FX Code")][0]
    sym = re.search(r"add: torch\.float32\[(s\d+), ", dump_line).group(1)
    assert f"add: torch.float32[{sym}, {sym}]cpu" in dump_line
    assert f"arg1_1: torch.float32[{sym}, {sym}]cpu" in dump_line
    assert f"arg2_1: torch.float32[{sym}, {sym}]cpu" in dump_line
