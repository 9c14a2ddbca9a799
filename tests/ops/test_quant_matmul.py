"""npu_quant_matmul: reference vs an independent numpy formula, fast CPU kernel vs reference,
exact int32 accumulation on worst-case inputs, int64 (npu_trans_quant_param) scales, fake kernel
and torch.compile, and every argument error."""
import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torchair.ops  # noqa: F401 (registers)
from torchair.ops.quant import cpu as _quant_cpu
from torchair.ops.quant.quant_matmul import decode_int64_scale, prepare_quant_matmul, quant_matmul_reference

OP = torch.ops.npu.npu_quant_matmul


def _ints(shape, g, lo=-128, hi=128):
    return torch.randint(lo, hi, shape, generator=g, dtype=torch.int8)


def _case(m=5, k=37, n=11, b1=(), b2=(), seed=0):
    g = torch.Generator().manual_seed(seed)
    return _ints((*b1, m, k), g), _ints((*b2, k, n), g), g


def _numpy_oracle(x1, x2, scale, offset=None, pertoken=None, bias=None, out=torch.int8):
    """The documented formula with numpy: int64 matmul, int32 bias with int32 wrap-around,
    float32 epilogue, np.rint (half even)."""
    acc = np.matmul(x1.numpy().astype(np.int64), x2.numpy().astype(np.int64))
    if bias is not None and bias.dtype == torch.int32:
        acc = (acc + bias.numpy().astype(np.int64) + 2**31) % 2**32 - 2**31
    v = acc.astype(np.float32) * scale.float().numpy()
    if pertoken is not None:
        v = v * pertoken.numpy()[:, None]
    if bias is not None and bias.dtype != torch.int32:
        v = v + bias.float().numpy()
    if out == torch.int8:
        if offset is not None:
            v = v + offset.numpy()
        return torch.from_numpy(np.clip(np.rint(v), -128, 127).astype(np.int8))
    return torch.from_numpy(v).to(out)


CASES = [  # (output_dtype, scale dtype, use offset, use pertoken, bias dtype)
    (None, torch.float32, False, False, None),
    (torch.int8, torch.float32, True, False, torch.int32),
    (torch.float16, torch.float32, False, False, torch.int32),
    (torch.float16, torch.float32, False, True, torch.float16),
    (torch.float16, torch.float32, False, True, torch.float32),
    (torch.bfloat16, torch.bfloat16, False, False, torch.bfloat16),
    (torch.bfloat16, torch.float32, False, True, torch.int32),
    (torch.bfloat16, torch.float32, False, True, torch.float32),
]


def _args(case, m, n, g, per_n=True):
    out, sdt, use_off, use_pt, bdt = case
    t = n if per_n else 1
    kw = {"output_dtype": out}
    scale = (torch.rand(t, generator=g) * 2e-3 + 1e-4).to(sdt)
    if use_off:
        kw["offset"] = torch.randn(t, generator=g) * 4
    if use_pt:
        kw["pertoken_scale"] = torch.rand(m, generator=g) + 0.5
    if bdt == torch.int32:
        kw["bias"] = torch.randint(-5000, 5000, (n,), generator=g, dtype=torch.int32)
    elif bdt is not None:
        kw["bias"] = (torch.randn(n, generator=g) * 3).to(bdt)
    return scale, kw


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("per_n", [True, False])
def test_reference_matches_numpy_formula(case, per_n):
    x1, x2, g = _case(m=6, k=45, n=13, seed=int(per_n))
    scale, kw = _args(case, 6, 13, g, per_n)
    ref = quant_matmul_reference(x1, x2, scale, **kw)
    expect = _numpy_oracle(x1, x2, scale, kw.get("offset"), kw.get("pertoken_scale"),
                           kw.get("bias"), ref.dtype)
    assert ref.dtype == (case[0] or torch.int8) and ref.shape == (6, 13)
    assert torch.equal(ref, expect)


SHAPES = [  # (m, k, n, batch of x1, batch of x2)
    (1, 7, 5, (), ()), (1, 4096, 3, (), ()), (16, 33, 17, (), ()), (37, 64, 31, (2,), ()),
    (3, 19, 8, (2, 3), (3,)), (4, 16, 9, (2, 1), (1, 3)), (5, 21, 6, (), (4,)),
]


@pytest.mark.parametrize("m,k,n,b1,b2", SHAPES)
@pytest.mark.parametrize("case", CASES[:2] + CASES[3:4] + CASES[6:])
def test_fast_cpu_matches_reference(m, k, n, b1, b2, case, monkeypatch):
    monkeypatch.setattr(_quant_cpu, "CHUNK_ROWS", 4)  # cross epilogue chunks
    x1, x2, g = _case(m, k, n, b1, b2, seed=m * n + k)
    scale, kw = _args(case, m, n, g)
    ref = quant_matmul_reference(x1, x2, scale, **kw)
    out = OP(x1, x2, scale, **kw)
    assert out.shape == ref.shape == (*torch.broadcast_shapes(b1, b2), m, n)
    assert torch.equal(out, ref)


def test_batched_int32_bias_3d():
    x1, x2, g = _case(m=4, k=24, n=6, b1=(3,), b2=(3,))
    bias = torch.randint(-100, 100, (3, 1, 6), generator=g, dtype=torch.int32)
    scale = torch.full((6,), 0.01)
    ref = quant_matmul_reference(x1, x2, scale, bias=bias, output_dtype=torch.float16)
    assert torch.equal(OP(x1, x2, scale, bias=bias, output_dtype=torch.float16), ref)
    expect = _numpy_oracle(x1, x2, scale, bias=bias, out=torch.float16)
    assert torch.equal(ref, expect)


@pytest.mark.parametrize("gemm", ["float", "int_mm", None])
@pytest.mark.parametrize("k", [1024, 1025, 7168, 65535])
def test_int32_accumulation_exact_on_worst_case(monkeypatch, k, gemm):
    """All -128 (and -128 x 127 mixes) give |acc| up to K * 2**14: exact, no float rounding, on
    either int8 GEMM (float32 slices, torch._int_mm) and on the one measured faster (None)."""
    monkeypatch.setattr(_quant_cpu, "GEMM", gemm)
    x1 = torch.full((3, k), -128, dtype=torch.int8)
    x1[1] = 127
    x1[2, ::2] = 127
    x2 = torch.full((k, 2), -128, dtype=torch.int8)
    x2[1::3, 1] = 127
    expect = torch.from_numpy(np.matmul(x1.numpy().astype(np.int64), x2.numpy().astype(np.int64)))
    acc = _quant_cpu.int8_matmul_cpu(x1, x2)
    assert acc.dtype == torch.int32 and torch.equal(acc.long(), expect)
    assert int(acc[0, 0]) == k * 128 * 128
    # the float32 epilogue sees the exact accumulator: scale 1 -> float32(acc) exactly
    for fn in (OP, quant_matmul_reference):
        out = fn(x1, x2, torch.ones(1), output_dtype=torch.bfloat16,
                 pertoken_scale=torch.ones(3))
        assert torch.equal(out, expect.float().to(torch.bfloat16))


@pytest.mark.parametrize("path", ["float32", "float64", "int_mm"])
@pytest.mark.parametrize("b1,b2", [((), ()), ((2,), ()), ((2,), (2,)), ((1, 3), (2, 1))])
def test_int8_matmul_is_exact_in_every_gemm_path(monkeypatch, path, b1, b2):
    """Random int8 operands over several 1024-column slices of K, batched and broadcast: the
    float32 slice path, the float64 path (taken when float32 matmuls may be reduced precision)
    and torch._int_mm (one weight only) all equal numpy's int64 product."""
    monkeypatch.setattr(_quant_cpu, "_fp32_matmul_is_ieee", lambda: path != "float64")
    monkeypatch.setattr(_quant_cpu, "GEMM", "int_mm" if path == "int_mm" else "float")
    g = torch.Generator().manual_seed(7)
    x1 = torch.randint(-128, 128, (*b1, 5, 2500), generator=g, dtype=torch.int8)
    x2 = torch.randint(-128, 128, (*b2, 2500, 3), generator=g, dtype=torch.int8)
    expect = np.matmul(x1.numpy().astype(np.int64), x2.numpy().astype(np.int64))
    acc = _quant_cpu.int8_matmul_cpu(x1, x2)
    assert acc.dtype == torch.int32
    assert torch.equal(acc.long(), torch.from_numpy(expect).reshape(-1, 3))


def test_decode_gemm_choice_is_measured_once_per_shape(monkeypatch, torchair_log):
    """Up to 16 rows, the first product of a (rows, K, N) times both GEMMs once and keeps the
    faster; more rows always take the float32 slices; the result is the same exact product."""
    monkeypatch.setattr(_quant_cpu, "GEMM", None)
    monkeypatch.setattr(_quant_cpu, "_gemm_choice", {})
    calls = []
    real = _quant_cpu._int_mm_is_faster
    monkeypatch.setattr(_quant_cpu, "_int_mm_is_faster",
                        lambda a, w: calls.append(tuple(a.shape)) or real(a, w))
    g = torch.Generator().manual_seed(3)
    w = torch.randint(-128, 128, (300, 40), generator=g, dtype=torch.int8)
    for rows in (1, 1, 4, 16, 17, 64):
        x = torch.randint(-128, 128, (rows, 300), generator=g, dtype=torch.int8)
        expect = np.matmul(x.numpy().astype(np.int64), w.numpy().astype(np.int64))
        assert torch.equal(_quant_cpu.int8_matmul_cpu(x, w).long(), torch.from_numpy(expect))
    assert calls == [(1, 300), (4, 300), (16, 300)]
    assert set(_quant_cpu._gemm_choice) == {(1, 300, 40), (4, 300, 40), (16, 300, 40)}


def test_reduced_precision_fp32_matmul_is_detected(monkeypatch):
    """A process that allows bf16 float32 matmuls on CPU must not get the float32 slice path."""
    matmul = getattr(getattr(torch.backends, "mkldnn", None), "matmul", None)
    if matmul is None or not hasattr(matmul, "fp32_precision"):
        pytest.skip("this torch has no torch.backends.mkldnn.matmul.fp32_precision")
    assert _quant_cpu._fp32_matmul_is_ieee()
    old = matmul.fp32_precision
    try:
        matmul.fp32_precision = "bf16"
        assert not _quant_cpu._fp32_matmul_is_ieee()
        x1 = torch.full((2, 3000), -128, dtype=torch.int8)
        x2 = torch.full((3000, 2), 127, dtype=torch.int8)
        assert int(_quant_cpu.int8_matmul_cpu(x1, x2)[0, 0]) == -3000 * 128 * 127
    finally:
        matmul.fp32_precision = old


def _trans_quant_param(scale, offset=None):
    """npu_trans_quant_param's packing (documented): high 19 bits of the float32 scale in the low
    word, bit 46 set, a 9-bit offset in bits 37..45."""
    bits = scale.view(torch.int32).long() & 0xFFFFE000
    out = bits | (1 << 46)
    if offset is not None:
        off = torch.round(offset).clamp(-256, 255).long() & 0x1FF
        out = (out & 0x4000FFFFFFFF) | (off << 37)
    return out


def test_int64_scale_is_decoded():
    x1, x2, g = _case(m=7, k=50, n=9)
    scale = torch.rand(9, generator=g) * 1e-3
    offset = torch.randint(-20, 20, (9,), generator=g).float()
    packed = _trans_quant_param(scale, offset)
    value, off = decode_int64_scale(packed)
    truncated = (scale.view(torch.int32) & -8192).view(torch.float32)  # 0xFFFFE000
    assert torch.equal(value, truncated) and torch.equal(off, offset)
    expect = quant_matmul_reference(x1, x2, truncated, offset=offset)
    assert torch.equal(quant_matmul_reference(x1, x2, packed), expect)
    assert torch.equal(OP(x1, x2, packed), expect)
    # float16 output: the packed offset is not used
    f16 = OP(x1, x2, _trans_quant_param(scale), output_dtype=torch.float16)
    assert torch.equal(f16, quant_matmul_reference(x1, x2, truncated, output_dtype=torch.float16))


def test_rounding_is_half_to_even_and_saturates():
    x1 = torch.tensor([[1], [3], [5], [-1], [-3], [127]], dtype=torch.int8)
    x2 = torch.tensor([[1, 127]], dtype=torch.int8)
    out = OP(x1, x2, torch.tensor([0.5]))  # acc * 0.5: 0.5, 1.5, 2.5, -0.5, -1.5 ; 127*63.5
    assert out[:, 0].tolist() == [0, 2, 2, 0, -2, 64]
    assert out[:, 1].tolist() == [64, 127, 127, -64, -128, 127]


def test_fake_kernel_and_compile():
    x1, x2, g = _case(m=6, k=32, n=10, b1=(2,))
    with FakeTensorMode() as mode:
        fx1, fx2 = mode.from_tensor(x1), mode.from_tensor(x2)
        out = OP(fx1, fx2, mode.from_tensor(torch.ones(10)), output_dtype=torch.bfloat16)
        assert out.shape == (2, 6, 10) and out.dtype == torch.bfloat16

    def fn(a, b, s, p):
        return OP(a, b, s, pertoken_scale=p, output_dtype=torch.bfloat16) * 2

    compiled = torch.compile(fn, backend="eager", fullgraph=True, dynamic=True)
    for m in (6, 9):
        a = _ints((m, 32), g)
        s, p = torch.rand(10, generator=g), torch.rand(m, generator=g)
        assert torch.equal(compiled(a, x2, s, p), fn(a, x2, s, p))


ERRORS = [  # (kwargs over a valid int8 call, exception, match)
    ({"x1": torch.zeros(4, 8)}, TypeError, "x1 must be int8"),
    ({"x2": torch.zeros(8, 3, dtype=torch.int32)}, NotImplementedError, "int4"),
    ({"x1": torch.zeros(8, dtype=torch.int8)}, ValueError, "x1 must have 2 to 6"),
    ({"x2": torch.zeros(9, 3, dtype=torch.int8)}, ValueError, "disagree on K"),
    ({"x2": torch.zeros(2, 8, 3, dtype=torch.int8), "x1": torch.zeros(3, 4, 8, dtype=torch.int8)},
     ValueError, "do not broadcast"),
    ({"scale": torch.ones(2)}, ValueError, "scale must have shape"),
    ({"scale": torch.ones(3, dtype=torch.float16)}, TypeError, "scale has dtype"),
    ({"output_dtype": torch.float32}, ValueError, "output_dtype"),
    ({"output_dtype": torch.int32}, NotImplementedError, "output_dtype=torch.int32"),
    ({"offset": torch.ones(3), "output_dtype": torch.float16}, ValueError, "offset is only"),
    ({"offset": torch.ones(3, dtype=torch.float16)}, TypeError, "offset must be float32"),
    ({"scale": torch.ones(3, dtype=torch.int64), "offset": torch.ones(3)}, ValueError,
     "offset was given with an int64 scale"),
    ({"pertoken_scale": torch.ones(4)}, ValueError, "pertoken_scale is not supported"),
    ({"pertoken_scale": torch.ones(5), "output_dtype": torch.bfloat16}, ValueError,
     "pertoken_scale must have shape"),
    ({"pertoken_scale": torch.ones(4, dtype=torch.float64), "output_dtype": torch.bfloat16},
     TypeError, "pertoken_scale must be float32"),
    ({"bias": torch.ones(3)}, TypeError, "bias has dtype"),
    ({"bias": torch.ones(4, dtype=torch.int32)}, ValueError, "bias must have shape"),
    ({"scale_dtype": 1}, NotImplementedError, "scale_dtype"),
    ({"group_sizes": [1, 1, 128]}, NotImplementedError, "group_sizes"),
    ({"x1_dtype": 1}, NotImplementedError, "x1_dtype"),
]


@pytest.mark.parametrize("override,exc,match", ERRORS)
def test_errors(override, exc, match):
    kw = {"x1": torch.zeros(4, 8, dtype=torch.int8), "x2": torch.zeros(8, 3, dtype=torch.int8),
          "scale": torch.ones(3)}
    kw.update(override)
    x1, x2, scale = kw.pop("x1"), kw.pop("x2"), kw.pop("scale")
    with pytest.raises(exc, match=match):
        OP(x1, x2, scale, **kw)
    with pytest.raises(exc, match=match):
        prepare_quant_matmul(x1, x2, scale, **kw)


def test_k_limit():
    with pytest.raises(ValueError, match="K = 65536 exceeds"):
        prepare_quant_matmul(torch.zeros(1, 65536, dtype=torch.int8),
                             torch.zeros(65536, 1, dtype=torch.int8), torch.ones(1))


@pytest.mark.parametrize("override,exc,match", ERRORS)
def test_fake_kernel_raises_the_same_errors(override, exc, match):
    """The fake kernel runs the eager kernel's checks (one shared function): e.g. K of x1 and x2
    must agree, and the scale / offset / pertoken_scale / bias rules."""
    kw = {"x1": torch.zeros(4, 8, dtype=torch.int8), "x2": torch.zeros(8, 3, dtype=torch.int8),
          "scale": torch.ones(3)}
    kw.update(override)
    with FakeTensorMode() as mode:
        kw = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        x1, x2, scale = kw.pop("x1"), kw.pop("x2"), kw.pop("scale")
        with pytest.raises(exc, match=match):
            OP(x1, x2, scale, **kw)


def test_fake_kernel_rejects_k_mismatch():
    with FakeTensorMode() as mode:
        x1 = mode.from_tensor(torch.zeros(4, 8, dtype=torch.int8))
        x2 = mode.from_tensor(torch.zeros(9, 3, dtype=torch.int8))
        with pytest.raises(ValueError, match="disagree on K"):
            OP(x1, x2, mode.from_tensor(torch.ones(3)))


@pytest.mark.parametrize("b1,b2,bias_shape", [((), (), (3,)), ((2,), (), (2, 1, 3)),
                                              ((2,), (2,), (3,))])
@pytest.mark.parametrize("out", [torch.bfloat16, torch.int8])
def test_int32_bias_wraps_around_in_every_kernel(b1, b2, bias_shape, out):
    """acc + int32 bias beyond the int32 range wraps around (the int32 accumulator) in the
    reference, the CPU kernel (int32 in place) and the numpy formula alike."""
    x1 = torch.full((*b1, 2, 64), 127, dtype=torch.int8)
    x2 = torch.full((*b2, 64, 3), 127, dtype=torch.int8)
    x2[..., 2] = -128
    bias = torch.tensor([2**31 - 1000, -2**31 + 5, -2**31 + 100], dtype=torch.int32)
    bias = bias.expand(bias_shape).contiguous()
    scale = torch.tensor([2.0 ** -24]) if out == torch.int8 else torch.ones(1)
    kw = {"bias": bias, "output_dtype": out}
    ref = quant_matmul_reference(x1, x2, scale, **kw)
    got = OP(x1, x2, scale, **kw)
    assert torch.equal(got, ref)
    acc = torch.tensor([64 * 127 * 127, 64 * 127 * 127, -64 * 127 * 128])
    wrapped = (acc + bias.reshape(-1, 3).long() + 2**31) % 2**32 - 2**31
    want = (wrapped.double() * float(scale)).float()
    want = want.round().clamp(-128, 127) if out == torch.int8 else want
    assert torch.equal(ref.reshape(-1, 2, 3), want[:, None, :].to(out).expand_as(
        ref.reshape(-1, 2, 3)))
    if out == torch.int8:  # wrapped: -128 / -128 / +127; without the wrap: 127 / -128 / -128
        assert ref.reshape(-1, 3)[0].tolist() == [-128, -128, 127]
    if not b1 and not b2:
        assert torch.equal(_numpy_oracle(x1, x2, scale, bias=bias, out=out), ref)
