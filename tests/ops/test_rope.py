"""npu_apply_rotary_pos_emb (in place) and npu_rotary_mul: the reference against independent
formulas, the fused kernel against the reference, in-place aliasing, fake shapes, errors, and
compiled runs through torchair's backend (FX engine, and one path-4 static build)."""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torchair
import torchair.ops  # noqa: F401 (registers the ops)
from tests.ops._units import compile_static, op_calls
from torchair.ops.rope.common import rope_reference
from torchair.ops.rope.cpu import rope_cpu
from torchair.ops.rope.rotary import apply_rotary_pos_emb_reference, rotary_mul_reference

APPLY = torch.ops.npu.npu_apply_rotary_pos_emb
FUNCTIONAL = torch.ops.npu.npu_apply_rotary_pos_emb_functional
MUL = torch.ops.npu.npu_rotary_mul
ULP = {torch.float32: 2 ** -23, torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7}


def _angles(*lead, d, seed=0):
    """Angles theta [*lead, d/2] and the per-pair cos / sin of the half layout and the
    interleave layout (each angle repeated over its pair)."""
    g = torch.Generator().manual_seed(seed)
    theta = torch.rand(*lead, d // 2, generator=g, dtype=torch.float64) * 6.0
    half = lambda f: torch.cat((f(theta), f(theta)), dim=-1)  # noqa: E731
    inter = lambda f: f(theta).repeat_interleave(2, dim=-1)  # noqa: E731
    return theta, (half(torch.cos), half(torch.sin)), (inter(torch.cos), inter(torch.sin))


def _close(got, want, dtype, ulps=2):
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), atol=1e-6, rtol=ulps * ULP[dtype])


# ---------------------------------------------------------------- reference vs formulas ----------

def test_reference_half_is_the_rotation_of_the_two_halves():
    x = torch.randn(2, 3, 4, 16, dtype=torch.float64)
    _, (cos, sin), _ = _angles(2, 3, 1, d=16)
    x1, x2 = torch.chunk(x, 2, dim=-1)
    c1, s1 = cos[..., :8], sin[..., :8]
    want = torch.cat((x1 * c1 - x2 * s1, x2 * c1 + x1 * s1), dim=-1)
    got = rope_reference(x.float(), cos.float(), sin.float(), "half")
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_reference_interleave_is_complex_multiplication():
    x = torch.randn(2, 5, 3, 8, dtype=torch.float64)
    theta, _, (cos, sin) = _angles(2, 5, 1, d=8, seed=1)
    z = torch.view_as_complex(x.reshape(2, 5, 3, 4, 2).contiguous())
    want = torch.view_as_real(z * torch.polar(torch.ones_like(theta), theta)).flatten(-2)
    got = rope_reference(x.float(), cos.float(), sin.float(), "interleave")
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_reference_quarter_rotates_each_half_by_its_own_halves():
    x = torch.randn(3, 2, 2, 16)
    cos, sin = torch.randn(3, 2, 1, 16), torch.randn(3, 2, 1, 16)
    parts = [rope_reference(xh, ch, sh, "half") for xh, ch, sh in
             zip(x.chunk(2, -1), cos.chunk(2, -1), sin.chunk(2, -1))]
    assert torch.equal(rope_reference(x, cos, sin, "quarter"), torch.cat(parts, dim=-1))


def test_rotary_is_a_rotation_norm_of_each_pair_is_kept():
    x = torch.randn(4, 1, 2, 32, dtype=torch.float64)
    _, (cos, sin), _ = _angles(4, 1, 1, d=32, seed=2)
    y = rope_reference(x, cos, sin, "half")
    pair_norm = lambda t: t[..., :16] ** 2 + t[..., 16:] ** 2  # noqa: E731
    torch.testing.assert_close(pair_norm(y), pair_norm(x), rtol=1e-6, atol=1e-6)  # float32 math


# ---------------------------------------------------------------- fused kernel vs reference -----

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", ["half", "quarter", "interleave"])
@pytest.mark.parametrize("cos_shape", [(3, 1, 1, 16), (1, 2, 1, 16), (3, 2, 4, 16)])
def test_fused_kernel_matches_reference(dtype, mode, cos_shape):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 2, 4, 16, generator=g).to(dtype)
    cos, sin = (torch.randn(cos_shape, generator=g).to(dtype) for _ in range(2))
    want = rope_reference(x, cos, sin, mode)
    _close(rope_cpu(x, cos, sin, mode, torch.empty_like(x)), want, dtype)
    inplace = x.clone()
    assert rope_cpu(inplace, cos, sin, mode, inplace) is inplace
    _close(inplace, want, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout,q_shape,k_shape,cos_shape", [
    ("BSH", (4, 1, 8, 32), (4, 1, 2, 32), (4, 1, 1, 32)),     # vllm-ascend decode: [T, 1, N, D]
    ("BSND", (2, 3, 4, 16), (2, 3, 4, 16), (1, 3, 1, 16)),
    ("SBND", (3, 2, 4, 16), (3, 2, 1, 16), (3, 1, 1, 16)),
    ("BNSD", (2, 4, 3, 16), (2, 2, 3, 16), (2, 1, 3, 16)),
    ("TND", (5, 4, 16), (5, 2, 16), (5, 1, 16))])
def test_apply_is_in_place_and_matches_reference(dtype, layout, q_shape, k_shape, cos_shape):
    g = torch.Generator().manual_seed(4)
    q, k, cos, sin = (torch.randn(s, generator=g).to(dtype)
                      for s in (q_shape, k_shape, cos_shape, cos_shape))
    for mode in ("half", "interleave"):
        q0, k0, cos0 = q.clone(), k.clone(), cos.clone()
        want_q, want_k = apply_rotary_pos_emb_reference(q, k, cos, sin, layout, mode)
        assert torch.equal(q, q0)  # the reference leaves its inputs alone
        got_q, got_k = APPLY(q, k, cos, sin, layout=layout, rotary_mode=mode)
        assert got_q is q and got_k is k  # returned tensors are the inputs, rotated in place
        _close(q, want_q, dtype)
        _close(k, want_k, dtype)
        assert torch.equal(cos, cos0)
        f_q, f_k = FUNCTIONAL(q0, k0, cos, sin, layout=layout, rotary_mode=mode)
        assert torch.equal(f_q, q) and torch.equal(f_k, k) and torch.equal(q0, q0.clone())
        q.copy_(q0)
        k.copy_(k0)


def test_apply_writes_through_a_view_into_its_base():
    base = torch.randn(4, 8 * 16)
    q = base.view(4, 1, 8, 16)
    k = torch.randn(4, 1, 2, 16)
    cos, sin = torch.randn(4, 1, 1, 16), torch.randn(4, 1, 1, 16)
    want_q, _ = apply_rotary_pos_emb_reference(q, k, cos, sin)
    APPLY(q, k, cos, sin)
    _close(base.view(4, 1, 8, 16), want_q, torch.float32)
    strided = torch.randn(4, 1, 8, 32)[..., :16]  # non-contiguous query
    want_s, _ = apply_rotary_pos_emb_reference(strided, k, cos, sin)
    APPLY(strided, k, cos, sin)
    _close(strided, want_s, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_rotary_mul_matches_reference_and_formula(dtype, mode):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 2, 5, 16, generator=g).to(dtype)
    r1 = torch.randn(1, 1, 5, 16, generator=g)  # float32 tables with a bf16 x are accepted
    r2 = torch.randn(1, 1, 5, 16, generator=g)
    y = MUL(x, r1, r2, rotary_mode=mode)
    assert y.dtype == dtype and y.shape == x.shape
    _close(y, rotary_mul_reference(x, r1, r2, mode), dtype)
    if mode == "half":  # torch_npu's documented formula
        x1, x2 = torch.chunk(x.float(), 2, -1)
        _close(y, (r1 * x.float() + r2 * torch.cat((-x2, x1), dim=-1)).to(dtype), dtype)


# ---------------------------------------------------------------- fake kernels and errors --------

def test_fake_kernels_alias_and_shape():
    with FakeTensorMode():
        q, k = torch.empty(4, 1, 8, 64, dtype=torch.bfloat16), torch.empty(4, 1, 2, 64,
                                                                           dtype=torch.bfloat16)
        cos = torch.empty(4, 1, 1, 64, dtype=torch.bfloat16)
        out_q, out_k = APPLY(q, k, cos, cos)
        assert out_q is q and out_k is k
        f_q, f_k = FUNCTIONAL(q, k, cos, cos)
        assert f_q.shape == q.shape and f_k.shape == k.shape and f_q.dtype == torch.bfloat16
        y = MUL(q, cos, cos, rotary_mode="interleave")
        assert y.shape == q.shape and y.dtype == q.dtype


def _apply_args(**over):
    args = dict(query=torch.randn(2, 1, 4, 16), key=torch.randn(2, 1, 2, 16),
                cos=torch.randn(2, 1, 1, 16), sin=torch.randn(2, 1, 1, 16), layout="BSND",
                rotary_mode="half")
    args.update(over)
    return args


@pytest.mark.parametrize("over,exc,match", [
    (dict(layout="BHSD"), ValueError, "layout='BHSD' is not supported"),
    (dict(rotary_mode="neox"), ValueError, "rotary_mode='neox' is not supported"),
    (dict(query=torch.randn(2, 1, 4, 15), key=torch.randn(2, 1, 2, 15),
          cos=torch.randn(2, 1, 1, 15), sin=torch.randn(2, 1, 1, 15)), ValueError,
     "head_dim D. is 15"),
    (dict(query=torch.randn(2, 1, 4, 18), key=torch.randn(2, 1, 2, 18),
          cos=torch.randn(2, 1, 1, 18), sin=torch.randn(2, 1, 1, 18), rotary_mode="quarter"),
     ValueError, "divisible by 4"),
    (dict(query=torch.randn(2, 4, 16)), ValueError, r"query has shape \[2, 4, 16\] \(3-D\)"),
    (dict(key=torch.randn(3, 1, 2, 16)), ValueError, "may differ only in dim 2"),
    (dict(cos=torch.randn(2, 1, 16), sin=torch.randn(2, 1, 16)), ValueError,
     "cos has shape .* must have query's rank"),
    (dict(cos=torch.randn(2, 1, 3, 16), sin=torch.randn(2, 1, 3, 16)), ValueError,
     "does not broadcast to query"),
    (dict(sin=torch.randn(1, 1, 1, 16)), ValueError, "sin has shape .* but cos has"),
    (dict(key=torch.randn(2, 1, 2, 16, dtype=torch.float16)), TypeError, "key has dtype"),
    (dict(query=torch.ones(2, 1, 4, 16, dtype=torch.int32)), TypeError, "query has dtype"),
])
def test_apply_errors_name_the_argument(over, exc, match):
    with pytest.raises(exc, match=match):
        APPLY(**_apply_args(**over))


def test_rotary_mul_errors():
    x = torch.randn(2, 2, 5, 16)
    with pytest.raises(ValueError, match="r1 has shape"):
        MUL(x, torch.randn(2, 5, 16), torch.randn(2, 5, 16))
    with pytest.raises(ValueError, match="rotary_mode='x'"):
        MUL(x, torch.randn(1, 1, 5, 16), torch.randn(1, 1, 5, 16), rotary_mode="x")


# ---------------------------------------------------------------- compiled -----------------------

class _Attn(torch.nn.Module):
    """vllm-ascend's TorchAir decode rope: q from a projection (an intermediate), k a graph input
    (rotated in place: the caller sees the write), cos / sin [T, 1, 1, D]."""

    def forward(self, x, k, cos, sin):
        q = (x * 2).view(x.shape[0], 1, 4, 16)
        q2, k2 = APPLY(q, k, cos, sin)
        return q2.flatten(-2) + 1, k2.sum(-1)


def _attn_inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(6)
    return (torch.randn(3, 64, generator=g).to(dtype), torch.randn(3, 1, 2, 16, generator=g).to(
        dtype), torch.randn(3, 1, 1, 16, generator=g).to(dtype),
        torch.randn(3, 1, 1, 16, generator=g).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_fx_engine_equals_eager(dtype):
    cfg = torchair.CompilerConfig()
    cfg.debug.run_eagerly = True
    model = _Attn()
    compiled = torch.compile(model, backend=torchair.get_npu_backend(compiler_config=cfg),
                             fullgraph=True)
    args = _attn_inputs(dtype)
    eager_args = [a.clone() for a in args]
    want = model(*eager_args)
    got = compiled(*args)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert torch.equal(args[1], eager_args[1])  # the in-place write into the input k is kept
    assert not torch.equal(args[1], _attn_inputs(dtype)[1])


class _DecodeStep(torch.nn.Module):
    """Rope in place on the graph inputs q / k, then attention over a KV cache with per-batch
    lengths (a value-dependent SymInt[]: what makes the graph path 4)."""

    def forward(self, q, k, cos, sin, kc, vc, lens):
        q2, k2 = APPLY(q, k, cos, sin)
        out, _ = torch.ops.npu.npu_fused_infer_attention_score(  # lse on: stays a FIA call
            q2, kc, vc, actual_seq_lengths_kv=lens, num_heads=4, num_key_value_heads=2,
            input_layout="BSND", scale=0.25, softmax_lse_flag=True)
        return out.flatten(-2) * 2, k2.sum(-1)


def _step_inputs(step):
    g = torch.Generator().manual_seed(7 + step)
    return [torch.randn(s, generator=g) for s in
            ((3, 1, 4, 16), (3, 1, 2, 16), (3, 1, 1, 16), (3, 1, 1, 16), (3, 8, 2, 16),
             (3, 8, 2, 16))]


def test_path4_static_build_with_in_place_rope_on_inputs():
    model = _DecodeStep()
    compiled = compile_static(model, _step_inputs(0), run_eagerly=True)
    before = len(torchair.graph_reports())
    for step, lens in enumerate(([8, 3, 5], [2, 8, 1], [4, 4, 7])):
        args = _step_inputs(step)
        for a in args:
            torch._dynamo.mark_static(a)
        eager_args = [a.clone() for a in args]
        got = compiled(*args, lens)
        want = model(*eager_args, lens)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
        assert torch.equal(args[0], eager_args[0]) and torch.equal(args[1], eager_args[1])
        assert not torch.equal(args[0], _step_inputs(step)[0])  # q was rotated in place
    reports = torchair.graph_reports()[before:]
    assert len(reports) == 1, [str(r) for r in reports]
    assert reports[0].path == 4 and reports[0].build_static, str(reports[0])
    calls = op_calls(compiled, *_step_inputs(0), [1, 2, 3])
    assert "npu::npu_apply_rotary_pos_emb_functional" in calls, calls
