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


# --- TorchAir's remove_noop_ops list: each no-op removed, each near miss kept --------------------

NOOPS = {
    "slice-full": (lambda x: aten.slice.Tensor(x, 1, 0, 3) * 2, aten.slice.Tensor),
    "slice-open-end": (lambda x: x[0:] * 2, aten.slice.Tensor),
    "slice_scatter-full": (lambda x: torch.slice_scatter(x, x * 3, 1, 0, 3) + 1,
                           aten.slice_scatter.default),
    "repeat-ones": (lambda x: x.repeat(1, 1) * 2, aten.repeat.default),
    "pad-zero": (lambda x: torch.nn.functional.pad(x, (0, 0)) * 2, aten.constant_pad_nd.default),
    "cat-one": (lambda x: torch.cat([x * 2]) + 1, aten.cat.default),
    "pow-one": (lambda x: torch.pow(x, 1) + 1, aten.pow.Tensor_Scalar),
    "clone": (lambda x: x.clone() * 2, aten.clone.default),
}
NEAR_MISSES = {
    "slice-part": (lambda x: x[:, 0:2] * 2, aten.slice.Tensor),
    "slice-step": (lambda x: x[:, ::2] * 2, aten.slice.Tensor),
    "slice_scatter-part": (lambda x: torch.slice_scatter(x, x[:, :2] * 3, 1, 0, 2) + 1,
                           aten.slice_scatter.default),
    "repeat-two": (lambda x: x.repeat(1, 2) * 2, aten.repeat.default),
    "pad-one": (lambda x: torch.nn.functional.pad(x, (0, 1)) * 2, aten.constant_pad_nd.default),
    "cat-two": (lambda x: torch.cat([x, x]) + 1, aten.cat.default),
    "pow-two": (lambda x: torch.pow(x, 2) + 1, aten.pow.Tensor_Scalar),
    "clone-returned": (lambda x: x.clone(), aten.clone.default),
    "clone-view-returned": (lambda x: x.clone()[0], aten.clone.default),
}


@pytest.mark.parametrize("name", sorted(NOOPS))
def test_torchair_noops_are_removed(name):
    f, target = NOOPS[name]
    x = torch.randn(2, 3)
    gm = make_fx(f)(x)
    assert target in _targets(gm)
    RemoveNoOpsPass()(gm)
    gm.recompile()
    assert target not in _targets(gm)
    assert torch.equal(gm(x), f(x))


@pytest.mark.parametrize("name", sorted(NEAR_MISSES))
def test_near_misses_are_kept(name):
    f, target = NEAR_MISSES[name]
    x = torch.randn(2, 3)
    gm = make_fx(f)(x)
    RemoveNoOpsPass()(gm)
    gm.recompile()
    assert target in _targets(gm)
    out = gm(x)
    assert torch.equal(out, f(x))


@pytest.mark.parametrize("op", [torch.ceil, torch.floor, torch.round, torch.trunc])
def test_rounding_of_integers_is_removed_of_floats_kept(op):
    def f(x):
        return op(x) + 1

    ints = torch.arange(6).view(2, 3)
    gm = make_fx(f)(ints)
    RemoveNoOpsPass()(gm)
    gm.recompile()
    assert all(t.__name__ not in ("ceil", "floor", "round", "trunc")
               for t in (getattr(t, "overloadpacket", t) for t in _targets(gm)))
    assert torch.equal(gm(ints), f(ints))
    floats = torch.tensor([[0.5, 1.5, -2.5]])
    gm = make_fx(f)(floats)
    before = len(_targets(gm))
    RemoveNoOpsPass()(gm)
    assert len(_targets(gm)) == before


def test_config_switch_turns_the_pass_off():
    import torchair
    from torchair.passes import default_passes

    config = torchair.CompilerConfig()
    assert any(isinstance(p, RemoveNoOpsPass) for p in default_passes(config))
    config.experimental_config.remove_noop_ops = False
    assert not any(isinstance(p, RemoveNoOpsPass) for p in default_passes(config))
