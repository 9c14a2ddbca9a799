"""scatter_update(_) and npu_scatter_nd_update(_): reference against an independent one-hot blend,
eager kernels against the reference, fake kernels, registration, errors."""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torchair
import torchair.ops
from torchair.ops.cache.scatter_nd_update import scatter_nd_update_reference
from torchair.ops.cache.scatter_update import scatter_update_reference

SU, SU_ = torch.ops.npu.scatter_update, torch.ops.npu.scatter_update_
ND, ND_ = torch.ops.npu.npu_scatter_nd_update, torch.ops.npu.npu_scatter_nd_update_


def _rand(shape, dtype, g):
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    return torch.randint(-100, 100, shape, generator=g).to(dtype)


# ---------------------------------------------------------------- independent formulas

def _blend_scatter_update(cache, indices, updates, axis):
    """cache * (1 - onehot) + onehot * placed: ``onehot[row, p] = start <= p < start + e`` along
    the axis, ``placed`` the updates gathered at ``p - start`` (float64 arithmetic)."""
    a = axis % cache.dim()
    e, size = updates.shape[a], cache.shape[a]
    idx = indices.long()
    batch = torch.arange(cache.shape[0]) if idx.dim() == 1 else idx[:, 0]
    start = idx if idx.dim() == 1 else idx[:, 1]
    out = cache.double()
    p = torch.arange(size)
    for row in range(updates.shape[0]):  # rows of 2-D indices may share a batch: blend in turn
        onehot = ((p >= start[row]) & (p < start[row] + e)).double()
        src = torch.clamp(p - start[row], 0, e - 1)
        placed = updates[row].double().index_select(a - 1, src)
        shape = [1] * (cache.dim() - 1)
        shape[a - 1] = size
        m = onehot.view(shape)
        out[batch[row]] = out[batch[row]] * (1 - m) + m * placed
    return out.to(cache.dtype)


def _blend_scatter_nd(x, indices, updates):
    """One-hot matrix product over the first K dims flattened (no duplicate rows)."""
    k = indices.shape[-1]
    lead = x.shape[:k]
    strides = torch.tensor([int(torch.tensor(lead[j + 1:]).prod()) for j in range(k)])
    linear = (indices.reshape(-1, k).long() * strides).sum(-1)
    onehot = torch.nn.functional.one_hot(linear, int(torch.tensor(lead).prod())).double()
    flat = x.reshape(onehot.shape[1], -1).double()
    upd = updates.reshape(onehot.shape[0], -1).double()
    hit = onehot.sum(0).unsqueeze(1)
    return (flat * (1 - hit) + onehot.T @ upd).reshape(x.shape).to(x.dtype)


# layouts: (cache shape, updates shape, indices, axis)
CASES = {
    "BSND-axis1-decode": ((3, 8, 2, 4), (3, 1, 2, 4), [1, 5, 7], 1),
    "BSND-axis-3-prefill": ((2, 8, 2, 4), (2, 3, 2, 4), [0, 5], -3),
    "BNSD-axis-2-decode": ((3, 2, 8, 4), (3, 2, 1, 4), [7, 0, 3], -2),
    "BNSD-axis2-chunk": ((2, 2, 8, 4), (2, 2, 4, 4), [4, 1], 2),
    "BSH-axis-1-last": ((2, 3, 6), (2, 3, 2), [0, 4], -1),
    "paged-2d": ((5, 4, 6), (3, 1, 6), [[0, 1], [4, 3], [2, 0]], -2),
    "paged-2d-same-block": ((3, 4, 2, 3), (2, 1, 2, 3), [[1, 0], [1, 3]], 1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_scatter_update_reference_equals_one_hot_blend(case):
    cache_shape, upd_shape, idx, axis = CASES[case]
    g = torch.Generator().manual_seed(1)
    cache, upd = torch.randn(cache_shape, generator=g), torch.randn(upd_shape, generator=g)
    indices = torch.tensor(idx)
    want = _blend_scatter_update(cache, indices, upd, axis)
    torch.testing.assert_close(scatter_update_reference(cache, indices, upd, axis), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int8,
                                   torch.int32])
@pytest.mark.parametrize("case", list(CASES))
def test_scatter_update_kernels_equal_reference(case, dtype):
    cache_shape, upd_shape, idx, axis = CASES[case]
    g = torch.Generator().manual_seed(2)
    cache, upd = _rand(cache_shape, dtype, g), _rand(upd_shape, dtype, g)
    for index_dtype in (torch.int32, torch.int64):
        indices = torch.tensor(idx, dtype=index_dtype)
        want = scatter_update_reference(cache, indices, upd, axis)
        before = cache.clone()
        out = SU(cache, indices, upd, axis)
        assert torch.equal(out, want) and torch.equal(cache, before)  # functional: input kept
        target = cache.clone()
        assert SU_(target, indices, upd, axis) is target  # in place: returns its input
        assert torch.equal(target, want)


def test_scatter_update_noncontiguous_cache_view():
    big = torch.randn(3, 2, 8, 6)
    cache = big[..., :4]  # a strided view, written through
    upd, indices = torch.randn(3, 2, 1, 4), torch.tensor([2, 6, 0])
    want = scatter_update_reference(cache, indices, upd, 2)
    SU_(cache, indices, upd, 2)
    torch.testing.assert_close(big[..., :4], want)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_scatter_nd_update_reference_kernels_and_blend(k):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 5, 6, generator=g)
    rows = torch.randperm(int(torch.tensor(x.shape[:k]).prod()), generator=g)[:4]
    coords = torch.stack(torch.unravel_index(rows, x.shape[:k]), -1).view(2, 2, k)
    upd = torch.randn(2, 2, *x.shape[k:], generator=g)
    want = _blend_scatter_nd(x, coords, upd)
    torch.testing.assert_close(scatter_nd_update_reference(x, coords, upd), want)
    for dtype in (torch.int32, torch.int64):
        idx = coords.to(dtype)
        assert torch.equal(ND(x, idx, upd), want)
        y = x.clone()
        assert ND_(y, idx, upd) is y and torch.equal(y, want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.bool, torch.int64,
                                   torch.int8])
def test_scatter_nd_update_dtypes(dtype):
    g = torch.Generator().manual_seed(4)
    x, upd = _rand((6, 2, 3), dtype, g), _rand((3, 2, 3), dtype, g)  # a paged [slots, N, D]
    slots = torch.tensor([[4], [0], [5]], dtype=torch.int32)
    want = scatter_nd_update_reference(x, slots, upd)
    assert torch.equal(ND(x, slots, upd), want)
    assert torch.equal(want[torch.tensor([4, 0, 5])], upd)


def test_scatter_nd_update_duplicates_write_one_of_the_updates():
    x = torch.zeros(4, 3)
    upd = torch.stack([torch.full((3,), 1.0), torch.full((3,), 2.0)])
    out = ND(x, torch.tensor([[2], [2]]), upd)
    assert torch.equal(out[2], upd[0]) or torch.equal(out[2], upd[1])
    assert torch.equal(scatter_nd_update_reference(x, torch.tensor([[2], [2]]), upd)[2], upd[1])


def test_fake_kernels():
    with FakeTensorMode():
        cache = torch.empty(2, 8, 2, 4, dtype=torch.float16)
        out = SU(cache, torch.empty(2, dtype=torch.int64), torch.empty(2, 1, 2, 4,
                                                                        dtype=torch.float16), 1)
        assert out.shape == cache.shape and out.dtype == cache.dtype
        assert SU_(cache, torch.empty(2, dtype=torch.int32),
                   torch.empty(2, 3, 2, 4, dtype=torch.float16), 1) is cache
        x = torch.empty(4, 5, 6)
        assert ND(x, torch.empty(3, 2, dtype=torch.int64), torch.empty(3, 6)).shape == x.shape
        assert ND_(x, torch.empty(3, 1, dtype=torch.int64), torch.empty(3, 5, 6)) is x


def test_registration_and_torch_npu_names():
    for name in ("scatter_update", "scatter_update_", "npu_scatter_nd_update",
                 "npu_scatter_nd_update_"):
        assert name in torchair.ops.TORCH_NPU_OPS and name in torchair.ops.__all__
        assert getattr(torchair.ops, name) is getattr(torch.ops.npu, name)
    schema = str(SU_.default._schema)
    assert "Tensor(a!) self" in schema and schema.endswith("-> Tensor(a!)")
    assert str(ND.default._schema).endswith("-> Tensor")


# ---------------------------------------------------------------- errors

def _su(**kw):
    a = dict(self=torch.zeros(2, 8, 4), indices=torch.tensor([1, 2]),
             updates=torch.zeros(2, 1, 4), axis=1)
    a.update(kw)
    return SU_(a["self"], a["indices"], a["updates"], a["axis"])


@pytest.mark.parametrize("kwargs,err,match", [
    (dict(indices=torch.tensor([-1, 2])), ValueError, r"indices\[0\]=-1 is out of range"),
    (dict(indices=torch.tensor([1, 8])), ValueError, r"indices\[1\]=8 is out of range.*"
                                                     r"p \+ 1 <= self.shape\[1\]=8"),
    (dict(updates=torch.zeros(2, 3, 4), indices=torch.tensor([6, 0])), ValueError,
     r"indices\[0\]=6 .*p \+ 3 <= self.shape\[1\]=8"),
    (dict(indices=torch.tensor([[2, 0], [1, 1]]), updates=torch.zeros(2, 1, 4)), ValueError,
     r"indices\[0\]=\[2, 0\] is out of range; expected a batch id in \[0, 2\)"),
    (dict(axis=0), ValueError, "axis=0 is dim 0, the batch dim"),
    (dict(axis=-3), ValueError, "axis=-3 is dim 0"),
    (dict(axis=3), ValueError, r"axis=3 is out of range .* \[-3, 3\)"),
    (dict(updates=torch.zeros(2, 1, 4, dtype=torch.float16)), TypeError,
     "updates has dtype torch.float16 but self has torch.float32"),
    (dict(indices=torch.tensor([1.0, 2.0])), TypeError, "indices has dtype torch.float32"),
    (dict(self=torch.zeros(2, 8, 4, dtype=torch.float64),
          updates=torch.zeros(2, 1, 4, dtype=torch.float64)), TypeError, "self has dtype"),
    (dict(updates=torch.zeros(2, 4)), ValueError, "updates has rank 2 but self has rank 3"),
    (dict(updates=torch.zeros(3, 1, 4)), ValueError, "updates.shape\\[0\\]=3"),
    (dict(updates=torch.zeros(2, 1, 5)), ValueError, "must agree on every dim but 0 and the axis"),
    (dict(updates=torch.zeros(2, 9, 4)), ValueError, "do not fit self.shape\\[1\\]=8"),
    (dict(indices=torch.zeros(2, 3, dtype=torch.int64)), ValueError, r"\[M, 2\] rows"),
    (dict(indices=torch.zeros(2, 1, 1, dtype=torch.int64)), ValueError, "indices has rank 3"),
    (dict(self=torch.zeros(8), updates=torch.zeros(1), indices=torch.tensor([1])), ValueError,
     "self has rank 1"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_scatter_update_errors(kwargs, err, match):
    with pytest.raises(err, match=match):
        _su(**kwargs)
    if "indices" in kwargs:  # the functional op checks the same
        a = dict(self=torch.zeros(2, 8, 4), updates=torch.zeros(2, 1, 4), axis=1)
        a.update(kwargs)
        with pytest.raises(err, match=match):
            SU(a["self"], a["indices"], a["updates"], a["axis"])


def test_scatter_update_error_leaves_cache_untouched():
    cache = torch.randn(2, 8, 4)
    before = cache.clone()
    with pytest.raises(ValueError):
        SU_(cache, torch.tensor([3, 8]), torch.ones(2, 1, 4), 1)
    assert torch.equal(cache, before)


@pytest.mark.parametrize("indices,updates,err,match", [
    (torch.tensor([[4, 0]]), torch.zeros(1, 6), ValueError,
     r"index row 0 of indices .* is \[4, 0\], out of range for self.shape\[:2\]=\[4, 5\]"),
    (torch.tensor([[0, -1]]), torch.zeros(1, 6), ValueError, "negative indices do not wrap"),
    (torch.tensor([1, 2]), torch.zeros(2, 5, 6), ValueError, "expected rank >= 2"),
    (torch.zeros(2, 4, dtype=torch.int64), torch.zeros(2), ValueError,
     r"indices.shape\[-1\]=4 must be in \[1, self.dim\(\)=3\]"),
    (torch.zeros(2, 1, dtype=torch.int64), torch.zeros(2, 6), ValueError,
     r"expected indices.shape\[:-1\] \+ self.shape\[1:\] = \[2, 5, 6\]"),
    (torch.zeros(2, 1, dtype=torch.int16), torch.zeros(2, 5, 6), TypeError,
     "indices has dtype torch.int16"),
    (torch.zeros(2, 1, dtype=torch.int64), torch.zeros(2, 5, 6, dtype=torch.float16), TypeError,
     "updates has dtype torch.float16"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_scatter_nd_update_errors(indices, updates, err, match):
    x = torch.zeros(4, 5, 6)
    with pytest.raises(err, match=match):
        ND_(x, indices, updates)
    assert not x.any()


def test_device_checked_kernels_never_wrap_negative_indices():
    """The CUDA-graph-capture path reads no value on the host: a negative index is sent past the
    end, so index_put_'s bounds check fails (IndexError on CPU, a device assert on CUDA) instead
    of writing the last slot."""
    from torchair.ops.cache import cpu as kernels

    cache = torch.zeros(2, 8, 4)
    with pytest.raises(IndexError):
        kernels.scatter_update_into(cache, torch.tensor([1, -1]), torch.ones(2, 1, 4), 1,
                                    device_checked=True)
    with pytest.raises(IndexError):
        kernels.scatter_update_into(cache, torch.tensor([[-1, 0]]), torch.ones(1, 1, 4), 1,
                                    device_checked=True)
    with pytest.raises(IndexError):
        kernels.scatter_nd_update_into(cache, torch.tensor([[0, -2]]), torch.ones(1, 4),
                                       device_checked=True)
    assert not cache[:, -2:].any()  # where -1 / -2 would have wrapped to: never written
    cache.zero_()
    kernels.scatter_update_into(cache, torch.tensor([6, 0]), torch.ones(2, 2, 4), 1,
                                device_checked=True)  # in range: written as usual
    assert cache.sum() == 2 * 2 * 4 and cache[0, 6:].all() and cache[1, :2].all()
