"""npu_rms_norm / npu_add_rms_norm / npu_add_rms_norm_cast: reference vs independent formulas, the
fast CPU kernel vs the reference, exactness of the fused forms, fake kernels, errors."""
from __future__ import annotations

import itertools

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torchair.ops  # noqa: F401 (registers the ops)
from torchair.ops.norm import cpu as _norm_cpu
from torchair.ops.norm.rms_norm import add_rms_norm_cast_reference, add_rms_norm_reference, rms_norm_reference

RMS = torch.ops.npu.npu_rms_norm
ADD = torch.ops.npu.npu_add_rms_norm
CAST = torch.ops.npu.npu_add_rms_norm_cast
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# shapes: 1 token, 2-D, 3-D [B, S, H], odd H
SHAPES = [(1, 64), (7, 48), (2, 3, 64), (5, 37)]
ULP = {torch.float32: 2 ** -23, torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7}


def _data(shape, dtype, seed=0, gamma_shape=None):
    g = torch.Generator().manual_seed(seed)
    x1 = (torch.randn(shape, generator=g) * 3).to(dtype)
    x2 = torch.randn(shape, generator=g).to(dtype)
    gamma = (torch.rand(gamma_shape or shape[-1:], generator=g) + 0.5).to(dtype)
    return x1, x2, gamma


@pytest.fixture
def chunk_rows():
    """Set ``_norm_cpu.CHUNK_ROWS`` for one test (restored after)."""
    old = _norm_cpu.CHUNK_ROWS
    yield lambda rows: setattr(_norm_cpu, "CHUNK_ROWS", rows)
    _norm_cpu.CHUNK_ROWS = old


def _assert_y_close(y, ref, dtype):
    """Equal up to one rounding of the output dtype (float32 rstd may differ in its last bit)."""
    torch.testing.assert_close(y.float(), ref.float(), atol=1e-6, rtol=2 * ULP[dtype])


# ---------------------------------------------------------------- reference vs independent -------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_reference_matches_vector_norm_fp64(dtype, shape):
    x, _, gamma = _data(shape, dtype)
    eps = 1e-5
    y, rstd = rms_norm_reference(x, gamma, eps)
    x64 = x.double()
    h = shape[-1]
    rstd64 = 1.0 / torch.sqrt(torch.linalg.vector_norm(x64, dim=-1, keepdim=True) ** 2 / h + eps)
    torch.testing.assert_close(rstd.double(), rstd64, rtol=1e-6, atol=0)
    assert rstd.dtype == torch.float32 and rstd.shape == shape[:-1] + (1,)
    _assert_y_close(y, (x64 * rstd64 * gamma.double()).to(dtype), dtype)
    assert y.dtype == dtype


@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_matches_functional_rms_norm(dtype):
    x, _, gamma = _data((4, 96), dtype)
    y, _ = rms_norm_reference(x, gamma, 1e-6)
    ref = torch.nn.functional.rms_norm(x.float(), (96,), weight=gamma.float(), eps=1e-6)
    _assert_y_close(y, ref.to(dtype), dtype)


def test_reference_two_normalized_dims_explicit_loops():
    x, _, gamma = _data((3, 2, 4, 5), torch.float32, gamma_shape=(4, 5))
    y, rstd = rms_norm_reference(x, gamma, 1e-6)
    assert rstd.shape == (3, 2, 1, 1)
    for i, j in itertools.product(range(3), range(2)):
        vals = [float(v) for v in x[i, j].flatten()]
        r = 1.0 / (sum(v * v for v in vals) / len(vals) + 1e-6) ** 0.5
        assert abs(float(rstd[i, j, 0, 0]) - r) <= 1e-6 * r
        expect = torch.tensor([[float(x[i, j, a, b]) * r * float(gamma[a, b]) for b in range(5)]
                               for a in range(4)])
        torch.testing.assert_close(y[i, j], expect, rtol=1e-6, atol=1e-6)


def test_add_reference_rounds_the_sum_once():
    x1 = torch.tensor([[1.0, 256.0, -3.0, 0.5]], dtype=torch.bfloat16)
    x2 = torch.tensor([[2.0 ** -9, 1.0, 3.0, 0.25]], dtype=torch.bfloat16)
    _, _, x_out = add_rms_norm_reference(x1, x2, torch.ones(4))
    # 1 + 2^-9 -> 1 and 256 + 1 -> 256 (below half a bf16 ulp), -3 + 3 -> 0
    assert x_out.tolist() == [[1.0, 256.0, 0.0, 0.75]]


# ---------------------------------------------------------------- exact identities ---------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_add_rms_norm_equals_rms_norm_of_sum_exactly(dtype, shape, chunk_rows):
    chunk_rows(2)
    x1, x2, gamma = _data(shape, dtype, seed=1)
    for add, rms in ((ADD, RMS), (add_rms_norm_reference, rms_norm_reference)):
        y, rstd, x_out = add(x1, x2, gamma, 1e-6)
        assert torch.equal(x_out, x1 + x2)
        y2, rstd2 = rms(x1 + x2, gamma, 1e-6)
        assert torch.equal(y, y2) and torch.equal(rstd, rstd2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_cast_is_the_unfused_cast_exactly(dtype):
    x1, x2, gamma = _data((2, 3, 64), dtype, seed=2)
    for cast, add in ((CAST, ADD), (add_rms_norm_cast_reference, add_rms_norm_reference)):
        y_f32, y, rstd, x_out = cast(x1, x2, gamma, 1e-6)
        assert y_f32.dtype == torch.float32 and torch.equal(y_f32, y.float())
        y_u, rstd_u, x_out_u = add(x1, x2, gamma, 1e-6)
        assert torch.equal(y, y_u) and torch.equal(rstd, rstd_u) and torch.equal(x_out, x_out_u)


# ---------------------------------------------------------------- fast CPU kernel vs reference ---

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES + [(3, 2, 4, 5)])
@pytest.mark.parametrize("rows", [None, 1, 3])
def test_cpu_kernels_match_reference(dtype, shape, rows, chunk_rows):
    chunk_rows(rows)
    gshape = (4, 5) if len(shape) == 4 else None
    x1, x2, gamma = _data(shape, dtype, seed=3, gamma_shape=gshape)
    y, rstd = RMS(x1, gamma, 1e-5)
    y_r, rstd_r = rms_norm_reference(x1, gamma, 1e-5)
    _assert_y_close(y, y_r, dtype)
    torch.testing.assert_close(rstd, rstd_r, rtol=2e-7, atol=0)
    out = CAST(x1, x2, gamma, 1e-5)
    ref = add_rms_norm_cast_reference(x1, x2, gamma, 1e-5)
    for got, want in zip(out, ref):
        assert got.dtype == want.dtype and got.shape == want.shape
    _assert_y_close(out[0], ref[0], dtype)
    _assert_y_close(out[1], ref[1], dtype)
    torch.testing.assert_close(out[2], ref[2], rtol=2e-7, atol=0)
    assert torch.equal(out[3], ref[3])


def test_cpu_kernel_chunked_equals_unchunked(chunk_rows):
    x1, x2, gamma = _data((11, 40), torch.bfloat16, seed=4)
    whole = ADD(x1, x2, gamma)
    chunk_rows(4)  # 4 + 4 + 3 rows
    for a, b in zip(whole, ADD(x1, x2, gamma)):
        assert torch.equal(a, b)


def test_empty_rows_and_non_contiguous_input():
    x = torch.randn(0, 8)
    y, rstd = RMS(x, torch.ones(8))
    assert y.shape == (0, 8) and rstd.shape == (0, 1)
    base = torch.randn(8, 6)
    xt = base.t()  # [6, 8], not contiguous
    y, _ = RMS(xt, torch.ones(8))
    assert torch.equal(y, rms_norm_reference(xt.contiguous(), torch.ones(8))[0])


# ---------------------------------------------------------------- fake kernels / compile ---------

def test_fake_shapes_and_dtypes():
    with FakeTensorMode():
        x = torch.empty(2, 5, 16, dtype=torch.bfloat16)
        g = torch.empty(16, dtype=torch.bfloat16)
        y, rstd = RMS(x, g)
        assert (y.shape, y.dtype, rstd.shape, rstd.dtype) == \
            ((2, 5, 16), torch.bfloat16, (2, 5, 1), torch.float32)
        y, rstd, x_out = ADD(x, x, g)
        assert x_out.shape == (2, 5, 16) and x_out.dtype == torch.bfloat16
        y_f32, y, rstd, x_out = CAST(x, x, g)
        assert y_f32.dtype == torch.float32 and y.dtype == torch.bfloat16
        assert rstd.shape == (2, 5, 1)
        _, rstd = RMS(x, torch.empty(5, 16))
        assert rstd.shape == (2, 1, 1)


def test_compile_dynamic_fullgraph():
    def f(x1, x2, g):
        y, rstd, x_out = ADD(x1, x2, g)
        y_f32, y2, _, _ = CAST(x1, x2, g)
        n, _ = RMS(x_out, g)
        return y, rstd, y_f32, n

    compiled = torch.compile(f, backend="eager", fullgraph=True, dynamic=True)
    for tokens in (3, 5):
        args = _data((tokens, 32), torch.float16, seed=tokens)
        for a, b in zip(compiled(*args), f(*args)):
            assert torch.equal(a, b)


# ---------------------------------------------------------------- errors -------------------------

ERRORS = {
    "self_dtype": (lambda: RMS(torch.ones(2, 4, dtype=torch.int32), torch.ones(4)),
                   TypeError, "self has dtype torch.int32"),
    "gamma_dtype": (lambda: RMS(torch.ones(2, 4), torch.ones(4, dtype=torch.int8)),
                    TypeError, "gamma has dtype torch.int8"),
    "gamma_shape": (lambda: RMS(torch.ones(2, 4), torch.ones(5)), ValueError,
                    r"gamma has shape \[5\] but self has shape \[2, 4\]"),
    "gamma_rank": (lambda: RMS(torch.ones(4), torch.ones(1, 4)), ValueError, "gamma has shape"),
    "x2_shape": (lambda: ADD(torch.ones(2, 4), torch.ones(1, 4), torch.ones(4)), ValueError,
                 r"x2 has shape \[1, 4\] but x1 has \[2, 4\]"),
    "x2_dtype": (lambda: CAST(torch.ones(2, 4), torch.ones(2, 4).half(), torch.ones(4)),
                 TypeError, "x2 has dtype torch.float16"),
    "x1_dtype": (lambda: ADD(torch.ones(2, 4).double(), torch.ones(2, 4).double(),
                             torch.ones(4)), TypeError, "x1 has dtype torch.float64"),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_errors_name_the_argument(case):
    fn, exc, match = ERRORS[case]
    with pytest.raises(exc, match=match):
        fn()


def test_fake_kernel_raises_the_same_errors():
    with FakeTensorMode():
        with pytest.raises(ValueError, match="gamma has shape"):
            RMS(torch.empty(2, 4), torch.empty(3))


ZERO_WIDTH = [((3, 0), (0,)), ((2, 4, 0), (4, 0)), ((0, 0), (0,))]


@pytest.mark.parametrize("x_shape,gamma_shape", ZERO_WIDTH)
def test_zero_sized_normalized_dims_raise_a_clear_error(x_shape, gamma_shape):
    """x [3, 0] with gamma [0]: the RMS of an empty row is undefined. Reference, CPU kernel and
    fake kernel raise one ValueError naming gamma and x (not a raw reshape RuntimeError)."""
    x, gamma = torch.empty(x_shape), torch.empty(gamma_shape)
    match = r"gamma has shape .*normalized dims .* hold zero elements"
    calls = [lambda a, g: RMS(a, g), lambda a, g: ADD(a, a, g), lambda a, g: CAST(a, a, g),
             lambda a, g: rms_norm_reference(a, g), lambda a, g: add_rms_norm_reference(a, a, g),
             lambda a, g: add_rms_norm_cast_reference(a, a, g)]
    for call in calls:
        with pytest.raises(ValueError, match=match):
            call(x, gamma)
    with FakeTensorMode() as mode:
        fx, fg = mode.from_tensor(x), mode.from_tensor(gamma)
        for call in calls[:3]:
            with pytest.raises(ValueError, match=match):
                call(fx, fg)


def test_rstd_shape_has_one_definition():
    from torchair.ops.norm import rms_norm, triton as _norm_triton
    assert rms_norm.rstd_shape is _norm_cpu.rstd_shape is _norm_triton.rstd_shape
    assert not hasattr(_norm_cpu, "_rstd_shape")
    assert _norm_cpu.rstd_shape(torch.empty(2, 3, 4, 5), torch.empty(4, 5)) == [2, 3, 1, 1]
