"""The four compile paths of seed 000 end to end, through ``torch.compile``.

A small decode step: q/k/v projections, a KV cache passed as arguments and written in place at
position ``pos`` (``index_copy_``, or slice assignment ``kc[:, p:p+1] = k``), incremental flash
attention with ``actual_seq_lengths=lens``, then an MLP. Every compiled run is compared with an
uncompiled twin model that owns its own copies of the caches: outputs allclose, caches equal.

Dynamo facts the tests rely on: with ``dynamic=True`` the ints of ``lens`` become SymInts, but the
values 0 and 1 are specialized and equal values may be "duck sized" together on the FIRST call, so
the first call always uses distinct lengths >= 2 that differ from every tensor size (2, 16, 32).
"""
from __future__ import annotations

import dataclasses
import os
import random

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend

import torchair

B, S, H, HEADS = 2, 16, 32, 4
OP = "npu_incre_flash_attention"

# (fx_static, ir_static, build_static) per path: the SPEC table
FLAGS = {1: (True, True, True), 2: (False, False, False), 3: (False, True, False),
         4: (False, True, True)}

# first entry: distinct, >= 2, and no tensor size; later entries may be anything in [0, S]
LENGTH_SETS = [[5, 7], [3, 9], [1, 12], [16, 16], [0, 4], [10, 2]]
POSITIONS = [3, 4, 5, 6, 7, 8]


class Decode(torch.nn.Module):
    """One decode step with a KV cache written in place."""

    def __init__(self, write: str = "index_copy", lens_fn=None, scale_by_len: bool = False,
                 graph_break: bool = False) -> None:
        super().__init__()
        self.q = torch.nn.Linear(H, H)
        self.k = torch.nn.Linear(H, H)
        self.v = torch.nn.Linear(H, H)
        self.up = torch.nn.Linear(H, 2 * H)
        self.down = torch.nn.Linear(2 * H, H)
        self.write = write
        self.lens_fn = lens_fn
        self.scale_by_len = scale_by_len
        self.graph_break = graph_break

    def forward(self, x, pos, lens, kc, vc):
        k, v = self.k(x), self.v(x)
        if self.write == "index_copy":
            kc.index_copy_(1, pos, k)
            vc.index_copy_(1, pos, v)
        else:  # slice assignment at an int position
            kc[:, pos:pos + 1] = k
            vc[:, pos:pos + 1] = v
        # scale_value is a literal 1/sqrt(H // HEADS), not a global: with dynamic=True Dynamo
        # traces a global float as a SymFloat and restarts the compile to specialize it, which
        # calls the backend twice for one graph
        seq = self.lens_fn(lens) if self.lens_fn is not None else lens
        attn = torch.ops.npu.npu_incre_flash_attention(
            self.q(x), kc, vc, actual_seq_lengths=seq, num_heads=HEADS, input_layout="BSH",
            scale_value=0.35355339059327373)
        if self.scale_by_len:
            attn = attn * lens[0]
        h = x + attn
        if self.graph_break:
            torch._dynamo.graph_break()
        return h + self.down(torch.relu(self.up(h)))


def make_config(path: int, *, eager: bool = True) -> torchair.CompilerConfig:
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = eager
    config.experimental_config.tiling_schedule_optimize = path == 4
    return config


@dataclasses.dataclass
class Run:
    reports: list
    frames: int
    outputs: list


def run_steps(path: int, steps, *, write: str = "index_copy", config=None, fullgraph=True,
              atol=1e-5, **model_kwargs) -> Run:
    """Compile a Decode model the way ``path`` says and run ``steps`` = [(lens, pos), ...],
    checking outputs and caches against an uncompiled twin after every step."""
    torch.manual_seed(0)
    model = Decode(write, **model_kwargs).eval()
    twin = Decode(write, **model_kwargs).eval()
    twin.load_state_dict(model.state_dict())
    config = config or make_config(path)
    counter = CompileCounterWithBackend(torchair.get_npu_backend(compiler_config=config))
    compiled = torch.compile(model, backend=counter, dynamic=path != 1, fullgraph=fullgraph)
    kc, vc = torch.randn(B, S, H), torch.randn(B, S, H)
    ref_kc, ref_vc = kc.clone(), vc.clone()
    before = len(torchair.graph_reports())
    outputs = []
    with torch.no_grad():
        for step, (lens, pos) in enumerate(steps):
            x = torch.randn(B, 1, H)
            p = torch.tensor([pos]) if write == "index_copy" else pos
            if path in (3, 4):
                for t in (x, kc, vc) + ((p,) if isinstance(p, torch.Tensor) else ()):
                    torch._dynamo.mark_static(t)
            out = compiled(x, p, list(lens), kc, vc)
            ref = twin(x, p, list(lens), ref_kc, ref_vc)
            torch.testing.assert_close(out, ref, atol=atol, rtol=1e-5,
                                       msg=lambda m: f"path {path} step {step} lens {lens}: {m}")
            if config.debug.run_eagerly:  # eager's kernels: the caches bit for bit
                assert torch.equal(kc, ref_kc), f"path {path} step {step}: key cache differs"
                assert torch.equal(vc, ref_vc), f"path {path} step {step}: value cache differs"
            else:  # a static unit's few-row products (torchair_native::gemv) sum in their order
                for got, want, name in ((kc, ref_kc, "key"), (vc, ref_vc, "value")):
                    torch.testing.assert_close(got, want, atol=atol, rtol=1e-5, msg=lambda m, n=name:
                                               f"path {path} step {step}: {n} cache: {m}")
            outputs.append(out)
    return Run(torchair.graph_reports()[before:], counter.frame_count, outputs)


def by_name(report) -> dict:
    return {i.name: i for i in report.inputs}


def check_inputs(report, path: int, write: str = "index_copy") -> None:
    names = by_name(report)
    for name in ("L_x_", "L_kc_", "L_vc_"):
        assert names[name].kind == "tensor", report
    for layer in ("q", "k", "v", "up", "down"):
        for what in ("weight", "bias"):
            info = names[f"L_self_modules_{layer}_parameters_{what}_"]
            assert info.kind == "parameter", report
            assert -1 not in info.shape, report
    lens = [n for n in names if n.startswith("L_lens_")]
    if path == 1:
        assert lens == [], report  # the lengths are Consts, not inputs
    else:
        assert sorted(lens) == ["L_lens_0_", "L_lens_1_"], report
        for name in lens:
            assert names[name].kind == "symint" and names[name].shape == (), report
    if write == "index_copy":
        assert names["L_pos_"].kind == "tensor" and names["L_pos_"].shape == (1,), report
    elif path == 1:
        assert "L_pos_" not in names, report  # a Python int: specialized
    else:
        assert names["L_pos_"].kind == "symint", report
    dynamic = {i.name for i in report.inputs if i.kind != "symint" and -1 in i.shape}
    if path == 2:
        assert dynamic == {"L_x_", "L_kc_", "L_vc_"}, report
        assert names["L_kc_"].shape[-1] == H and names["L_x_"].shape[1] == 1, report
    else:
        assert dynamic == set(), report
        assert names["L_kc_"].shape == (B, S, H) and names["L_x_"].shape == (B, 1, H), report
    # every input not named above is one of Dynamo's shape symbols (path 2 only)
    for info in report.inputs:
        if not info.name.startswith("L_"):
            assert path == 2 and info.kind == "symint" and info.shape == (), report
    assert names["L_kc_"].mutated and names["L_vc_"].mutated and not names["L_x_"].mutated


def check_report(report, path: int, steps, write: str = "index_copy") -> None:
    fx_static, ir_static, build_static = FLAGS[path]
    assert (report.fx_static, report.ir_static, report.build_static) == FLAGS[path], str(report)
    assert report.path == path, str(report)
    assert report.value_dependent_ops == [OP], str(report)
    check_inputs(report, path, write)
    if path == 1:
        assert report.reasons == [], str(report)
        assert report.consts == {f"{OP}.actual_seq_lengths": list(steps[0][0])}, str(report)
        assert report.sunk_inputs == []
    elif path == 2:
        dynamic = [i.name for i in report.inputs if i.kind != "symint" and -1 in i.shape]
        assert len(report.reasons) == len(dynamic), str(report)
        for name in dynamic:
            matching = [r for r in report.reasons if f"`{name}`" in r]
            assert len(matching) == 1, str(report)
            assert "-1" in matching[0] and "mark_static" in matching[0], matching
        assert report.consts == {}
    elif path == 3:
        assert len(report.reasons) == 1, str(report)
        reason = report.reasons[0]
        assert "tiling_schedule_optimize" in reason and OP in reason, reason
        assert "actual_seq_lengths" in reason, reason
        assert report.consts == {} and report.sunk_inputs == []
    else:
        assert report.reasons == [], str(report)
        assert report.sunk_inputs == ["L_lens_0_", "L_lens_1_"], str(report)
        assert report.consts == {}
    if build_static:
        assert report.launch.startswith("one launch unit"), report.launch
    else:
        assert report.launch.startswith("host-scheduled"), report.launch
    assert report.engine == "fx"


STEPS = list(zip(LENGTH_SETS, POSITIONS))


@pytest.mark.parametrize("path", [1, 2, 3, 4])
def test_path_flags_reasons_and_recompiles(path):
    run = run_steps(path, STEPS)
    if path == 1:
        # the lengths are Consts: every new length set is a new graph
        assert run.frames == len(STEPS)
        assert len(run.reports) == len(STEPS)
        for report, (lens, _) in zip(run.reports, STEPS):
            check_report(report, 1, [(lens, None)])
    else:
        assert run.frames == 1, [str(r) for r in run.reports]
        assert len(run.reports) == 1
        check_report(run.reports[0], path, STEPS)


def test_path1_known_lengths_hit_the_cache():
    steps = STEPS[:3] + STEPS[:3]
    run = run_steps(1, steps)
    assert run.frames == 3 and len(run.reports) == 3


@pytest.mark.parametrize("path", [1, 2, 3])
def test_slice_assignment_variant(path):
    """``kc[:, p:p+1] = k`` with an int ``p``: same flags as the index_copy_ model."""
    run = run_steps(path, STEPS, write="slice")
    expected = len(STEPS) if path == 1 else 1
    assert run.frames == expected and len(run.reports) == expected
    report = run.reports[0]
    assert (report.fx_static, report.ir_static, report.build_static) == FLAGS[path], str(report)
    assert report.path == path
    assert report.value_dependent_ops == [OP]
    check_inputs(report, path, write="slice")
    if path == 1:
        assert report.reasons == []
        assert report.consts == {f"{OP}.actual_seq_lengths": STEPS[0][0]}
    if path == 3:
        assert any("tiling_schedule_optimize" in r for r in report.reasons), str(report)


def test_slice_assignment_at_symint_position_is_host_read_on_path4():
    """With tiling sink on, a SymInt slice offset still has to be read on the host: the graph
    is not build-static and the reason names the position input."""
    run = run_steps(4, STEPS, write="slice")
    assert run.frames == 1 and len(run.reports) == 1
    report = run.reports[0]
    assert (report.fx_static, report.ir_static, report.build_static) == (False, True, False)
    assert report.path == 3
    assert any("`L_pos_`" in r and "outside a value-dependent argument" in r
               for r in report.reasons), str(report)
    assert not any("tiling_schedule_optimize" in r for r in report.reasons), str(report)


def test_path4_fifty_steps_without_recompiles():
    rng = random.Random(1234)
    steps = [([5, 7], 0)]
    for step in range(1, 50):
        steps.append(([rng.randint(0, S), rng.randint(0, S)], step % S))
    run = run_steps(4, steps)
    assert run.frames == 1
    assert len(run.reports) == 1
    check_report(run.reports[0], 4, steps)
    # outputs are independent tensors, not one buffer returned again and again
    assert len({o.data_ptr() for o in run.outputs}) > 1


def test_txt_dump_of_path2(tmp_path):
    config = make_config(2)
    config.debug.graph_dump.type = "txt"
    config.debug.graph_dump.path = str(tmp_path)
    run = run_steps(2, STEPS[:2], config=config)
    assert run.frames == 1
    names = sorted(os.listdir(tmp_path))
    original = [n for n in names if n.startswith("dynamo_original_graph_")]
    optimized = [n for n in names if n.startswith("dynamo_optimized_graph_")]
    assert len(original) == 1 and len(optimized) == 1, names
    assert all(n.endswith(".txt") for n in names), names
    text = (tmp_path / original[0]).read_text()
    assert "-1" in text, text
    assert "npu_incre_flash_attention" in text, text
    assert sorted(os.path.basename(d) for d in run.reports[0].dumps) == sorted(names)


def test_graph_break_gives_one_report_per_piece():
    run = run_steps(4, STEPS, fullgraph=False, graph_break=True)
    assert run.frames == 2, [str(r) for r in run.reports]
    assert len(run.reports) == 2
    first, second = run.reports
    assert first.value_dependent_ops == [OP] and first.path == 4, str(first)
    assert first.sunk_inputs == ["L_lens_0_", "L_lens_1_"]
    assert second.value_dependent_ops == [], str(second)
    assert not any(i.name.startswith("L_lens_") for i in second.inputs), str(second)


def test_symint_used_outside_the_op_is_not_build_static():
    run = run_steps(4, STEPS, scale_by_len=True, atol=1e-4)
    assert run.frames == 1 and len(run.reports) == 1
    report = run.reports[0]
    assert report.ir_static and not report.build_static and not report.fx_static, str(report)
    assert report.path == 3
    bad = [r for r in report.reasons if "`L_lens_0_`" in r]
    assert bad, str(report)
    assert all("outside a value-dependent argument" in r for r in bad), bad
    assert not any("`L_lens_1_`" in r for r in report.reasons), str(report)
    assert report.sunk_inputs == []
    assert report.launch.startswith("host-scheduled")


def test_symint_arithmetic_feeding_the_op_is_still_build_static():
    steps = [([5, 7], 3)] + [([max(l - 1, 0) for l in lens], p) for lens, p in STEPS[1:]]
    run = run_steps(4, steps, lens_fn=lambda lens: [l + 1 for l in lens])
    assert run.frames == 1 and len(run.reports) == 1
    report = run.reports[0]
    assert (report.fx_static, report.ir_static, report.build_static) == FLAGS[4], str(report)
    assert report.path == 4 and report.reasons == []
    assert report.sunk_inputs == ["L_lens_0_", "L_lens_1_"]


@pytest.mark.inductor
def test_path4_with_inductor_engine():
    steps = STEPS[:4]
    run = run_steps(4, steps, config=make_config(4, eager=False), atol=1e-4)
    assert run.frames == 1 and len(run.reports) == 1
    report = run.reports[0]
    assert report.build_static and report.path == 4
    # a static CPU unit: Inductor's kernels called from its C++ wrapper
    assert report.engine == "inductor-cpp", str(report)


@pytest.mark.inductor
def test_path2_with_inductor_engine():
    steps = STEPS[:4]
    run = run_steps(2, steps, config=make_config(2, eager=False), atol=1e-4)
    assert run.frames == 1 and len(run.reports) == 1
    report = run.reports[0]
    assert report.path == 2 and not report.build_static
    assert report.engine == "inductor", str(report)
