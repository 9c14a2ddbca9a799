"""npu_moe_gating_top_k_softmax: the reference against a per-row loop formula (sorted() with
ties to the lower index, finished rows -> expert E, row_idx = j * N + n), the documented example
shapes, 3-D x, eager vs compiled through torchair's backend, fake shapes, errors."""
from __future__ import annotations

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import torchair
import torchair.ops  # noqa: F401 (registers the ops)
from torchair.ops.moe.gating_softmax import moe_gating_top_k_softmax_reference

OP = torch.ops.npu.npu_moe_gating_top_k_softmax


def _loop(x, finished, k):
    """Row by row in Python floats: softmax, then the k largest (ties: lower index)."""
    e = x.shape[-1]
    rows = x.reshape(-1, e).double().tolist()
    fin = [False] * len(rows) if finished is None else finished.reshape(-1).tolist()
    n = len(rows)
    ys, ids, rids = [], [], []
    for r, (row, done) in enumerate(zip(rows, fin)):
        m = max(row)
        ex = [math.exp(v - m) for v in row]
        p = [v / sum(ex) for v in ex]
        order = sorted(range(e), key=lambda i: (-p[i], i))[:k]
        ys.append([p[i] for i in order])
        ids.append([e if done else i for i in order])
        rids.append([j * n + r for j in range(k)])
    shape = (*x.shape[:-1], k)
    return (torch.tensor(ys, dtype=torch.float64).view(shape),
            torch.tensor(ids, dtype=torch.int32).view(shape),
            torch.tensor(rids, dtype=torch.int32).view(shape))


@pytest.mark.parametrize("with_finished", [False, True])
def test_reference_matches_loop(with_finished):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 8, generator=g)
    x[1, 2] = x[1, 6] = 5.0                         # a tie: the lower index first
    finished = torch.tensor([False, True, False, True, False]) if with_finished else None
    y, idx, rid = moe_gating_top_k_softmax_reference(x, finished, 3)
    wy, widx, wrid = _loop(x, finished, 3)
    torch.testing.assert_close(y.double(), wy, rtol=1e-6, atol=1e-7)
    assert idx.dtype == torch.int32 and rid.dtype == torch.int32 and y.dtype == x.dtype
    assert torch.equal(idx, widx) and torch.equal(rid, wrid)
    assert idx[1, :2].tolist() == ([8, 8] if with_finished else [2, 6])


def test_reference_3d_and_half():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 6, generator=g).half()
    finished = torch.tensor([[True, False, False], [False, False, True]])
    y, idx, rid = moe_gating_top_k_softmax_reference(x, finished, 2)
    wy, widx, wrid = _loop(x, finished, 2)
    assert y.shape == (2, 3, 2) and y.dtype == torch.float16
    torch.testing.assert_close(y.double(), wy, rtol=1e-3, atol=1e-3)
    assert torch.equal(idx, widx) and torch.equal(rid, wrid)


def test_eager_op_matches_reference_and_documented_example():
    # torch_npu's example: x [3, 3] float32, finished [3] bool, k=2
    x = torch.rand(3, 3, generator=torch.Generator().manual_seed(2))
    finished = torch.tensor([True, False, True])
    got = OP(x, finished, k=2)
    want = moe_gating_top_k_softmax_reference(x, finished, 2)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert got[2].tolist() == [[0, 3], [1, 4], [2, 5]]
    assert got[1][0].tolist() == [3, 3] and got[1][2].tolist() == [3, 3]
    y1, idx1, rid1 = OP(x)                                # defaults: no finished, k=1
    assert y1.shape == (3, 1) and torch.equal(idx1[:, 0], x.argmax(-1).int())
    assert rid1[:, 0].tolist() == [0, 1, 2]


def _backend():
    cfg = torchair.CompilerConfig()
    cfg.debug.run_eagerly = True
    return torchair.get_npu_backend(compiler_config=cfg)


def test_compiled_matches_eager():
    def f(logits, finished):
        y, idx, rid = OP(logits * 0.5, finished, 2)
        return y * 2, idx, rid

    compiled = torch.compile(f, backend=_backend(), fullgraph=True)
    g = torch.Generator().manual_seed(3)
    for n in (4, 6):
        logits = torch.randn(n, 8, generator=g)
        finished = torch.rand(n, generator=g) < 0.5
        got, want = compiled(logits, finished), f(logits, finished)
        torch.testing.assert_close(got[0], want[0])
        assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])


def test_fake_kernel_symbolic_shapes():
    mode = FakeTensorMode(shape_env=ShapeEnv())
    with mode:
        x = mode.from_tensor(torch.randn(5, 8, dtype=torch.bfloat16), static_shapes=False)
        fin = mode.from_tensor(torch.zeros(5, dtype=torch.bool), static_shapes=False)
        y, idx, rid = OP(x, fin, 3)
        assert y.dtype == torch.bfloat16 and idx.dtype == rid.dtype == torch.int32
        assert y.shape[0] == x.shape[0] and y.shape[1] == 3 and rid.shape == idx.shape
        x3 = mode.from_tensor(torch.randn(2, 4, 8), static_shapes=False)
        assert OP(x3, None, 2)[1].dim() == 3


def test_errors_name_the_argument():
    x = torch.randn(4, 6)
    with pytest.raises(TypeError, match="x has dtype torch.int64"):
        OP(x.long(), None, 1)
    with pytest.raises(ValueError, match=r"x has shape \[24\]"):
        OP(x.view(-1), None, 1)
    with pytest.raises(ValueError, match="k=7 must be in"):
        OP(x, None, 7)
    with pytest.raises(ValueError, match="k=0 must be in"):
        OP(x, None, 0)
    with pytest.raises(TypeError, match="finished has dtype torch.int64"):
        OP(x, torch.zeros(4, dtype=torch.long), 2)
    with pytest.raises(ValueError, match=r"finished has shape \[3\]"):
        OP(x, torch.zeros(3, dtype=torch.bool), 2)
