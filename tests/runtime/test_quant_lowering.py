"""CPU static units trace the quantization ops' formulas into Inductor's code: no call of the
ops' Python kernels per step, results within one quantization step of eager; with
TORCHAIR_LOWER_QUANT=0 the ops are called and the unit is bit-exact with eager."""
from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import torchair
from tests.ops._units import compile_static
from torchair.runtime import engines

pytestmark = pytest.mark.inductor
npu = torch.ops.npu
_QUANT = ("npu::npu_dynamic_quant", "npu::npu_add_rms_norm_dynamic_quant",
          "npu::npu_quant_matmul")


class _QuantBlock(torch.nn.Module):
    """A W8A8 MLP half: add + RMS norm + per-token quant, int8 GEMM, quant again, int8 GEMM."""

    def __init__(self, hidden=64, inner=96):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.register_buffer("gamma", torch.rand(hidden, generator=gen) + 0.5)
        self.register_buffer("w1", torch.randint(-128, 128, (inner, hidden), generator=gen,
                                                 dtype=torch.int8))
        self.register_buffer("s1", torch.rand(inner, generator=gen) / 100)
        self.register_buffer("w2", torch.randint(-128, 128, (hidden, inner), generator=gen,
                                                 dtype=torch.int8))
        self.register_buffer("s2", torch.rand(hidden, generator=gen) / 100)

    def forward(self, x, residual):
        q, _, x_out, scale, _ = npu.npu_add_rms_norm_dynamic_quant(
            x, residual, self.gamma, output_mask=[True, False])
        y = npu.npu_quant_matmul(q, self.w1.t(), self.s1, pertoken_scale=scale,
                                 output_dtype=torch.bfloat16)
        q2, scale2 = npu.npu_dynamic_quant(y.float())
        z = npu.npu_quant_matmul(q2, self.w2.t(), self.s2, pertoken_scale=scale2,
                                 output_dtype=torch.bfloat16)
        return z, x_out, q, scale


def _compiled(module, *static):
    """``module`` on torchair path 4 with the Inductor engine (fresh Dynamo state, ``static``
    tensors mark_static)."""
    return compile_static(module, static, run_eagerly=False)


def _quant_op_calls(fn, *args):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(*args)
    return [e.name for e in prof.events() if e.name in _QUANT]


def test_quant_ops_run_as_generated_code_within_one_step_of_eager():
    block = _QuantBlock().eval()
    gen = torch.Generator().manual_seed(1)
    x, r = torch.randn(4, 64, generator=gen), torch.randn(4, 64, generator=gen)
    compiled = _compiled(block, x, r)
    with torch.no_grad():
        got = compiled(x, r)
        assert torchair.graph_reports()[-1].build_static
        for _ in range(2):
            x, r = torch.randn(4, 64, generator=gen), torch.randn(4, 64, generator=gen)
            got, want = compiled(x, r), block(x, r)
            z, x_out, q, scale = got
            assert torch.equal(x_out, want[1])
            assert (q.int() - want[2].int()).abs().max() <= 1
            assert torch.allclose(scale, want[3], rtol=1e-6, atol=0)
            # z: bf16 outputs of a second quantization; one step of it at most
            step = want[0].float().abs().amax(-1, keepdim=True) / 127
            assert ((z.float() - want[0].float()).abs() <= 2 * step + 1e-3).all()
        assert _quant_op_calls(compiled, x, r) == []
        assert sorted(set(_quant_op_calls(block, x, r))) == sorted(_QUANT)


def test_switch_off_calls_the_ops_bit_exact(monkeypatch):
    monkeypatch.setenv(engines.ENV_LOWER_QUANT, "0")
    block = _QuantBlock().eval()
    gen = torch.Generator().manual_seed(2)
    x, r = torch.randn(4, 64, generator=gen), torch.randn(4, 64, generator=gen)
    compiled = _compiled(block, x, r)
    with torch.no_grad():
        compiled(x, r)
        x, r = torch.randn(4, 64, generator=gen), torch.randn(4, 64, generator=gen)
        got, want = compiled(x, r), block(x, r)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        assert _quant_op_calls(compiled, x, r)


def test_per_expert_smooth_scales_are_lowered():
    """group_index (cumulative row ends per expert) maps rows to experts with tensor ops, so
    calls with it are lowered like the others."""
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.randn(4, 16)
    smooth, groups = torch.rand(2, 16) + 0.5, torch.tensor([1, 3], dtype=torch.int32)

    def experts(x, smooth, groups):
        return npu.npu_dynamic_quant(x, smooth_scales=smooth, group_index=groups)

    def plain(x):
        return npu.npu_dynamic_quant(x)

    assert engines.lower_to_formulas(make_fx(experts)(x, smooth, groups)) == 1
    assert engines.lower_to_formulas(make_fx(plain)(x)) == 1
    assert engines.lower_to_formulas(make_fx(plain)(x), quant=False) == 0


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_per_expert_quant_in_a_unit_follows_group_index_values(index_dtype):
    """npu_dynamic_quant with group_index inside a CPU static unit: generated code, no op call
    per step, within one quantization step of eager, and the expert of each row follows the
    group_index values of every call (an input whose values change, not baked in at build),
    including ends past the last row, repeated ends (an empty expert) and rows after the last
    end (the last expert)."""
    gen = torch.Generator().manual_seed(5)
    rows, h, experts = 7, 32, 3
    smooth = torch.rand(experts, h, generator=gen) + 0.5

    class Experts(torch.nn.Module):
        def forward(self, x, groups):
            y, scale = npu.npu_dynamic_quant(x * 2.0, smooth_scales=smooth, group_index=groups)
            return y, scale

    module = Experts()
    x = torch.randn(rows, h, generator=gen)
    groups = torch.tensor([2, 5, 7], dtype=index_dtype)
    compiled = _compiled(module, x, groups)
    with torch.no_grad():
        compiled(x, groups)
        assert torchair.graph_reports()[-1].build_static
        for ends in ([2, 5, 7], [0, 3, 3], [1, 2, 9], [6, 6, 6], [0, 0, 0]):
            x = torch.randn(rows, h, generator=gen)
            groups = torch.tensor(ends, dtype=index_dtype)
            (y, scale), (wy, wscale) = compiled(x, groups), module(x, groups)
            assert torch.allclose(scale, wscale, rtol=1e-6, atol=0), ends
            assert (y.int() - wy.int()).abs().max() <= 1, ends
            # the reference formula, rows picked independently of the op's helper
            expert = torch.tensor([min(sum(int(e) <= r for e in ends), experts - 1)
                                   for r in range(rows)])
            scaled = x * 2.0 * smooth[expert]
            assert torch.allclose(wscale, scaled.abs().amax(-1) / 127, rtol=1e-6, atol=0), ends
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            compiled(x, groups)
        assert not [e.name for e in prof.events() if e.name == "npu::npu_dynamic_quant"]


@pytest.mark.parametrize("grouped", [False, True])
def test_dequant_swiglu_quant_is_lowered_within_one_step(grouped):
    """The int32 accumulator of a gate/up GEMM -> dequant, SwiGLU, dynamic quant; with groups of
    tokens (group_index, per-group scales) the formula maps rows to groups with tensor ops."""
    gen = torch.Generator().manual_seed(3)
    tokens, h = 6, 32
    x = torch.randint(-2000, 2000, (tokens, 2 * h), generator=gen, dtype=torch.int32)
    groups = torch.tensor([2, 4], dtype=torch.int64) if grouped else None
    ws = torch.rand(2 if grouped else 1, 2 * h, generator=gen) / 100
    qs = torch.rand(2 if grouped else 1, h, generator=gen) + 0.5
    act = torch.rand(tokens, generator=gen) + 0.5

    class Swiglu(torch.nn.Module):
        def forward(self, x, act):
            return npu.npu_dequant_swiglu_quant(x, weight_scale=ws, activation_scale=act,
                                                quant_scale=qs, group_index=groups,
                                                quant_mode=1)

    module = Swiglu()
    compiled = _compiled(module, x, act, ws, qs, *((groups,) if grouped else ()))
    with torch.no_grad():
        compiled(x, act)
        assert torchair.graph_reports()[-1].build_static
        x2 = torch.randint(-2000, 2000, (tokens, 2 * h), generator=gen, dtype=torch.int32)
        (y, scale), (want_y, want_scale) = compiled(x2, act), module(x2, act)
        assert (y.int() - want_y.int()).abs().max() <= 1
        assert torch.allclose(scale, want_scale, rtol=1e-5, atol=0)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            compiled(x2, act)
        assert not [e.name for e in prof.events() if e.name == "npu::npu_dequant_swiglu_quant"]
