"""npu_dequant_swiglu_quant: reference vs an independent float64 numpy formula, fast CPU kernel vs
reference over a grid, MoE groups (group_index), fake kernel and torch.compile, and every
argument error."""
import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torchair.ops  # noqa: F401 (registers)
from torchair.ops.quant import cpu as _quant_cpu
from torchair.ops.quant.dequant_swiglu_quant import dequant_swiglu_quant_reference, prepare_dequant_swiglu_quant

OP = torch.ops.npu.npu_dequant_swiglu_quant


def _numpy_oracle(x, ws=None, act=None, bias=None, qs=None, qo=None, left=False, dynamic=False,
                  groups=None):
    """The documented formula in float64; silu(z) = z / (1 + exp(-z)); np.rint (half even)."""
    x64 = x.double().numpy() if x.dtype != torch.int32 else x.numpy().astype(np.float64)
    if bias is not None and bias.dtype == torch.int32:
        x64 = x64 + bias.numpy()
    t, width = x64.shape
    h = width // 2
    gid = np.zeros(t, dtype=np.int64)
    valid = np.ones(t, dtype=bool)
    if groups is not None:
        ends = np.cumsum(np.maximum(groups, 0))
        gid = np.searchsorted(ends, np.arange(t), side="right")
        valid = gid < len(groups)
        gid = np.minimum(gid, len(groups) - 1)
    if ws is not None:
        x64 = x64 * ws.double().numpy().reshape(-1, width)[gid]
    if act is not None:
        x64 = x64 * act.double().numpy().reshape(t, 1)
    if bias is not None and bias.dtype != torch.int32:
        x64 = x64 + bias.double().numpy()
    a, b = (x64[:, :h], x64[:, h:]) if left else (x64[:, h:], x64[:, :h])
    out = a / (1.0 + np.exp(-a)) * b
    q = qs.double().numpy().reshape(-1, h if qs.numel() % h == 0 and qs.numel() >= h else 1)[gid] \
        if qs is not None else None
    if dynamic:
        if q is not None:
            out = out * q
        scale = np.abs(out).max(axis=1) / 127.0
        y = np.rint(out / np.where(scale == 0, 1.0, scale)[:, None])
    else:
        if q is not None:
            out = out / q
        if qo is not None:
            out = out + qo.double().numpy().reshape(1, -1)
        scale = np.zeros(t)
        y = np.rint(out)
    y = np.clip(y, -128, 127)
    y[~valid] = 0
    scale[~valid] = 0
    return torch.from_numpy(y.astype(np.int8)), torch.from_numpy(scale.astype(np.float32))


def _inputs(t=7, h=24, dtype=torch.int32, bias=None, per_h=True, dynamic=True, offset=False,
            seed=0, groups=None):
    g = torch.Generator().manual_seed(seed)
    kw = {"quant_mode": int(dynamic)}
    if dtype == torch.int32:
        x = torch.randint(-3000, 3000, (t, 2 * h), generator=g, dtype=torch.int32)
        n_ws = len(groups) if groups is not None else 1
        kw["weight_scale"] = (torch.rand(n_ws, 2 * h, generator=g) * 2e-3 + 1e-4).squeeze(0)
        kw["activation_scale"] = torch.rand(t, 1, generator=g) + 0.5
    else:
        x = (torch.randn(t, 2 * h, generator=g) * 2).to(dtype)
    if bias == torch.int32:
        kw["bias"] = torch.randint(-500, 500, (2 * h,), generator=g, dtype=torch.int32)
    elif bias is not None:
        kw["bias"] = (torch.randn(2 * h, generator=g) * 0.5).to(bias)
    n_q = len(groups) if groups is not None else 1
    if dynamic:
        kw["quant_scale"] = torch.rand(n_q, h if per_h else 1, generator=g) + 0.5
    else:
        kw["quant_scale"] = (torch.rand(h if per_h else 1, generator=g) * 0.02 + 0.005)
        if offset:
            kw["quant_offset"] = torch.randn(h if per_h else 1, generator=g) * 3
    if groups is not None:
        kw["group_index"] = torch.tensor(groups)
    return x, kw


def _check_close_int8(y, expect, frac=0.02):
    """int8 outputs: equal but for +-1 at rounding ties of differently rounded float math."""
    diff = (y.int() - expect.int()).abs()
    assert int(diff.max()) <= 1
    assert float((diff > 0).float().mean()) <= frac


GRID = [  # (x dtype, bias dtype, per_h, dynamic, offset)
    (torch.int32, None, True, True, False),
    (torch.int32, torch.int32, True, True, False),
    (torch.int32, torch.float32, False, True, False),
    (torch.int32, torch.bfloat16, True, False, True),
    (torch.int32, torch.int32, False, False, True),
    (torch.int32, None, True, False, False),
    (torch.bfloat16, None, True, True, False),
    (torch.float16, None, False, False, True),
]


@pytest.mark.parametrize("case", GRID)
@pytest.mark.parametrize("left", [False, True])
def test_reference_matches_numpy_formula(case, left):
    dtype, bias, per_h, dynamic, offset = case
    x, kw = _inputs(t=9, h=40, dtype=dtype, bias=bias, per_h=per_h, dynamic=dynamic,
                    offset=offset, seed=len(str(case)))
    y, scale = dequant_swiglu_quant_reference(x, activate_left=left, **kw)
    assert y.dtype == torch.int8 and y.shape == (9, 40) and scale.shape == (9,)
    ey, es = _numpy_oracle(x, kw.get("weight_scale"), kw.get("activation_scale"),
                           kw.get("bias"), kw.get("quant_scale"), kw.get("quant_offset"), left,
                           dynamic)
    _check_close_int8(y, ey)
    torch.testing.assert_close(scale, es, rtol=1e-5, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("per_token", [False, True])
def test_float_x_with_weight_and_activation_scales(dtype, dynamic, per_token):
    """Float x (e.g. npu_quant_matmul's bf16 output, as in seed 004) with the dequant scales:
    weight_scale [2H], or x's own shape [T, 2H] (a row per token); reference vs the float64
    formula, and the fast CPU kernel vs the reference."""
    t, h = 6, 20
    x, kw = _inputs(t=t, h=h, dtype=dtype, dynamic=dynamic, seed=3)
    g = torch.Generator().manual_seed(9)
    ws = torch.rand(t, 2 * h, generator=g) + 0.5 if per_token else torch.rand(2 * h, generator=g)
    kw.update(weight_scale=ws, activation_scale=torch.rand(t, generator=g) + 0.5)
    y, scale = dequant_swiglu_quant_reference(x, **kw)
    per_row = ws if per_token else ws.expand(t, 2 * h)
    ey, es = _numpy_oracle((x.double() * per_row.double()), None, kw["activation_scale"], None,
                           kw.get("quant_scale"), None, False, dynamic)
    _check_close_int8(y, ey)
    torch.testing.assert_close(scale, es, rtol=1e-5, atol=0)
    fy, fs = OP(x, **kw)  # eager on CPU: the chunked kernel
    assert torch.equal(fy, y) and torch.equal(fs, scale)
    if per_token:  # the per-token rows really are per token: another row changes its output
        other = ws.clone()
        other[2] *= 3
        y2, _ = OP(x, **{**kw, "weight_scale": other})
        assert torch.equal(y2[[0, 1, 3, 4, 5]], y[[0, 1, 3, 4, 5]]) and not torch.equal(y2[2], y[2])


def test_activate_left_false_activates_the_right_half():
    x = torch.tensor([[2.0, -1.0]], dtype=torch.bfloat16)  # a = 2, b = -1
    y_right, _ = OP(x, quant_scale=torch.tensor([0.01]))  # silu(-1) * 2
    y_left, _ = OP(x, quant_scale=torch.tensor([0.01]), activate_left=True)  # silu(2) * -1
    silu = lambda z: z / (1 + np.exp(-z))
    assert int(y_right) == int(np.clip(np.rint(silu(-1.0) * 2 / 0.01), -128, 127))
    assert int(y_left) == int(np.clip(np.rint(silu(2.0) * -1 / 0.01), -128, 127))


@pytest.mark.parametrize("case", GRID)
@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("t,h", [(1, 8), (13, 24), (33, 40)])
def test_fast_cpu_matches_reference(case, left, t, h, monkeypatch):
    monkeypatch.setattr(_quant_cpu, "CHUNK_ROWS", 5)  # cross chunk boundaries
    dtype, bias, per_h, dynamic, offset = case
    x, kw = _inputs(t=t, h=h, dtype=dtype, bias=bias, per_h=per_h, dynamic=dynamic,
                    offset=offset, seed=t + h)
    ref = dequant_swiglu_quant_reference(x, activate_left=left, **kw)
    out = OP(x, activate_left=left, **kw)
    _check_close_int8(out[0], ref[0], frac=0.01)
    torch.testing.assert_close(out[1], ref[1], rtol=1e-6, atol=0)


def test_fast_cpu_automatic_chunks_and_leading_dims():
    x, kw = _inputs(t=300, h=512, seed=3)
    ref = dequant_swiglu_quant_reference(x, **kw)
    out = OP(x, **kw)
    _check_close_int8(out[0], ref[0], frac=1e-3)
    torch.testing.assert_close(out[1], ref[1], rtol=1e-6, atol=0)
    x3 = x.view(3, 100, 1024)
    kw["activation_scale"] = kw["activation_scale"].view(3, 100)
    y3, s3 = OP(x3, **kw)
    assert y3.shape == (3, 100, 512) and s3.shape == (3, 100)
    assert torch.equal(y3.reshape(300, 512), out[0]) and torch.equal(s3.reshape(300), out[1])


@pytest.mark.parametrize("groups", [[2, 0, 3], [4, 5, 9], [-1, 3, 1], [13]])
def test_group_index(groups):
    x, kw = _inputs(t=11, h=16, groups=groups, seed=len(groups))
    y, scale = OP(x, **kw)
    ry, rs = dequant_swiglu_quant_reference(x, **kw)
    ey, es = _numpy_oracle(x, kw["weight_scale"], kw["activation_scale"], None,
                           kw["quant_scale"], None, False, True, groups=np.array(groups))
    _check_close_int8(ry, ey)
    torch.testing.assert_close(rs, es, rtol=1e-5, atol=0)
    _check_close_int8(y, ry, frac=0.01)
    torch.testing.assert_close(scale, rs, rtol=1e-6, atol=0)
    total = min(sum(max(c, 0) for c in groups), 11)
    assert not y[total:].any() and not scale[total:].any()  # rows past the groups: zeros


def test_static_zero_scale_counts_as_one_and_dynamic_zero_rows():
    x = torch.zeros(2, 8, dtype=torch.int32)
    x[1] = 1000
    ws = torch.full((8,), 1e-3)
    y, s = OP(x, weight_scale=ws, quant_scale=torch.zeros(1), quant_mode=0)
    ey, _ = OP(x, weight_scale=ws, quant_mode=0)
    assert torch.equal(y, ey) and not s.any()
    y, s = OP(x, weight_scale=ws, quant_mode=1)
    assert not y[0].any() and float(s[0]) == 0.0 and int(y[1].abs().max()) == 127


def test_fake_kernel_and_compile():
    x, kw = _inputs(t=6, h=16, seed=1)
    with FakeTensorMode() as mode:
        fkw = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v
               for k, v in kw.items()}
        y, s = OP(mode.from_tensor(x), **fkw)
        assert y.shape == (6, 16) and y.dtype == torch.int8
        assert s.shape == (6,) and s.dtype == torch.float32

    def fn(x, ws, act, qs):
        y, s = OP(x, weight_scale=ws, activation_scale=act, quant_scale=qs, quant_mode=1)
        return y.float() * s[:, None]

    compiled = torch.compile(fn, backend="eager", fullgraph=True, dynamic=True)
    for t in (6, 11):
        x, kw = _inputs(t=t, h=16, seed=t)
        args = (x, kw["weight_scale"], kw["activation_scale"], kw["quant_scale"])
        assert torch.equal(compiled(*args), fn(*args))


def _valid():
    return {"x": torch.zeros(4, 8, dtype=torch.int32), "weight_scale": torch.ones(8),
            "activation_scale": torch.ones(4), "quant_scale": torch.ones(4), "quant_mode": 1}


ERRORS = [  # (overrides of a valid call, exception, match)
    ({"x": torch.zeros(4, 8)}, TypeError, "x must be int32"),
    ({"x": torch.zeros(4, 7, dtype=torch.int32)}, ValueError, "x must be"),
    ({"x": torch.zeros(8, dtype=torch.int32)}, ValueError, "x must be"),
    ({"quant_mode": 2}, ValueError, "quant_mode=2"),
    ({"weight_scale": None}, ValueError, "weight_scale .* is required"),
    ({"weight_scale": torch.ones(6)}, ValueError, "weight_scale must have shape"),
    ({"weight_scale": torch.ones(8, dtype=torch.float16)}, TypeError, "weight_scale has dtype"),
    ({"activation_scale": torch.ones(5)}, ValueError, "activation_scale must have shape"),
    ({"bias": torch.ones(8, dtype=torch.int64)}, TypeError, "bias has dtype"),
    ({"bias": torch.ones(4, dtype=torch.int32)}, ValueError, "bias must have shape"),
    ({"quant_scale": torch.ones(3)}, ValueError, "quant_scale must have shape"),
    ({"quant_scale": torch.ones(4, dtype=torch.int32)}, TypeError, "quant_scale has dtype"),
    ({"quant_offset": torch.ones(4)}, ValueError, "quant_offset is only used by static"),
    ({"quant_mode": 0, "quant_offset": torch.ones(3)}, ValueError,
     "quant_offset must have shape"),
    ({"x": torch.zeros(4, 8, dtype=torch.bfloat16), "bias": torch.ones(8)}, ValueError,
     "bias applies to int32 x only"),
    ({"x": torch.zeros(4, 8, dtype=torch.bfloat16), "weight_scale": torch.ones(3, 8)},
     ValueError, "weight_scale must have shape"),
    ({"group_index": torch.tensor([2, 2]), "quant_mode": 0, "quant_scale": None}, ValueError,
     "group_index needs quant_mode=1"),
    ({"group_index": torch.tensor([2.0])}, ValueError, "group_index must be"),
    ({"group_index": torch.tensor([2, 2]), "bias": torch.ones(8, dtype=torch.int32)},
     ValueError, "bias is not supported with group_index"),
    ({"group_index": torch.tensor([2, 2])}, ValueError, r"weight_scale must have shape \(2, 8\)"),
]


@pytest.mark.parametrize("override,exc,match", ERRORS)
def test_errors(override, exc, match):
    kw = _valid()
    kw.update(override)
    kw = {k: v for k, v in kw.items() if v is not None}
    x = kw.pop("x")
    with pytest.raises(exc, match=match):
        OP(x, **kw)
    with pytest.raises(exc, match=match):
        prepare_dequant_swiglu_quant(x, **kw)


@pytest.mark.parametrize("override,exc,match", ERRORS)
def test_fake_kernel_raises_the_same_errors(override, exc, match):
    """The fake kernel runs the eager kernel's checks (one shared function), e.g. an odd last
    dim of x is rejected under FakeTensorMode too."""
    kw = _valid()
    kw.update(override)
    kw = {k: v for k, v in kw.items() if v is not None}
    with FakeTensorMode() as mode:
        kw = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        x = kw.pop("x")
        with pytest.raises(exc, match=match):
            OP(x, **kw)


def test_fake_kernel_rejects_odd_last_dim():
    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.zeros(4, 7, dtype=torch.int32))
        with pytest.raises(ValueError, match="even, non-zero last dimension"):
            OP(x, weight_scale=mode.from_tensor(torch.ones(7)), quant_mode=1)


def test_group_index_error_names_int32_and_int64():
    kw = _valid()
    x = kw.pop("x")
    for bad in (torch.tensor([2.0]), torch.zeros(0, dtype=torch.int64),
                torch.ones(1, 2, dtype=torch.int32)):
        with pytest.raises(ValueError, match="1-D int32 or int64 tensor"):
            OP(x, **dict(kw, group_index=bad))
    # int32 is accepted, as the message says
    y, s = OP(x, **dict(kw, group_index=torch.tensor([4], dtype=torch.int32),
                        weight_scale=torch.ones(1, 8), quant_scale=torch.ones(1, 4)))
    assert y.shape == (4, 4) and s.shape == (4,)
