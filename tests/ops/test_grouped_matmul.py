"""npu_grouped_matmul: the reference vs a per-row formula, the CPU loop and the sync-free masked
kernel vs the reference, split_item / group_type / group_list_type layouts, W8A8, fake kernels,
compiled vs eager, errors."""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import torchair
import torchair.ops  # noqa: F401 (registers the ops)
from torchair.ops.moe.grouped_matmul import grouped_matmul_masked, grouped_matmul_reference, plan_grouped_matmul

GMM = torch.ops.npu.npu_grouped_matmul


def _data(m=9, k=6, n=5, groups=3, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = torch.randn(groups, k, n, generator=g).to(dtype)
    return x, w, g


def _per_row(x, w, ends, bias=None):
    """Row m belongs to the first group whose end exceeds m; rows past the last end are 0."""
    out = torch.zeros(x.shape[0], w.shape[2], dtype=torch.float64)
    for m in range(x.shape[0]):
        group = next((gi for gi, end in enumerate(ends) if m < end), None)
        if group is not None:
            out[m] = x[m].double() @ w[group].double()
            if bias is not None:
                out[m] += bias[group].double()
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("counts", [[3, 2, 4], [0, 5, 2], [9, 0, 0]])
@pytest.mark.parametrize("list_type", [0, 1])
def test_reference_and_kernels_vs_per_row(dtype, counts, list_type):
    x, w, g = _data(dtype=dtype)
    bias = torch.randn(3, 5, generator=g).to(dtype)
    ends = torch.cumsum(torch.tensor(counts), 0).tolist()
    group_list = torch.tensor(ends if list_type == 0 else counts, dtype=torch.int64)
    kw = dict(bias=[bias], group_list=group_list, split_item=2, group_type=0,
              group_list_type=list_type)
    want = _per_row(x, w, ends, bias)
    ref = grouped_matmul_reference([x], [w], **kw)[0]
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(ref.double(), want, rtol=tol, atol=tol)
    assert ref.dtype == dtype and ref.shape == (9, 5)
    for got in (GMM([x], [w], **kw)[0],
                grouped_matmul_masked(plan_grouped_matmul([x], [w], **kw))[0]):
        torch.testing.assert_close(got, ref, rtol=tol, atol=tol)


def test_weight_list_equals_stacked_weight_and_split_outputs():
    x, w, _ = _data()
    gl = torch.tensor([2, 2, 7])  # group 1 empty; rows 7, 8 belong to no group
    single = GMM([x], [w], group_list=gl, split_item=3, group_type=0)[0]
    assert torch.equal(GMM([x], list(w.unbind(0)), group_list=gl, split_item=2, group_type=0)[0],
                       single)
    assert torch.equal(single[7:], torch.zeros(2, 5))
    parts = GMM([x], [w], group_list=gl, split_item=0, group_type=0)
    assert [p.shape[0] for p in parts] == [2, 0, 5]
    assert torch.equal(torch.cat(parts), single[:7])


def test_group_type_minus_one_pairs_x_and_weight():
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(2, 3, 4, generator=g), torch.randn(5, 6, generator=g)]
    ws = [torch.randn(4, 7, generator=g), torch.randn(6, 2, generator=g)]
    outs = GMM(xs, ws, split_item=0, group_type=-1)
    for o, a, b in zip(outs, xs, ws):
        torch.testing.assert_close(o, a @ b)
    xs2 = [torch.randn(2, 4, generator=g), torch.randn(3, 4, generator=g)]
    ws2 = [torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g)]
    cat = GMM(xs2, ws2, split_item=2, group_type=-1)
    assert len(cat) == 1
    torch.testing.assert_close(cat[0], torch.cat([xs2[0] @ ws2[0], xs2[1] @ ws2[1]]))


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_w8a8_per_channel_and_per_token_scales(out_dtype):
    g = torch.Generator().manual_seed(2)
    x = torch.randint(-128, 128, (7, 16), generator=g, dtype=torch.int8)
    w = torch.randint(-128, 128, (2, 16, 4), generator=g, dtype=torch.int8)
    scale = torch.rand(2, 4, generator=g) * 0.01
    pts = torch.rand(7, generator=g) + 0.5
    got = GMM([x], [w], scale=[scale], per_token_scale=[pts], group_list=torch.tensor([3, 7]),
              split_item=2, group_type=0, output_dtype=out_dtype)[0]
    want = torch.empty(7, 4, dtype=torch.float64)
    for m in range(7):
        e = 0 if m < 3 else 1
        acc = (x[m].long()[:, None] * w[e].long()).sum(0)  # exact integer products
        want[m] = acc.double() * scale[e].double() * float(pts[m])
    assert got.dtype == out_dtype
    torch.testing.assert_close(got.double(), want, rtol=1e-2, atol=1e-3)


def test_fake_kernel_shapes():
    with FakeTensorMode():
        x, w = torch.empty(9, 6), torch.empty(3, 6, 5)
        gl = torch.empty(3, dtype=torch.int64)
        out = GMM([x], [w], group_list=gl, split_item=2, group_type=0)
        assert len(out) == 1 and out[0].shape == (9, 5)
        q = GMM([torch.empty(9, 6, dtype=torch.int8)], [torch.empty(3, 6, 5, dtype=torch.int8)],
                scale=[torch.empty(3, 5)], group_list=gl, split_item=3, group_type=0,
                output_dtype=torch.bfloat16)
        assert q[0].dtype == torch.bfloat16 and q[0].shape == (9, 5)
        pairs = GMM([torch.empty(2, 3, 4), torch.empty(5, 6)],
                    [torch.empty(4, 7), torch.empty(6, 2)], split_item=0, group_type=-1)
        assert [tuple(p.shape) for p in pairs] == [(2, 3, 7), (5, 2)]
    with FakeTensorMode(shape_env=ShapeEnv()):  # one output per group: rows from the values
        parts = GMM([torch.empty(9, 6)], [torch.empty(3, 6, 5)],
                    group_list=torch.empty(3, dtype=torch.int64), split_item=0, group_type=0)
        assert len(parts) == 3 and all(isinstance(p.shape[0], torch.SymInt) for p in parts)


def test_compiled_equals_eager():
    torch._dynamo.reset()
    cfg = torchair.CompilerConfig()
    cfg.debug.run_eagerly = True

    def fn(x, w, counts):
        return GMM([x], [w], group_list=counts, split_item=2, group_type=0,
                   group_list_type=1)[0] * 2

    compiled = torch.compile(fn, backend=torchair.get_npu_backend(compiler_config=cfg),
                             dynamic=True, fullgraph=True)
    x, w, _ = _data()
    for counts in ([3, 2, 4], [1, 0, 6]):
        c = torch.tensor(counts)
        torch.testing.assert_close(compiled(x, w, c), fn(x, w, c))


X, W = torch.randn(4, 3), torch.randn(2, 3, 5)
GL = torch.tensor([1, 4])


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(group_list=GL), ValueError, "group_type is None; torch_npu requires it"),
    (dict(group_list=GL, group_type=2), NotImplementedError, "group_type=2"),
    (dict(group_list=GL, group_type=0, offset=[torch.zeros(5)]), NotImplementedError, "offset"),
    (dict(group_list=GL, group_type=0, antiquant_scale=[torch.ones(5)]), NotImplementedError,
     "antiquant_scale"),
    (dict(group_list=GL, group_type=0, act_type=1), NotImplementedError, "act_type=1"),
    (dict(group_list=GL.int(), group_type=0), ValueError, "group_list must be a 1-D int64"),
    (dict(group_type=0), ValueError, "group_type=0 needs group_list"),
    (dict(group_list=GL, group_type=0, split_item=5), ValueError, "split_item=5"),
    (dict(group_list=GL, group_type=0, output_dtype=torch.float16), ValueError, "output_dtype"),
    (dict(group_list=GL, group_type=0, scale=[torch.ones(2, 5)]), ValueError,
     "scale applies to int8"),
    (dict(group_list=torch.tensor([3, 2]), group_type=0, split_item=2), ValueError,
     "decreasing"),
    (dict(group_list=torch.tensor([1, 9]), group_type=0, split_item=2), ValueError,
     "outside x's 4 rows"),
])
def test_errors_name_the_argument(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        GMM([X], [W], **kwargs)


def test_w8a8_errors():
    xq, wq = torch.zeros(4, 3, dtype=torch.int8), torch.zeros(2, 3, 5, dtype=torch.int8)
    with pytest.raises(NotImplementedError, match="output_dtype=None"):
        GMM([xq], [wq], scale=[torch.ones(2, 5)], group_list=GL, group_type=0)
    with pytest.raises(ValueError, match="need scale"):
        GMM([xq], [wq], group_list=GL, group_type=0, output_dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="W8A8 needs int8 weights"):
        GMM([xq], [W], scale=[torch.ones(2, 5)], group_list=GL, group_type=0,
            output_dtype=torch.bfloat16)
