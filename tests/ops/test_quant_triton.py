"""Triton kernels of npu_quant_matmul / npu_dequant_swiglu_quant against the references.

Without a GPU they run in Triton's interpreter, which must be chosen before triton is imported
(tests/conftest.py sets TRITON_INTERPRET=1 when there is no GPU). If this process imported triton
compiled-mode without a GPU, ``test_interpreter_suite_subprocess`` re-runs this module in a child
pytest with TRITON_INTERPRET=1. The interpreter runs int8 ``tl.dot`` exactly (numpy int matmul),
so the int32 accumulation path itself is tested, not a float stand-in. ``cuda`` tests compare
realistic shapes with compiled kernels on a GPU.
"""
import os
import pathlib
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

from _interpreter import run_interpreted

import torchair.ops  # noqa: F401 (registers)
from torchair.ops.quant import triton as qt
from torchair.ops.quant.dequant_swiglu_quant import prepare_dequant_swiglu_quant, swiglu_quant_reference
from torchair.ops.quant.quant_matmul import prepare_quant_matmul, quant_matmul_reference

INTERPRETED = qt.interpreted()
ROOT = pathlib.Path(__file__).resolve().parents[2]

interp = pytest.mark.skipif(not INTERPRETED, reason="interpreter tests run in "
                            "test_interpreter_suite_subprocess (TRITON_INTERPRET=1 needed)")


def _int8(shape, g, device="cpu"):
    return torch.randint(-128, 128, shape, generator=g, dtype=torch.int8).to(device)


def _matmul_case(m, k, n, b1=(), b2=(), out=None, offset=False, pertoken=False, bias=None,
                 seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x1, x2 = _int8((*b1, m, k), g, device), _int8((*b2, k, n), g, device)
    kw = {"output_dtype": out}
    scale = (torch.rand(n, generator=g) * 2e-3 + 1e-4).to(device)
    if offset:
        kw["offset"] = (torch.randn(n, generator=g) * 4).to(device)
    if pertoken:
        kw["pertoken_scale"] = (torch.rand(m, generator=g) + 0.5).to(device)
    if bias == torch.int32:
        kw["bias"] = torch.randint(-5000, 5000, (n,), generator=g, dtype=torch.int32).to(device)
    elif bias is not None:
        kw["bias"] = (torch.randn(n, generator=g) * 3).to(bias).to(device)
    return x1, x2, scale, kw


def _check_matmul(x1, x2, scale, blocks=None, **kw):
    plan = prepare_quant_matmul(x1, x2, scale, **kw)
    out = qt.quant_matmul_triton(x1, x2, plan, blocks=blocks)
    ref = quant_matmul_reference(x1, x2, scale, **kw)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    if ref.dtype == torch.int8:  # +-1 at rounding ties (fused multiply-add on GPUs)
        diff = (out.int() - ref.int()).abs()
        assert int(diff.max()) <= 1 and float((diff > 0).float().mean()) <= 0.01
    else:  # one ulp of the output dtype (the interpreter rounds bf16 its own way)
        torch.testing.assert_close(out.float(), ref.float(), rtol=2 ** -7, atol=0)


MATMUL_CASES = [  # (m, k, n, b1, b2, out, offset, pertoken, bias)
    (1, 40, 19, (), (), None, True, False, torch.int32),
    (5, 70, 33, (2,), (2,), torch.float16, False, False, torch.int32),
    (17, 33, 16, (), (), torch.bfloat16, False, True, torch.float32),
    (3, 16, 20, (2,), (), torch.float16, False, True, torch.float16),
]


@interp
@pytest.mark.parametrize("case", MATMUL_CASES)
def test_quant_matmul_interpreted(case):
    m, k, n, b1, b2, out, offset, pertoken, bias = case
    x1, x2, scale, kw = _matmul_case(m, k, n, b1, b2, out, offset, pertoken, bias, seed=m + k)
    _check_matmul(x1, x2, scale, blocks=(16, 16, 32), **kw)


@interp
def test_quant_matmul_interpreted_worst_case_exact():
    """All -128 over K = 96 (three K blocks): exact int32 accumulation in the kernel."""
    x1 = torch.full((2, 96), -128, dtype=torch.int8)
    x2 = torch.full((96, 3), -128, dtype=torch.int8)
    plan = prepare_quant_matmul(x1, x2, torch.ones(1), output_dtype=torch.bfloat16,
                                pertoken_scale=torch.ones(2))
    out = qt.quant_matmul_triton(x1, x2, plan, blocks=(16, 16, 32))
    assert torch.equal(out, torch.full((2, 3), 96 * 128 * 128.0).to(torch.bfloat16))


@interp
def test_quant_matmul_interpreted_rounding():
    x1 = torch.tensor([[1], [3], [5], [-1], [-3], [127]], dtype=torch.int8)
    x2 = torch.tensor([[1, 127]], dtype=torch.int8)
    plan = prepare_quant_matmul(x1, x2, torch.tensor([0.5]))
    out = qt.quant_matmul_triton(x1, x2, plan)
    assert out[:, 0].tolist() == [0, 2, 2, 0, -2, 64]
    assert out[:, 1].tolist() == [64, 127, 127, -64, -128, 127]


def _swiglu_case(t, h, dtype=torch.int32, bias=None, dynamic=True, per_h=True, offset=False,
                 groups=None, left=False, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    kw = {"quant_mode": int(dynamic), "activate_left": left}
    n_g = len(groups) if isinstance(groups, list) else 1
    if dtype == torch.int32:
        x = torch.randint(-3000, 3000, (t, 2 * h), generator=g, dtype=torch.int32)
        kw["weight_scale"] = (torch.rand(n_g, 2 * h, generator=g) * 2e-3 + 1e-4)
        kw["activation_scale"] = torch.rand(t, generator=g) + 0.5
    else:
        x = (torch.randn(t, 2 * h, generator=g) * 2).to(dtype)
    if bias == torch.int32:
        kw["bias"] = torch.randint(-500, 500, (2 * h,), generator=g, dtype=torch.int32)
    elif bias is not None:
        kw["bias"] = (torch.randn(2 * h, generator=g) * 0.5).to(bias)
    if dynamic:
        kw["quant_scale"] = torch.rand(n_g, h if per_h else 1, generator=g) + 0.5
    else:
        kw["quant_scale"] = torch.rand(h if per_h else 1, generator=g) * 0.02 + 0.005
        if offset:
            kw["quant_offset"] = torch.randn(h if per_h else 1, generator=g) * 3
    if groups == "per_token":  # float x with x-shaped weight_scale: a scale row per token
        kw["weight_scale"] = torch.rand(t, 2 * h, generator=g) + 0.5
        kw["activation_scale"] = torch.rand(t, generator=g) + 0.5
    elif groups is not None:
        kw["group_index"] = torch.tensor(groups)
    kw = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    return x.to(device), kw


def _check_swiglu(x, block_h=None, **kw):
    plan = prepare_dequant_swiglu_quant(x, **kw)
    y, s = qt.dequant_swiglu_quant_triton(plan, block_h=block_h)
    ry, rs = swiglu_quant_reference(plan)
    diff = (y.int() - ry.int()).abs()
    assert int(diff.max()) <= 1 and float((diff > 0).float().mean()) <= 0.01
    torch.testing.assert_close(s, rs, rtol=1e-5, atol=0)


SWIGLU_CASES = [  # (t, h, dtype, bias, dynamic, per_h, offset, groups, left)
    (5, 24, torch.int32, torch.int32, True, True, False, None, False),
    (3, 40, torch.int32, torch.float32, False, True, True, None, True),
    (4, 16, torch.int32, None, False, False, True, None, False),
    (6, 16, torch.int32, None, True, False, False, [2, 0, 3], True),
    (4, 20, torch.bfloat16, None, True, True, False, None, False),
    (3, 16, torch.float16, None, False, True, False, None, True),
    (5, 16, torch.bfloat16, None, False, True, False, "per_token", False),
    (4, 20, torch.float16, None, True, True, False, "per_token", True),
]


@interp
@pytest.mark.parametrize("case", SWIGLU_CASES)
def test_dequant_swiglu_quant_interpreted(case):
    t, h, dtype, bias, dynamic, per_h, offset, groups, left = case
    x, kw = _swiglu_case(t, h, dtype, bias, dynamic, per_h, offset, groups, left, seed=t * h)
    _check_swiglu(x, block_h=16, **kw)  # several chunks per row (two passes when dynamic)


def test_interpreter_suite_subprocess():
    if INTERPRETED:
        pytest.skip("the interpreter tests ran in this process")
    if torch.cuda.is_available():
        pytest.skip("compiled kernels are tested on the GPU")
    run_interpreted(__file__, min_passed=10)


# ---------------------------------------------------------------- GPU ----------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED,
                          reason="needs a CUDA GPU and compiled (not interpreted) Triton")


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("m", [1, 128, 1000])
@pytest.mark.parametrize("out,pertoken,bias", [(None, False, torch.int32),
                                               (torch.bfloat16, True, torch.bfloat16),
                                               (torch.float16, False, torch.int32)])
def test_quant_matmul_cuda(m, out, pertoken, bias):
    x1, x2, scale, kw = _matmul_case(m, 4096, 1536, out=out, pertoken=pertoken, bias=bias,
                                     offset=out is None, device="cuda")
    _check_matmul(x1, x2, scale, **kw)
    assert torch.equal(torch.ops.npu.npu_quant_matmul(x1, x2, scale, **kw),
                       qt.quant_matmul_triton(x1, x2, prepare_quant_matmul(x1, x2, scale, **kw)))


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("dynamic", [True, False])
@pytest.mark.parametrize("groups", [None, [100, 0, 300]])
def test_dequant_swiglu_quant_cuda(dynamic, groups):
    if groups is not None and not dynamic:
        pytest.skip("group_index needs dynamic quantization")
    x, kw = _swiglu_case(512, 2048, bias=None if groups else torch.int32, dynamic=dynamic,
                         offset=not dynamic, groups=groups, device="cuda")
    _check_swiglu(x, **kw)


# ---------------------------------------------------------------- review fixes -------------------

@pytest.mark.parametrize("blocks", [(16, 16, 16), (16, 16, 8), (8, 16, 32), (16, 24, 32),
                                    (16, 16), ("a", 16, 32)])
def test_blocks_override_is_validated(blocks):
    """An int8 tl.dot needs K >= 32 on NVIDIA GPUs (Triton's min_dot_size (1, 1, 32) for 8-bit
    operands); the interpreter does not enforce it, so the override must."""
    x1 = torch.zeros(4, 64, dtype=torch.int8)
    x2 = torch.zeros(64, 16, dtype=torch.int8)
    plan = prepare_quant_matmul(x1, x2, torch.ones(1))
    with pytest.raises(ValueError, match="blocks"):
        qt.quant_matmul_triton(x1, x2, plan, blocks=blocks)
    with pytest.raises(ValueError, match=r"blocks.*BLOCK_K >= 32"):
        qt.check_matmul_blocks(blocks)


def test_blocks_override_accepts_valid():
    assert qt.check_matmul_blocks((16, 32, 32)) == (16, 32, 32)
    assert qt.check_matmul_blocks([64, 16, 128]) == (64, 16, 128)
    assert qt._matmul_blocks(3, 5, 7)[2] >= 32  # the heuristic honours the same rule


_ROW_OFFSET_PROBE = """
import torch
import torchair.ops
from torchair.ops.quant import triton as qt
from torchair.ops.quant.quant_matmul import prepare_quant_matmul, quant_matmul_reference
assert qt.interpreted()
g = torch.Generator().manual_seed(0)
# rows 2**30 bytes apart: row 2 starts at 2**31, past int32 (pages are touched lazily: ~no memory)
store = torch.empty(2 * 2**30 + 64, dtype=torch.int8)
x1 = store.as_strided((3, 32), (2**30, 1))
x1.copy_(torch.randint(-128, 128, (3, 32), generator=g, dtype=torch.int8))
x2 = torch.randint(-128, 128, (32, 16), generator=g, dtype=torch.int8)
scale = torch.full((16,), 1e-3)
plan = prepare_quant_matmul(x1, x2, scale, output_dtype=torch.float16)
out = qt.quant_matmul_triton(x1, x2, plan, blocks=(16, 16, 32))
ref = quant_matmul_reference(x1.contiguous(), x2, scale, output_dtype=torch.float16)
assert torch.equal(out, ref), (out, ref)
print("ROW_OFFSETS_OK")
"""


def test_quant_matmul_row_offsets_are_int64_subprocess():
    """``offs_m * stride_am`` past 2**31 (~300k tokens at K = 7168): int32 offsets wrap to a
    negative address (a segfault in the interpreter), int64 ones read the right row. Run in a
    child interpreter process so that a crash fails this test instead of killing the session."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-c", _ROW_OFFSET_PROBE], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0 and "ROW_OFFSETS_OK" in res.stdout, \
        f"rc={res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"


@interp
def test_quant_matmul_interpreted_int32_bias_wraps_like_reference():
    """acc + int32 bias past 2**31 wraps around in the int32 accumulator, as in the reference."""
    x1 = torch.full((2, 64), 127, dtype=torch.int8)
    x2 = torch.full((64, 3), 127, dtype=torch.int8)
    bias = torch.tensor([2**31 - 1000, -2**31 + 5, 7], dtype=torch.int32)
    scale = torch.tensor([2.0 ** -24])  # int8 output: v = wrapped accumulator / 2**24, exact
    plan = prepare_quant_matmul(x1, x2, scale, bias=bias)
    out = qt.quant_matmul_triton(x1, x2, plan, blocks=(16, 16, 32))
    acc = 64 * 127 * 127
    want = [(acc + int(b) + 2**31) % 2**32 - 2**31 for b in bias]
    want = torch.tensor(want, dtype=torch.float64).mul(2.0 ** -24).round().clamp(-128, 127)
    assert out[0].tolist() == [-128, -128, 0] == want.to(torch.int8).tolist()  # no wrap: 127
    assert torch.equal(out[1], out[0])
    assert torch.equal(out, quant_matmul_reference(x1, x2, scale, bias=bias))
