"""ReinplaceInputsPass turns functionalized input updates back into in-place writes, and only
when no reader of the old value runs after the write."""
import copy

import pytest
import torch
import torch.fx as fx
from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func

from torchair.passes import ReinplaceInputsPass, run_passes

aten = torch.ops.aten


def _aot_graph(fn, args):
    """The functionalized ATen inference graph AOT makes of ``fn`` (input mutations as copy_),
    and real inputs in the graph's input order (Dynamo may reorder them)."""
    captured = {}

    def backend(gm, example_inputs):
        captured["inputs"] = [a.clone() for a in example_inputs]

        def fw(g, inputs):
            captured["gm"] = g
            return make_boxed_func(g.forward)
        return aot_module_simplified(gm, example_inputs, fw_compiler=fw,
                                     keep_inference_input_mutations=True)

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(fn, backend=backend, fullgraph=True, dynamic=False)(
            *[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
    return captured["gm"], captured["inputs"]


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _run_both(gm, args):
    """Run the graph before and after the pass on copies of ``args``; return both results."""
    before = copy.deepcopy(gm)
    a1 = [a.clone() for a in args]
    a2 = [a.clone() for a in args]
    out1 = before(*a1)
    fired = run_passes(gm, [ReinplaceInputsPass()])
    out2 = gm(*a2)
    return fired, (out1, a1), (out2, a2)


def _kv_update(kc, vc, pos, x):
    kc.index_copy_(1, pos, x)
    vc[:, pos] = x * 2              # index_put
    kc[:, 0:1] = x + 1              # slice assignment (slice_scatter), chained on kc
    vc.mul_(0.5)                    # chained elementwise update
    return (kc * vc).sum(1)


def test_fires_on_kv_cache_updates_and_matches_functional_graph():
    args = [torch.randn(2, 8, 4), torch.randn(2, 8, 4), torch.tensor([3]), torch.randn(2, 1, 4)]
    gm, args = _aot_graph(_kv_update, args)
    assert aten.copy_.default in _targets(gm) and aten.index_copy.default in _targets(gm)
    fired, (out1, a1), (out2, a2) = _run_both(gm, args)
    targets = _targets(gm)
    assert fired["reinplace_inputs"] >= 4
    assert aten.index_copy_.default in targets and aten.index_put_.default in targets
    assert aten.index_copy.default not in targets and aten.slice_scatter.default not in targets
    # the final copy_ into the input is gone: the input is written where it is
    assert not [n for n in gm.graph.find_nodes(op="call_function", target=aten.copy_.default)
                if n.args[0].op == "placeholder" and n.args[1].op != "placeholder"
                and n.args[1].target is not aten.slice.Tensor]
    torch.testing.assert_close(out1, out2)
    for x, y in zip(a1, a2):
        torch.testing.assert_close(x, y)


def _handmade(read_after: bool):
    """P -> index_copy(P) -> copy_(P, ...), with a read of the old P before or after the write."""
    g = fx.Graph()
    p, pos, x = g.placeholder("p"), g.placeholder("pos"), g.placeholder("x")
    early = g.call_function(aten.sum.default, (p,)) if not read_after else None
    new = g.call_function(aten.index_copy.default, (p, 0, pos, x))
    late = g.call_function(aten.sum.default, (p,)) if read_after else None
    g.call_function(aten.copy_.default, (p, new))
    g.output((early if early is not None else late,))
    gm = fx.GraphModule(torch.nn.Module(), g)
    example = [torch.randn(5, 3), torch.tensor([1]), torch.randn(1, 3)]
    for node, value in zip(gm.graph.find_nodes(op="placeholder"), example):
        node.meta["val"] = value
    new.meta["val"] = example[0].clone()
    return gm, example


@pytest.mark.parametrize("read_after", [False, True], ids=["read-before", "read-after"])
def test_old_value_read_after_the_write_stays_functional(read_after):
    gm, args = _handmade(read_after)
    fired, (out1, a1), (out2, a2) = _run_both(gm, args)
    assert bool(fired) is (not read_after)
    assert (aten.index_copy.default in _targets(gm)) is read_after
    torch.testing.assert_close(out1, out2)
    torch.testing.assert_close(a1[0], a2[0])


def test_dtype_changing_update_stays_functional():
    def f(kc, x):
        kc.copy_(kc.to(torch.float64).mul(x).to(torch.float32))
        return kc.sum()

    args = [torch.randn(3, 4), torch.randn(4, dtype=torch.float64)]
    gm, args = _aot_graph(f, args)
    fired, (out1, a1), (out2, a2) = _run_both(gm, args)
    torch.testing.assert_close(out1, out2)
    torch.testing.assert_close(a1[0], a2[0])
    assert aten.mul_.Tensor not in _targets(gm)  # float64 product cannot be written into fp32
