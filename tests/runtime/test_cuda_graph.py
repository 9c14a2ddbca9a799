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
    model, twin, config = _pair(Decode, device, run_eagerly)
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


def test_sunk_scalars_staged_while_the_device_is_busy():
    """The sunk buffer's values go through one pageable host tensor rewritten every call: each
    launch must see its own values even when the device has not run the earlier copies yet (20
    calls queue behind a long kernel)."""
    import operator

    from torchair.plan.sink import HostScalarProgram, StepRef
    from torchair.runtime.staging import SunkScalars

    program = HostScalarProgram(input_indices=(0, 1), steps=((operator.add, (StepRef(0), 1), {}),),
                                slots=(StepRef(2), StepRef(1)), input_names=("a", "b"))
    sunk = SunkScalars(program, torch.device("cuda"))
    seen = []
    torch.cuda._sleep(50_000_000)  # the copies below queue behind this
    for a in range(20):
        buffer = sunk.stage([a, -a])
        seen.append(buffer.clone())  # queued on the stream after this call's copy
    torch.cuda.synchronize()
    assert [s.tolist() for s in seen] == [[a + 1, -a] for a in range(20)]


def test_inputs_in_persistent_buffers_are_read_in_place_and_new_buffers_are_copied(tmp_path):
    """A capture adopts the first call's device inputs (no copy while the caller keeps them in
    the same buffers); inputs in other buffers go through a capture on owned buffers; both equal
    eager at every step. Also run on CPU by the CPU emulation (test_static_unit.py)."""
    check_adopted_inputs(torch.device("cuda"), str(tmp_path))


def _cached(module_class, device, cache_dir, run_eagerly):
    """(model, its eager twin with the same weights, the model's forward through cache_compile
    as path 4)."""
    model, twin, config = _pair(module_class, device, run_eagerly)
    return model, twin, torchair.inference.cache_compile(model.forward, config=config,
                                                         cache_dir=cache_dir)


def _pair(module_class, device, run_eagerly):
    """(a seeded model, its eager twin with the same weights, a path-4 config: tiling sink on,
    the FX engine when ``run_eagerly``)."""
    torch.manual_seed(0)
    model = module_class().to(device).eval()
    twin = module_class().to(device).eval()
    twin.load_state_dict(model.state_dict())
    config = torchair.CompilerConfig()
    config.experimental_config.tiling_schedule_optimize = True
    config.debug.run_eagerly = run_eagerly
    return model, twin, config


def check_adopted_inputs(device: torch.device, cache_dir: str, run_eagerly: bool = False) -> None:
    """A cached path-4 step over persistent and fresh input buffers on ``device`` (see the
    test above); ``run_eagerly``: the FX engine."""
    from torchair.runtime.staging import InputStager

    copies = []
    copy_in = InputStager._copy_in

    def counting(self, i, arg):
        copies.append(i)
        return copy_in(self, i, arg)

    model, twin, compiled = _cached(Decode, device, cache_dir, run_eagerly)
    kc, vc = torch.randn(B, S, H, device=device), torch.randn(B, S, H, device=device)
    ref_kc, ref_vc = kc.clone(), vc.clone()
    x_buf, p_buf = torch.randn(B, 1, H, device=device), torch.tensor([0], device=device)
    g = torch.Generator().manual_seed(3)
    InputStager._copy_in = counting
    try:
        with torch.no_grad():
            for step in range(24):
                lens = torch.randint(0, S + 1, (2,), generator=g).tolist()
                if step < 12 or step % 3 == 0:  # the persistent buffers, written in place
                    x_buf.normal_()
                    p_buf.fill_(step % S)
                    x, p = x_buf, p_buf
                else:
                    x, p = torch.randn(B, 1, H, device=device), torch.tensor([step % S],
                                                                             device=device)
                for t in (x, p, kc, vc):
                    torch._dynamo.mark_static(t)
                before = len(copies)
                out = compiled(x, p, lens, kc, vc)
                ref = twin(x, p, lens, ref_kc, ref_vc)
                torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4,
                                           msg=lambda m: f"step {step}: {m}")
                torch.testing.assert_close(kc, ref_kc, atol=1e-5, rtol=0)
                if 0 < step < 12:
                    assert len(copies) == before, (step, copies[before:])
    finally:
        InputStager._copy_in = copy_in
    assert copies, "the fresh inputs were never copied into owned buffers"


class _Normed(torch.nn.Module):
    """A float attribute (``eps``), which cache_compile's graph takes as a 0-d CPU tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(H, H)
        self.eps = 1e-6

    def forward(self, x, pos, lens, kc, vc):
        h = self.lin(x)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        kc.index_copy_(1, pos, h)
        return torch.ops.npu.npu_incre_flash_attention(
            h, kc, vc, actual_seq_lengths=lens, num_heads=HEADS, input_layout="BSH",
            scale_value=0.25)


@pytest.mark.parametrize("run_eagerly", [True, False], ids=["fx-engine", "inductor-engine"])
def test_cached_module_with_a_float_attribute_replays_a_cuda_graph(tmp_path, run_eagerly):
    """A module's float (``eps``) reaches the graph as a 0-d CPU tensor: the unit reads it from a
    device copy, so the step is still one CUDA graph replay, and a new eps is used."""
    device = torch.device("cuda")
    model, twin, compiled = _cached(_Normed, device, str(tmp_path), run_eagerly)
    kc, vc = torch.randn(B, S, H, device=device), torch.randn(B, S, H, device=device)
    ref_kc = kc.clone()
    x, p = torch.randn(B, 1, H, device=device), torch.tensor([3], device=device)
    before = len(torchair.graph_reports())
    with torch.no_grad():
        for step in range(8):
            if step == 5:
                model.eps = twin.eps = 0.5  # a large eps changes the result visibly
            for t in (x, p, kc, vc):
                torch._dynamo.mark_static(t)
            lens = [10 + step, 20 + step]
            out = compiled(x, p, lens, kc, vc)
            ref = twin(x, p, lens, ref_kc, vc)
            torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4,
                                       msg=lambda m: f"step {step}: {m}")
    reports = torchair.graph_reports()[before:]
    assert reports and all("CUDA graph" in r.launch for r in reports), \
        [(r.launch, r.reasons) for r in reports]
