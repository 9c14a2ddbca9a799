"""LowerPrimsPass swaps prims.convert_element_type for the ATen kernel, same values and dtype."""
import torch
import torch.fx as fx

from torchair.passes import LowerPrimsPass, run_passes


def test_convert_element_type_becomes_to_copy():
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(torch.ops.prims.convert_element_type.default, (x, torch.float32))
    g.output((g.call_function(torch.ops.aten.mul.Tensor, (y, 2)),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    value = torch.tensor(0.1, dtype=torch.float64)
    expected = gm(value)
    fired = run_passes(gm, [LowerPrimsPass()])
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert fired == {"lower_prims": 1}
    assert torch.ops.aten._to_copy.default in targets
    assert torch.ops.prims.convert_element_type.default not in targets
    out = gm(value)[0]
    assert out.dtype == torch.float32 and torch.equal(out, expected[0])


def test_nothing_to_lower_reports_nothing():
    g = fx.Graph()
    x = g.placeholder("x")
    g.output((g.call_function(torch.ops.aten.relu.default, (x,)),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    assert run_passes(gm, [LowerPrimsPass()]) == {}
