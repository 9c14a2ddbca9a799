"""Path 4 on a CUDA GPU: the static graph is captured once as a CUDA graph and replayed."""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend

import torchair

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

B, S, H, HEADS = 2, 64, 64, 4


class Decode(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = torch.nn.Linear(H, H)
        self.k = torch.nn.Linear(H, H)
        self.up = torch.nn.Linear(H, 2 * H)
        self.down = torch.nn.Linear(2 * H, H)

    def forward(self, x, pos, lens, kc, vc):
        kc.index_copy_(1, pos, self.k(x))
        vc[:, :1].add_(x)  # not idempotent: a repeated warm-up mutation would show
        attn = torch.ops.npu.npu_incre_flash_attention(
            self.q(x), kc, vc, actual_seq_lengths=lens, num_heads=HEADS, input_layout="BSH",
            scale_value=0.25)
        h = x + attn
        return h + self.down(torch.relu(self.up(h)))


@pytest.mark.parametrize("run_eagerly", [True, False], ids=["fx-engine", "inductor-engine"])
def test_path4_cuda_graph_replay_equals_eager(run_eagerly):
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = Decode().to(device).eval()
    twin = Decode().to(device).eval()
    twin.load_state_dict(model.state_dict())
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = run_eagerly
    config.experimental_config.tiling_schedule_optimize = True
    counter = CompileCounterWithBackend(torchair.get_npu_backend(compiler_config=config))
    compiled = torch.compile(model, backend=counter, dynamic=True, fullgraph=True)
    kc = torch.randn(B, S, H, device=device)
    vc = torch.randn(B, S, H, device=device)
    ref_kc, ref_vc = kc.clone(), vc.clone()
    g = torch.Generator().manual_seed(3)
    steps = [([5, 7], 0)] + [(torch.randint(0, S + 1, (2,), generator=g).tolist(), i % S)
                             for i in range(1, 40)]
    before = len(torchair.graph_reports())
    outputs = []
    with torch.no_grad():
        for step, (lens, pos) in enumerate(steps):
            x = torch.randn(B, 1, H, device=device)
            p = torch.tensor([pos], device=device)
            for t in (x, p, kc, vc):
                torch._dynamo.mark_static(t)
            out = compiled(x, p, lens, kc, vc)
            ref = twin(x, p, lens, ref_kc, ref_vc)
            torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4,
                                       msg=lambda m: f"step {step} lens {lens}: {m}")
            torch.testing.assert_close(kc, ref_kc, atol=1e-5, rtol=0)
            torch.testing.assert_close(vc, ref_vc, atol=1e-5, rtol=0)
            outputs.append((out, ref))
    assert counter.frame_count == 1
    reports = torchair.graph_reports()[before:]
    assert len(reports) == 1
    report = reports[0]
    assert report.path == 4 and report.build_static, str(report)
    assert "CUDA graph" in report.launch, report.launch
    assert report.sunk_inputs == ["L_lens_0_", "L_lens_1_"]
    assert all(i.device.startswith("cuda") for i in report.inputs if i.kind != "symint")
    # earlier outputs were not overwritten by later replays
    for out, ref in outputs:
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
