"""The Inductor engine lowers the norm ops to their reference formula (fixed-shape builds), so
Inductor can fuse them with their neighbours instead of calling an opaque custom op."""
import torch
import torch.fx as fx

import torchair  # noqa: F401 (registers torch.ops.npu.*)
from torchair.ops.norm.rms_norm import add_rms_norm_reference, rms_norm_reference
from torchair.runtime.engines import lower_to_formulas

npu = torch.ops.npu


def _graph():
    def fn(x, r, g):
        y, rstd, x_out = npu.npu_add_rms_norm.default(x, r, g, 1e-5)
        z, _ = npu.npu_rms_norm.default(y * 2, g, epsilon=1e-6)
        a, b, _, _ = npu.npu_add_rms_norm_cast.default(z, x_out, g)
        return a, b, rstd

    return fx.symbolic_trace(fn)


def test_lowering_replaces_the_ops_and_keeps_the_results():
    gm = _graph()
    args = (torch.randn(3, 16, dtype=torch.bfloat16), torch.randn(3, 16, dtype=torch.bfloat16),
            torch.rand(16, dtype=torch.bfloat16) + 0.5)
    with torch.no_grad():
        want = gm(*args)
        assert lower_to_formulas(gm) == 3
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert not any(isinstance(t, torch._ops.OpOverload) and t.namespace == "npu" for t in targets)
    assert add_rms_norm_reference in targets and rms_norm_reference in targets
    got = gm(*args)
    for a, b in zip(got, want):  # the CPU kernels and the formula agree to rounding
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)
    # the formula is the reference kernel itself: bit for bit
    y, rstd, x_out = add_rms_norm_reference(*args, 1e-5)
    torch.testing.assert_close(got[2], rstd, rtol=0, atol=0)
    assert lower_to_formulas(gm) == 0  # nothing left to lower


def test_lowered_graph_traces_to_plain_aten_ops():
    """What Inductor sees after the lowering: ATen ops only (make_fx of the lowered graph)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = _graph()
    lower_to_formulas(gm)
    args = (torch.randn(2, 8), torch.randn(2, 8), torch.rand(8) + 0.5)
    traced = make_fx(gm)(*args)
    namespaces = {n.target.namespace for n in traced.graph.nodes
                  if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)}
    assert namespaces <= {"aten", "prims"}, namespaces
