"""npu_moe_gating_top_k, npu_moe_init_routing, npu_moe_compute_expert_tokens,
npu_moe_finalize_routing: references vs independent (loop) formulas, the documented examples,
eager vs compiled through torchair's backend, fake kernels, errors."""
from __future__ import annotations

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import torchair
import torchair.ops  # noqa: F401 (registers the ops)
from torchair.ops.moe.gating import moe_gating_top_k_reference
from torchair.ops.moe.routing import compute_expert_tokens_reference, finalize_routing_reference, init_routing_reference

GATING = torch.ops.npu.npu_moe_gating_top_k
INIT = torch.ops.npu.npu_moe_init_routing
TOKENS = torch.ops.npu.npu_moe_compute_expert_tokens
FINAL = torch.ops.npu.npu_moe_finalize_routing


def _row_idx(n, k):
    return torch.arange(n * k, dtype=torch.int32).view(k, n).t().contiguous()


def _topk_ids(n, k, e, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(n)]).to(torch.int32)



# ---------------------------------------------------------------- init routing -------------------

def test_init_routing_documented_example_by_hand():
    # the torch_npu example: 3 tokens, top-2; worked by hand from the documented formula
    x = torch.tensor([[0.1] * 4, [0.2] * 4, [0.3] * 4])
    row_idx = torch.tensor([[0, 3], [1, 4], [2, 5]], dtype=torch.int32)
    expert_idx = torch.tensor([[1, 2], [0, 1], [0, 2]], dtype=torch.int32)
    ex, eri, eei = INIT(x, row_idx, expert_idx, 3)
    # experts sorted (token order within an expert): e0 <- t1, t2; e1 <- t0, t1; e2 <- t0, t2
    assert eei.tolist() == [0, 0, 1, 1, 2, 2]
    assert ex[:, 0].tolist() == pytest.approx([0.2, 0.3, 0.1, 0.2, 0.1, 0.3])
    # source k*N+n -> position: (t0,k0)=0 -> 2, (t1,k0)=1 -> 0, (t2,k0)=2 -> 1,
    #                           (t0,k1)=3 -> 4, (t1,k1)=4 -> 3, (t2,k1)=5 -> 5
    assert eri.tolist() == [2, 0, 1, 4, 3, 5]
    assert eri.dtype == eei.dtype == torch.int32


@pytest.mark.parametrize("n,k,e,active", [(5, 2, 4, 5), (7, 3, 6, 7), (6, 2, 3, 4), (1, 1, 2, 1)])
def test_init_routing_reference_vs_loops(n, k, e, active):
    g = torch.Generator().manual_seed(n * 10 + k)
    x = torch.randn(n, 8, generator=g)
    expert_idx = _topk_ids(n, k, e, seed=n + k)
    ex, eri, eei = init_routing_reference(x, _row_idx(n, k), expert_idx, active)
    order = [(tok, c) for ex_id in range(e) for tok in range(n) for c in range(k)
             if int(expert_idx[tok, c]) == ex_id]  # experts ascending, tokens in order
    assert eei.tolist() == [int(expert_idx[t, c]) for t, c in order]
    for pos, (t, c) in enumerate(order):
        assert int(eri[c * n + t]) == pos
    assert ex.shape == (min(n, active) * k, 8)
    want = torch.stack([x[t] for t, _ in order[:min(n, active) * k]])
    assert torch.equal(ex, want)
    got = INIT(x, _row_idx(n, k), expert_idx, active)
    for a, b in zip(got, (ex, eri, eei)):
        assert torch.equal(a, b)


# ---------------------------------------------------------------- expert tokens ------------------

def test_compute_expert_tokens_documented_example_and_bincount():
    out = TOKENS(torch.tensor([3, 3, 4, 5, 6, 7], dtype=torch.int32), 5)
    assert out.tolist() == [0, 0, 0, 2, 3] and out.dtype == torch.int32
    ids = torch.sort(_topk_ids(9, 3, 6).reshape(-1)).values
    want = torch.cumsum(torch.bincount(ids.long(), minlength=6), 0)
    assert TOKENS(ids, 6).tolist() == want.tolist()
    assert compute_expert_tokens_reference(ids, 6).tolist() == want.tolist()


# ---------------------------------------------------------------- finalize -----------------------

def _finalize_loops(rows, skip1, skip2, bias, scales, src_to_dst, experts):
    n, k = experts.shape
    out = torch.zeros(n, rows.shape[1], dtype=torch.float64)
    for i in range(n):
        if skip1 is not None:
            out[i] += skip1[i].double()
        if skip2 is not None:
            out[i] += skip2[i].double()
        for c in range(k):
            term = rows[int(src_to_dst[c * n + i])].double()
            if bias is not None:
                term = term + bias[int(experts[i, c])].double()
            out[i] += (1.0 if scales is None else float(scales[i, c])) * term
    return out


@pytest.mark.parametrize("with_skips,with_bias,with_scales", [
    (True, True, True), (False, False, True), (True, False, False), (False, True, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_finalize_reference_vs_loops(with_skips, with_bias, with_scales, dtype):
    n, k, e, h = 5, 3, 6, 8
    g = torch.Generator().manual_seed(3)
    experts = _topk_ids(n, k, e, seed=4)
    _, eri, _ = init_routing_reference(torch.zeros(n, h), _row_idx(n, k), experts, n)
    rows = torch.randn(n * k, h, generator=g).to(dtype)
    skip1 = torch.randn(n, h, generator=g).to(dtype) if with_skips else None
    skip2 = torch.randn(n, h, generator=g).to(dtype) if with_skips else None
    bias = torch.randn(e, h, generator=g).to(dtype) if with_bias else None
    scales = torch.rand(n, k, generator=g).to(dtype) if with_scales else None
    args = (rows, skip1, skip2, bias, scales, eri, experts)
    got = finalize_routing_reference(*args)
    want = _finalize_loops(*args)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    assert got.dtype == dtype and torch.equal(FINAL(*args), got)


def test_init_then_finalize_restores_tokens():
    # finalize of the unchanged expanded rows with weights summing to 1 gives back x
    n, k, e = 6, 2, 5
    x = torch.randn(n, 4)
    experts = _topk_ids(n, k, e, seed=9)
    ex, eri, _ = INIT(x, _row_idx(n, k), experts, n)
    scales = torch.full((n, k), 1.0 / k)
    out = FINAL(ex, None, None, None, scales, eri, experts)
    torch.testing.assert_close(out, x)


# ---------------------------------------------------------------- gating top-k -------------------

def _gating_loops(x, k, bias, k_group, group_count, mode, norm_type, scale, eps):
    """Per token in plain Python floats."""
    ys, ids = [], []
    n, e = x.shape
    for row in x.double().tolist():
        if norm_type == 0:
            m = max(row)
            ex = [math.exp(v - m) for v in row]
            norm = [v / sum(ex) for v in ex]
        else:
            norm = [1.0 / (1.0 + math.exp(-v)) for v in row]
        sel = [v + (0.0 if bias is None else float(bias[j])) for j, v in enumerate(norm)]
        size = e // group_count
        if group_count > 1:
            scores = []
            for gi in range(group_count):
                grp = sorted(sel[gi * size:(gi + 1) * size], reverse=True)
                scores.append(grp[0] if mode == 0 else grp[0] + grp[1])
            kept = sorted(range(group_count), key=lambda gi: (-scores[gi], gi))[:k_group]
            sel = [v if j // size in kept else -math.inf for j, v in enumerate(sel)]
        chosen = sorted(range(e), key=lambda j: (-sel[j], j))[:k]
        w = [norm[j] for j in chosen]
        total = sum(w) + eps
        ys.append([v / total * scale for v in w])
        ids.append(chosen)
    return torch.tensor(ys, dtype=torch.float64), ids


@pytest.mark.parametrize("case", [
    dict(k=2, k_group=1, group_count=1, group_select_mode=0, norm_type=0),
    dict(k=3, k_group=1, group_count=1, group_select_mode=0, norm_type=1, bias=True),
    dict(k=4, k_group=2, group_count=4, group_select_mode=1, norm_type=1, bias=True,
         routed_scaling_factor=2.5),  # DeepSeek-V3 style: sigmoid, biased choice, top-2 sums
    dict(k=2, k_group=3, group_count=4, group_select_mode=0, norm_type=0),
])
def test_gating_reference_vs_loops(case):
    case = dict(case)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(7, 16, generator=g) * 2
    bias = torch.randn(16, generator=g) * 0.5 if case.pop("bias", False) else None
    y, idx, out = moe_gating_top_k_reference(x, bias=bias, **case)
    want_y, want_idx = _gating_loops(x, case["k"], bias, case["k_group"], case["group_count"],
                                     case["group_select_mode"], case["norm_type"],
                                     case.get("routed_scaling_factor", 1.0), 1e-20)
    assert idx.tolist() == want_idx and idx.dtype == torch.int32
    torch.testing.assert_close(y.double(), want_y, rtol=1e-5, atol=1e-6)
    want_norm = torch.softmax(x, -1) if case["norm_type"] == 0 else torch.sigmoid(x)
    torch.testing.assert_close(out, want_norm)
    got = GATING(x, bias=bias, **case)
    for a, b in zip(got, (y, idx, out)):
        assert torch.equal(a, b)


def test_gating_bias_chooses_but_does_not_weigh():
    x = torch.zeros(1, 4)  # equal scores: the bias alone decides
    bias = torch.tensor([0.0, 0.0, 5.0, 1.0])
    y, idx, _ = GATING(x, 2, bias=bias, norm_type=1)
    assert idx.tolist() == [[2, 3]]
    torch.testing.assert_close(y, torch.tensor([[0.5, 0.5]]))  # sigmoid(0) each, renormalized


def test_gating_half_precision_output_dtype():
    x = torch.randn(3, 8).to(torch.bfloat16)
    y, idx, out = GATING(x, 2)
    assert y.dtype == torch.bfloat16 and out.dtype == torch.float32 and idx.shape == (3, 2)


# ---------------------------------------------------------------- compiled -----------------------

def test_ops_compiled_equal_eager_with_symbolic_shapes():
    def routing(logits, x, bias):
        n = x.shape[0]
        w, ids, _ = GATING(logits, 2, bias=bias, k_group=2, group_count=4, group_select_mode=1,
                           norm_type=1)
        row_idx = torch.arange(n * 2, dtype=torch.int32).view(2, n).t().contiguous()
        ex, eri, eei = INIT(x, row_idx, ids, n)
        counts = TOKENS(eei, 8)
        return FINAL(ex * 2, None, None, None, w, eri, ids), counts

    compiled = torch.compile(routing, backend=_backend(), dynamic=True, fullgraph=True)
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    bias = torch.randn(8, generator=g)
    for n in (3, 5):
        logits, x = torch.randn(n, 8, generator=g), torch.randn(n, 6, generator=g)
        got, want = compiled(logits, x, bias), routing(logits, x, bias)
        torch.testing.assert_close(got[0], want[0])
        assert torch.equal(got[1], want[1])


def _backend():
    cfg = torchair.CompilerConfig()
    cfg.debug.run_eagerly = True
    return torchair.get_npu_backend(compiler_config=cfg)


def test_fake_kernels_symbolic_shapes():
    mode = FakeTensorMode(shape_env=ShapeEnv())
    with mode:
        n = 5
        x = mode.from_tensor(torch.randn(n, 8), static_shapes=False)
        logits = mode.from_tensor(torch.randn(n, 16), static_shapes=False)
        y, ids, out = GATING(logits, 3)
        assert y.shape[1] == 3 and ids.dtype == torch.int32 and out.dtype == torch.float32
        rows = x.shape[0]
        expert_idx = mode.from_tensor(torch.zeros(n, 3, dtype=torch.int32), static_shapes=False)
        row_idx = mode.from_tensor(torch.zeros(n, 3, dtype=torch.int32), static_shapes=False)
        ex, eri, eei = INIT(x, row_idx, expert_idx, rows)
        assert ex.shape[1] == 8 and str(ex.shape[0]) == str(eri.shape[0])  # rows * k, symbolic
        assert TOKENS(eei, 16).shape == (16,)
        scales = mode.from_tensor(torch.zeros(n, 3), static_shapes=False)
        assert FINAL(ex, None, None, None, scales, eri, expert_idx).shape[1] == 8


# ---------------------------------------------------------------- errors -------------------------

@pytest.mark.parametrize("call,exc,match", [
    (lambda: GATING(torch.randn(2, 8), 9), ValueError, r"k=9 must be in \[1"),
    (lambda: GATING(torch.randn(2, 8), 2, group_count=3), ValueError, "group_count=3"),
    (lambda: GATING(torch.randn(2, 8), 2, renorm=1), NotImplementedError, "renorm=1"),
    (lambda: GATING(torch.randn(2, 8), 2, norm_type=2), ValueError, "norm_type=2"),
    (lambda: GATING(torch.randn(2, 8), 2, bias=torch.randn(7)), ValueError, "bias must have"),
    (lambda: GATING(torch.randn(2, 2, 8), 2), ValueError, "x must be 2-D"),
    (lambda: INIT(torch.randn(3, 4), _row_idx(3, 2).long(), _topk_ids(3, 2, 4), 3), TypeError,
     "row_idx must be int32"),
    (lambda: INIT(torch.randn(3, 4), _row_idx(2, 3), _topk_ids(3, 2, 4), 3), ValueError,
     "row_idx must have expert_idx's shape"),
    (lambda: INIT(torch.randn(3, 4), _row_idx(3, 2), _topk_ids(3, 2, 4), -1), ValueError,
     "active_num=-1"),
    (lambda: TOKENS(torch.zeros(4, dtype=torch.int64), 3), TypeError, "must be int32"),
    (lambda: TOKENS(torch.zeros(4, dtype=torch.int32), 0), ValueError, "num_expert=0"),
    (lambda: FINAL(torch.randn(6, 4), None, None, None, torch.rand(3, 2),
                   torch.arange(6, dtype=torch.int32), None, 1), NotImplementedError,
     "drop_pad_mode=1"),
    (lambda: FINAL(torch.randn(6, 4), torch.randn(3, 4), None, None, torch.rand(3, 2),
                   torch.arange(6, dtype=torch.int32), None), ValueError, "skip1 was given"),
    (lambda: FINAL(torch.randn(6, 4), None, None, torch.randn(4, 4), torch.rand(3, 2),
                   torch.arange(6, dtype=torch.int32), None), ValueError,
     "bias .* needs export_for_source_row"),
    (lambda: FINAL(torch.randn(6, 4), None, None, None, torch.rand(3, 3),
                   torch.arange(6, dtype=torch.int32), None), ValueError, "expected N \\* K"),
])
def test_errors_name_the_argument(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_fake_kernel_raises_the_same_error():
    with FakeTensorMode():
        with pytest.raises(ValueError, match=r"k=9 must be in \[1"):
            GATING(torch.empty(2, 8), 9)
        with pytest.raises(ValueError, match="active_num=-1"):
            INIT(torch.empty(3, 4), torch.empty(3, 2, dtype=torch.int32),
                 torch.empty(3, 2, dtype=torch.int32), -1)
