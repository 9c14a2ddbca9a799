"""The Triton rotary and SwiGLU kernels against the references.

Without a GPU, tests/conftest.py sets TRITON_INTERPRET=1 before triton is imported, so the
``interp`` tests run the kernels in Triton's interpreter on CPU tensors (tiny shapes; float32 and
float16: numpy has no bfloat16). The ``cuda`` tests run the compiled kernels on a GPU through the
ops' CUDA dispatch, bfloat16 included, on decode-sized shapes.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import torchair.ops  # noqa: E402,F401 (registers the ops)
from torchair.ops.activation import triton as at  # noqa: E402
from torchair.ops.activation.swiglu import swiglu_reference  # noqa: E402
from torchair.ops.rope import (
    rotary,  # noqa: E402
    triton as rt,  # noqa: E402
)
from torchair.ops.rope.common import rope_reference  # noqa: E402
from torchair.ops.rope.kv_rmsnorm_rope_cache import kv_rmsnorm_rope_cache_reference  # noqa: E402
from torchair.ops.toolchain.triton_utils import interpreted  # noqa: E402

INTERPRETED = interpreted()
interp = pytest.mark.skipif(not INTERPRETED,
                            reason="interpreter tests need TRITON_INTERPRET=1 before triton loads "
                                   "(tests/conftest.py sets it when there is no GPU)")
cuda = pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED,
                          reason="needs a CUDA GPU and compiled (not interpreted) Triton")
ULP = {torch.float32: 2 ** -23, torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7}


def _close(got, want, dtype, ulps=2):
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), atol=1e-5, rtol=ulps * ULP[dtype])


def _rope_case(x_shape, cos_shape, dtype, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(dtype).to(device) for s in (x_shape, cos_shape,
                                                                       cos_shape)]


def _check_rope(x, cos, sin, dtype):
    for mode in ("half", "quarter", "interleave"):
        want = rope_reference(x, cos, sin, mode)
        _close(rt.rope_triton(x, cos, sin, mode, torch.empty_like(x)), want, dtype)
        inplace = x.clone()
        rt.rope_triton(inplace, cos, sin, mode, inplace)
        _close(inplace, want, dtype)


# ---------------------------------------------------------------- interpreter (CPU) --------------

@interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("x_shape,cos_shape", [((3, 1, 4, 16), (3, 1, 1, 16)),
                                               ((2, 3, 2, 8), (1, 3, 1, 8)),
                                               ((5, 2, 12), (5, 1, 12))])
def test_rope_interpreted(dtype, x_shape, cos_shape):
    _check_rope(*_rope_case(x_shape, cos_shape, dtype), dtype)


@interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape,dim", [((3, 16), -1), ((2, 6, 3), 1), ((4, 1, 2), 0)])
def test_swiglu_interpreted(dtype, shape, dim):
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    _close(at.swiglu_triton(x, dim % x.dim()), swiglu_reference(x, dim), dtype, ulps=4)


# ---------------------------------------------------------------- CUDA -------------------------

@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("x_shape,cos_shape", [((64, 1, 32, 128), (64, 1, 1, 128)),
                                               ((2, 512, 8, 64), (1, 512, 1, 64)),
                                               ((37, 16, 128), (37, 1, 128))])
def test_cuda_rope_matches_reference(dtype, x_shape, cos_shape):
    _check_rope(*_rope_case(x_shape, cos_shape, dtype, "cuda"), dtype)


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_ops_dispatch_to_triton(dtype):
    q, cos, sin = _rope_case((16, 1, 32, 128), (16, 1, 1, 128), dtype, "cuda")
    k = q[:, :, :8].clone()
    assert rotary.device_kernel(q, q) == "triton"
    want_q, want_k = rotary.apply_rotary_pos_emb_reference(q, k, cos, sin)
    out_q, out_k = torch.ops.npu.npu_apply_rotary_pos_emb(q, k, cos, sin)
    assert out_q is q and out_k is k
    _close(q, want_q, dtype)
    _close(k, want_k, dtype)
    _close(torch.ops.npu.npu_rotary_mul(q, cos, sin, "interleave"),
           rope_reference(q, cos, sin, "interleave"), dtype)
    x = torch.randn(16, 2 * 1408, device="cuda").to(dtype)
    _close(torch.ops.npu.npu_swiglu(x), swiglu_reference(x), dtype, ulps=4)
    x = torch.randn(4, 6, 2 * 64, device="cuda").to(dtype)
    _close(torch.ops.npu.npu_swiglu(x, dim=1), swiglu_reference(x, 1), dtype, ulps=4)


@pytest.mark.cuda
@cuda
def test_cuda_kv_rmsnorm_rope_cache_and_graph_capture():
    g = torch.Generator().manual_seed(3)
    dt = torch.bfloat16
    kv = torch.randn(8, 1, 1, 576, generator=g).to(dt).cuda()
    gamma = (torch.rand(512, generator=g) + 0.5).to(dt).cuda()
    cos, sin = (torch.randn(8, 1, 1, 64, generator=g).to(dt).cuda() for _ in range(2))
    k_cache = torch.randn(4, 16, 1, 64, generator=g).to(dt).cuda()
    ckv_cache = torch.randn(4, 16, 1, 512, generator=g).to(dt).cuda()
    index = torch.tensor([3, 17, -1, 40, 41, 0, 63, 9], device="cuda")
    want = kv_rmsnorm_rope_cache_reference(kv, gamma, cos, sin, index, k_cache, ckv_cache,
                                           cache_mode="PA")
    graph = torch.cuda.CUDAGraph()
    torch.ops.npu.npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache.clone(),
                                            ckv_cache.clone(), cache_mode="PA")  # warm up
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):  # no host reads: capturable
        out = torch.ops.npu.npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache,
                                                      ckv_cache, cache_mode="PA")
    graph.replay()
    torch.cuda.synchronize()
    for got, ref in zip(out, want):
        _close(got, ref, dt)
