"""TorchAir's graph-mode ``torchair.ops.npu_fused_infer_attention_score`` (lengths as tensors,
torchair/ops/attention/fia_graph.py): which op it calls, eager equality with torch_npu's op,
compile paths 1-4 without graph breaks or recompiles over new length values, one static unit on
path 4, and TorchAir's documentation sample (tensor lengths and a shared prefix) on CPU."""
from __future__ import annotations

import math
import types

import pytest
import torch
from _units import compile_static, op_calls
from torch._dynamo.testing import CompileCounterWithBackend

import torchair
import torchair.ops
from torchair.compat._torch_npu import make_torch_npu
from torchair.ops.attention.fia_graph import npu_fused_infer_attention_score as GRAPH_FORM

OP = torch.ops.npu.npu_fused_infer_attention_score
TWIN = torch.ops.npu.npu_fused_infer_attention_score_tensor
B, N, N_KV, S_Q, S_KV, S_P, D = 2, 4, 2, 3, 8, 4, 16


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, N, S_Q, D, generator=g), torch.randn(B, N_KV, S_KV, D, generator=g),
            torch.randn(B, N_KV, S_KV, D, generator=g), torch.randn(1, N_KV, S_P, D, generator=g),
            torch.randn(1, N_KV, S_P, D, generator=g))


def test_names():
    assert torchair.ops.npu_fused_infer_attention_score is GRAPH_FORM
    torch_npu = make_torch_npu(types.ModuleType("npu"))  # the emulated torch_npu keeps the op
    assert torch_npu.npu_fused_infer_attention_score is OP
    assert torchair.ops.npu_fused_infer_attention_score_v2 is (
        torch.ops.npu.npu_fused_infer_attention_score_v2)


def _attention(q, k, v, kp, vp, ql, kl, pl):
    out, lse = torchair.ops.npu_fused_infer_attention_score(
        q, k, v, key_shared_prefix=kp, value_shared_prefix=vp, actual_seq_lengths=ql,
        actual_seq_lengths_kv=kl, actual_shared_prefix_len=pl, num_heads=4,
        num_key_value_heads=2, input_layout="BNSD", scale=0.25, sparse_mode=3,
        softmax_lse_flag=True)
    return out * 2, lse.clamp_min(-1e4)


LENGTH_SETS = (([3, 2], [8, 5], [4]), ([1, 3], [2, 8], [1]), ([3, 3], [0, 6], [0]),
               ([2, 1], [7, 7], [3]))


def test_eager_forms_agree_and_pick_their_op():
    q, k, v, kp, vp = _inputs()
    for ql, kl, pl in LENGTH_SETS:
        want = OP(q, k, v, key_shared_prefix=kp, value_shared_prefix=vp, actual_seq_lengths=ql,
                  actual_seq_lengths_kv=kl, actual_shared_prefix_len=pl, num_heads=N,
                  num_key_value_heads=N_KV, input_layout="BNSD", scale=0.25, sparse_mode=3,
                  softmax_lse_flag=True)
        want = (want[0] * 2, want[1].clamp_min(-1e4))
        tensors = [torch.tensor(x) for x in (ql, kl, pl)]
        for lengths in (tensors, (ql, kl, pl), (ql, tensors[1], pl)):  # tensors, lists, a mix
            torch.testing.assert_close(_attention(q, k, v, kp, vp, *lengths), want,
                                       atol=0, rtol=0)
    assert op_calls(_attention, q, k, v, kp, vp, *tensors) == {
        "npu::npu_fused_infer_attention_score_tensor"}
    assert op_calls(_attention, q, k, v, kp, vp, ql, kl, pl) == {
        "npu::npu_fused_infer_attention_score"}
    with pytest.raises(ValueError, match="actual_seq_lengths must be a 1-D int64 tensor"):
        GRAPH_FORM(q, k, v, actual_seq_lengths=torch.ones(2, 1, dtype=torch.int64),
                   num_heads=N, num_key_value_heads=N_KV, input_layout="BNSD")


@pytest.mark.parametrize("path", [1, 2, 3, 4])
def test_compile_paths_no_break_no_recompile(path):
    """Tensor lengths: fullgraph on every path; new values reuse the one compiled frame; the
    graph calls the twin with the tensors (nothing read on the host); path 4 is one static unit."""
    torch._dynamo.reset()
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    config.experimental_config.tiling_schedule_optimize = path == 4
    backend = CompileCounterWithBackend(torchair.get_npu_backend(compiler_config=config))
    compiled = torch.compile(_attention, backend=backend, dynamic=path != 1, fullgraph=True)
    q, k, v, kp, vp = _inputs(path)
    before = len(torchair.graph_reports())
    for ql, kl, pl in LENGTH_SETS:
        args = (q, k, v, kp, vp, *(torch.tensor(x) for x in (ql, kl, pl)))
        if path >= 3:
            for t in args:
                torch._dynamo.mark_static(t)
        torch.testing.assert_close(compiled(*args), _attention(*args))
    assert backend.frame_count == 1
    code = backend.graphs[0].code
    assert "npu_fused_infer_attention_score_tensor" in code and "item" not in code
    reports = torchair.graph_reports()[before:]
    assert len(reports) == 1
    if path >= 3:  # no host scalar at all: static from FX on (the report's path 1), one unit
        report = reports[0]
        assert report.build_static and report.launches_per_step == 1, str(report)
        assert report.fx_static and not report.value_dependent_ops, str(report)
    else:
        assert reports[0].build_static == (path == 1)


def test_doc_sample_graph_mode_on_cpu(tmp_path, monkeypatch):
    """TorchAir's documented sample of torchair.ops.npu_fused_infer_attention_score (tensor
    lengths, shared prefix, BNSD, compiled with dynamic=False) on CPU with small shapes."""
    monkeypatch.chdir(tmp_path)  # the sample dumps its graph (pbtxt) into the working directory
    import torchair as tng
    from torchair.configs.compiler_config import CompilerConfig

    config = CompilerConfig()
    config.debug.graph_dump.type = "pbtxt"
    config.debug.run_eagerly = True  # (not in the sample: the FX engine keeps the test fast)
    npu_backend = tng.get_npu_backend(compiler_config=config)

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 6, 16, dtype=torch.float16, generator=g)
    k = torch.randn(1, 2, 12, 16, dtype=torch.float16, generator=g)
    v = torch.randn(1, 2, 12, 16, dtype=torch.float16, generator=g)
    k_prefix = torch.randn(1, 2, 12, 16, dtype=torch.float16, generator=g)
    v_prefix = torch.randn(1, 2, 12, 16, dtype=torch.float16, generator=g)
    actual_seq_lengths_kv = torch.tensor([5])
    actual_seq_lengths = torch.tensor([3])
    actual_seq_lengths_prefix = torch.tensor([4])
    scale = 1 / math.sqrt(16.0)

    class Model(torch.nn.Module):
        def forward(self):
            return tng.ops.npu_fused_infer_attention_score(
                q, k, v, actual_seq_lengths=actual_seq_lengths,
                actual_seq_lengths_kv=actual_seq_lengths_kv, key_shared_prefix=k_prefix,
                value_shared_prefix=v_prefix, actual_shared_prefix_len=actual_seq_lengths_prefix,
                num_heads=2, input_layout="BNSD", scale=scale, pre_tokens=65535,
                next_tokens=65535)

    with torch.no_grad():
        model = torch.compile(Model(), backend=npu_backend, dynamic=False, fullgraph=True)
        graph_output = model()
    eager = Model()()
    torch.testing.assert_close(graph_output[0], eager[0], atol=0, rtol=0)
    assert graph_output[0].shape == (1, 2, 6, 16)
    # the same as the op without a prefix on the concatenated KV (prefix[:4] ++ key[:5])
    want = OP(q, torch.cat([k_prefix[:, :, :4], k[:, :, :5]], 2),
              torch.cat([v_prefix[:, :, :4], v[:, :, :5]], 2), actual_seq_lengths=[3],
              num_heads=2, input_layout="BNSD", scale=scale)[0]
    torch.testing.assert_close(graph_output[0], want, atol=1e-3, rtol=1e-3)
    assert graph_output[0][:, :, 3:].abs().max() == 0  # query rows past actual_seq_lengths
    assert list(tmp_path.iterdir()), "the sample's pbtxt dump"


@pytest.mark.inductor
def test_path4_inductor_one_static_unit_over_new_lengths():
    """Inductor's static unit (path 4 settings): the tensor lengths are unit inputs, so new
    values run the same unit, with the prefix (the general op: no launch kernel takes it)."""
    q, k, v, kp, vp = _inputs(9)
    first = [torch.tensor(x) for x in LENGTH_SETS[0]]
    backend_calls = len(torchair.graph_reports())
    compiled = compile_static(_attention, (q, k, v, kp, vp, *first), run_eagerly=False)
    for ql, kl, pl in LENGTH_SETS:
        args = (q, k, v, kp, vp, *(torch.tensor(x) for x in (ql, kl, pl)))
        for t in args:
            torch._dynamo.mark_static(t)
        torch.testing.assert_close(compiled(*args), _attention(*args))
    reports = torchair.graph_reports()[backend_calls:]
    assert len(reports) == 1 and reports[0].build_static and reports[0].launches_per_step == 1
    assert reports[0].engine.startswith("inductor"), str(reports[0])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_capture_and_path4_unit_with_prefix():
    """On CUDA: the tensor form with a prefix is captured in a CUDA graph (nothing read on the
    host) and replays new length values; path 4 builds one unit (a CUDA graph) that does too."""
    q, k, v, kp, vp = (t.cuda().half() for t in _inputs(11))
    lengths = [torch.tensor(x, device="cuda") for x in LENGTH_SETS[0]]
    _attention(q, k, v, kp, vp, *lengths)  # warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _attention(q, k, v, kp, vp, *lengths)
    compiled = compile_static(_attention, (q, k, v, kp, vp, *lengths), run_eagerly=True)
    before = len(torchair.graph_reports())
    for ql, kl, pl in LENGTH_SETS:
        for t, x in zip(lengths, (ql, kl, pl)):
            t.copy_(torch.tensor(x))
        graph.replay()
        want = _attention(*(t.cpu().float() for t in (q, k, v, kp, vp)), ql, kl, pl)
        torch.testing.assert_close(tuple(o.float().cpu() for o in out), want, atol=5e-3,
                                   rtol=5e-3)
        for t in (q, k, v, kp, vp, *lengths):
            torch._dynamo.mark_static(t)
        got = compiled(q, k, v, kp, vp, *lengths)
        torch.testing.assert_close(tuple(o.float().cpu() for o in got), want, atol=5e-3,
                                   rtol=5e-3)
    reports = torchair.graph_reports()[before:]
    assert len(reports) == 1 and reports[0].build_static, str(reports[0])
    assert "CUDA graph" in reports[0].launch, str(reports[0])
