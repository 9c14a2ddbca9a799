"""``torchair_native::gemv_cat`` (toolchain/csrc/small_gemm.cpp): the products of one ``x`` with
2 or 3 weights side by side in one parallel region. Its columns are gemv's products bit for bit
(every register tile, tails shorter than a tile, one and two threads, biases or not), close to a
float64 reference; calls it cannot take fast are ATen's. The binder groups the products of one
input (a layer's q/k/v, gate/up) and only those it can compute before the group's first product
with nothing written in between; ``TORCHAIR_GEMV_GROUPS=0`` keeps one gemv call each."""
import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import torchair
from tests.ops.test_small_gemm import _traced, _unit
from torchair.ops.matmul import cpu as _mm
from torchair.runtime.binders.small_products import SmallProductBinder

pytestmark = pytest.mark.skipif(not _mm.available(),
                                reason="needs the small-product kernel (a C++ compiler, AVX2)")


def _weights(k, ns, seed=0, biases=(True, False, True)):
    g = torch.Generator().manual_seed(seed)
    ws = [torch.randn(n, k, generator=g) for n in ns]
    bs = [torch.randn(n, generator=g) if b else None for n, b in zip(ns, biases)]
    return ws, bs


def _cat(x, ws, bs):
    w_ts = [w.t() for w in ws] + [None] * (3 - len(ws))
    return _mm.gemv_cat()(x, *w_ts, *(list(bs) + [None] * (3 - len(bs))))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 12, 17, 32])
@pytest.mark.parametrize("ns", [(48, 16, 16), (7, 300, 65), (2, 1, 3), (96, 96)])
def test_columns_are_gemvs_products_bit_for_bit(rows, ns, threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        k = 100
        x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
        ws, bs = _weights(k, ns, biases=(True, False, True)[:len(ns)])
        out = _cat(x, ws, bs)
        parts = [_mm.gemv()(x, w.t(), b) for w, b in zip(ws, bs)]
    finally:
        torch.set_num_threads(before)
    assert out.shape == (rows, sum(ns)) and out.is_contiguous()
    assert torch.equal(out, torch.cat(parts, 1))
    ref = torch.cat([_mm.reference(x, w.t(), b) for w, b in zip(ws, bs)], 1)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)


def test_the_reference_is_a_written_out_sum():
    x = torch.tensor([[1.0, 2.0]])
    w0, w1 = torch.tensor([[3.0, 4.0]]), torch.tensor([[5.0, 6.0], [7.0, 8.0]])
    out = _cat(x, [w0, w1], [torch.tensor([0.5]), None])
    assert out.tolist() == [[1 * 3 + 2 * 4 + 0.5, 1 * 5 + 2 * 6, 1 * 7 + 2 * 8]]


def test_calls_it_cannot_take_fast_are_atens():
    ws, bs = _weights(24, (8, 4))
    x = torch.randn(16, 48)[:, ::2]  # rows not contiguous in k
    expected = torch.cat([torch.addmm(bs[0], x, ws[0].t()), x @ ws[1].t()], 1)
    assert torch.equal(_cat(x, ws, bs), expected)
    xd, wd = x.double(), [w.double() for w in ws]
    assert torch.equal(_mm.gemv_cat()(xd, wd[0].t(), wd[1].t()),
                       torch.cat([xd @ wd[0].t(), xd @ wd[1].t()], 1))


def test_a_bias_without_its_weight_is_refused():
    ws, _ = _weights(8, (4, 4))
    with pytest.raises(RuntimeError, match="b2 is given without w2"):
        _mm.gemv_cat()(torch.randn(2, 8), ws[0].t(), ws[1].t(), None, None, None, torch.randn(4))


class _Layer(torch.nn.Module):
    """q/k/v of one input (with biases, as Qwen's), then gate/up of another, then down."""

    def __init__(self, dim=48, kv=16, hidden=64):
        super().__init__()
        self.q = torch.nn.Linear(dim, dim)
        self.k = torch.nn.Linear(dim, kv)
        self.v = torch.nn.Linear(dim, kv)
        self.gate = torch.nn.Linear(dim, hidden, bias=False)
        self.up = torch.nn.Linear(dim, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        h = x + q * 2 + torch.cat([k, v], -1).sum(-1, keepdim=True)
        return self.down(F.silu(self.gate(h)) * self.up(h))


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("batch", [1, 8])
def test_products_of_one_input_share_a_call(batch, monkeypatch):
    monkeypatch.setattr(_mm, "MIN_ROWS", 1)  # an Intel CPU with MKL binds from 4 rows
    torch.manual_seed(0)
    gm, args = _traced(_Layer(), torch.randn(batch, 1, 48))
    binder = SmallProductBinder()
    grouped, calls = binder(gm)
    assert calls == 3 and (binder.grouped, binder.groups) == (5, 2)
    targets = _targets(grouped)
    assert targets.count(_mm.gemv_cat()) == 2 and targets.count(_mm.gemv()) == 1
    assert torch.ops.aten.mm.default not in targets and torch.ops.aten.addmm.default not in targets
    assert _targets(gm).count(torch.ops.aten.addmm.default) == 3  # the traced graph is unchanged
    with torch.no_grad():
        out, = grouped(*args)
        eager, = gm(*args)
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-5)


def test_the_switch_keeps_one_gemv_call_per_product(monkeypatch):
    torch.manual_seed(0)
    gm, args = _traced(_Layer(), torch.randn(8, 1, 48))
    grouped, calls = SmallProductBinder()(gm)
    monkeypatch.setenv(_mm.GROUP_SWITCH, "0")
    binder = SmallProductBinder()
    separate, separate_calls = binder(gm)
    assert separate_calls == 6 and binder.grouped == 0 and calls == 3
    assert _mm.gemv_cat() not in _targets(separate)
    with torch.no_grad():  # the same sums, grouped or not
        assert torch.equal(grouped(*args)[0], separate(*args)[0])


def _bound(fn, *args):
    gm = make_fx(fn, tracing_mode="fake")(*args)
    binder = SmallProductBinder()
    out, calls = binder(gm)
    return out, calls, binder


def test_a_weight_written_between_the_products_is_not_grouped():
    """An in-place write between the products (as a unit's in-place KV-cache writes are) to the
    second product's weight: computing that product with the first would read the old values."""
    def step(x, w1, w2):
        return x @ w1.t(), x @ w2.t()

    x, w1, w2 = torch.randn(8, 32), torch.randn(16, 32), torch.randn(24, 32)
    traced = make_fx(step, tracing_mode="fake")(x, w1, w2)
    w2_node = [n for n in traced.graph.nodes if n.op == "placeholder"][2]
    second = [n for n in traced.graph.nodes if n.target is torch.ops.aten.mm.default][1]
    with traced.graph.inserting_before(second):
        traced.graph.call_function(torch.ops.aten.add_.Tensor, (w2_node, 1.0))
    traced.recompile()
    binder = SmallProductBinder()
    gm, calls = binder(traced)
    assert calls == 2 and binder.grouped == 0 and _mm.gemv_cat() not in _targets(gm)
    expected = (x @ w1.t(), x @ (w2 + 1).t())
    for got, want in zip(gm(x, w1, w2.clone()), expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_write_through_a_view_of_x_between_the_products_is_not_grouped():
    """A copy into a slice of the input between the products (what the in-place passes make of
    a ``slice_scatter``): the second product reads the written values, so it keeps its call."""
    def step(x, w1, w2, src):
        a = x @ w1.t()
        x[:, :4].copy_(src)
        return a, x @ w2.t()

    x, w1, w2, src = torch.randn(8, 32), torch.randn(16, 32), torch.randn(24, 32), torch.randn(8, 4)
    gm, calls, binder = _bound(step, x, w1, w2, src)
    assert calls == 2 and binder.grouped == 0
    written = x.clone()
    written[:, :4] = src
    got = gm(x.clone(), w1, w2, src)
    torch.testing.assert_close(got[0], x @ w1.t(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], written @ w2.t(), rtol=1e-5, atol=1e-5)


def test_a_product_viewed_across_its_rows_is_not_grouped(monkeypatch):
    """Columns of a wider output are rows ``sum N`` apart: a view that merges rows (``[8, 16]``
    to ``[128]``) cannot be taken of them, so that product keeps its call; at one row it can."""
    monkeypatch.setattr(_mm, "MIN_ROWS", 1)  # an Intel CPU with MKL binds from 4 rows

    def step(x, w1, w2):
        return (x @ w1.t()).view(-1), x @ w2.t()

    w1, w2 = torch.randn(16, 32), torch.randn(24, 32)
    for rows, grouped in ((8, 0), (1, 2)):
        x = torch.randn(rows, 32)
        gm, calls, binder = _bound(step, x, w1, w2)
        assert binder.grouped == grouped and calls == 2 - grouped // 2
        got = gm(x, w1, w2)
        torch.testing.assert_close(got[0], (x @ w1.t()).view(-1), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got[1], x @ w2.t(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 4])
def test_a_product_read_through_as_strided_is_not_grouped(rows, monkeypatch):
    """``as_strided`` counts its offset from the start of the storage: of columns of a wider
    output it would read other columns, even at one row."""
    monkeypatch.setattr(_mm, "MIN_ROWS", 1)  # an Intel CPU with MKL binds from 4 rows

    def step(x, w1, w2):
        return torch.as_strided(x @ w1.t(), (16,), (1,)), x @ w2.t()

    x, w1, w2 = torch.randn(rows, 32), torch.randn(16, 32), torch.randn(24, 32)
    gm, calls, binder = _bound(step, x, w1, w2)
    assert binder.grouped == 0 and calls == 2
    torch.testing.assert_close(gm(x, w1, w2)[0], (x @ w1.t()).reshape(-1)[:16], rtol=1e-5,
                               atol=1e-5)


def test_a_weight_made_after_the_first_product_is_not_grouped():
    def step(x, w1, w2):
        a = x @ w1.t()
        w3 = w2 * a.mean()  # depends on the first product: cannot be computed before it
        return a, x @ w3.t()

    x, w1, w2 = torch.randn(8, 32), torch.randn(16, 32), torch.randn(24, 32)
    gm, calls, binder = _bound(step, x, w1, w2)
    assert calls == 2 and binder.grouped == 0


def test_a_later_weights_transpose_moves_up_to_the_group():
    def step(x, w1, w2, w3):
        a = x @ w1.t()
        b = a.relu()  # between the products: a use of the first
        return b, x @ w2.t(), x @ w3.t()

    x, ws = torch.randn(4, 32), [torch.randn(n, 32) for n in (16, 8, 24)]
    gm, calls, binder = _bound(step, x, *ws)
    assert calls == 1 and binder.grouped == 3
    for got, w in zip(gm(x, *ws)[1:], ws[1:]):
        assert torch.equal(got, _mm.gemv()(x, w.t()))
    assert torch.equal(gm(x, *ws)[0], _mm.gemv()(x, ws[0].t()).relu())


def test_more_than_three_products_of_one_input_make_several_calls():
    def step(x, *ws):
        return tuple(x @ w.t() for w in ws)

    x, ws = torch.randn(8, 32), [torch.randn(8 + i, 32) for i in range(5)]
    gm, calls, binder = _bound(step, x, *ws)
    assert calls == 2 and (binder.grouped, binder.groups) == (5, 2)
    for got, w in zip(gm(x, *ws), ws):
        assert torch.equal(got, _mm.gemv()(x, w.t()))


@pytest.mark.inductor
def test_an_inductor_unit_calls_gemv_cat_and_matches_eager():
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    module = _Layer().eval()
    compiled, backend = _unit(module, run_eagerly=False)
    with torch.no_grad():
        x = torch.randn(8, 1, 48)
        out, codes = run_and_get_code(lambda: compiled(x))
        torch.testing.assert_close(out, module(x), rtol=1e-5, atol=1e-5)
        x2 = torch.randn(8, 1, 48)
        torch.testing.assert_close(compiled(x2), module(x2), rtol=1e-5, atol=1e-5)
    report = torchair.graph_reports()[-1]
    assert report.small_products == 3 and "small products: 3 call(s)" in str(report)
    assert backend.frame_count == 1
    assert len(codes) == 1 and "torchair_native.gemv_cat" in codes[0]
