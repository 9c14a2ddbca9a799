"""npu_swiglu: the reference against F.silu over torch.chunk halves (and the exp formula), the
fused kernel against the reference, fake shapes, errors, and a compiled run through torchair."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import torchair
import torchair.ops  # noqa: F401 (registers the ops)
from torchair.ops.activation.cpu import swiglu_cpu
from torchair.ops.activation.swiglu import swiglu_reference

SWIGLU = torch.ops.npu.npu_swiglu


@pytest.mark.parametrize("shape,dim", [((4, 16), -1), ((2, 6, 3), 1), ((8, 2, 5), 0),
                                       ((3, 2, 4, 6), -2)])
def test_reference_is_silu_of_first_half_times_second(shape, dim):
    x = torch.randn(shape, dtype=torch.float64) * 3
    a, b = torch.chunk(x, 2, dim=dim)
    want = F.silu(a) * b
    got = swiglu_reference(x.float(), dim)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got.double(), a / (1 + torch.exp(-a)) * b, rtol=1e-6, atol=1e-6)
    # the order matters: the first half is activated (not silu(b) * a)
    assert not torch.allclose(got.double(), F.silu(b) * a, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape,dim", [((5, 32), -1), ((2, 8, 3), 1), ((1, 2, 1), -2)])
def test_fused_kernel_equals_reference(dtype, shape, dim):
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(1)) * 4).to(dtype)
    got = SWIGLU(x, dim=dim)
    want = swiglu_reference(x, dim)
    assert got.dtype == dtype and got.shape == want.shape
    # the same float32 math and one rounding; PyTorch's contiguous (vectorized) and strided silu
    # may differ by an ulp of float32 (they do on torch 2.11 for these shapes, not on 2.13), so
    # float32 within 2 ulps and the rounded dtypes within one step of their own
    tol = {torch.float32: 2 ** -22, torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7}[dtype]
    for out in (got, swiglu_cpu(x, dim % x.dim())):
        torch.testing.assert_close(out.float(), want.float(), rtol=tol, atol=1e-6)


def test_non_contiguous_input():
    x = torch.randn(6, 16).t()  # [16, 6], split along dim 0
    torch.testing.assert_close(SWIGLU(x, dim=0), swiglu_reference(x, 0), rtol=2 ** -22, atol=0)
    torch.testing.assert_close(SWIGLU(x, dim=0), swiglu_reference(x.contiguous(), 0), rtol=0,
                               atol=0)


def test_fake_kernel_shapes():
    with FakeTensorMode():
        x = torch.empty(4, 7, 2 * 384, dtype=torch.bfloat16)
        y = SWIGLU(x)
        assert y.shape == (4, 7, 384) and y.dtype == torch.bfloat16
        assert SWIGLU(x, dim=0).shape == (2, 7, 768)


@pytest.mark.parametrize("x,dim,exc,match", [
    (torch.randn(4, 7), -1, ValueError, "self has size 7 along dim=-1"),
    (torch.randn(4, 8), 2, ValueError, r"dim=2 is out of range .* expected dim in \[-2, 1\]"),
    (torch.ones(4, 8, dtype=torch.int32), -1, TypeError, "self has dtype torch.int32"),
    (torch.tensor(1.0), -1, ValueError, "dim=-1 is out of range"),
])
def test_errors_name_the_argument(x, dim, exc, match):
    with pytest.raises(exc, match=match):
        SWIGLU(x, dim=dim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_fx_engine_equals_eager(dtype):
    def mlp(x, w):
        return SWIGLU(x @ w) * 2

    cfg = torchair.CompilerConfig()
    cfg.debug.run_eagerly = True
    compiled = torch.compile(mlp, backend=torchair.get_npu_backend(compiler_config=cfg),
                             dynamic=True, fullgraph=True)
    g = torch.Generator().manual_seed(2)
    w = torch.randn(16, 24, generator=g).to(dtype)
    for rows in (3, 5):
        x = torch.randn(rows, 16, generator=g).to(dtype)
        assert torch.equal(compiled(x, w), mlp(x, w))
