"""An MoE layer of the torch_npu MoE ops (gating top-k -> init routing -> expert token counts ->
grouped matmul (gate/up) -> SwiGLU -> grouped matmul (down) -> finalize routing) against a dense
one-hot computation (every expert on every token), and compiled on path 4 as one static unit."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torchair
import torchair.ops  # noqa: F401 (registers the ops)
from tests.ops._units import compile_static

T, H, I, E, TOP_K = 5, 16, 8, 4, 2  # tokens, hidden, expert intermediate, experts, top-k


class MoE(torch.nn.Module):
    """The fused-MoE step of vllm-ascend's TorchAir path, on weights ``w13 [E, H, 2I]``
    (gate | up) and ``w2 [E, I, H]``."""

    def forward(self, h, router, bias, w13, w2):
        n = h.shape[0]
        weights, ids, _ = torch.ops.npu.npu_moe_gating_top_k(
            h @ router, TOP_K, bias=bias, norm_type=1)
        row_idx = torch.arange(n * TOP_K, dtype=torch.int32, device=h.device)
        row_idx = row_idx.view(TOP_K, n).t().contiguous()
        rows, src_to_dst, sorted_ids = torch.ops.npu.npu_moe_init_routing(h, row_idx, ids, n)
        ends = torch.ops.npu.npu_moe_compute_expert_tokens(sorted_ids, E).to(torch.int64)
        gate_up = torch.ops.npu.npu_grouped_matmul([rows], [w13], group_list=ends, split_item=2,
                                                   group_type=0, group_list_type=0)[0]
        gate, up = gate_up.chunk(2, dim=-1)
        down = torch.ops.npu.npu_grouped_matmul([F.silu(gate) * up], [w2], group_list=ends,
                                                split_item=2, group_type=0)[0]
        return torch.ops.npu.npu_moe_finalize_routing(down, None, None, None, weights,
                                                      src_to_dst, ids)


def _weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(H, E, generator=g), torch.randn(E, generator=g) * 0.1,
            torch.randn(E, H, 2 * I, generator=g) * 0.3, torch.randn(E, I, H, generator=g) * 0.3)


def _dense(h, router, bias, w13, w2):
    """Every expert applied to every token, summed with a one-hot top-k weight matrix."""
    weights, ids, _ = torch.ops.npu.npu_moe_gating_top_k(h @ router, TOP_K, bias=bias,
                                                         norm_type=1)
    onehot = torch.zeros(h.shape[0], E, dtype=torch.float64)
    onehot.scatter_(1, ids.long(), weights.double())
    out = torch.zeros(h.shape[0], H, dtype=torch.float64)
    for e in range(E):
        gu = h.double() @ w13[e].double()
        y = (F.silu(gu[:, :I]) * gu[:, I:]) @ w2[e].double()
        out += onehot[:, e:e + 1] * y
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_moe_layer_equals_dense_one_hot(seed):
    router, bias, w13, w2 = _weights(seed)
    h = torch.randn(T, H, generator=torch.Generator().manual_seed(seed + 7))
    got = MoE()(h, router, bias, w13, w2)
    torch.testing.assert_close(got.double(), _dense(h, router, bias, w13, w2), rtol=1e-5,
                               atol=1e-5)


def _run_path4(run_eagerly):
    router, bias, w13, w2 = _weights(3)
    g = torch.Generator().manual_seed(5)
    h = torch.randn(T, H, generator=g)
    model = MoE()
    compiled = compile_static(model, (h, router, bias, w13, w2), run_eagerly=run_eagerly)
    before = len(torchair.graph_reports())
    with torch.no_grad():
        for _ in range(3):  # new routing each call: group_list values change, shapes do not
            h.copy_(torch.randn(T, H, generator=g))
            got = compiled(h, router, bias, w13, w2)
            torch.testing.assert_close(got, model(h, router, bias, w13, w2))
            torch.testing.assert_close(got.double(), _dense(h, router, bias, w13, w2),
                                       rtol=1e-5, atol=1e-5)
    reports = torchair.graph_reports()[before:]
    assert len(reports) == 1, [str(r) for r in reports]  # one graph, no recompile
    # every input is mark_static and no host integer enters: the report names it path 1
    assert reports[0].build_static and reports[0].launches_per_step == 1, str(reports[0])


def test_moe_layer_path4_one_static_unit():
    _run_path4(run_eagerly=True)


@pytest.mark.inductor
def test_moe_layer_path4_inductor():
    _run_path4(run_eagerly=False)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_moe_layer_cuda_graph_one_static_unit():
    """On CUDA the grouped matmul takes its sync-free path, so the layer replays as a CUDA graph
    and equals the CPU computation."""
    router, bias, w13, w2 = (t.cuda() for t in _weights(4))
    g = torch.Generator().manual_seed(6)
    h = torch.randn(T, H, generator=g).cuda()
    model = MoE()
    compiled = compile_static(model, (h, router, bias, w13, w2), run_eagerly=True)
    before = len(torchair.graph_reports())
    with torch.no_grad():
        for _ in range(3):
            h.copy_(torch.randn(T, H, generator=g))
            got = compiled(h, router, bias, w13, w2)
            torch.testing.assert_close(got, model(h, router, bias, w13, w2))
            cpu = [t.cpu() for t in (h, router, bias, w13, w2)]
            torch.testing.assert_close(got.cpu(), model(*cpu), rtol=1e-4, atol=1e-4)
    reports = torchair.graph_reports()[before:]
    assert len(reports) == 1 and reports[0].build_static, [str(r) for r in reports]
    assert "CUDA graph" in reports[0].launch, str(reports[0])
