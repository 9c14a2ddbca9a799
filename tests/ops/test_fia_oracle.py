"""npu_fused_infer_attention_score against an independent float64 formula, on a sampled grid.

The oracle loops over batch, head and query row and builds each row's attended KV positions from
the sparse-mode rules written out in the op's docstring; it shares no code with torchair (the
layout/paging builders come from ``test_ifa_oracle``).
"""
from __future__ import annotations

import itertools
import random

import pytest
import torch
from test_ifa_oracle import _scatter_like, from_layout, paged_cache, to_layout

import torchair.ops  # noqa: F401 (registers the ops)
from torchair.ops.attention import fused_infer_attention_score as fia_module
from torchair.ops.attention.fused_infer_attention_score import fused_infer_attention_score_reference

OP = torch.ops.npu.npu_fused_infer_attention_score
INT_MAX = 2147483647
B, N, D, S_KV = 2, 4, 16, 32
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5),
       torch.float16: dict(atol=3e-3, rtol=3e-3),
       torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def fia_expected(q, k, v, scale, *, mode=0, pre=INT_MAX, nxt=INT_MAX, mask=None, q_lens=None,
                 kv_lens=None, pads=None, pse=None):
    """float64 ``(out [B, N, S_q, D], lse [B, N, S_q, 1])``; k/v the logical dequantized KV."""
    q, k, v = q.double(), k.double(), v.double()
    b_, n_, s_q, d_ = q.shape
    n_kv, s_kv = k.shape[1], k.shape[2]
    if mask is not None:
        mask = mask.bool().expand(b_, n_, s_q, s_kv)
    if pse is not None:
        pse = pse.double().expand(b_, n_, s_q, s_kv)
    out = torch.zeros(b_, n_, s_q, d_, dtype=torch.float64)
    lse = torch.full((b_, n_, s_q, 1), float("-inf"), dtype=torch.float64)
    for b in range(b_):
        if kv_lens is None:
            lo, hi = 0, s_kv
        elif pads is None:
            lo, hi = 0, min(kv_lens[b], s_kv)
        else:
            hi = s_kv - max(pads[b], 0)
            lo = hi - kv_lens[b]
            if lo < 0:
                lo = hi = 0
        sq_b = s_q if q_lens is None else q_lens[b]
        skv_b = hi - lo
        for h in range(n_):
            kvh = h // (n_ // n_kv)
            for i in range(sq_b):
                cols = [p for p in range(lo, hi) if _keep(
                    mode, pre, nxt, None if mask is None else mask[b, h, i, p], i, p - lo,
                    sq_b, skv_b)]
                if not cols:
                    continue
                scores = k[b, kvh, cols] @ q[b, h, i] * scale
                if pse is not None:
                    scores = scores + pse[b, h, i, cols]
                lse[b, h, i, 0] = torch.logsumexp(scores, 0)
                out[b, h, i] = torch.softmax(scores, 0) @ v[b, kvh, cols]
    return out, lse


def _keep(mode, pre, nxt, masked, i, j, sq_b, skv_b):
    """Whether row ``i`` attends relative KV position ``j`` (the docstring's sparse rules)."""
    if mode in (0, 1) and masked is not None and bool(masked):
        return False
    if mode == 0:  # the band only with a mask (Ascend: without one, pre/next are ignored)
        return masked is None or i - pre <= j <= i + nxt
    if mode == 2:
        return j <= i
    if mode == 3:
        return j <= i + skv_b - sq_b
    if mode == 4:
        return -pre <= j - (i + skv_b - sq_b) <= nxt
    return True


SPARSE = [(0, INT_MAX, INT_MAX, False), (0, INT_MAX, INT_MAX, True), (0, 3, 1, False),
          (0, 2, 0, True), (1, 0, 0, True), (2, 0, 0, False), (3, 0, 0, False),
          (4, 4, 0, False), (4, 1, 3, False)]
AXES = dict(s_q=[1, 5], layout=["BSH", "BNSD", "BSND"], n_kv=[4, 2, 1], sparse=SPARSE,
            q_lens=[False, True], kv_lens=["none", "per_batch", "single", "left"],
            kv=["dense", "paged3", "paged4"],
            quant=["none", "ch", "ch_sep", "tok", "tok_sep_v"], int8_out=[False, True],
            lse=[False, True], pse=[False, True],
            dtype=[torch.float32, torch.float16, torch.bfloat16])


def _grid(count=150, seed=1234):
    rng = random.Random(seed)
    cases = []
    # every value of every axis appears at least once (one case per value), then random points
    for axis, values in AXES.items():
        for value in values:
            point = {a: rng.choice(v) for a, v in AXES.items()}
            point[axis] = value
            cases.append(point)
    while len(cases) < count:
        cases.append({a: rng.choice(v) for a, v in AXES.items()})
    out = []
    for i, c in enumerate(cases):
        if c["kv"] == "paged4":
            c["layout"] = "BNSD"  # a (blocknum, N_kv, bs, D) cache needs BNSD
        if c["kv"] != "dense" and c["kv_lens"] == "none":
            c["kv_lens"] = "per_batch"  # page attention needs actual_seq_lengths_kv
        c["seed"] = i
        out.append(c)
    return out


def _ids(c):
    mode, pre, nxt, m = c["sparse"]
    return (f"sq{c['s_q']}-{c['layout']}-kv{c['n_kv']}-m{mode}p{min(pre, 99)}n{min(nxt, 99)}"
            f"{'M' if m else ''}-q{int(c['q_lens'])}-{c['kv_lens']}-{c['kv']}-{c['quant']}-"
            f"o{int(c['int8_out'])}-l{int(c['lse'])}-pse{int(c['pse'])}-{str(c['dtype'])[6:]}-"
            f"{c['seed']}")


def _quant_shapes(layout, n_kv):
    return {"BNSD": (1, n_kv, 1, D), "BSH": (1, n_kv * D), "BSND": (1, n_kv, D)}[layout]


def build(c):
    """``(args, kwargs, want_out, want_lse)`` of one grid point."""
    g = torch.Generator().manual_seed(c["seed"])
    dtype, layout, n_kv, s_q = c["dtype"], c["layout"], c["n_kv"], c["s_q"]
    mode, pre, nxt, masked = c["sparse"]
    q = torch.randn(B, N, s_q, D, generator=g).to(dtype)
    kw = dict(num_heads=N, num_key_value_heads=n_kv, input_layout=layout, scale=0.3,
              sparse_mode=mode, pre_tokens=pre, next_tokens=nxt, softmax_lse_flag=c["lse"])
    quant = c["quant"]
    if quant == "none":
        k_st = torch.randn(B, n_kv, S_KV, D, generator=g).to(dtype)
        v_st = torch.randn(B, n_kv, S_KV, D, generator=g).to(dtype)
        k_log, v_log = k_st, v_st
    else:
        k_st, v_st = (torch.randint(-128, 128, (B, n_kv, S_KV, D), generator=g).to(torch.int8)
                      for _ in range(2))
        per_tok = {"k": quant == "tok", "v": quant in ("tok", "tok_sep_v")}
        params = {}
        for name in ("k", "v"):
            shape = (B, S_KV) if per_tok[name] else (n_kv, D)
            params[name] = ((torch.rand(shape, generator=g) * 0.02 + 0.01).to(dtype),
                            torch.randint(-8, 8, shape, generator=g).to(dtype))

        def deq(x, name):
            s, o = (t.double() for t in params[name])
            if per_tok[name]:
                return (x.double() + o[:, None, :, None]) * s[:, None, :, None]
            return (x.double() + o[None, :, None, :]) * s[None, :, None, :]
        k_log, v_log = deq(k_st, "k"), deq(v_st, "v")
        if quant in ("ch", "tok"):
            shape = (2, B, S_KV) if quant == "tok" else (2,) + _quant_shapes(layout, n_kv)[1:]
            kw.update(antiquant_mode=int(quant == "tok"),
                      antiquant_scale=torch.stack([params["k"][0], params["v"][0]]).reshape(shape),
                      antiquant_offset=torch.stack([params["k"][1], params["v"][1]]).reshape(shape))
        else:
            for name, full in (("k", "key"), ("v", "value")):
                shape = (1, B, S_KV) if per_tok[name] else _quant_shapes(layout, n_kv)
                kw[f"{full}_antiquant_mode"] = int(per_tok[name])
                kw[f"{full}_antiquant_scale"] = params[name][0].reshape(shape)
                kw[f"{full}_antiquant_offset"] = params[name][1].reshape(shape)
    if c["kv"] == "dense":
        key, value = to_layout(k_st, layout), to_layout(v_st, layout)
    else:
        block_size = 32 if quant != "none" else 16
        key, table = paged_cache(k_st, block_size, c["kv"], g)
        value = _scatter_like(v_st, table, block_size, c["kv"], key.shape[0])
        kw.update(block_table=table, block_size=block_size)
    kv_lens = pads = None
    if c["kv_lens"] != "none":
        kv_lens = {"per_batch": [20, S_KV], "single": [11], "left": [9, 20]}[c["kv_lens"]]
        kw["actual_seq_lengths_kv"] = kv_lens
        kv_lens = kv_lens * B if len(kv_lens) == 1 else kv_lens
    if c["kv_lens"] == "left":
        pads = [4, S_KV - 15]  # batch 1: start = 15 - 20 < 0 -> nothing attended
        kw["kv_padding_size"] = torch.tensor(pads, dtype=torch.int64)
    q_lens = None
    if c["q_lens"]:
        q_lens = [s_q - 2, s_q] if s_q > 1 else [1, 0]
        kw["actual_seq_lengths"] = q_lens
    mask = None
    if masked:
        if mode == 1:
            mask = torch.rand(B, N, s_q, S_KV, generator=g) < 0.3
        elif s_q > 1:
            mask = torch.rand(s_q, S_KV, generator=g) < 0.3  # prompt 2-D [S_q, S_kv]
        else:
            mask = torch.rand(B, S_KV, generator=g) < 0.3  # incremental 2-D [B, S_kv]
        kw["atten_mask"] = mask.to(torch.int8) if c["seed"] % 2 else mask
        mask = mask.view(1, 1, s_q, S_KV) if mask.dim() == 2 and s_q > 1 else (
            mask.view(B, 1, 1, S_KV) if mask.dim() == 2 else mask)
    pse = None
    if c["pse"]:
        pse = torch.randn(1, N, s_q, S_KV, generator=g).to(dtype)
        kw["pse_shift"] = pse
    want, lse = fia_expected(q.double(), k_log, v_log, 0.3, mode=mode, pre=pre, nxt=nxt,
                             mask=mask, q_lens=q_lens, kv_lens=kv_lens, pads=pads, pse=pse)
    if c["int8_out"]:
        qs = torch.rand(N * D, generator=g) * 20 + 30
        qo = torch.randn(N * D, generator=g).round()
        kw.update(quant_scale2=qs, quant_offset2=qo)
        y = torch.round(want * qs.double().view(1, N, 1, D) + qo.double().view(1, N, 1, D))
        valid = torch.ones(B, 1, s_q, 1, dtype=torch.bool)
        if q_lens is not None:
            for b in range(B):
                valid[b, :, q_lens[b]:] = False
        want = torch.where(valid, y.clamp(-128, 127), 0.0)
    return (to_layout(q, layout), key, value), kw, want, lse


def check(c, out, lse, want, want_lse, kw):
    got = from_layout(out, c["layout"]).double()
    if c["int8_out"]:
        assert out.dtype == torch.int8
        diff = (got - want).abs()
        assert diff.max() <= 1, f"int8 output off by {diff.max()}"
        assert (diff == 0).float().mean() >= (0.7 if c["dtype"] == torch.bfloat16 else 0.9)
    else:
        assert out.dtype == c["dtype"]
        torch.testing.assert_close(got, want, **TOL[c["dtype"]])
    if kw["softmax_lse_flag"]:
        assert lse.dtype == torch.float32 and lse.shape == (B, N, c["s_q"], 1)
        torch.testing.assert_close(lse.double(), want_lse, atol=2e-4, rtol=2e-4)
    else:
        assert lse.shape == (0,) and lse.dtype == torch.float32


GRID = _grid()


@pytest.mark.parametrize("c", GRID, ids=[_ids(c) for c in GRID])
def test_grid_reference_and_op(c):
    args, kw, want, want_lse = build(c)
    out, lse = fused_infer_attention_score_reference(*args, **kw)
    check(c, out, lse, want, want_lse, kw)
    out2, lse2 = OP(*args, **kw)
    check(c, out2, lse2, want, want_lse, kw)


def test_incremental_uses_the_decode_kernel(monkeypatch):
    calls = []
    real = fia_module._compute.decode_path
    monkeypatch.setattr(fia_module._compute, "decode_path",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    eligible = [c for c in GRID if c["s_q"] == 1 and not c["pse"] and not c["lse"]
                and c["quant"] in ("none", "ch", "ch_sep") and c["sparse"][0] != 1]
    assert len(eligible) >= 5
    for c in eligible:
        args, kw, want, want_lse = build(c)
        out, lse = OP(*args, **kw)
        check(c, out, lse, want, want_lse, kw)
    assert len(calls) == len(eligible)


def test_lse_with_the_query_dtype_and_fully_masked_rows():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 3, 16, generator=g)
    k = torch.randn(1, 2, 5, 16, generator=g)
    mask = torch.zeros(1, 1, 3, 5, dtype=torch.bool)
    mask[0, 0, 1] = True  # row 1 fully masked
    out, lse = OP(q, k, k, atten_mask=mask, num_heads=2, input_layout="BNSD",
                  softmax_lse_flag=True)
    assert (out[:, :, 1] == 0).all() and torch.isneginf(lse[:, :, 1]).all()
    scores = (q @ k.transpose(-1, -2)).masked_fill(mask, float("-inf"))
    torch.testing.assert_close(lse[:, :, [0, 2]], torch.logsumexp(scores, -1, True)[:, :, [0, 2]])
    assert not out.isnan().any()


def test_compressed_causal_mask_is_ignored_for_modes_2_to_4():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 4, 16, generator=g), torch.randn(1, 2, 6, 16, generator=g)
    comp = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)
    for mode in (2, 3, 4):
        kw = dict(num_heads=2, input_layout="BNSD", sparse_mode=mode, pre_tokens=2,
                  next_tokens=0)
        a, _ = OP(q, k, k, atten_mask=comp, **kw)
        b, _ = OP(q, k, k, **kw)
        assert torch.equal(a, b)


def test_grid_covers_every_axis_value():
    for axis, values in AXES.items():
        seen = {repr(c[axis]) for c in GRID}
        assert all(repr(v) in seen for v in values if not (axis == "kv_lens" and v == "none")), axis
    assert len(list(itertools.islice(GRID, 0, None))) >= 100


@pytest.mark.parametrize("pre,nxt", [(0, 0), (1, 2), (-1, 3)])
def test_default_mask_mode_without_a_mask_ignores_the_band(pre, nxt):
    """Ascend's sparse_mode 0 (defaultMask): without atten_mask nothing is masked and pre/next
    are ignored (ops-transformer's sparse-mode doc); with a mask the band applies as well."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, s, 16, generator=g) for s in (4, 6, 6))
    kw = dict(num_heads=2, input_layout="BNSD", scale=0.25, sparse_mode=0, pre_tokens=pre,
              next_tokens=nxt)
    out, _ = torch.ops.npu.npu_fused_infer_attention_score(q, k, v, **kw)
    full = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.25)
    torch.testing.assert_close(out, full, rtol=1e-5, atol=1e-5)
    keep_all = torch.zeros(4, 6, dtype=torch.bool)  # a mask that masks nothing: the band remains
    out, _ = torch.ops.npu.npu_fused_infer_attention_score(q, k, v, atten_mask=keep_all, **kw)
    i, j = torch.arange(4).view(-1, 1), torch.arange(6).view(1, -1)
    band = (j >= i - pre) & (j <= i + nxt)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=band, scale=0.25)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
