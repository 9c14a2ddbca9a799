"""SuperKernel segments run as launch units (issue 7, item 4): in a host-scheduled graph each
static segment is one launch unit (CPU: one compiled call; CUDA: one CUDA graph, emulated on CPU
here), the skipped op and the ops outside scopes run between them, results equal the unscoped
model; symbolic shapes warn and run unfused; a graph that is one launch unit already is left
whole."""
import logging

import pytest
import torch

import torchair
from torchair.core import recorder
from torchair.runtime import units

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, CAPACITY = 64, 4, 2, 16, 32
npu = torch.ops.npu


class Step(torch.nn.Module):
    """A decode step: projections in a scope around incremental flash attention, which reads
    ``actual_seq_lengths`` on the host (tiling sink off): the scope splits in two segments."""

    def __init__(self, scoped: bool, write_cache: bool = False):
        super().__init__()
        self.scoped = scoped
        self.write_cache = write_cache
        self.q = torch.nn.Linear(HIDDEN, HIDDEN)
        self.k = torch.nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM)
        self.o = torch.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x, k_cache, v_cache, pos, lengths: list):
        scope = torchair.scope.super_kernel("sk1") if self.scoped else _Nothing()
        with scope:
            q = torch.nn.functional.gelu(self.q(x)) * 0.5
            if self.write_cache:
                k_cache.index_copy_(1, pos, self.k(x))
                v_cache.index_copy_(1, pos, self.k(x).sin())
            attn = npu.npu_incre_flash_attention(
                q, k_cache, v_cache, actual_seq_lengths=lengths, num_heads=HEADS,
                num_key_value_heads=KV_HEADS, input_layout="BSH", scale_value=HEAD_DIM ** -0.5)
            out = self.o(attn).relu() + q
        return out * 2 + x


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _config(engine="fx"):
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = engine == "fx"
    return config


def _inputs(seed=0, batch=2):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 1, HIDDEN, generator=g)
    caches = [torch.randn(batch, CAPACITY, KV_HEADS * HEAD_DIM, generator=g) for _ in range(2)]
    pos = torch.tensor([3 + seed % 5])
    return x, *caches, pos


def _compile(model, config, dynamic=True, static_inputs=True):
    compiled = torch.compile(model, backend=torchair.get_npu_backend(compiler_config=config),
                             dynamic=dynamic, fullgraph=True)

    def run(x, k_cache, v_cache, pos, lengths):
        if static_inputs:
            for t in (x, k_cache, v_cache, pos):
                torch._dynamo.mark_static(t)
        with torch.no_grad():
            return compiled(x, k_cache, v_cache, pos, lengths)

    return run


def _pair(write_cache=False, engine="fx"):
    torch.manual_seed(0)
    scoped = Step(True, write_cache).eval()
    plain = Step(False, write_cache).eval()
    plain.load_state_dict(scoped.state_dict())
    return scoped, plain


# ------------------------------------------------------------------------------ CPU

def test_segments_around_a_host_op_run_as_separate_launch_units():
    scoped, plain = _pair()
    with recorder.recording() as records:
        run_sk = _compile(scoped, _config())
        run_plain = _compile(plain, _config())
        for step, lengths in enumerate(([5, 9], [7, 30], [17, 2])):
            args = _inputs(step)
            out_sk = run_sk(*args, lengths)
            out_plain = run_plain(*args, lengths)
            assert torch.equal(out_sk, out_plain)  # the same ATen ops: bit for bit
            with torch.no_grad():
                torch.testing.assert_close(out_sk, plain(*args, lengths))
    sk_report, plain_report = [r.report for r in records]
    plan = sk_report.segments["sk1"]
    assert len(plan["segments"]) == 2 and len(plan["skipped"]) == 1
    assert plan["launch"] == ["one launch unit: one compiled call (fx engine)"] * 2
    assert sk_report.launch.startswith("host-scheduled: 2 super_kernel segment(s)")
    unit = records[0].launch_unit
    assert [lau.launches for lau in unit.launchers.values()] == [3, 3]  # once per step each
    # 2 segments + attention + the two ops after the scope (out * 2 + x)
    assert sk_report.launches_per_step == 5
    assert plain_report.launches_per_step == 9  # every op on its own (views not counted)
    text = str(sk_report)
    assert "segment 1: " in text and "-> one launch unit" in text
    assert "launches per step: 5" in text


def test_captured_segments_with_an_in_place_cache_update_match_the_unscoped_model():
    """CUDA-graph mode emulated on CPU: each segment captured once, replayed on staged inputs;
    the KV cache written in a segment in place, the outputs fresh every step."""
    scoped, plain = _pair(write_cache=True)
    with units.capture_mode("emulate"), recorder.recording() as records:
        run_sk = _compile(scoped, _config())
        run_plain = _compile(plain, _config())
        x, k_cache, v_cache, _ = _inputs()
        caches_plain = [k_cache.clone(), v_cache.clone()]
        outs = []
        for step, lengths in enumerate(([5, 9], [7, 30], [17, 12])):
            x = _inputs(step)[0]
            pos = torch.tensor([4 + step])
            out_sk = run_sk(x, k_cache, v_cache, pos, lengths)
            out_plain = run_plain(x, *caches_plain, pos, lengths)
            assert torch.equal(out_sk, out_plain)
            assert torch.equal(k_cache, caches_plain[0]) and torch.equal(v_cache, caches_plain[1])
            outs.append((out_sk, out_sk.clone()))
    for out, copy in outs:  # not overwritten by later replays
        assert torch.equal(out, copy)
    report = records[0].report
    assert set(report.segments["sk1"]["launch"]) == {
        "one launch unit: captured replay (CPU emulation)"}
    # the KV writes (made in place by reinplace_inputs) stay inside the scope: only the
    # attention op splits it
    first, second = report.segments["sk1"]["segments"]
    assert {"index_copy__default", "index_copy__default_1"} <= set(first)
    unit = records[0].launch_unit
    assert all(len(lau._captures) == 1 for lau in unit.launchers.values())  # no recapture
    # parameters (and their transposes, views kept on the host) are used in place, not copied
    # (the first segment also reads x through three views and pos: those four are copied in;
    # the caches it writes are not)
    assert all(lau.mutated <= lau.borrowed for lau in unit.launchers.values())
    assert all(cap.stager.copies <= 4 * 3 for lau in unit.launchers.values()
               for cap in lau._captures.values())


def test_symbolic_shapes_warn_and_run_unfused(torchair_log):
    scoped, plain = _pair()
    run_sk = _compile(scoped, _config(), static_inputs=False)
    args = _inputs(batch=3)
    out = run_sk(*args, [5, 9, 11])
    with torch.no_grad():
        assert torch.equal(out, _compile(plain, _config(), static_inputs=False)(*args,
                                                                                 [5, 9, 11]))
    report = torchair.graph_reports()[-2]
    warnings = [r.getMessage() for r in torchair_log if r.levelno == logging.WARNING
                and "super_kernel scope" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "scope 'sk1' has symbolic shapes (input 3 (`L_x_`) dim 0 (s" in warnings[0]
    assert "runs unfused" in warnings[0] and "mark_static" in warnings[0]
    assert all(how.startswith("unfused, op by op: symbolic shapes (input 3 (`L_x_`) dim 0")
               for how in report.segments["sk1"]["launch"])
    assert report.launch == "host-scheduled, shape-generic"


def test_a_static_graph_keeps_its_scopes_inside_its_one_launch_unit():
    def fn(x, w):
        h = x @ w
        with torchair.scope.super_kernel("sk"):
            y = torch.nn.functional.silu(h) * h
        return y + 1

    x, w = torch.randn(4, 8), torch.randn(8, 8)
    out = torch.compile(fn, backend=torchair.get_npu_backend(compiler_config=_config()),
                        dynamic=False, fullgraph=True)(x, w)
    assert torch.equal(out, fn(x, w))
    report = torchair.graph_reports()[-1]
    assert report.launches_per_step == 1
    assert report.segments["sk"]["launch"] == [
        "inside the graph's one launch unit: one fixed-shape compiled call"]


def test_interleaved_scopes_tuple_outputs_and_an_op_outside():
    def fn(x, r, gamma, k_cache, v_cache, lengths: list):
        with torchair.scope.super_kernel("a"):
            y, _, xo = npu.npu_add_rms_norm(x, r, gamma)  # a tuple: getitems join the segment
            q = y * 2
        with torchair.scope.super_kernel("b"):
            z = xo.sigmoid()
        attn = npu.npu_incre_flash_attention(
            q, k_cache, v_cache, actual_seq_lengths=lengths, num_heads=HEADS,
            num_key_value_heads=KV_HEADS, input_layout="BSH", scale_value=HEAD_DIM ** -0.5)
        with torchair.scope.super_kernel("a"):
            out = attn.tanh() + z
        return out, y

    g = torch.Generator().manual_seed(1)
    args = [torch.randn(2, 1, HIDDEN, generator=g) for _ in range(2)] + [
        torch.rand(HIDDEN, generator=g)] + [
        torch.randn(2, CAPACITY, KV_HEADS * HEAD_DIM, generator=g) for _ in range(2)]
    for t in args:
        torch._dynamo.mark_static(t)
    with units.capture_mode("emulate"):
        compiled = torch.compile(fn, backend=torchair.get_npu_backend(compiler_config=_config()),
                                 dynamic=True, fullgraph=True)
        for lengths in ([4, 9], [30, 3]):
            out, y = compiled(*args, lengths)
            ref_out, ref_y = fn(*args, lengths)
            torch.testing.assert_close(out, ref_out)
            torch.testing.assert_close(y, ref_y)
    report = torchair.graph_reports()[-1]
    assert len(report.segments["a"]["segments"]) == 2
    assert len(report.segments["b"]["segments"]) == 1
    assert report.launches_per_step == 3 + 1  # three segments, attention


@pytest.mark.inductor
def test_segments_compile_with_inductor_and_match():
    scoped, plain = _pair()
    args = _inputs()
    with recorder.recording() as records:
        out_sk = _compile(scoped, _config("inductor"))(*args, [5, 9])
    with torch.no_grad():
        torch.testing.assert_close(out_sk, plain(*args, [5, 9]))
    report = records[0].report
    assert report.segments["sk1"]["launch"] == [
        "one launch unit: one compiled call (inductor engine)"] * 2
    assert report.engine == "inductor (segments) + fx (host)"


# ------------------------------------------------------------------------------ CUDA

@pytest.mark.cuda
def test_cuda_each_segment_is_one_cuda_graph_replay():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    scoped, plain = _pair(write_cache=True)
    scoped, plain = scoped.cuda(), plain.cuda()
    with recorder.recording() as records:
        run_sk = _compile(scoped, _config())
        run_plain = _compile(plain, _config())
        x, k_cache, v_cache, _ = (t.cuda() for t in _inputs())
        caches_plain = [k_cache.clone(), v_cache.clone()]
        for step, lengths in enumerate(([5, 9], [7, 30], [17, 12])):
            x = _inputs(step)[0].cuda()
            pos = torch.tensor([4 + step], device="cuda")
            out_sk = run_sk(x, k_cache, v_cache, pos, lengths)
            out_plain = run_plain(x, *caches_plain, pos, lengths)
            torch.testing.assert_close(out_sk, out_plain)
            torch.testing.assert_close(k_cache, caches_plain[0])
    report = records[0].report
    assert report.segments["sk1"]["launch"] == ["one launch unit: CUDA graph replay"] * 2
    unit = records[0].launch_unit
    assert all(len(lau._captures) == 1 for lau in unit.launchers.values())
