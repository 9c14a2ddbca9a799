"""One-row matrix products in a static unit reach ATen's BLAS path without a copy.

Inductor views a ``[1, 1, K]`` buffer as ``[1, K]`` with strides ``(0, 1)``; ATen's CPU ``mm``
clones such an operand before every call. torchair's compile restrides it to ``(K, 1)`` (the
same elements), and leaves stock Inductor compiles alone."""
from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from torchair.runtime import engines
from torchair.runtime._blas_strides import blas_compatible, blas_strides


@pytest.mark.parametrize("size, stride, want", [
    ([1, 512], [0, 1], [512, 1]),      # a row viewed with a zero leading stride
    ([512, 1], [1, 0], [1, 512]),      # a column, the transposed case
    ([1, 512], [512, 1], None),        # already what BLAS takes
    ([4, 512], [0, 1], None),          # a broadcast (expanded) operand: real zero stride
    ([1, 1], [0, 0], None),            # one element: any stride is fine
    ([1, 512], [0, 2], None),          # not contiguous along the row: left to ATen
    ([2, 3, 4], [0, 4, 1], None),      # not 2-D
])
def test_blas_compatible(size, stride, want):
    assert blas_compatible(size, stride) == want


def test_the_new_strides_address_the_same_elements():
    base = torch.arange(512.0)
    for size, stride in (([1, 512], [0, 1]), ([512, 1], [1, 0])):
        new = blas_compatible(size, stride)
        assert torch.equal(base.as_strided(size, stride), base.as_strided(size, new))


def test_patch_is_scoped_and_not_nested():
    from torch._inductor import lowering

    mm = torch.ops.aten.mm.default
    before = lowering.lowerings[mm]
    with blas_strides():
        inside = lowering.lowerings[mm]
        assert inside is not before and inside.torchair_blas_strides
        with blas_strides():
            assert lowering.lowerings[mm] is inside  # nested: one wrapper, not two
        assert lowering.lowerings[mm] is inside
    assert lowering.lowerings[mm] is before


def _norm_linear(x, w, n, b):
    h = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * n
    return [torch.nn.functional.linear(h, w), torch.nn.functional.linear(h, w, b)]


def _clones(engine, args) -> int:
    with torch.profiler.profile() as prof:
        engine(list(args))
    return sum(1 for e in prof.events() if e.name == "aten::clone")


@pytest.mark.inductor
@pytest.mark.parametrize("cpp", [False, True], ids=["python-wrapper", "cpp-wrapper"])
def test_one_row_products_run_without_a_copy(cpp):
    import torch._inductor.config as inductor_config

    with inductor_config.patch(force_disable_caches=True):  # no code from another build
        _check_one_row_products(cpp)


def _check_one_row_products(cpp: bool) -> None:
    x, w, n, b = torch.randn(1, 1, 64), torch.randn(48, 64), torch.randn(64), torch.randn(48)
    gm = make_fx(_norm_linear)(x, w, n, b)
    engine, _ = engines.inductor_engine(gm, [x, w, n, b], "test graph", cpp_wrapper=cpp)
    for _ in range(2):
        x = torch.randn(1, 1, 64)
        got, want = engine([x, w, n, b]), _norm_linear(x, w, n, b)
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    assert _clones(engine, [x, w, n, b]) == 0

    # the same graph through stock Inductor (no torchair compile around it) still copies:
    # what this test guards against is real, and the patch did not leak out of torchair
    from torch._inductor.compile_fx import compile_fx

    stock = compile_fx(make_fx(_norm_linear)(x, w, n, b), [x, w, n, b])
    assert _clones(lambda args: stock(*args), [x, w, n, b]) >= 1


def test_mm_and_addmm_restride_their_matrix_operands_only(monkeypatch):
    from torchair.runtime import _blas_strides

    monkeypatch.setattr(_blas_strides, "_restride", lambda x: ("restrided", x))
    calls = []
    mm = _blas_strides._wrap(lambda *a, **k: calls.append((a, k)), (0, 1))
    addmm = _blas_strides._wrap(lambda *a, **k: calls.append((a, k)), (1, 2))
    mm("a", "b", layout="L")
    addmm("bias", "a", "b", beta=2)
    assert calls == [((("restrided", "a"), ("restrided", "b")), {"layout": "L"}),
                     (("bias", ("restrided", "a"), ("restrided", "b")), {"beta": 2})]


def _row_and_broadcast(x, w, b):
    row = (x * 3).view(1, -1)                # a [1, K] buffer Inductor views with strides (0, 1)
    wide = row.expand(4, -1)                 # a real zero stride: 4 rows of the same data
    return [row @ w.t(), torch.addmm(b, (x * 5).view(1, -1), w.t()), wide @ w.t()]


@pytest.mark.inductor
def test_broadcast_operands_are_left_alone_and_products_equal_eager(monkeypatch):
    """A broadcast operand (a real zero stride over several rows) keeps its strides; the row
    operand is restrided; every product (mm, addmm, broadcast) equals eager."""
    import torch._inductor.config as inductor_config

    from torchair.runtime import _blas_strides

    seen = []
    real = _blas_strides.blas_compatible

    def spy(size, stride):
        new = real(size, stride)
        seen.append(([int(d) for d in size], [int(d) for d in stride], new))
        return new

    monkeypatch.setattr(_blas_strides, "blas_compatible", spy)
    x, w, b = torch.randn(1, 1, 256), torch.randn(128, 256), torch.randn(128)
    gm = make_fx(_row_and_broadcast)(x, w, b)
    with inductor_config.patch(force_disable_caches=True):
        engine, _ = engines.inductor_engine(gm, [x, w, b], "test graph", cpp_wrapper=True)
    assert ([1, 256], [0, 1], [256, 1]) in seen  # the row
    assert ([4, 256], [0, 1], None) in seen  # the broadcast keeps its zero stride
    for _ in range(2):
        x = torch.randn(1, 1, 256)
        for got, want in zip(engine([x, w, b]), _row_and_broadcast(x, w, b)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_patch_changes_inductors_cache_key_only_inside():
    import torch._inductor.config as inductor_config

    assert inductor_config.post_grad_custom_pre_pass is None
    with blas_strides():
        marker = inductor_config.post_grad_custom_pre_pass
        assert marker.uuid() == "torchair.blas_strides.1"
        marker(None)  # a no-op pass
    assert inductor_config.post_grad_custom_pre_pass is None


@pytest.mark.inductor
def test_code_cached_without_the_patch_is_not_served_with_it(tmp_path, monkeypatch):
    """Inductor's FX-graph cache on (a fresh cache directory): a compile without the patch
    stores code that copies; the torchair compile of the same graph gets its own entry."""
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import compile_fx

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    x, w, n, b = torch.randn(1, 1, 64), torch.randn(48, 64), torch.randn(64), torch.randn(48)
    with inductor_config.patch(fx_graph_cache=True, force_disable_caches=False):
        stock = compile_fx(make_fx(_norm_linear)(x, w, n, b),
                           engines._static_fakes([x, w, n, b]))
        assert _clones(lambda args: stock(*args), [x, w, n, b]) >= 1
        engine, _ = engines.inductor_engine(make_fx(_norm_linear)(x, w, n, b), [x, w, n, b],
                                            "test graph", cpp_wrapper=False)
        assert _clones(engine, [x, w, n, b]) == 0
