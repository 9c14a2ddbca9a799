"""npu_interleave_rope (DeepSeek MLA's rope): the reference against an independent formula
(complex multiplication of the (even, odd) pairs, stored de-interleaved), the eager kernel and a
compiled run through torchair's backend against the reference, the shared formula of
npu_kv_rmsnorm_rope_cache, fake shapes under symbolic shapes, errors."""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import torchair
import torchair.ops  # noqa: F401 (registers the ops)
from torchair.ops.rope.interleave_rope import interleave_rope_reference

OP = torch.ops.npu.npu_interleave_rope


def _inputs(b, n, s, d, dtype=torch.float32, seed=0, table_s=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, n, s, d, generator=g).to(dtype)
    theta = torch.rand(b, 1, table_s or s, d // 2, generator=g, dtype=torch.float64) * 6
    cos = torch.cat((theta.cos(), theta.cos()), -1).to(dtype)
    sin = torch.cat((theta.sin(), theta.sin()), -1).to(dtype)
    return x, cos, sin, theta


def _formula(x, theta):
    """float64: x's interleaved pairs as complex numbers (even + i odd) times e^(i theta), the
    result stored as [real parts, imaginary parts]."""
    xd = x.double()
    z = torch.view_as_complex(xd.reshape(*xd.shape[:-1], xd.shape[-1] // 2, 2).contiguous())
    rot = z * torch.polar(torch.ones_like(theta), theta)
    return torch.cat((rot.real, rot.imag), -1)


@pytest.mark.parametrize("table_s", [None, 1])
def test_reference_matches_complex_formula(table_s):
    x, cos, sin, theta = _inputs(2, 3, 4, 8, table_s=table_s)
    got = interleave_rope_reference(x, cos, sin)
    assert got.shape == x.shape and got.dtype == x.dtype
    torch.testing.assert_close(got.double(), _formula(x, theta), rtol=1e-5, atol=1e-5)


def test_reference_is_not_a_plain_rotate_half():
    # the interleaved pairing differs from rotating the halves of x (a wrong formula fails)
    x, cos, sin, _ = _inputs(1, 1, 2, 8)
    wrong = torch.ops.npu.npu_rotary_mul(x, cos, sin, "half")
    assert not torch.allclose(interleave_rope_reference(x, cos, sin), wrong, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_eager_matches_reference(dtype):
    x, cos, sin, _ = _inputs(2, 4, 3, 16, dtype, seed=1)
    x_before = x.clone()
    got = OP(x, cos, sin)
    want = interleave_rope_reference(x, cos, sin)
    assert got.dtype == dtype and got.shape == x.shape
    assert torch.equal(x, x_before)                      # x is not written
    if dtype == torch.float32:                           # addcmul may fuse: an ulp or two
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    else:                                                 # both rounded once from float32
        ulp = torch.finfo(dtype).eps
        assert ((got.float() - want.float()).abs() <= ulp * want.float().abs().clamp_min(1)).all()


def test_same_formula_as_kv_rmsnorm_rope_cache():
    # the rope part of npu_kv_rmsnorm_rope_cache (one KV head) equals npu_interleave_rope
    dv, dk = 8, 16
    g = torch.Generator().manual_seed(3)
    kv = torch.randn(2, 1, 3, dv + dk, generator=g)
    gamma = torch.rand(dv, generator=g) + 0.5
    _, cos, sin, _ = _inputs(2, 1, 3, dk, seed=4)
    index = torch.arange(6).view(2, 3)
    caches = torch.zeros(2, 1, 8, dk), torch.zeros(2, 1, 8, dv)
    k_rope = torch.ops.npu.npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, *caches)[2]
    torch.testing.assert_close(k_rope, OP(kv[..., dv:].contiguous(), cos, sin))


def _backend():
    cfg = torchair.CompilerConfig()
    cfg.debug.run_eagerly = True
    return torchair.get_npu_backend(compiler_config=cfg)


def test_compiled_matches_eager():
    def f(x, cos, sin):
        return OP(x * 2, cos, sin) + 1

    compiled = torch.compile(f, backend=_backend(), fullgraph=True)
    for s in (2, 3):
        x, cos, sin, _ = _inputs(1, 2, s, 8, seed=s)
        torch.testing.assert_close(compiled(x, cos, sin), f(x, cos, sin))
        torch.testing.assert_close(compiled(x, cos, sin),
                                   interleave_rope_reference(x * 2, cos, sin) + 1)


def test_fake_kernel_symbolic_shapes():
    mode = FakeTensorMode(shape_env=ShapeEnv())
    x, cos, sin, _ = _inputs(2, 3, 5, 8, torch.float16)
    with mode:
        fx = mode.from_tensor(x, static_shapes=False)
        fc, fs = mode.from_tensor(cos), mode.from_tensor(sin)
        y = OP(fx, fc, fs)
        assert y.dtype == torch.float16 and y.dim() == 4
        assert y.shape[1] == fx.shape[1] and y.shape[3] == 8


def test_errors_name_the_argument():
    x, cos, sin, _ = _inputs(2, 3, 4, 8)
    with pytest.raises(ValueError, match="x has shape .* expected 4-D"):
        OP(x[0], cos[0], sin[0])
    with pytest.raises(ValueError, match="even D"):
        OP(x[..., :7].contiguous(), cos[..., :7].contiguous(), sin[..., :7].contiguous())
    with pytest.raises(TypeError, match="cos has dtype torch.float16 but x has torch.float32"):
        OP(x, cos.half(), sin)
    with pytest.raises(TypeError, match="x has dtype torch.int32"):
        OP(x.int(), cos, sin)
    with pytest.raises(ValueError, match="sin has shape .* but cos has"):
        OP(x, cos, sin[:, :, :1])
    with pytest.raises(ValueError, match="cos has shape .* does not broadcast"):
        OP(x, cos[..., :4], sin[..., :4])
    with pytest.raises(ValueError, match="N dim .* must be 1"):
        OP(x, cos.expand(2, 3, 4, 8), sin.expand(2, 3, 4, 8))
