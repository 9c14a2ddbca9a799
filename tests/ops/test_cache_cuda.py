"""Cache-write ops and PFA on a CUDA GPU: eager equals the CPU reference, a CUDA-graph capture
writes the cache in place at the replayed positions, and a path-4 decode step (one CUDA graph)
writes its KV cache inputs in place, equal to eager over steps."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import torchair
import torchair.ops
from torchair.ops.cache.scatter_nd_update import scatter_nd_update_reference
from torchair.ops.cache.scatter_update import scatter_update_reference

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

B, N, S, D = 3, 2, 16, 8
SU_ = torch.ops.npu.scatter_update_


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.int8])
def test_eager_equals_cpu_reference(dtype):
    g = torch.Generator().manual_seed(0)
    cache = torch.randn(B, N, S, D, generator=g).mul(20).to(dtype)
    upd = torch.randn(B, N, 2, D, generator=g).mul(20).to(dtype)
    idx = torch.tensor([0, 7, 14], dtype=torch.int32)
    want = scatter_update_reference(cache, idx, upd, -2)
    got = cache.cuda()
    assert SU_(got, idx.cuda(), upd.cuda(), -2) is got
    assert torch.equal(got.cpu(), want)
    paged = torch.randn(6, 4, N * D, generator=g).to(dtype)
    tokens = torch.randn(5, 1, N * D, generator=g).to(dtype)
    slots = torch.tensor([[0, 1], [5, 3], [2, 0], [2, 1], [4, 2]])
    want = scatter_update_reference(paged, slots, tokens, -2)
    assert torch.equal(torch.ops.npu.scatter_update(paged.cuda(), slots.cuda(), tokens.cuda(),
                                                    -2).cpu(), want)
    x = torch.randn(8, N, D, generator=g).to(dtype)
    rows = torch.tensor([[6], [1], [3]])
    u = torch.randn(3, N, D, generator=g).to(dtype)
    want = scatter_nd_update_reference(x, rows, u)
    assert torch.equal(torch.ops.npu.npu_scatter_nd_update(x.cuda(), rows.cuda(),
                                                           u.cuda()).cpu(), want)


def test_eager_out_of_range_names_indices():
    cache = torch.zeros(B, S, D, device="cuda")
    with pytest.raises(ValueError, match=r"indices\[2\]=-1 is out of range"):
        SU_(cache, torch.tensor([0, 1, -1], device="cuda"), torch.ones(B, 1, D, device="cuda"), 1)
    assert not cache.any()


def test_cuda_graph_capture_writes_in_place_at_replayed_positions():
    cache = torch.zeros(B, N, S, D, device="cuda")
    pos = torch.zeros(B, dtype=torch.int64, device="cuda")
    upd = torch.zeros(B, N, 1, D, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up outside the capture (eager path, host check)
        SU_(cache, pos, upd, -2)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        SU_(cache, pos, upd, -2)
    want = cache.cpu().clone()
    for step in range(3):
        new_pos = torch.tensor([step, 5 + step, 15 - step])
        new_upd = torch.randn(B, N, 1, D)
        pos.copy_(new_pos)
        upd.copy_(new_upd)
        graph.replay()
        want = scatter_update_reference(want, new_pos, new_upd, -2)
    torch.cuda.synchronize()
    assert torch.equal(cache.cpu(), want)


class _Step(torch.nn.Module):
    def forward(self, q, k, v, k_cache, v_cache, pos, lengths):
        torch.ops.npu.scatter_update_(k_cache, pos, k, 1)
        torch.ops.npu.scatter_update_(v_cache, pos, v, 1)
        return torch.ops.npu.npu_incre_flash_attention(
            q, k_cache, v_cache, actual_seq_lengths=lengths, num_heads=N, input_layout="BSH",
            scale_value=0.3) + 1


@pytest.mark.parametrize("run_eagerly", [True, False], ids=["fx-engine", "inductor-engine"])
def test_path4_decode_step_writes_cache_inputs_in_place(run_eagerly):
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = run_eagerly
    config.experimental_config.tiling_schedule_optimize = True
    backend = CompileCounterWithBackend(torchair.get_npu_backend(compiler_config=config))
    model = _Step()
    compiled = torch.compile(model, backend=backend, dynamic=True, fullgraph=True)
    caches = [torch.randn(B, S, N * D, device="cuda") for _ in range(2)]
    eager = [c.clone() for c in caches]
    pointers = [c.data_ptr() for c in caches]
    before = len(torchair.graph_reports())
    with torch.no_grad():
        for step in range(4):
            q, k, v = (torch.randn(B, 1, N * D, device="cuda") for _ in range(3))
            pos = torch.tensor([step, 3 + step, 9 - step], device="cuda")
            lengths = [step + 1, 4 + step, 10 - step]
            for t in (q, k, v, pos, *caches):
                torch._dynamo.mark_static(t)
            got = compiled(q, k, v, *caches, pos, lengths)
            want = model(q, k, v, *eager, pos, lengths)
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
            for c, e in zip(caches, eager):
                torch.testing.assert_close(c, e)
    assert [c.data_ptr() for c in caches] == pointers
    assert backend.frame_count == 1
    report = torchair.graph_reports()[before:][0]
    assert report.path == 4 and report.build_static and "CUDA graph" in report.launch, str(report)


def test_prompt_flash_attention_equals_cpu():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 6, D, generator=g).half()
    k = torch.randn(2, 2, 9, D, generator=g).half()
    v = torch.randn(2, 2, 9, D, generator=g).half()
    kw = dict(num_heads=4, num_key_value_heads=2, input_layout="BNSD", scale_value=0.35,
              sparse_mode=3, actual_seq_lengths=[6, 4], actual_seq_lengths_kv=[9, 5])
    want = torch.ops.npu.npu_prompt_flash_attention(q, k, v, **kw)
    got = torch.ops.npu.npu_prompt_flash_attention(q.cuda(), k.cuda(), v.cuda(), **kw)
    torch.testing.assert_close(got.cpu(), want, atol=2e-3, rtol=2e-3)
