"""npu_fused_infer_attention_score_v2 (issue 17, item 2): TorchAir's v2 arguments mapped onto
the FIA op, against a plain softmax-attention reference written here; output layouts, LSE, the
fake kernel, value-dependent registration, a compiled call and TorchAir's error texts."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torchair
from torchair.ops import get_value_dependent

V2 = torch.ops.npu.npu_fused_infer_attention_score_v2
B, N, N_KV, S_Q, S_KV, D = 2, 4, 2, 3, 7, 8
SCALE = 0.3


def _bnsd(seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, N, S_Q, D, generator=g), torch.randn(B, N_KV, S_KV, D, generator=g),
            torch.randn(B, N_KV, S_KV, D, generator=g))


def _reference(q, k, v, kv_lengths=None, causal=False):
    """Plain attention in BNSD: GQA by repeating KV heads; masked positions get -inf."""
    k = k.repeat_interleave(N // N_KV, dim=1)
    v = v.repeat_interleave(N // N_KV, dim=1)
    scores = q @ k.transpose(-1, -2) * SCALE
    masked = torch.zeros(B, 1, S_Q, S_KV, dtype=torch.bool)
    if kv_lengths is not None:
        masked |= (torch.arange(S_KV)[None, :] >= torch.tensor(kv_lengths)[:, None])[:, None,
                                                                                     None, :]
    if causal:  # sparse_mode 3: right-down aligned, S_KV - S_Q extra visible positions
        masked |= torch.ones(S_Q, S_KV, dtype=torch.bool).triu(S_KV - S_Q + 1)
    scores = scores.masked_fill(masked, float("-inf"))
    return scores.softmax(-1) @ v, torch.logsumexp(scores, -1, keepdim=True)


def _to(layout, x):
    """A BNSD tensor in ``layout``."""
    if layout == "BSH":
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1)
    if layout == "BSND":
        return x.transpose(1, 2)
    if layout == "NBSD":
        return x.permute(1, 0, 2, 3)
    return x


KW = dict(num_query_heads=N, num_key_value_heads=N_KV, softmax_scale=SCALE)


@pytest.mark.parametrize("layout", ["BNSD", "BSH", "BSND", "BNSD_BSND", "BSH_BNSD", "BSND_BNSD",
                                    "BSH_NBSD", "BSND_NBSD", "BNSD_NBSD"])
def test_layouts_against_reference(layout):
    q, k, v = _bnsd()
    q_layout, _, out_layout = layout.partition("_")
    out_layout = out_layout or q_layout
    out, lse = V2(_to(q_layout, q), _to(q_layout, k), _to(q_layout, v), input_layout=layout,
                  actual_seq_kvlen=[5, 7], return_softmax_lse=True, **KW)
    ref, ref_lse = _reference(q, k, v, kv_lengths=[5, 7])
    torch.testing.assert_close(out, _to(out_layout, ref), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)  # [B, N, S_q, 1]


def test_nsd_causal_and_empty_lse():
    q, k, v = _bnsd(1)
    out, lse = V2(q[0], k[0], v[0], input_layout="NSD", sparse_mode=3, **KW)
    torch.testing.assert_close(out, _reference(q, k, v, causal=True)[0][0], atol=1e-5,
                               rtol=1e-5)
    assert lse.shape == (0,) and lse.dtype == torch.float32


def test_int8_kv_and_quantized_output_use_v2_names():
    q, k, v = _bnsd(2)
    k8, v8 = (k * 20).round().clamp(-128, 127).to(torch.int8), \
        (v * 20).round().clamp(-128, 127).to(torch.int8)
    scale = torch.full((N_KV, D), 0.05)
    out, _ = V2(q, k8, v8, input_layout="BNSD", dequant_scale_key=scale,
                dequant_scale_value=scale, **KW)
    torch.testing.assert_close(out, _reference(q, k8.float() * 0.05, v8.float() * 0.05)[0],
                               atol=1e-5, rtol=1e-5)
    out8, _ = V2(q, k, v, input_layout="BNSD", quant_scale_out=torch.tensor([10.0]), **KW)
    assert out8.dtype == torch.int8


def test_registration_fake_and_compiled_call():
    entry = get_value_dependent(V2.default)
    assert entry.args == ("actual_seq_qlen", "actual_seq_kvlen")
    assert entry.twin is torch.ops.npu.npu_fused_infer_attention_score_v2_tensor.default
    assert torchair.ops.npu_fused_infer_attention_score_v2 is V2
    with FakeTensorMode():
        q, k = torch.empty(B, S_Q, N * D), torch.empty(B, S_KV, N_KV * D)
        out, lse = V2(q, k, k, input_layout="BSH_NBSD", return_softmax_lse=True, **KW)
        assert out.shape == (N, B, S_Q, D) and lse.shape == (B, N, S_Q, 1)

    def attend(q, k, v, lengths):
        return V2(q, k, v, input_layout="BNSD_BSND", actual_seq_kvlen=lengths, **KW)[0]

    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    compiled = torch.compile(attend, backend=torchair.get_npu_backend(compiler_config=config),
                             fullgraph=True)
    q, k, v = _bnsd(3)
    torch.testing.assert_close(compiled(q, k, v, [4, 7]),
                               _reference(q, k, v, kv_lengths=[4, 7])[0].transpose(1, 2),
                               atol=1e-5, rtol=1e-5)
    assert torchair.graph_reports()[-1].value_dependent_ops == [
        "npu_fused_infer_attention_score_v2"]


@pytest.mark.parametrize("kwargs,error,text", [
    (dict(num_query_heads=0), ValueError, "numHeads should be greater than 0, but got 0!"),
    (dict(input_layout="BHSD"), ValueError, "Layout BHSD is not supported!"),
    (dict(input_layout="BSH"), ValueError, r"Layout BSH, queryDims\(4\) must be 3!"),
    (dict(input_layout="TND", query=torch.ones(6, 4, 8)), NotImplementedError,
     "input_layout='TND'"),
    (dict(learnable_sink=torch.ones(4)), NotImplementedError, "learnable_sink is not implemented"),
    (dict(out_dtype=1), NotImplementedError, "out_dtype is not implemented"),
    (dict(query_rope=torch.ones(1)), NotImplementedError, "query_rope is not implemented"),
    (dict(query_quant_mode=1), NotImplementedError, "query_quant_mode=1"),
    (dict(actual_seq_qlen=[9, 1]), ValueError,
     r"npu_fused_infer_attention_score_v2: actual_seq_qlen\[0\]=9"),
    (dict(num_query_heads=3), ValueError, "num_key_value_heads=2 must divide num_query_heads=3"),
])
def test_errors(kwargs, error, text):
    q, k, v = _bnsd()
    q = kwargs.pop("query", q)
    with pytest.raises(error, match=text):
        V2(q, k, v, **{**KW, "input_layout": "BNSD", **kwargs})
