"""The options TorchAir scripts set do what TorchAir documents (on CPU, FX engine for speed)."""
import csv
import glob
import os
import re

import numpy as np
import pytest
import torch

import torchair
from torchair.configs import CompilerConfig


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, cache):
        y = self.lin(x) * 2
        cache.add_(1)
        return torch.relu(y) + cache.sum()


def _config(**options):
    config = CompilerConfig()
    config.debug.run_eagerly = True
    for dotted, value in options.items():
        node = config
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = getattr(node, p)
        setattr(node, leaf, value)
    return config


def _run(config, steps=1):
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(2, 4)
    compiled = torch.compile(model, backend=torchair.get_npu_backend(compiler_config=config),
                             fullgraph=True)
    cache_c, cache_e = torch.zeros(3), torch.zeros(3)
    with torch.no_grad():
        for _ in range(steps):
            out, ref = compiled(x, cache_c), model(x, cache_e)
            torch.testing.assert_close(out, ref)
    assert torch.equal(cache_c, cache_e)
    return model, x


def test_post_grad_custom_passes_are_called_with_gm_inputs_config_and_take_effect():
    calls = []

    def pre(gm, example_inputs, config):
        calls.append(("pre", isinstance(gm, torch.fx.GraphModule), len(example_inputs), config.get("mode")))

    def post(gm, example_inputs, config):
        calls.append(("post", isinstance(gm, torch.fx.GraphModule), len(example_inputs), config.get("mode")))
        for node in gm.graph.nodes:  # relu -> identity: the graph's result must change
            if node.target is torch.ops.aten.relu.default:
                node.replace_all_uses_with(node.args[0])
                gm.graph.erase_node(node)

    config = _config(post_grad_custom_pre_pass=pre, post_grad_custom_post_pass=post)
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(2, 4) * 10
    compiled = torch.compile(model, backend=torchair.get_npu_backend(compiler_config=config))
    with torch.no_grad():
        out = compiled(x, torch.zeros(3))
        expect = model.lin(x) * 2 + 3.0  # no relu
    torch.testing.assert_close(out, expect)
    assert [c[0] for c in calls] == ["pre", "post"]
    assert calls[0][1] is True and calls[0][2] == 4 and calls[0][3] == "max-autotune"


def test_npu_fx_pass_runs_inductors_joint_graph_passes(monkeypatch):
    from torch._inductor.fx_passes import joint_graph

    seen = []
    real = joint_graph.joint_graph_passes
    monkeypatch.setattr(joint_graph, "joint_graph_passes",
                        lambda gm: seen.append(gm) or real(gm))
    _run(_config(experimental_config__npu_fx_pass=True))
    assert len(seen) == 1
    seen.clear()
    _run(_config())
    assert seen == []


@pytest.mark.parametrize("mode", ["reduce-overhead", "npugraph_ex"])
def test_npugraph_ex_is_the_capture_mode(mode):
    config = CompilerConfig()
    config.mode = mode
    before = len(torchair.graph_reports())
    _run(config, steps=2)
    assert torchair.graph_reports()[before].engine == "fx"


def test_keep_inference_input_mutations_off_still_writes_the_cache():
    _run(_config(experimental_config__keep_inference_input_mutations=False), steps=2)


def test_data_dump_saves_every_op_per_step_named_as_torchair(tmp_path):
    config = CompilerConfig()
    config.debug.data_dump.type = "npy"
    config.debug.data_dump.path = str(tmp_path)
    model, x = _run(config, steps=2)
    graphs = glob.glob(str(tmp_path / "worldsize1_global_rank0" / "graph_*"))
    assert len(graphs) == 1
    steps = sorted(os.listdir(graphs[0]))
    assert steps == ["0", "1"]
    files = sorted(os.listdir(os.path.join(graphs[0], "0")))
    pattern = re.compile(r"^(\w+)-(aten\.\w+\.\w+)\.(INPUT|OUTPUT)\.(\d+)(\.\d+)?\.(\d{20})\.npy$")
    assert files and all(pattern.match(f) for f in files), files
    ops = {pattern.match(f).group(2) for f in files}
    assert {"aten.addmm.default", "aten.relu.default", "aten.add.Tensor"} <= ops
    # the addmm output is the linear layer's value on step 0
    addmm_out = [f for f in files if "aten.addmm.default.OUTPUT.0." in f]
    assert len(addmm_out) == 1
    saved = np.load(os.path.join(graphs[0], "0", addmm_out[0]))
    with torch.no_grad():
        np.testing.assert_allclose(saved, model.lin(x).numpy(), rtol=1e-6, atol=1e-6)
    # one timestamp per op call: every file of one call shares it
    stamps = {}
    for f in files:
        m = pattern.match(f)
        stamps.setdefault(m.group(1), set()).add(m.group(6))
    assert all(len(s) == 1 for s in stamps.values())


def test_data_dump_filter_skips_nodes(tmp_path):
    config = CompilerConfig()
    config.debug.data_dump.type = "npy"
    config.debug.data_dump.path = str(tmp_path)
    config.debug.data_dump.filter = lambda node: node if "relu" in str(node.target) else None
    _run(config)
    (step,) = glob.glob(str(tmp_path / "worldsize1_global_rank0" / "graph_*" / "0"))
    assert os.listdir(step) and all("aten.relu.default" in f for f in os.listdir(step))


def test_fx_summary_writes_a_csv_and_skips_compile(tmp_path):
    config = CompilerConfig()
    config.debug.fx_summary.type = "csv"
    config.debug.fx_summary.path = str(tmp_path)
    before = len(torchair.graph_reports())
    _run(config)
    (file,) = glob.glob(str(tmp_path / "summary_graph_*.csv"))
    rows = list(csv.DictReader(open(file, encoding="utf-8")))
    ops = {r["op"]: int(r["count"]) for r in rows}
    assert ops["aten.relu.default"] == 1 and ops["aten.addmm.default"] == 1
    assert "op by op" in torchair.graph_reports()[before].launch


def test_py_dump_has_torchairs_fx_code_section(tmp_path):
    config = _config(debug__graph_dump__type="py", debug__graph_dump__path=str(tmp_path))
    _run(config)
    (original,) = glob.glob(str(tmp_path / "dynamo_original_graph_*.py"))
    text = open(original, encoding="utf-8").read()
    assert re.search(r'^# File .*test_option_effects\.py", line \d+, in forward', text, re.M)
    assert re.search(r"^## FX Code: relu\w*: torch\.float32\[2, 4\]cpu = "
                     r"torch\.ops\.aten\.relu\.default\(", text, re.M)
