"""The Triton RMS-norm / dynamic-quant kernels against the references.

Without a GPU, tests/conftest.py sets TRITON_INTERPRET=1 before triton is imported, so the
``interp`` tests run the kernels in Triton's interpreter on CPU tensors (tiny shapes; float32 and
float16 only: numpy has no bfloat16). The ``cuda`` tests run the compiled kernels on a GPU, with
bfloat16 and realistic shapes, through the ops' CUDA dispatch.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import torchair.ops  # noqa: E402,F401 (registers the ops)
from torchair.ops.norm import triton as nt  # noqa: E402
from torchair.ops.norm.rms_norm import add_rms_norm_cast_reference, rms_norm_reference  # noqa: E402
from torchair.ops.quant.dynamic_quant import add_rms_norm_dynamic_quant_reference, dynamic_quant_reference  # noqa: E402
from torchair.ops.toolchain.triton_utils import rint  # noqa: E402

INTERPRETED = nt.interpreted()
interp = pytest.mark.skipif(not INTERPRETED,
                            reason="interpreter tests need TRITON_INTERPRET=1 before triton loads "
                                   "(tests/conftest.py sets it when there is no GPU)")
cuda = pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED,
                          reason="needs a CUDA GPU and compiled (not interpreted) Triton")
ULP = {torch.float32: 2 ** -23, torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7}


def _inputs(shape, dtype, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    h = shape[-1]

    def t(s, scale=1.0, offset=0.0):
        return (torch.randn(s, generator=g) * scale + offset).to(dtype).to(device)

    return dict(x1=t(shape, 3.0), x2=t(shape), gamma=t(h, 0.2, 1), s1=t(h, 0.2, 1),
                s2=t(h, 0.2, 1), beta=t(h, 0.1))


def _close_y(y, ref, dtype):
    assert y.dtype == ref.dtype and y.shape == ref.shape
    torch.testing.assert_close(y.float(), ref.float(), atol=1e-6, rtol=2 * ULP[dtype])


def _close_quant(y, scale, y_ref, scale_ref):
    assert y.dtype == torch.int8 and y.shape == y_ref.shape and scale.shape == scale_ref.shape
    if y.numel():
        assert int((y.int() - y_ref.int()).abs().max()) <= 1
    torch.testing.assert_close(scale, scale_ref, rtol=1e-6, atol=0)


def _check_norm_family(d, dtype):
    x1, x2, gamma = d["x1"], d["x2"], d["gamma"]
    y, rstd = nt.rms_norm_triton(x1, gamma, 1e-5)
    y_r, rstd_r = rms_norm_reference(x1, gamma, 1e-5)
    _close_y(y, y_r, dtype)
    torch.testing.assert_close(rstd, rstd_r, rtol=1e-6, atol=0)
    y, rstd, x_out, y_f32 = nt.add_rms_norm_triton(x1, x2, gamma, 1e-5, want_f32=True)
    y_f32_r, y_r, rstd_r, x_out_r = add_rms_norm_cast_reference(x1, x2, gamma, 1e-5)
    assert torch.equal(x_out, x_out_r)
    _close_y(y, y_r, dtype)
    assert torch.equal(y_f32, y.float())
    torch.testing.assert_close(rstd, rstd_r, rtol=1e-6, atol=0)
    # the add variant normalizes the rounded sum: the same kernel on x1 + x2 gives the same y
    y2, rstd2 = nt.rms_norm_triton(x_out, gamma, 1e-5)
    assert torch.equal(y, y2) and torch.equal(rstd, rstd2)


def _check_quant_family(d, dtype, experts_rows):
    x1 = d["x1"]
    for smooth in (None, d["s1"]):
        y, scale = nt.dynamic_quant_triton(x1, smooth, None)
        _close_quant(y, scale, *dynamic_quant_reference(x1, smooth_scales=smooth))
    g = torch.Generator().manual_seed(7)
    smooth = (torch.rand(3, x1.shape[-1], generator=g) + 0.5).to(dtype).to(x1.device)
    group_index = torch.tensor(experts_rows, dtype=torch.int32, device=x1.device)
    y, scale = nt.dynamic_quant_triton(x1, smooth, group_index)
    _close_quant(y, scale, *dynamic_quant_reference(x1, smooth_scales=smooth,
                                                    group_index=group_index))
    for kw, wants in (({}, (True, False)),
                      ({"smooth_scale1": d["s1"], "smooth_scale2": d["s2"], "beta": d["beta"]},
                       (True, True)),
                      ({"smooth_scale2": d["s2"], "output_mask": [False, True]}, (False, True))):
        kernel_kw = {k: v for k, v in kw.items() if k != "output_mask"}
        kernel_kw.setdefault("smooth_scale1", None)
        kernel_kw.setdefault("smooth_scale2", None)
        kernel_kw.setdefault("beta", None)
        out = nt.add_rms_norm_dynamic_quant_triton(d["x1"], d["x2"], d["gamma"], epsilon=1e-5,
                                                   want1=wants[0], want2=wants[1], **kernel_kw)
        ref = add_rms_norm_dynamic_quant_reference(d["x1"], d["x2"], d["gamma"], epsilon=1e-5,
                                                   **kw)
        assert torch.equal(out[2], ref[2])
        _close_quant(out[0], out[3], ref[0], ref[3])
        _close_quant(out[1], out[4], ref[1], ref[4])


# ---------------------------------------------------------------- interpreter (CPU) --------------

@interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(1, 16), (3, 37), (2, 2, 24)])
def test_norm_family_interpreted(dtype, shape):
    _check_norm_family(_inputs(shape, dtype, seed=shape[-1]), dtype)


@interp
def test_norm_two_normalized_dims_interpreted():
    x = torch.randn(2, 3, 4, 5)
    gamma = torch.rand(4, 5) + 0.5
    y, rstd = nt.rms_norm_triton(x, gamma, 1e-6)
    y_r, rstd_r = rms_norm_reference(x, gamma, 1e-6)
    _close_y(y, y_r, torch.float32)
    assert rstd.shape == (2, 3, 1, 1)
    torch.testing.assert_close(rstd, rstd_r, rtol=1e-6, atol=0)


@interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(1, 16), (5, 37), (2, 3, 24)])
def test_quant_family_interpreted(dtype, shape):
    rows = 1
    for s in shape[:-1]:
        rows *= s
    _check_quant_family(_inputs(shape, dtype, seed=shape[-1] + 1), dtype,
                        experts_rows=[rows // 3, rows // 3, max(1, rows - 1)])


@interp
def test_rounding_and_zero_rows_interpreted():
    x = torch.tensor([[127.0, 2.5, 3.5, -2.5, 0.5, -0.5, 1.5, -127.0], [0.0] * 8])
    y, scale = nt.dynamic_quant_triton(x, None, None)
    assert y.tolist() == [[127, 2, 4, -2, 0, 0, 2, -127], [0] * 8]
    assert scale.tolist() == [1.0, 0.0]


@interp
def test_empty_rows_interpreted():
    y, scale = nt.dynamic_quant_triton(torch.randn(0, 8), None, None)
    assert y.shape == (0, 8) and scale.shape == (0,)
    y, rstd = nt.rms_norm_triton(torch.randn(0, 8), torch.ones(8), 1e-6)
    assert y.shape == (0, 8) and rstd.shape == (0, 1)


# ---------------------------------------------------------------- GPU ----------------------------

@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(1, 7168), (37, 4096), (4, 33, 5120), (3, 129)])
def test_cuda_kernels_match_reference(dtype, shape):
    d = _inputs(shape, dtype, seed=1, device="cuda")
    _check_norm_family(d, dtype)
    rows = 1
    for s in shape[:-1]:
        rows *= s
    _check_quant_family(d, dtype, experts_rows=[rows // 4, rows // 2, rows])


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_ops_dispatch_to_triton(dtype):
    d = _inputs((64, 7168), dtype, seed=2, device="cuda")
    x1, x2, gamma, s1 = d["x1"], d["x2"], d["gamma"], d["s1"]
    y, rstd, x_out = torch.ops.npu.npu_add_rms_norm(x1, x2, gamma)
    assert y.device.type == "cuda"
    y2, rstd2 = torch.ops.npu.npu_rms_norm(x_out, gamma)
    assert torch.equal(y, y2) and torch.equal(rstd, rstd2)
    y1, _, x_out_f, scale1, _ = torch.ops.npu.npu_add_rms_norm_dynamic_quant(
        x1, x2, gamma, smooth_scale1=s1)
    assert torch.equal(x_out_f, x_out)
    q, qs = torch.ops.npu.npu_dynamic_quant(y, smooth_scales=s1)
    assert int((y1.int() - q.int()).abs().max()) <= 1  # fused quantizes float32 y
    ulp = 2 ** -8 if dtype == torch.bfloat16 else 2 ** -11
    torch.testing.assert_close(scale1, qs, rtol=ulp * 1.01, atol=0)


@pytest.mark.cuda
@cuda
def test_cuda_graph_capture():
    d = _inputs((16, 1024), torch.bfloat16, seed=3, device="cuda")

    def run():
        return nt.add_rms_norm_dynamic_quant_triton(
            d["x1"], d["x2"], d["gamma"], smooth_scale1=d["s1"], smooth_scale2=None, beta=None,
            epsilon=1e-6, want1=True, want2=False)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    d["x1"].mul_(2)
    graph.replay()
    torch.cuda.synchronize()
    ref = add_rms_norm_dynamic_quant_reference(d["x1"], d["x2"], d["gamma"],
                                               smooth_scale1=d["s1"])
    assert torch.equal(out[2], ref[2])
    _close_quant(out[0], out[3], ref[0], ref[3])


# ---------------------------------------------------------------- review fixes -------------------

def test_group_index_is_moved_to_the_input_device():
    """dynamic_quant_triton hands group_index to the kernel on x's device: a CPU group_index with
    a CUDA x is copied (Triton would otherwise read a host pointer on the GPU). Checked here with
    the meta device standing in for CUDA."""
    gi = torch.tensor([1, 3, 5, 7], dtype=torch.int32)[::2]  # non-contiguous, on the CPU
    moved = nt.group_index_on(gi, torch.device("meta"))
    assert moved.device.type == "meta" and moved.dtype == torch.int32
    assert moved.shape == (2,) and moved.is_contiguous()
    same = nt.group_index_on(gi, torch.device("cpu"))
    assert same.is_contiguous() and same.tolist() == [1, 5]


@interp
def test_dynamic_quant_triton_grouped_uses_group_index_on_device(monkeypatch):
    seen = []
    real = nt.group_index_on

    def spy(group_index, device):
        seen.append(torch.device(device))
        return real(group_index, device)

    monkeypatch.setattr(nt, "group_index_on", spy)
    d = _inputs((6, 16), torch.float32, seed=5)
    smooth = torch.rand(3, 16) + 0.5
    gi = torch.tensor([2, 4, 6], dtype=torch.int64)
    y, scale = nt.dynamic_quant_triton(d["x1"], smooth, gi)
    assert seen == [d["x1"].device]
    _close_quant(y, scale, *dynamic_quant_reference(d["x1"], smooth_scales=smooth,
                                                    group_index=gi))


@pytest.mark.cuda
@cuda
def test_dynamic_quant_cuda_with_cpu_group_index():
    d = _inputs((64, 512), torch.bfloat16, seed=9, device="cuda")
    smooth = (torch.rand(3, 512) + 0.5).to(torch.bfloat16).cuda()
    gi = torch.tensor([10, 40, 64], dtype=torch.int32)  # on the CPU
    y, scale = torch.ops.npu.npu_dynamic_quant(d["x1"], smooth_scales=smooth, group_index=gi)
    _close_quant(y, scale, *dynamic_quant_reference(d["x1"], smooth_scales=smooth,
                                                    group_index=gi))


def test_triton_helpers_have_one_definition():
    """next_pow2 / interpreted / round half to even live in torchair.ops.toolchain.triton_utils
    only."""
    from torchair.ops.attention.triton import decode as _decode_triton
    from torchair.ops.quant import triton as _quant_triton
    from torchair.ops.toolchain import triton_utils as _triton_utils
    for mod in (nt, _quant_triton, _decode_triton):
        assert mod.next_pow2 is _triton_utils.next_pow2
        assert mod.interpreted is _triton_utils.interpreted
        assert not hasattr(mod, "_next_pow2")
    assert nt.rint is _triton_utils.rint and _quant_triton._rint is _triton_utils.rint
    assert not hasattr(nt, "_ROUND_MAGIC") and not hasattr(nt, "_INT8_MAX")
    assert [_triton_utils.next_pow2(v) for v in (0, 1, 2, 3, 16, 17)] == [1, 1, 2, 4, 16, 32]


@triton.jit
def _rint_kernel(X, Y, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(Y + offs, rint(tl.load(X + offs)))


@interp
def test_rint_is_round_half_to_even_for_every_float32():
    v = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 127.5, -127.5, 0.49999997,
                      2.0 ** 22 + 0.5, 2.0 ** 23 + 1, -(2.0 ** 24) - 2, 3.0e38, -1e-30, 0.0])
    out = torch.empty_like(v)
    _rint_kernel[(1,)](v, out, N=v.numel())
    assert torch.equal(out, torch.round(v))
