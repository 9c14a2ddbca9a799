"""Decode steps that write a KV cache input with scatter_update_ / npu_scatter_nd_update_ and read
it with IFA / FIA, compiled on path 4: one static unit, the write in place and visible to the
caller, equal to eager over steps with new positions, no recompile."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import torchair
import torchair.ops
from tests.ops._units import op_calls

B, N, S, D = 2, 2, 8, 4
H = N * D


class _IfaStep(torch.nn.Module):
    """BNSD caches written at ``pos`` (axis -2), then incremental attention over them."""

    def forward(self, q, k, v, k_cache, v_cache, pos, lengths):
        torch.ops.npu.scatter_update_(k_cache, pos, k, -2)
        torch.ops.npu.scatter_update_(v_cache, pos, v, -2)
        return torch.ops.npu.npu_incre_flash_attention(
            q, k_cache, v_cache, actual_seq_lengths=lengths, num_heads=N, input_layout="BNSD",
            scale_value=0.5) * 2


class _FiaStep(torch.nn.Module):
    """BSH caches written at rows (batch, position) with scatter_nd, then FIA (BSH)."""

    def forward(self, q, k, v, k_cache, v_cache, rows, kv_lengths):
        torch.ops.npu.npu_scatter_nd_update_(k_cache, rows, k)
        torch.ops.npu.npu_scatter_nd_update_(v_cache, rows, v)
        out, _ = torch.ops.npu.npu_fused_infer_attention_score(
            q, k_cache, v_cache, actual_seq_lengths_kv=kv_lengths, num_heads=N,
            input_layout="BSH", scale=0.5)
        return out + 1


def _compiled(model, run_eagerly: bool):
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = run_eagerly
    config.experimental_config.tiling_schedule_optimize = True
    torch._dynamo.reset()
    backend = CompileCounterWithBackend(torchair.get_npu_backend(compiler_config=config))
    return torch.compile(model, backend=backend, dynamic=True, fullgraph=True), backend


def _ifa_inputs(step, g):
    q, k, v = (torch.randn(B, N, 1, D, generator=g) for _ in range(3))
    pos = torch.tensor([2 + step, 5 - step], dtype=torch.int32)
    return (q, k, v), pos, [3 + step, 6 - step]


def _fia_inputs(step, g):
    q, k, v = (torch.randn(B, 1, H, generator=g) for _ in range(3))
    pos = [1 + 2 * step, 4 + step]
    rows = torch.tensor([[0, pos[0]], [1, pos[1]]])
    return (q, k.view(B, H), v.view(B, H)), rows, [p + 1 for p in pos]


def _run_steps(model, make, cache_shape, run_eagerly):
    compiled, backend = _compiled(model, run_eagerly)
    g = torch.Generator().manual_seed(0)
    caches = [torch.randn(cache_shape, generator=g) for _ in range(2)]
    eager_caches = [c.clone() for c in caches]
    before = len(torchair.graph_reports())
    with torch.no_grad():
        for step in range(3):
            (q, k, v), index, lengths = make(step, g)
            for t in (q, k, v, index, *caches):
                torch._dynamo.mark_static(t)
            got = compiled(q, k, v, *caches, index, lengths)
            want = model(q, k, v, *eager_caches, index, lengths)
            torch.testing.assert_close(got, want)
            for c, e in zip(caches, eager_caches):  # the write is visible to the caller
                assert torch.equal(c, e)
    assert backend.frame_count == 1  # new positions and lengths: no recompile
    reports = torchair.graph_reports()[before:]
    assert len(reports) == 1
    report = reports[0]
    assert report.path == 4 and report.build_static, str(report)
    assert report.launch.startswith("one launch unit"), str(report)
    return compiled, report, caches, (q, k, v, index, lengths)


def test_scatter_update_decode_step_is_one_static_unit_written_in_place():
    _, report, _, _ = _run_steps(_IfaStep(), _ifa_inputs, (B, N, S, D), run_eagerly=True)
    assert report.passes.get("reinplace_inputs") == 2, str(report)
    assert sum(i.mutated for i in report.inputs) == 2, str(report)


def test_scatter_nd_update_decode_step_is_one_static_unit_written_in_place():
    compiled, report, caches, (q, k, v, rows, lengths) = _run_steps(
        _FiaStep(), _fia_inputs, (B, S, H), run_eagerly=True)
    assert report.passes.get("reinplace_inputs") == 2, str(report)
    # the unit writes the caches with the in-place op (no functional copy of the whole cache)
    with torch.no_grad():  # as compiled (grad mode is guarded)
        calls = op_calls(compiled, q, k, v, *caches, rows, lengths)
    assert "npu::npu_scatter_nd_update_" in calls and "npu::npu_scatter_nd_update" not in calls


def test_functional_scatter_update_in_a_graph_leaves_its_input():
    def f(cache, pos, upd):
        new = torch.ops.npu.scatter_update(cache, pos, upd, 1)
        return new.sum(1), new

    compiled, _ = _compiled(f, run_eagerly=True)
    cache, pos, upd = torch.randn(B, S, H), torch.tensor([0, 7]), torch.randn(B, 1, H)
    before = cache.clone()
    got_sum, got = compiled(cache, pos, upd)
    assert torch.equal(cache, before)
    want = torch.ops.npu.scatter_update(cache, pos, upd, 1)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_sum, want.sum(1))


def test_out_of_range_position_in_the_compiled_unit_names_indices():
    compiled, _ = _compiled(_IfaStep(), run_eagerly=True)
    g = torch.Generator().manual_seed(1)
    (q, k, v), pos, lengths = _ifa_inputs(0, g)
    caches = [torch.zeros(B, N, S, D) for _ in range(2)]
    compiled(q, k, v, *caches, pos, lengths)
    with pytest.raises(ValueError, match=r"scatter_update: indices\[1\]=8 is out of range"):
        compiled(q, k, v, *caches, torch.tensor([1, S], dtype=torch.int32), lengths)


@pytest.mark.inductor
def test_scatter_update_decode_step_under_inductor():
    _, report, _, _ = _run_steps(_IfaStep(), _ifa_inputs, (B, N, S, D), run_eagerly=False)
    assert report.passes.get("reinplace_inputs") == 2, str(report)


def test_writes_through_views_of_one_kv_input():
    """k and v caches as views ``kv[0]`` / ``kv[1]`` of one input: both writes reach it."""
    def f(kv, pos, k, v):
        torch.ops.npu.scatter_update_(kv[0], pos, k, 1)
        rows = torch.stack([torch.arange(B), pos], 1)
        torch.ops.npu.npu_scatter_nd_update_(kv[1], rows, v[:, 0])
        return kv.sum(2)

    compiled, backend = _compiled(f, run_eagerly=True)
    kv = torch.randn(2, B, S, H)
    eager = kv.clone()
    for step in range(3):
        pos = torch.tensor([step, S - 1 - step])
        k, v = torch.randn(B, 1, H), torch.randn(B, 1, H)
        torch.testing.assert_close(compiled(kv, pos, k, v), f(eager, pos, k, v))
        assert torch.equal(kv, eager)
    assert backend.frame_count == 1
