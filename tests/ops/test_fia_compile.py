"""npu_fused_infer_attention_score: op/twin, fake kernel, registration, path-4 compile, errors."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch._subclasses.fake_tensor import FakeTensorMode

import torchair
import torchair.ops
from torchair.ops import get_value_dependent, value_dependent_ops

OP = torch.ops.npu.npu_fused_infer_attention_score
TWIN = torch.ops.npu.npu_fused_infer_attention_score_tensor
B, N, N_KV, S_Q, S_KV, D = 2, 4, 2, 5, 12, 16


def _qkv(s_q=S_Q, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, N, s_q, D, generator=g).to(dtype),
            torch.randn(B, N_KV, S_KV, D, generator=g).to(dtype),
            torch.randn(B, N_KV, S_KV, D, generator=g).to(dtype))


KW = dict(num_heads=N, num_key_value_heads=N_KV, input_layout="BNSD", scale=0.25)


def test_registration_and_export():
    entry = get_value_dependent(OP.default)
    assert entry is not None and entry in value_dependent_ops()
    assert entry.args == ("actual_seq_lengths", "actual_seq_lengths_kv",
                          "actual_shared_prefix_len")
    assert entry.twin is TWIN.default
    # torchair.ops' name is TorchAir's tensor-length form (test_fia_graph_form.py), not the op
    from torchair.ops.attention.fia_graph import npu_fused_infer_attention_score as graph_form
    assert torchair.ops.npu_fused_infer_attention_score is graph_form
    assert torchair.ops.npu_fused_infer_attention_score is not OP
    assert "npu_fused_infer_attention_score" in torchair.ops.__all__


@pytest.mark.parametrize("s_q,mode", [(S_Q, 3), (S_Q, 0), (1, 4), (1, 0)])
def test_twin_equals_op(s_q, mode):
    q, k, v = _qkv(s_q)
    kw = dict(KW, sparse_mode=mode, pre_tokens=3, next_tokens=1, softmax_lse_flag=True)
    for ql, kl in (([s_q, s_q - 1 if s_q > 1 else 0], [7, 12]), ([s_q], [5])):
        out, lse = OP(q, k, v, actual_seq_lengths=ql, actual_seq_lengths_kv=kl, **kw)
        t_out, t_lse = TWIN(q, k, v, actual_seq_lengths=torch.tensor(ql),
                            actual_seq_lengths_kv=torch.tensor(kl), **kw)
        torch.testing.assert_close(t_out, out, atol=0, rtol=0)
        torch.testing.assert_close(t_lse, lse, atol=0, rtol=0)


@pytest.mark.parametrize("layout,q_shape,kv_shape,lse_shape", [
    ("BSH", (2, 5, 64), (2, 9, 32), (2, 4, 5, 1)),
    ("BNSD", (2, 4, 5, 16), (2, 2, 9, 16), (2, 4, 5, 1)),
    ("BSND", (2, 5, 4, 16), (2, 9, 2, 16), (2, 4, 5, 1))])
def test_fake_kernel_shapes(layout, q_shape, kv_shape, lse_shape):
    with FakeTensorMode():
        q = torch.empty(q_shape, dtype=torch.float16)
        k = torch.empty(kv_shape, dtype=torch.float16)
        kw = dict(num_heads=4, num_key_value_heads=2, input_layout=layout)
        out, lse = OP(q, k, k, actual_seq_lengths=[3, 5], softmax_lse_flag=True, **kw)
        assert out.shape == q.shape and out.dtype == torch.float16
        assert lse.shape == lse_shape and lse.dtype == torch.float32
        out, lse = TWIN(q, k, k, actual_seq_lengths_kv=torch.empty(2, dtype=torch.int64),
                        quant_scale2=torch.empty(1), **kw)
        assert out.shape == q.shape and out.dtype == torch.int8 and lse.shape == (0,)


class _Model(torch.nn.Module):
    def forward(self, q, k, v, q_lens, kv_lens):
        out, lse = OP(q, k, v, actual_seq_lengths=q_lens, actual_seq_lengths_kv=kv_lens,
                      sparse_mode=3, softmax_lse_flag=True, num_heads=N,
                      num_key_value_heads=N_KV, input_layout="BNSD", scale=0.25)
        return out * 2, lse.clamp_min(-1e4)


def test_compile_path4_once_over_length_sets():
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    config.experimental_config.tiling_schedule_optimize = True
    backend = CompileCounterWithBackend(torchair.get_npu_backend(compiler_config=config))
    model = _Model()
    compiled = torch.compile(model, backend=backend, dynamic=True, fullgraph=True)
    q, k, v = _qkv()
    before = len(torchair.graph_reports())
    with torch.no_grad():
        for q_lens, kv_lens in (([5, 3], [12, 7]), ([2, 4], [9, 12]), ([1, 5], [3, 5]),
                                ([5, 5], [12, 12]), ([0, 2], [4, 1])):
            for t in (q, k, v):
                torch._dynamo.mark_static(t)
            got = compiled(q, k, v, q_lens, kv_lens)
            want = model(q, k, v, q_lens, kv_lens)
            torch.testing.assert_close(got, want)
    assert backend.frame_count == 1
    reports = torchair.graph_reports()[before:]
    assert len(reports) == 1
    report = reports[0]
    assert report.path == 4 and report.build_static, str(report)
    assert report.value_dependent_ops == ["npu_fused_infer_attention_score"], str(report)


# ---------------------------------------------------------------- errors

def _call(**kwargs):
    q, k, v = _qkv()
    kw = dict(KW)
    kw.update(kwargs)
    return OP(kw.pop("q", q), kw.pop("k", k), kw.pop("v", v), **kw)


@pytest.mark.parametrize("kwargs,match", [
    (dict(actual_seq_lengths=[1, 2, 3]), "actual_seq_lengths has 3 entries; expected B=2"),
    (dict(actual_seq_lengths=[6, 2]), r"actual_seq_lengths\[0\]=6 must be in \[0, S_q=5\]"),
    (dict(actual_seq_lengths=[-1, 2]), r"actual_seq_lengths\[0\]=-1"),
    (dict(actual_seq_lengths_kv=[1, 2, 3]), "actual_seq_lengths_kv has 3 entries; expected B=2"),
    (dict(actual_seq_lengths_kv=[-1, 2]), r"actual_seq_lengths_kv\[0\]=-1 must be >= 0"),
    (dict(sparse_mode=1), "sparse_mode=1 .allMask. needs atten_mask"),
    (dict(sparse_mode=4, pre_tokens=-3, next_tokens=1), "pre_tokens \\+ next_tokens >= 0"),
    (dict(inner_precise=5), "inner_precise=5"),
    (dict(atten_mask=torch.zeros(S_Q, S_KV)), "atten_mask dtype torch.float32"),
    (dict(atten_mask=torch.zeros(S_Q, S_KV + 1, dtype=torch.bool)), r"atten_mask shape"),
    (dict(sparse_mode=2, atten_mask=torch.zeros(8, dtype=torch.bool)), "compressed mask"),
    (dict(num_key_value_heads=3), "num_key_value_heads=3 must divide num_heads=4"),
    (dict(input_layout="BSH"), "input_layout='BSH' needs 3-D"),
    (dict(num_heads=2), "num_heads=2 must equal the N of query"),
    (dict(k=torch.randn(B, N_KV, S_KV, 8)), "key and value must have the same shape"),
    (dict(quant_offset2=torch.zeros(1)), "quant_offset2 needs quant_scale2"),
    (dict(quant_scale2=torch.zeros(3)), "quant_scale2 has 3 elements"),
    (dict(antiquant_scale=torch.ones(2, N_KV, 1, D)), "antiquant_scale is only used with int8"),
    (dict(kv_padding_size=torch.zeros(3, dtype=torch.int64)), "kv_padding_size shape"),
    (dict(block_table=torch.zeros(B, 1, dtype=torch.int32), block_size=16,
          k=torch.randn(4, N_KV, 16, D), v=torch.randn(4, N_KV, 16, D)),
     "page attention .block_table given. needs actual_seq_lengths_kv"),
    (dict(block_table=torch.zeros(B, 1, dtype=torch.int32), block_size=16,
          actual_seq_lengths_kv=[20, 3], k=torch.randn(4, N_KV, 16, D),
          v=torch.randn(4, N_KV, 16, D)), "block_table second dim 1 must be >="),
], ids=lambda x: x if isinstance(x, str) else None)
def test_value_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _call(**kwargs)


def _int8_kv():
    return tuple(torch.randint(-5, 5, (B, N_KV, S_KV, D), dtype=torch.int8) for _ in range(2))


def test_antiquant_errors():
    k, v = _int8_kv()
    with pytest.raises(ValueError, match="int8 key/value need antiquant_scale"):
        _call(k=k, v=v)
    with pytest.raises(ValueError, match="value_antiquant_scale is missing"):
        _call(k=k, v=v, key_antiquant_scale=torch.ones(N_KV * D))
    with pytest.raises(ValueError, match="not both"):
        _call(k=k, v=v, antiquant_scale=torch.ones(2, N_KV, 1, D),
              key_antiquant_scale=torch.ones(N_KV * D))
    with pytest.raises(ValueError, match="antiquant_scale shape"):
        _call(k=k, v=v, antiquant_scale=torch.ones(2, N_KV, 1, D + 1))
    with pytest.raises(ValueError, match=r"per-token antiquant \(mode 1\)"):
        _call(k=k, v=v, antiquant_mode=1, antiquant_scale=torch.ones(2, B, S_KV - 1))
    with pytest.raises(NotImplementedError, match="key_antiquant_mode=2"):
        _call(k=k, v=v, key_antiquant_mode=2, key_antiquant_scale=torch.ones(N_KV * D),
              value_antiquant_scale=torch.ones(N_KV * D))


@pytest.mark.parametrize("name", ["query_padding_size", "query_rope", "key_rope",
                                  "key_rope_antiquant_scale", "dequant_scale1", "quant_scale1",
                                  "dequant_scale2"])
def test_not_implemented_arguments(name):
    with pytest.raises(NotImplementedError, match=name):
        _call(**{name: torch.zeros(1)})


def test_not_implemented_modes():
    with pytest.raises(NotImplementedError, match="sparse_mode=5"):
        _call(sparse_mode=5)
    with pytest.raises(NotImplementedError, match="int8 query"):
        q = torch.zeros(B, N, S_Q, D, dtype=torch.int8)
        _call(q=q, k=q[:, :N_KV], v=q[:, :N_KV])
