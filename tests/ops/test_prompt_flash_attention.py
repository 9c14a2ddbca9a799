"""npu_prompt_flash_attention: against an independent SDPA-with-explicit-mask formula and against
FIA, defaults, layouts, GQA, fake kernel, registration, path-4 compile, errors."""
from __future__ import annotations

import math

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch._subclasses.fake_tensor import FakeTensorMode

import torchair
import torchair.ops
from torchair.ops import get_value_dependent
from torchair.ops.attention.prompt_flash_attention import prompt_flash_attention_reference

PFA = torch.ops.npu.npu_prompt_flash_attention
TWIN = torch.ops.npu.npu_prompt_flash_attention_tensor
FIA = torch.ops.npu.npu_fused_infer_attention_score
B, N, N_KV, S_Q, S_KV, D = 2, 4, 2, 6, 9, 8


def _bnsd(s_q=S_Q, s_kv=S_KV, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, N, s_q, D, generator=g).to(dtype),
            torch.randn(B, N_KV, s_kv, D, generator=g).to(dtype),
            torch.randn(B, N_KV, s_kv, D, generator=g).to(dtype))


def _to_bsh(x):
    b, n, s, d = x.shape
    return x.transpose(1, 2).reshape(b, s, n * d)


def _sdpa(q, k, v, keep, scale):
    """Independent formula: per batch, SDPA with an explicit boolean keep-mask [S_q, S_kv] (GQA
    by repeating KV heads); rows with nothing kept are 0. BNSD in, BNSD out, float64."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    rep = q.shape[1] // k.shape[1]
    for b in range(q.shape[0]):
        kb = k[b].double().repeat_interleave(rep, 0)
        vb = v[b].double().repeat_interleave(rep, 0)
        m = keep[b]
        rows = m.any(-1)
        if rows.any():
            o = torch.nn.functional.scaled_dot_product_attention(
                q[b].double()[:, rows], kb, vb, attn_mask=m[rows], scale=scale)
            out[b][:, rows] = o
    return out


def _keep(mode, q_lens, kv_lens, pre=None, nxt=None, mask=None):
    """[B, S_q, S_kv] bool: kept (i, j) for a sparse mode, KV window [0, kv_len), rows < q_len."""
    i = torch.arange(S_Q).view(-1, 1)
    j = torch.arange(S_KV).view(1, -1)
    keeps = []
    for b in range(B):
        sq, skv = q_lens[b], kv_lens[b]
        k = (j < skv) & (i < sq)
        if mode == 2:
            k &= j <= i
        elif mode == 3:
            k &= j <= i + (skv - sq)
        elif mode == 0 and mask is not None:
            k &= ~mask & (j >= i - pre) & (j <= i + nxt)
        keeps.append(k)
    return torch.stack(keeps)


CASES = [  # (sparse_mode, q lengths, kv lengths, extra kwargs, what the mask is)
    (2, [6, 4], [9, 5], {}, "leftUpCausal"),
    (3, [6, 4], [9, 5], {}, "rightDownCausal"),
    (3, [3, 6], [6, 9], {}, "rightDownCausal, short query"),
    (0, [6, 6], [9, 9], {"next_tokens": 0}, "defaultMask without a mask: everything"),
    (0, [5, 6], [9, 7], {"pre_tokens": 2, "next_tokens": 1, "mask": True}, "mask + band"),
]


@pytest.mark.parametrize("layout", ["BNSD", "BSH"])
@pytest.mark.parametrize("mode,q_lens,kv_lens,extra,what", CASES,
                         ids=[c[-1] for c in CASES])
def test_equals_sdpa_with_explicit_mask(layout, mode, q_lens, kv_lens, extra, what):
    q, k, v = _bnsd()
    scale = 1 / math.sqrt(D)
    extra = dict(extra)
    mask = None
    kw = {}
    if extra.pop("mask", False):
        g = torch.Generator().manual_seed(5)
        mask = torch.rand(S_Q, S_KV, generator=g) < 0.3
        mask[:, 0] = False
        kw["atten_mask"] = mask
    if mode in (2, 3):
        kw["atten_mask"] = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)
    kw.update(extra)
    keep = _keep(mode, q_lens, kv_lens, extra.get("pre_tokens"), extra.get("next_tokens"), mask)
    want = _sdpa(q, k, v, keep, scale)
    args = (q, k, v) if layout == "BNSD" else (_to_bsh(q), _to_bsh(k), _to_bsh(v))
    out = PFA(*args, num_heads=N, num_key_value_heads=N_KV, input_layout=layout,
              scale_value=scale, actual_seq_lengths=q_lens, actual_seq_lengths_kv=kv_lens,
              sparse_mode=mode, **kw)
    got = out if layout == "BNSD" else out.view(B, S_Q, N, D).transpose(1, 2)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_defaults_are_torch_npus():
    """scale_value=1.0, next_tokens=0 and no mask: full, unscaled attention (not causal)."""
    q, k, v = _bnsd(dtype=torch.float16)
    got = PFA(q, k, v, num_heads=N, num_key_value_heads=N_KV, input_layout="BNSD")
    keep = torch.ones(B, S_Q, S_KV, dtype=torch.bool)
    torch.testing.assert_close(got.double(), _sdpa(q, k, v, keep, 1.0), atol=2e-3, rtol=2e-3)
    assert got.dtype == torch.float16 and got.shape == q.shape
    schema = {a.name: a.default_value for a in PFA.default._schema.arguments}
    assert schema["scale_value"] == 1.0 and schema["next_tokens"] == 0
    assert schema["pre_tokens"] == 2147473647 and schema["sparse_mode"] == 0
    assert schema["input_layout"] == "BSH"


@pytest.mark.parametrize("mode,kw", [
    (2, {}), (3, {}), (4, dict(pre_tokens=3, next_tokens=0)),
    (0, dict(pre_tokens=2, next_tokens=1, atten_mask=torch.zeros(S_Q, S_KV, dtype=torch.bool))),
    (1, dict(atten_mask=torch.eye(S_Q, S_KV, dtype=torch.bool).logical_not())),
])
def test_equals_fia_prompt_case(mode, kw):
    q, k, v = _bnsd(dtype=torch.bfloat16, seed=2)
    common = dict(num_heads=N, num_key_value_heads=N_KV, input_layout="BNSD",
                  actual_seq_lengths=[6, 5], actual_seq_lengths_kv=[9, 6], sparse_mode=mode, **kw)
    got = PFA(q, k, v, scale_value=0.3, **common)
    want, _ = FIA(q, k, v, scale=0.3, **common)
    assert torch.equal(got, want)
    torch.testing.assert_close(prompt_flash_attention_reference(q, k, v, scale_value=0.3,
                                                                **common), want)
    scale, offset = torch.tensor([20.0]), torch.tensor([1.0])  # int8 output, as FIA's
    got8 = PFA(q, k, v, scale_value=0.3, quant_scale2=scale, quant_offset2=offset, **common)
    want8, _ = FIA(q, k, v, scale=0.3, quant_scale2=scale, quant_offset2=offset, **common)
    assert got8.dtype == torch.int8 and torch.equal(got8, want8)


def test_twin_equals_op_and_registration():
    q, k, v = _bnsd()
    kw = dict(num_heads=N, num_key_value_heads=N_KV, input_layout="BNSD", sparse_mode=3)
    want = PFA(q, k, v, actual_seq_lengths=[4, 6], actual_seq_lengths_kv=[7, 9], **kw)
    got = TWIN(q, k, v, actual_seq_lengths=torch.tensor([4, 6]),
               actual_seq_lengths_kv=torch.tensor([7, 9]), **kw)
    assert torch.equal(got, want)
    entry = get_value_dependent(PFA.default)
    assert entry.args == ("actual_seq_lengths", "actual_seq_lengths_kv")
    assert entry.twin is TWIN.default
    assert torchair.ops.npu_prompt_flash_attention is PFA
    assert "npu_prompt_flash_attention" in torchair.ops.TORCH_NPU_OPS


@pytest.mark.parametrize("layout,q_shape,kv_shape", [
    ("BSH", (2, 5, 32), (2, 9, 16)), ("BNSD", (2, 4, 5, 8), (2, 2, 9, 8)),
    ("BSND", (2, 5, 4, 8), (2, 9, 2, 8))])
def test_fake_kernel(layout, q_shape, kv_shape):
    with FakeTensorMode():
        q, k = torch.empty(q_shape, dtype=torch.float16), torch.empty(kv_shape,
                                                                      dtype=torch.float16)
        kw = dict(num_heads=4, num_key_value_heads=2, input_layout=layout)
        out = PFA(q, k, k, actual_seq_lengths=[3, 5], **kw)
        assert out.shape == q.shape and out.dtype == torch.float16
        out = TWIN(q, k, k, actual_seq_lengths_kv=torch.empty(2, dtype=torch.int64),
                   quant_scale2=torch.empty(1), **kw)
        assert out.shape == q.shape and out.dtype == torch.int8


class _Prefill(torch.nn.Module):
    def forward(self, q, k, v, q_lens, kv_lens):
        out = PFA(q, k, v, actual_seq_lengths=q_lens, actual_seq_lengths_kv=kv_lens,
                  num_heads=N, num_key_value_heads=N_KV, input_layout="BSH",
                  scale_value=0.35, sparse_mode=3,
                  atten_mask=torch.ones(2048, 2048, dtype=torch.bool).triu(1))
        return out * 2


def test_compile_path4_static_once_over_lengths():
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    config.experimental_config.tiling_schedule_optimize = True
    torch._dynamo.reset()
    backend = CompileCounterWithBackend(torchair.get_npu_backend(compiler_config=config))
    model = _Prefill()
    compiled = torch.compile(model, backend=backend, dynamic=True, fullgraph=True)
    q, k, v = (_to_bsh(t) for t in _bnsd(seed=3))
    before = len(torchair.graph_reports())
    with torch.no_grad():
        for q_lens, kv_lens in (([6, 3], [9, 4]), ([2, 6], [5, 9]), ([1, 1], [1, 2])):
            for t in (q, k, v):
                torch._dynamo.mark_static(t)
            torch.testing.assert_close(compiled(q, k, v, q_lens, kv_lens),
                                       model(q, k, v, q_lens, kv_lens))
    assert backend.frame_count == 1
    reports = torchair.graph_reports()[before:]
    assert len(reports) == 1
    assert reports[0].path == 4 and reports[0].build_static, str(reports[0])
    assert reports[0].value_dependent_ops == ["npu_prompt_flash_attention"], str(reports[0])


# ---------------------------------------------------------------- errors

def _call(**kw):
    q, k, v = _bnsd()
    a = dict(num_heads=N, num_key_value_heads=N_KV, input_layout="BNSD")
    a.update(kw)
    return PFA(a.pop("q", q), a.pop("k", k), a.pop("v", v), **a)


@pytest.mark.parametrize("kwargs,err,match", [
    (dict(padding_mask=torch.zeros(1)), NotImplementedError, "padding_mask is reserved"),
    (dict(deq_scale1=torch.ones(1)), NotImplementedError,
     "npu_prompt_flash_attention: deq_scale1 is not implemented"),
    (dict(deq_scale2=torch.ones(1)), NotImplementedError, "deq_scale2 is not implemented"),
    (dict(quant_scale1=torch.ones(1)), NotImplementedError, "quant_scale1 is not implemented"),
    (dict(sparse_mode=5), NotImplementedError, "sparse_mode=5"),
    (dict(actual_seq_lengths=[7, 2]), ValueError,
     r"npu_prompt_flash_attention: actual_seq_lengths\[0\]=7 must be in \[0, S_q=6\]"),
    (dict(actual_seq_lengths_kv=[1, 2, 3]), ValueError,
     "actual_seq_lengths_kv has 3 entries; expected B=2"),
    (dict(sparse_mode=1), ValueError, "sparse_mode=1 .allMask. needs atten_mask"),
    (dict(num_key_value_heads=3), ValueError, "num_key_value_heads=3 must divide num_heads=4"),
    (dict(input_layout="BSH"), ValueError, "npu_prompt_flash_attention.*input_layout='BSH'"),
    (dict(atten_mask=torch.zeros(S_Q, S_KV)), ValueError, "atten_mask dtype torch.float32"),
    (dict(sparse_mode=4, pre_tokens=-3, next_tokens=1), ValueError,
     r"pre_tokens \+ next_tokens >= 0"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_errors_name_this_op_and_its_arguments(kwargs, err, match):
    with pytest.raises(err, match=match) as info:
        _call(**kwargs)
    assert "fused_infer_attention_score" not in str(info.value)
    assert "dequant_scale" not in str(info.value)
