"""npu_dynamic_quant / npu_add_rms_norm_dynamic_quant: references vs independent formulas, rounding
and zero rows, MoE group_index, output_mask, the fast CPU kernels vs the references, fused vs the
unfused chain, fake kernels, errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torchair.ops  # noqa: F401 (registers the ops)
from torchair.ops.norm import cpu as _norm_cpu
from torchair.ops.quant.dynamic_quant import add_rms_norm_dynamic_quant_reference, dynamic_quant_reference

DQ = torch.ops.npu.npu_dynamic_quant
FUSED = torch.ops.npu.npu_add_rms_norm_dynamic_quant
ADD = torch.ops.npu.npu_add_rms_norm
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(1, 64), (7, 48), (2, 3, 64), (5, 37)]


def _t(shape, dtype, g, scale=1.0, offset=0.0):
    return (torch.randn(shape, generator=g) * scale + offset).to(dtype)


def _fused_inputs(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = shape[-1]
    return dict(x1=_t(shape, dtype, g, 3.0), x2=_t(shape, dtype, g), gamma=_t(h, dtype, g, 0.2, 1),
                s1=_t(h, dtype, g, 0.2, 1), s2=_t(h, dtype, g, 0.2, 1), beta=_t(h, dtype, g, 0.1))


@pytest.fixture
def chunk_rows():
    old = _norm_cpu.CHUNK_ROWS
    yield lambda rows: setattr(_norm_cpu, "CHUNK_ROWS", rows)
    _norm_cpu.CHUNK_ROWS = old


def _independent_quant(x64: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Per-row int8 in float64 with numpy: scale = max|x| / 127, y = rint(x / scale)."""
    x = x64.reshape(-1, x64.shape[-1]).numpy()
    scale = np.abs(x).max(axis=1) / 127.0
    safe = np.where(scale > 0, scale, 1.0)
    return np.clip(np.rint(x / safe[:, None]), -128, 127), scale


def _assert_quant_close(y, scale, y_ref, scale_ref, rtol=1e-6):
    """int8 within one step (a quotient next to .5 may round either way), scales close."""
    y_ref = torch.as_tensor(y_ref).reshape(y.shape)
    diff = (y.to(torch.int32) - y_ref.to(torch.int32)).abs()
    assert diff.numel() == 0 or int(diff.max()) <= 1
    assert int((diff > 0).sum()) <= max(1, diff.numel() // 100)
    torch.testing.assert_close(scale.double(), torch.as_tensor(scale_ref).double().reshape(
        scale.shape), rtol=rtol, atol=0)


# ---------------------------------------------------------------- dynamic_quant reference --------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("smooth", [False, True])
def test_reference_matches_numpy_fp64(dtype, smooth):
    g = torch.Generator().manual_seed(0)
    x = _t((6, 50), dtype, g, 4.0)
    s = _t(50, dtype, g, 0.3, 1) if smooth else None
    y, scale = dynamic_quant_reference(x, smooth_scales=s)
    assert y.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (6,)
    x64 = x.double() * (s.double() if smooth else 1.0)
    _assert_quant_close(y, scale, *_independent_quant(x64))


def test_rounding_is_half_to_even_and_extremes():
    # amax 127 -> scale 1: quotients are the values themselves
    x = torch.tensor([[127.0, 2.5, 3.5, -2.5, 0.5, -0.5, 1.5, -127.0]])
    for fn in (DQ, dynamic_quant_reference):
        y, scale = fn(x)
        assert scale.tolist() == [1.0]
        assert y.tolist() == [[127, 2, 4, -2, 0, 0, 2, -127]]


def test_zero_row_gives_zero_scale_and_zero_y():
    x = torch.zeros(3, 16, dtype=torch.bfloat16)
    x[1] = torch.linspace(-1, 1, 16)
    for fn in (DQ, dynamic_quant_reference):
        y, scale = fn(x)
        assert scale[0] == 0 and scale[2] == 0 and scale[1] > 0
        assert not torch.isnan(scale).any()
        assert torch.equal(y[0], torch.zeros(16, dtype=torch.int8)) and y[1].abs().max() == 127


def test_group_index_reference_matches_explicit_expert_loop():
    g = torch.Generator().manual_seed(5)
    x = _t((10, 24), torch.float16, g, 2.0)
    smooth = _t((3, 24), torch.float16, g, 0.3, 1)
    group_index = torch.tensor([3, 3, 8], dtype=torch.int32)  # rows 0-2, none, 3-7, then 8-9
    y, scale = dynamic_quant_reference(x, smooth_scales=smooth, group_index=group_index)
    bounds = [(0, 3, 0), (3, 3, 1), (3, 8, 2), (8, 10, 2)]  # rows past the last end: last expert
    for lo, hi, e in bounds:
        if hi > lo:
            y_e, s_e = dynamic_quant_reference(x[lo:hi], smooth_scales=smooth[e])
            assert torch.equal(y[lo:hi], y_e) and torch.equal(scale[lo:hi], s_e)


def test_dst_type_int8_is_accepted():
    x = torch.randn(2, 8)
    y, _ = DQ(x, dst_type=torch.int8)
    assert y.dtype == torch.int8 and torch.equal(y, DQ(x)[0])


# ---------------------------------------------------------------- dynamic_quant fast CPU ---------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("rows", [None, 2])
@pytest.mark.parametrize("mode", ["plain", "smooth", "group"])
def test_cpu_dynamic_quant_matches_reference(dtype, shape, rows, mode, chunk_rows):
    chunk_rows(rows)
    g = torch.Generator().manual_seed(1)
    x = _t(shape, dtype, g, 3.0)
    kw = {}
    if mode == "smooth":
        kw["smooth_scales"] = _t(shape[-1], dtype, g, 0.3, 1)
    elif mode == "group":
        kw["smooth_scales"] = _t((3, shape[-1]), dtype, g, 0.3, 1)
        kw["group_index"] = torch.tensor([1, 2, 4], dtype=torch.int64)
    y, scale = DQ(x, **kw)
    y_r, scale_r = dynamic_quant_reference(x, **kw)
    assert y.shape == shape and scale.shape == shape[:-1]
    assert torch.equal(y, y_r) and torch.equal(scale, scale_r)


# ---------------------------------------------------------------- fused reference ----------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("extras", ["none", "s1", "s1s2beta"])
def test_fused_reference_matches_fp64_formula(dtype, extras):
    d = _fused_inputs((5, 40), dtype, seed=2)
    kw = {}
    if extras != "none":
        kw["smooth_scale1"] = d["s1"]
    if extras == "s1s2beta":
        kw.update(smooth_scale2=d["s2"], beta=d["beta"])
    y1, y2, x_out, scale1, scale2 = add_rms_norm_dynamic_quant_reference(
        d["x1"], d["x2"], d["gamma"], epsilon=1e-5, **kw)
    x = x_out.double()
    assert torch.equal(x_out, (d["x1"].double() + d["x2"].double()).to(dtype))
    ms = torch.linalg.vector_norm(x, dim=-1, keepdim=True) ** 2 / x.shape[-1]
    y = x / torch.sqrt(ms + 1e-5) * d["gamma"].double()
    if "beta" in kw:
        y = y + d["beta"].double()
    s1 = d["s1"].double() if "smooth_scale1" in kw else 1.0
    _assert_quant_close(y1, scale1, *_independent_quant(y * s1), rtol=1e-5)
    if "smooth_scale2" in kw:
        _assert_quant_close(y2, scale2, *_independent_quant(y * d["s2"].double()), rtol=1e-5)
    else:
        assert y2.shape == (0,) and scale2.shape == (0,)


def test_output_mask_selects_the_outputs():
    d = _fused_inputs((2, 3, 16), torch.float16)
    x1, x2, gamma = d["x1"], d["x2"], d["gamma"]
    full = (2, 3, 16)
    cases = [  # (kwargs, y1 produced?, y2 produced?)
        ({}, True, False),
        ({"smooth_scale1": d["s1"]}, True, False),
        ({"smooth_scale1": d["s1"], "smooth_scale2": d["s2"]}, True, True),
        ({"output_mask": [True, True]}, True, True),
        ({"output_mask": [False, True]}, False, True),
        ({"output_mask": [False, False]}, False, False),
        ({"smooth_scale2": d["s2"], "output_mask": [False, True]}, False, True),
    ]
    for kw, want1, want2 in cases:
        for fn in (FUSED, add_rms_norm_dynamic_quant_reference):
            y1, y2, x_out, s1, s2 = fn(x1, x2, gamma, **kw)
            assert x_out.shape == full
            assert (y1.shape, s1.shape) == (((2, 3, 16), (2, 3)) if want1 else ((0,), (0,)))
            assert (y2.shape, s2.shape) == (((2, 3, 16), (2, 3)) if want2 else ((0,), (0,)))
            assert y1.dtype == y2.dtype == torch.int8 and s1.dtype == s2.dtype == torch.float32
    # without smooth_scale2 the second quantization reads y itself: equal to the first
    y1, y2, _, s1, s2 = FUSED(x1, x2, gamma, output_mask=[True, True])
    assert torch.equal(y1, y2) and torch.equal(s1, s2)


# ---------------------------------------------------------------- fused fast CPU -----------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("rows", [None, 3])
def test_cpu_fused_matches_reference(dtype, shape, rows, chunk_rows):
    chunk_rows(rows)
    d = _fused_inputs(shape, dtype, seed=3)
    for kw in ({}, {"smooth_scale1": d["s1"], "smooth_scale2": d["s2"], "beta": d["beta"]},
               {"smooth_scale2": d["s2"], "output_mask": [False, True]}):
        out = FUSED(d["x1"], d["x2"], d["gamma"], epsilon=1e-5, **kw)
        ref = add_rms_norm_dynamic_quant_reference(d["x1"], d["x2"], d["gamma"], epsilon=1e-5,
                                                   **kw)
        for got, want in zip(out, ref):
            assert got.shape == want.shape and got.dtype == want.dtype
        assert torch.equal(out[2], ref[2])
        for y, s, y_r, s_r in ((out[0], out[3], ref[0], ref[3]), (out[1], out[4], ref[1], ref[4])):
            _assert_quant_close(y, s, y_r, s_r)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_fused_vs_unfused_chain_bound(dtype, chunk_rows):
    """The fusion pass's rewrite: fused quantizes float32 y, the chain y rounded to the dtype.

    Bound: |y1 - y1_chain| <= 1 per element, scales within one rounding of the dtype (the
    rounding of max|y|); x_out equal; float32 inputs: all equal.
    """
    chunk_rows(5)
    d = _fused_inputs((64, 96), dtype, seed=4)
    y1, _, x_out, scale1, _ = FUSED(d["x1"], d["x2"], d["gamma"], smooth_scale1=d["s1"])
    y, _, x_out_c = ADD(d["x1"], d["x2"], d["gamma"])
    y_c, scale_c = DQ(y, smooth_scales=d["s1"])
    assert torch.equal(x_out, x_out_c)
    diff = (y1.int() - y_c.int()).abs()
    assert int(diff.max()) <= 1
    if dtype == torch.float32:
        assert torch.equal(y1, y_c) and torch.equal(scale1, scale_c)
    else:
        ulp = 2 ** -8 if dtype == torch.bfloat16 else 2 ** -11
        torch.testing.assert_close(scale1, scale_c, rtol=ulp * 1.01, atol=0)


# ---------------------------------------------------------------- fake kernels / compile ---------

def test_fake_shapes_and_dtypes():
    with FakeTensorMode():
        x = torch.empty(4, 3, 32, dtype=torch.bfloat16)
        h = torch.empty(32, dtype=torch.bfloat16)
        y, scale = DQ(x, smooth_scales=h)
        assert (y.shape, y.dtype, scale.shape, scale.dtype) == \
            ((4, 3, 32), torch.int8, (4, 3), torch.float32)
        y1, y2, x_out, s1, s2 = FUSED(x, x, h, smooth_scale1=h)
        assert (y1.shape, y2.shape, x_out.shape, s1.shape, s2.shape) == \
            ((4, 3, 32), (0,), (4, 3, 32), (4, 3), (0,))
        assert x_out.dtype == torch.bfloat16 and y2.dtype == torch.int8
        y1, y2, _, s1, s2 = FUSED(x, x, h, output_mask=[False, True])
        assert (y1.shape, y2.shape, s1.shape, s2.shape) == ((0,), (4, 3, 32), (0,), (4, 3))


def test_compile_dynamic_fullgraph():
    def f(x1, x2, g, s):
        y1, _, x_out, scale1, _ = FUSED(x1, x2, g, smooth_scale1=s, smooth_scale2=s)
        y, _, _ = ADD(x1, x2, g)
        q, qs = DQ(y, smooth_scales=s)
        return y1, x_out, scale1, q, qs

    compiled = torch.compile(f, backend="eager", fullgraph=True, dynamic=True)
    for tokens in (3, 6):
        d = _fused_inputs((tokens, 32), torch.bfloat16, seed=tokens)
        args = (d["x1"], d["x2"], d["gamma"], d["s1"])
        for a, b in zip(compiled(*args), f(*args)):
            assert torch.equal(a, b)


# ---------------------------------------------------------------- errors -------------------------

def _x(*shape, dtype=torch.float16):
    return torch.ones(shape, dtype=dtype)


ERRORS = {
    "input_dtype": (lambda: DQ(_x(2, 4, dtype=torch.int32)), TypeError,
                    "input has dtype torch.int32"),
    "input_empty_row": (lambda: DQ(_x(2, 0)), ValueError, r"input has shape \[2, 0\]"),
    "dst_type": (lambda: DQ(_x(2, 4), dst_type=torch.quint4x2), TypeError,
                 "dst_type is torch.quint4x2; only torch.int8"),
    "smooth_shape": (lambda: DQ(_x(2, 4), smooth_scales=_x(5)), ValueError,
                     r"smooth_scales has shape \[5\]; expected \[4\]"),
    "smooth_dtype": (lambda: DQ(_x(2, 4), smooth_scales=_x(4, dtype=torch.int8)), TypeError,
                     "smooth_scales has dtype torch.int8"),
    "group_without_smooth": (lambda: DQ(_x(2, 4), group_index=torch.tensor([2])), ValueError,
                             "group_index is given but smooth_scales is None"),
    "group_dtype": (lambda: DQ(_x(2, 4), smooth_scales=_x(1, 4),
                               group_index=torch.tensor([2.0])), TypeError,
                    "group_index has dtype torch.float32"),
    "group_smooth_shape": (lambda: DQ(_x(2, 4), smooth_scales=_x(4),
                                      group_index=torch.tensor([2])), ValueError,
                           r"smooth_scales has shape \[4\] with group_index"),
    "fused_gamma": (lambda: FUSED(_x(2, 4), _x(2, 4), _x(3)), ValueError, "gamma has shape"),
    "fused_gamma_2d": (lambda: FUSED(_x(2, 4), _x(2, 4), _x(2, 4)), ValueError,
                       r"gamma has shape \[2, 4\]; expected \[4\]"),
    "fused_x2": (lambda: FUSED(_x(2, 4), _x(2, 4, dtype=torch.bfloat16), _x(4)), TypeError,
                 "x2 has dtype torch.bfloat16"),
    "fused_smooth1": (lambda: FUSED(_x(2, 4), _x(2, 4), _x(4), smooth_scale1=_x(2, 4)),
                      ValueError, r"smooth_scale1 has shape \[2, 4\]"),
    "fused_beta": (lambda: FUSED(_x(2, 4), _x(2, 4), _x(4), beta=_x(3)), ValueError,
                   r"beta has shape \[3\]"),
    "fused_s2_without_s1": (lambda: FUSED(_x(2, 4), _x(2, 4), _x(4), smooth_scale2=_x(4)),
                            ValueError, "smooth_scale2 is given but smooth_scale1 is None"),
    "fused_mask_len": (lambda: FUSED(_x(2, 4), _x(2, 4), _x(4), output_mask=[True]),
                       ValueError, r"output_mask is \[True\]"),
    "fused_mask_vs_smooth": (lambda: FUSED(_x(2, 4), _x(2, 4), _x(4), smooth_scale1=_x(4),
                                           output_mask=[False, True]), ValueError,
                             r"smooth_scale1 is given but output_mask\[0\] is False"),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_errors_name_the_argument(case):
    fn, exc, match = ERRORS[case]
    with pytest.raises(exc, match=match):
        fn()


def test_fake_kernels_raise_the_same_errors():
    with FakeTensorMode():
        with pytest.raises(TypeError, match="dst_type"):
            DQ(torch.empty(2, 4), dst_type=torch.quint4x2)
        with pytest.raises(ValueError, match="output_mask"):
            FUSED(torch.empty(2, 4), torch.empty(2, 4), torch.empty(4), output_mask=[True])


def test_fused_zero_width_rows_raise_a_clear_error():
    """x1 [3, 0]: a zero-sized normalized dim is rejected by the shared norm checks (reference,
    CPU kernel and fake alike) with a ValueError naming gamma, not a raw reshape error."""
    x, gamma = torch.empty(3, 0), torch.empty(0)
    match = "gamma has shape .* hold zero elements"
    with pytest.raises(ValueError, match=match):
        FUSED(x, x, gamma)
    with pytest.raises(ValueError, match=match):
        add_rms_norm_dynamic_quant_reference(x, x, gamma)
    with FakeTensorMode() as mode:
        fx, fg = mode.from_tensor(x), mode.from_tensor(gamma)
        with pytest.raises(ValueError, match=match):
            FUSED(fx, fx, fg)
