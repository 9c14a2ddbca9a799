"""npu_fused_infer_attention_score with a shared KV prefix (key_shared_prefix,
value_shared_prefix, actual_shared_prefix_len): the int-list op, its tensor twin and TorchAir's
tensor form against an independent formula (explicit concatenation per batch, then SDPA with an
explicit mask), against the op without a prefix on concatenated KV, the fast decode path against
the reference, int8 KV, path 4 sinking the prefix length, and the errors."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend

import torchair
import torchair.ops
from torchair.ops import get_value_dependent
from torchair.ops.attention.fused_infer_attention_score import fused_infer_attention_score_reference

OP = torch.ops.npu.npu_fused_infer_attention_score
TWIN = torch.ops.npu.npu_fused_infer_attention_score_tensor
B, N, N_KV, D, S_KV, S_P = 2, 4, 2, 16, 6, 5
SCALE = 0.3


def _make(layout, s_q, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)

    def t(batch, heads, s):
        x = torch.randn(batch, heads, s, D, generator=g).to(dtype)  # BNSD
        if layout == "BNSD":
            return x
        x = x.transpose(1, 2).contiguous()
        return x.reshape(batch, s, heads * D) if layout == "BSH" else x
    return t(B, N, s_q), t(B, N_KV, S_KV), t(B, N_KV, S_KV), t(1, N_KV, S_P), t(1, N_KV, S_P)


def _bnsd(x, layout, heads):
    if layout == "BSH":
        return x.reshape(x.shape[0], x.shape[1], heads, -1).permute(0, 2, 1, 3)
    return x.permute(0, 2, 1, 3) if layout == "BSND" else x


def _oracle(q, k, v, kp, vp, layout, *, p=S_P, kv_lens=None, q_lens=None, mode=0,
            pre=2**31 - 1, nxt=2**31 - 1, mask=None, pse=None):
    """Per batch: KV = cat(prefix[:p], kv_b[:L_b]); keep-mask over those p + L_b positions;
    SDPA in float64; rows with nothing kept are 0 and have lse -inf. Output BNSD float64."""
    qb, kb, vb = (_bnsd(x, layout, h).double() for x, h in ((q, N), (k, N_KV), (v, N_KV)))
    kpb, vpb = (_bnsd(x, layout, N_KV).double()[0] for x in (kp, vp))
    s_q = qb.shape[2]
    out = torch.zeros_like(qb)
    lse = torch.full((B, N, s_q, 1), float("-inf"), dtype=torch.float64)
    for b in range(B):
        own = S_KV if kv_lens is None else min(kv_lens[b if len(kv_lens) > 1 else 0], S_KV)
        kc = torch.cat([kpb[:, :p], kb[b, :, :own]], 1).repeat_interleave(N // N_KV, 0)
        vc = torch.cat([vpb[:, :p], vb[b, :, :own]], 1).repeat_interleave(N // N_KV, 0)
        total = p + own
        sq = s_q if q_lens is None else q_lens[b if len(q_lens) > 1 else 0]
        i, j = torch.arange(s_q)[:, None], torch.arange(total)[None, :]
        keep = (i < sq).expand(s_q, total).clone()
        if mode == 0:
            keep &= (j >= i - pre) & (j <= i + nxt)
        if mode in (0, 1) and mask is not None:
            m = mask[b] if mask.dim() == 3 else (mask[b:b + 1] if s_q == 1 else mask)
            keep &= ~m[..., :total].bool().reshape(-1, total)
        elif mode == 2:
            keep &= j <= i
        elif mode == 3:
            keep &= j <= i + (total - sq)
        elif mode == 4:
            d = j - (i + total - sq)
            keep &= (d >= -pre) & (d <= nxt)
        bias = torch.zeros(N, s_q, total, dtype=torch.float64)
        if pse is not None:
            bias = bias + pse[b if pse.shape[0] > 1 else 0][..., :total].double()
        mask_add = bias.masked_fill(~keep, float("-inf"))
        rows = keep.any(-1)
        o = F.scaled_dot_product_attention(qb[b], kc, vc, attn_mask=mask_add, scale=SCALE)
        out[b] = torch.where(rows[None, :, None], o, 0)
        scores = qb[b] @ kc.transpose(-1, -2) * SCALE + mask_add
        lse[b] = torch.logsumexp(scores, -1, keepdim=True)
    return out, lse


def _to_bnsd_out(out, layout):
    return _bnsd(out, layout, N).double()


KW = dict(num_heads=N, num_key_value_heads=N_KV, scale=SCALE, softmax_lse_flag=True)
CASES = {  # name -> (S_q, op kwargs, oracle kwargs)
    "decode": (1, dict(actual_seq_lengths_kv=[4, 6]), dict(kv_lens=[4, 6])),
    "decode_mask": (1, dict(), dict()),
    "prompt_causal": (4, dict(sparse_mode=3, actual_seq_lengths=[4, 2],
                              actual_seq_lengths_kv=[3, 6]),
                      dict(mode=3, q_lens=[4, 2], kv_lens=[3, 6])),
    "prompt_mask_band": (4, dict(sparse_mode=0, pre_tokens=3, next_tokens=1),
                         dict(mode=0, pre=3, nxt=1)),
    "prompt_band_mode4": (4, dict(sparse_mode=4, pre_tokens=2, next_tokens=0,
                                  actual_seq_lengths_kv=[5]),
                          dict(mode=4, pre=2, nxt=0, kv_lens=[5])),
    "prompt_left_up": (4, dict(sparse_mode=2), dict(mode=2)),
    "prompt_pse": (4, dict(actual_seq_lengths_kv=[6, 1]), dict(kv_lens=[6, 1])),
}


@pytest.mark.parametrize("layout", ["BSH", "BNSD", "BSND"])
@pytest.mark.parametrize("case", list(CASES))
def test_prefix_forms_against_independent_formula(layout, case):
    s_q, op_kw, oracle_kw = CASES[case]
    q, k, v, kp, vp = _make(layout, s_q, seed=len(case))
    p = 3
    g = torch.Generator().manual_seed(7)
    width = p + S_KV + 2  # wider than P + S_kv: the extra columns are never read
    extra = {}
    if case == "decode_mask":
        extra["atten_mask"] = torch.rand(B, width, generator=g) < 0.3
    elif case == "prompt_mask_band":
        extra["atten_mask"] = torch.rand(s_q, width, generator=g) < 0.3
    elif case == "prompt_pse":
        extra["pse_shift"] = torch.randn(1, N, s_q, width, generator=g)
    if op_kw.get("sparse_mode", 0) in (2, 3, 4):
        extra["atten_mask"] = torch.ones(2048, 2048, dtype=torch.bool).triu_(1)
    want, want_lse = _oracle(q, k, v, kp, vp, layout, p=p,
                             mask=extra.get("atten_mask") if "mask" in case else None,
                             pse=extra.get("pse_shift"), **oracle_kw)
    kw = dict(KW, input_layout=layout, key_shared_prefix=kp, value_shared_prefix=vp,
              **op_kw, **extra)
    tensors = {n: torch.tensor(kw[n]) for n in ("actual_seq_lengths", "actual_seq_lengths_kv")
               if n in kw}
    calls = {
        "op": lambda: OP(q, k, v, actual_shared_prefix_len=[p], **kw),
        "twin": lambda: TWIN(q, k, v, **{**kw, **tensors},
                             actual_shared_prefix_len=torch.tensor([p])),
        "torchair": lambda: torchair.ops.npu_fused_infer_attention_score(
            q, k, v, **{**kw, **tensors}, actual_shared_prefix_len=torch.tensor([p])),
        "reference": lambda: fused_infer_attention_score_reference(
            q, k, v, actual_shared_prefix_len=[p], **kw),
    }
    for name, call in calls.items():
        out, lse = call()
        assert out.shape == q.shape, name
        torch.testing.assert_close(_to_bnsd_out(out, layout), want, atol=1e-5, rtol=1e-5,
                                   msg=lambda m: f"{name}: {m}")
        torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5,
                                   msg=lambda m: f"{name} lse: {m}")


@pytest.mark.parametrize("s_q", [1, 3])
def test_whole_prefix_equals_no_prefix_op_on_concatenated_kv(s_q):
    """No actual_shared_prefix_len: the whole prefix, i.e. the op without a prefix on
    cat(prefix, key) with the KV lengths moved by S_prefix."""
    q, k, v, kp, vp = _make("BSND", s_q, seed=3)
    kw = dict(KW, input_layout="BSND", sparse_mode=3 if s_q > 1 else 0,
              actual_seq_lengths_kv=[2, 6])
    got = OP(q, k, v, key_shared_prefix=kp, value_shared_prefix=vp, **kw)
    kw["actual_seq_lengths_kv"] = [S_P + 2, S_P + 6]
    want = OP(q, torch.cat([kp.expand(B, -1, -1, -1), k], 1),
              torch.cat([vp.expand(B, -1, -1, -1), v], 1), **kw)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("p", [0, 2, S_P])
def test_decode_fast_path_equals_reference(p):
    q, k, v, kp, vp = _make("BNSD", 1, seed=p, dtype=torch.float16)
    kw = dict(num_heads=N, num_key_value_heads=N_KV, input_layout="BNSD", scale=SCALE,
              key_shared_prefix=kp, value_shared_prefix=vp, actual_shared_prefix_len=[p],
              actual_seq_lengths_kv=[5, 2])
    fast = OP(q, k, v, **kw)[0]
    ref = fused_infer_attention_score_reference(q, k, v, **kw)[0]
    torch.testing.assert_close(fast, ref, atol=2e-3, rtol=2e-3)
    want, _ = _oracle(q, k, v, kp, vp, "BNSD", p=p, kv_lens=[5, 2])
    torch.testing.assert_close(fast.double(), want, atol=3e-3, rtol=3e-3)


def test_int8_kv_per_channel_antiquant_dequantizes_the_prefix_too():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B, N, 1, D, generator=g, dtype=torch.float16)
    k, v = (torch.randint(-8, 8, (B, N_KV, S_KV, D), generator=g, dtype=torch.int8)
            for _ in range(2))
    kp, vp = (torch.randint(-8, 8, (1, N_KV, S_P, D), generator=g, dtype=torch.int8)
              for _ in range(2))
    scale = (torch.rand(2, N_KV, 1, D, generator=g) * 0.2 + 0.05).half()
    offset = torch.randn(2, N_KV, 1, D, generator=g).half()
    kw = dict(num_heads=N, num_key_value_heads=N_KV, input_layout="BNSD", scale=SCALE,
              actual_shared_prefix_len=[4])
    got = OP(q, k, v, key_shared_prefix=kp, value_shared_prefix=vp, antiquant_scale=scale,
             antiquant_offset=offset, **kw)[0]

    def deq(x, i):
        return ((x.float() + offset[i].float()) * scale[i].float()).half()
    want = OP(q, deq(k, 0), deq(v, 1), key_shared_prefix=deq(kp, 0),
              value_shared_prefix=deq(vp, 1), **kw)[0]
    torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)


def test_prefix_length_is_value_dependent():
    entry = get_value_dependent(OP.default)
    assert "actual_shared_prefix_len" in entry.args
    arg = {a.name: a for a in TWIN.default._schema.arguments}["actual_shared_prefix_len"]
    assert str(arg.type) == "Optional[Tensor]"


class _ListModel(torch.nn.Module):
    def forward(self, q, k, v, kp, vp, kv_lens, p_len):
        out, _ = torchair.ops.npu_fused_infer_attention_score(
            q, k, v, key_shared_prefix=kp, value_shared_prefix=vp,
            actual_shared_prefix_len=p_len, actual_seq_lengths_kv=kv_lens, num_heads=N,
            num_key_value_heads=N_KV, input_layout="BNSD", scale=0.25)
        return out + 1


def test_path4_sinks_the_prefix_length_of_the_int_list_op():
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    config.experimental_config.tiling_schedule_optimize = True
    backend = CompileCounterWithBackend(torchair.get_npu_backend(compiler_config=config))
    model = _ListModel()
    compiled = torch.compile(model, backend=backend, dynamic=True, fullgraph=True)
    q, k, v, kp, vp = _make("BNSD", 1, seed=5)
    before = len(torchair.graph_reports())
    for kv_lens, p_len in (([6, 3], [5]), ([2, 4], [1]), ([0, 6], [3]), ([6, 6], [0])):
        for t in (q, k, v, kp, vp):
            torch._dynamo.mark_static(t)
        torch.testing.assert_close(compiled(q, k, v, kp, vp, kv_lens, p_len),
                                   model(q, k, v, kp, vp, kv_lens, p_len))
    assert backend.frame_count == 1
    reports = torchair.graph_reports()[before:]
    assert len(reports) == 1
    report = reports[0]
    assert report.path == 4 and report.build_static, str(report)
    assert report.value_dependent_ops == ["npu_fused_infer_attention_score"], str(report)
    with pytest.raises(ValueError, match=r"actual_shared_prefix_len\[0\]=6 must be in "
                                         r"\[0, S_prefix=5\]"):
        compiled(q, k, v, kp, vp, [6, 6], [6])


# ---------------------------------------------------------------- errors

def _call(form="op", **kwargs):
    q, k, v, kp, vp = _make("BNSD", 2)
    kw = dict(num_heads=N, num_key_value_heads=N_KV, input_layout="BNSD",
              key_shared_prefix=kp, value_shared_prefix=vp)
    kw.update(kwargs)
    kw = {n: x for n, x in kw.items() if x is not None}
    fn = OP if form == "op" else TWIN
    return fn(kw.pop("q", q), kw.pop("k", k), kw.pop("v", v), **kw)


@pytest.mark.parametrize("kwargs,match", [
    (dict(value_shared_prefix=None), "key_shared_prefix given without value_shared_prefix"),
    (dict(key_shared_prefix=None, value_shared_prefix=None, actual_shared_prefix_len=[1]),
     "actual_shared_prefix_len given without key_shared_prefix"),
    (dict(block_table=torch.zeros(B, 1, dtype=torch.int32), block_size=16,
          actual_seq_lengths_kv=[3, 3], k=torch.randn(4, N_KV, 16, D),
          v=torch.randn(4, N_KV, 16, D)), "not supported with page attention"),
    (dict(kv_padding_size=torch.zeros(1, dtype=torch.int64), actual_seq_lengths_kv=[3, 3]),
     "not supported with kv_padding_size"),
    (dict(key_shared_prefix=torch.randn(1, N_KV, S_P, D).half()),
     "key_shared_prefix dtype torch.float16 must equal the key dtype torch.float32"),
    (dict(key_shared_prefix=torch.randn(2, N_KV, S_P, D)),
     r"key_shared_prefix shape \[2, 2, 5, 16\] must be \[1, 2, 'S_prefix', 16\]"),
    (dict(value_shared_prefix=torch.randn(1, N, S_P, D)), "value_shared_prefix shape"),
    (dict(value_shared_prefix=torch.randn(1, N_KV, S_P + 1, D)), "must have the same shape"),
    (dict(actual_shared_prefix_len=[S_P + 1]),
     r"actual_shared_prefix_len\[0\]=6 must be in \[0, S_prefix=5\]"),
    (dict(actual_shared_prefix_len=[-1]), r"actual_shared_prefix_len\[0\]=-1"),
    (dict(actual_shared_prefix_len=[1, 2]), "actual_shared_prefix_len has 2 entries; expected 1"),
    (dict(atten_mask=torch.zeros(2, S_KV + 2, dtype=torch.bool)),
     r"atten_mask last dimension 8 must be >= actual_shared_prefix_len \+ S_kv = 5 \+ 6"),
    (dict(pse_shift=torch.zeros(1, N, 2, S_KV), actual_shared_prefix_len=[1]),
     r"pse_shift last dimension 6 must be >= actual_shared_prefix_len \+ S_kv = 1 \+ 6"),
    (dict(num_heads=3), "num_heads=3"),  # the call's other checks still run, with its shapes
], ids=lambda x: x if isinstance(x, str) else None)
def test_value_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _call(**kwargs)


@pytest.mark.parametrize("kwargs,match", [
    (dict(actual_shared_prefix_len=torch.tensor([S_P + 1])),
     r"actual_shared_prefix_len\[0\]=6 must be in \[0, S_prefix=5\]"),
    (dict(actual_shared_prefix_len=torch.tensor([1, 2])),
     "actual_shared_prefix_len must be a 1-D int64 tensor of one entry"),
    (dict(actual_shared_prefix_len=torch.tensor([3]),
          atten_mask=torch.zeros(2, S_KV + 2, dtype=torch.bool)),
     r"atten_mask last dimension 8 must be >= actual_shared_prefix_len \+ S_kv = 3 \+ 6"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_twin_value_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _call("twin", **kwargs)


def test_per_token_antiquant_with_prefix_is_not_implemented():
    k, v = (torch.randint(-5, 5, (B, N_KV, S_KV, D), dtype=torch.int8) for _ in range(2))
    kp, vp = (torch.randint(-5, 5, (1, N_KV, S_P, D), dtype=torch.int8) for _ in range(2))
    with pytest.raises(NotImplementedError, match="per-token antiquant"):
        _call(k=k, v=v, key_shared_prefix=kp, value_shared_prefix=vp, antiquant_mode=1,
              antiquant_scale=torch.ones(2, B, S_KV))
