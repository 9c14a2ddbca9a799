"""SuperKernel segmentation (seed 004): ops in program order, an unfusable op ends a segment, is
skipped with its reason, and fusion resumes after it."""
import pathlib
import sys

import torch

import torchair
from torchair.plan.segments import plan_segments

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
from four_paths import CAPACITY, HEAD_DIM, HEADS, HIDDEN, KV_HEADS  # noqa: E402


class ScopedStep(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(HIDDEN, HIDDEN)
        self.o = torch.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x, k_cache, v_cache, lengths: list):
        with torchair.scope.super_kernel("sk1", "stream-fusion=1"):
            q = self.q(x).relu()
            attn = torch.ops.npu.npu_incre_flash_attention(
                q, k_cache, v_cache, actual_seq_lengths=lengths, num_heads=HEADS,
                num_key_value_heads=KV_HEADS, input_layout="BSH", scale_value=HEAD_DIM ** -0.5)
            out = self.o(attn) * 2
        return out + x


def _compile(tiling: bool):
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    config.experimental_config.tiling_schedule_optimize = tiling
    model = ScopedStep().eval()
    compiled = torch.compile(model, backend=torchair.get_npu_backend(compiler_config=config),
                             dynamic=True, fullgraph=True)
    x = torch.randn(2, 1, HIDDEN)
    caches = [torch.randn(2, CAPACITY, KV_HEADS * HEAD_DIM) for _ in range(2)]
    for t in (x, *caches):
        torch._dynamo.mark_static(t)
    with torch.no_grad():
        out = compiled(x, *caches, [5, 9])
        torch.testing.assert_close(out, model(x, *caches, [5, 9]))
    return torchair.graph_reports()[-1]


def test_host_read_attention_splits_the_scope_into_two_segments():
    report = _compile(tiling=False)
    plan = report.segments["sk1"]
    (skipped_name, reason), = plan["skipped"]
    assert "npu_incre_flash_attention" in skipped_name
    assert "reads actual_seq_lengths on the host" in reason
    assert len(plan["segments"]) == 2
    assert all(plan["segments"]), plan
    text = str(report)
    assert "segment 1:" in text and "segment 2:" in text and "skipped" in text


def test_with_tiling_sink_the_scope_is_one_segment():
    report = _compile(tiling=True)
    plan = report.segments["sk1"]
    assert plan["skipped"] == [] and len(plan["segments"]) == 1
    assert set(plan["segments"][0]) == set(report.scopes["sk1"])


def test_ops_outside_the_scope_end_a_segment_and_getitem_follows_its_producer():
    import operator

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    a = graph.call_function(torch.ops.aten.relu.default, (x,))
    a.meta["_super_kernel_scope"] = "s"
    b = graph.call_function(torch.ops.aten.neg.default, (a,))  # not in the scope
    c = graph.call_function(torch.ops.aten.nonzero.default, (b,))
    c.meta["_super_kernel_scope"] = "s"
    d = graph.call_function(operator.getitem, (c, 0))
    d.meta["_super_kernel_scope"] = "s"
    e = graph.call_function(torch.ops.aten.sin.default, (b,))
    e.meta["_super_kernel_scope"] = "s"
    graph.output((d, e))
    plans = plan_segments(torch.fx.GraphModule(torch.nn.Module(), graph), tiling_sink=False,
                          cuda=False)
    assert plans["s"].segments == [[a.name], [e.name]]
    assert [name for name, _ in plans["s"].skipped] == [c.name, d.name]
    assert "data-dependent" in plans["s"].skipped[0][1]
