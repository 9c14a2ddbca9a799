"""RemoveNoOpsPass removes identity ops and keeps the ones whose removal would change aliasing."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from torchair.passes import RemoveNoOpsPass, run_passes

aten = torch.ops.aten


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_removes_same_shape_view_and_alias():
    def f(x):
        a = x.view(2, 3)                     # same shape: no-op
        b = torch.ops.aten.alias(a)          # identity
        return (b * 2).relu()

    x = torch.randn(2, 3)
    gm = make_fx(f)(x)
    assert aten.view.default in _targets(gm) and aten.alias.default in _targets(gm)
    fired = run_passes(gm, [RemoveNoOpsPass()])
    after = _targets(gm)
    assert aten.view.default not in after and aten.alias.default not in after
    assert fired["remove_noops"] == 2
    assert torch.equal(gm(x), f(x))


@pytest.mark.parametrize("make_copy", [lambda x: x.clone(), lambda x: x.to(torch.float32, copy=True)],
                         ids=["clone", "to-copy"])
def test_copies_followed_by_a_view_are_kept(make_copy):
    # removing the copy would return a view of the caller's input
    def f(x):
        return make_copy(x).t()

    x = torch.randn(2, 3)
    gm = make_fx(f)(x)
    RemoveNoOpsPass()(gm)
    gm.recompile()
    out = gm(x)
    x.fill_(7)
    assert not torch.equal(out, torch.full_like(out, 7))


def test_keeps_shape_changing_view_and_dtype_cast():
    def f(x):
        return (x.view(3, 2).to(torch.float64) + 1).sum(0)

    x = torch.randn(2, 3)
    gm = make_fx(f)(x)
    count = RemoveNoOpsPass()(gm)
    gm.recompile()
    assert count == 0
    assert aten.view.default in _targets(gm) and aten._to_copy.default in _targets(gm)
    assert torch.equal(gm(x), f(x))


def test_keeps_clone_returned_as_output():
    # removing it would return the input itself: the caller's output would alias its input
    def f(x):
        return x.clone()

    x = torch.randn(4)
    gm = make_fx(f)(x)
    assert RemoveNoOpsPass()(gm) == 0
    gm.recompile()
    out = gm(x)
    assert out.data_ptr() != x.data_ptr()


def test_keeps_clone_next_to_inplace_mutation():
    def f(x):
        y = x.clone()
        y.add_(1)
        return y * 2

    x = torch.randn(4)
    gm = make_fx(f)(x)
    RemoveNoOpsPass()(gm)
    gm.recompile()
    before = x.clone()
    assert torch.equal(gm(x), f(before))
    assert torch.equal(x, before)  # the input was not mutated through a removed copy


def test_pass_uuid_is_stable_hash_of_source():
    assert RemoveNoOpsPass().uuid() == RemoveNoOpsPass().uuid()
    assert len(RemoveNoOpsPass().uuid()) == 16
