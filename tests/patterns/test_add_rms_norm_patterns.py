"""The three default fusion passes of seed 003: each fires on its chain (with and without x_out,
with and without epsilon, static and dynamic shapes), not on near misses, gives the unfused
graph's results, shows in dumps and reports, and is switched off by pattern_fusion_pass=False."""
import pytest
import torch

import torchair
from torchair.patterns import add_rms_norm as defaults

npu = torch.ops.npu
DT = torch.float16


def _compile(fn, *args, fusion=True, dynamic=False, dump=None):
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    config.experimental_config.pattern_fusion_pass = fusion
    if dump is not None:
        config.debug.graph_dump.type = dump[0]
        config.debug.graph_dump.path = str(dump[1])
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=torchair.get_npu_backend(compiler_config=config),
                             dynamic=dynamic, fullgraph=True)
    return compiled(*args), torchair.graph_reports()[-1]


def _inputs(tokens=(2, 5), hidden=32, seed=0, smooth=True, dtype=DT):
    g = torch.Generator().manual_seed(seed)
    x1 = torch.randn(*tokens, hidden, generator=g).to(dtype)
    x2 = torch.randn(*tokens, hidden, generator=g).to(dtype)
    gamma = (torch.rand(hidden, generator=g) + 0.5).to(dtype)
    s = (torch.rand(hidden, generator=g) + 0.5).to(dtype)
    return (x1, x2, gamma, s) if smooth else (x1, x2, gamma)


def _norm(x1, x2, gamma, eps):
    return npu.npu_add_rms_norm(x1, x2, gamma) if eps is None else npu.npu_add_rms_norm(
        x1, x2, gamma, eps)


# Share of int8 values one step apart: the fused op quantizes the float32 row, the chain the row
# rounded to the input dtype (bf16 keeps 8 bits of mantissa, so more values cross a .5 boundary).
INT8_DIFF = {torch.float16: 0.03, torch.bfloat16: 0.15}


def _assert_same(fused, unfused):
    """int8 values may differ by one step; scales by the input dtype's rounding."""
    for a, b in zip(fused, unfused):
        assert a.shape == b.shape and a.dtype == b.dtype
        if a.dtype == torch.int8:
            assert (a.int() - b.int()).abs().max() <= 1
            assert (a != b).float().mean() < max(INT8_DIFF.values())
        else:
            tol = 1e-2 if a.dtype == torch.bfloat16 else 4e-3
            torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def _check(fn, args, name, *, dynamic=False, fires=True):
    fused, report = _compile(fn, *args, dynamic=dynamic)
    unfused, plain = _compile(fn, *args, fusion=False, dynamic=dynamic)
    eager = fn(*args)
    _assert_same(fused, unfused)
    for a, b in zip(unfused, eager):
        assert torch.equal(a, b)
    assert plain.patterns == {}
    if fires:
        assert report.patterns == {name: 1}, report.patterns
    else:
        assert report.patterns == {}, report.patterns
    return fused, report


# ---- pattern 1: add_rms_norm -> dynamic_quant(smooth_scales) ----------------------------------

def _smooth_chain(keep_x_out, eps):
    def fn(x1, x2, gamma, s):
        y, _, x_out = _norm(x1, x2, gamma, eps)
        yq, scale = npu.npu_dynamic_quant(y, smooth_scales=s)
        return (yq, scale, x_out * 2) if keep_x_out else (yq, scale)
    return fn


@pytest.mark.parametrize("keep_x_out", [True, False], ids=["x_out", "no-x_out"])
@pytest.mark.parametrize("eps", [None, 1e-5], ids=["eps-default", "eps"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_smooth_quant_fuses(keep_x_out, eps, dynamic, dtype):
    _check(_smooth_chain(keep_x_out, eps), _inputs(dtype=dtype), defaults.SMOOTH,
           dynamic=dynamic)


def test_smooth_quant_fused_op_gets_epsilon(tmp_path):
    _, report = _compile(_smooth_chain(True, 1e-5), *_inputs(), dump=("py", tmp_path))
    text = open(next(d for d in report.dumps if "optimized" in d)).read()
    assert "npu.npu_add_rms_norm_dynamic_quant.default" in text
    assert "npu.npu_add_rms_norm.default" not in text and "npu_dynamic_quant.default" not in text
    assert "1e-05" in text


def test_smooth_quant_near_misses():
    x1, x2, gamma, s = _inputs()

    def quant_of_x_out(x1, x2, gamma, s):  # quantizes the sum, not the norm
        _, _, x_out = npu.npu_add_rms_norm(x1, x2, gamma)
        return npu.npu_dynamic_quant(x_out, smooth_scales=s)

    def norm_used_again(x1, x2, gamma, s):  # y is needed unquantized too: stays unfused
        y, _, _ = npu.npu_add_rms_norm(x1, x2, gamma)
        yq, scale = npu.npu_dynamic_quant(y, smooth_scales=s)
        return yq, scale, y + 1

    def rstd_used(x1, x2, gamma, s):  # the fused op has no rstd output
        y, rstd, _ = npu.npu_add_rms_norm(x1, x2, gamma)
        yq, scale = npu.npu_dynamic_quant(y, smooth_scales=s)
        return yq, scale, rstd

    for fn in (quant_of_x_out, norm_used_again, rstd_used):
        _check(fn, (x1, x2, gamma, s), defaults.SMOOTH, fires=False)


# ---- pattern 2: add_rms_norm -> flatten(0, 1) -> dynamic_quant, scale.view(-1, 1) -------------

def _flatten_chain(keep_x_out, eps):
    def fn(x1, x2, gamma):
        y, _, x_out = _norm(x1, x2, gamma, eps)
        yq, scale = npu.npu_dynamic_quant(y.flatten(0, 1))
        scale = scale.view(-1, 1)
        return (yq, scale, x_out) if keep_x_out else (yq, scale)
    return fn


@pytest.mark.parametrize("keep_x_out", [True, False], ids=["x_out", "no-x_out"])
@pytest.mark.parametrize("eps", [None, 1e-5], ids=["eps-default", "eps"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_flatten_quant_fuses(keep_x_out, eps, dynamic, dtype):
    _check(_flatten_chain(keep_x_out, eps), _inputs(smooth=False), defaults.FLATTEN, dynamic=dynamic)


def test_flatten_quant_dump_matches_the_seed(tmp_path):
    """Seed 003's example dump: the fused op, then the flatten and the (-1, 1) view."""
    _, report = _compile(_flatten_chain(True, None), *_inputs(tokens=(2, 3), hidden=4,
                                                             smooth=False), dump=("py", tmp_path))
    text = open(next(d for d in report.dumps if "optimized" in d)).read()
    assert "npu.npu_add_rms_norm_dynamic_quant.default" in text
    assert "npu_dynamic_quant.default" not in text
    assert "[-1, 1]" in text


def test_flatten_quant_near_misses():
    args = _inputs(smooth=False)

    def other_view(x1, x2, gamma):  # scale viewed (1, -1)
        y, _, _ = npu.npu_add_rms_norm(x1, x2, gamma)
        yq, scale = npu.npu_dynamic_quant(y.flatten(0, 1))
        return yq, scale.view(1, -1)

    def other_flatten(x1, x2, gamma):  # flattens dims 1, 2 (the hidden dim with them)
        y, _, _ = npu.npu_add_rms_norm(x1, x2, gamma)
        yq, scale = npu.npu_dynamic_quant(y.flatten(1, 2))
        return yq, scale.view(-1, 1)

    def scale_not_viewed(x1, x2, gamma):
        y, _, _ = npu.npu_add_rms_norm(x1, x2, gamma)
        return npu.npu_dynamic_quant(y.flatten(0, 1))

    for fn in (other_view, other_flatten, scale_not_viewed):
        _check(fn, args, defaults.FLATTEN, fires=False)


# ---- pattern 3: add_rms_norm -> view(-1, h) -> to(float32) ------------------------------------

def _cast_chain(keep_x_out, eps):
    def fn(x1, x2, gamma):
        y, _, x_out = _norm(x1, x2, gamma, eps)
        h = y.size(-1)
        y32 = y.view(-1, h).to(torch.float32)
        return (y32, x_out) if keep_x_out else (y32,)
    return fn


@pytest.mark.parametrize("keep_x_out", [True, False], ids=["x_out", "no-x_out"])
@pytest.mark.parametrize("eps", [None, 1e-5], ids=["eps-default", "eps"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_cast_fuses_exactly(keep_x_out, eps, dynamic):
    fused, _ = _check(_cast_chain(keep_x_out, eps), _inputs(smooth=False), defaults.CAST, dynamic=dynamic)
    for a, b in zip(fused, _cast_chain(keep_x_out, eps)(*_inputs(smooth=False))):
        assert torch.equal(a, b)  # float(y) is exact


def test_cast_near_misses():
    args = _inputs(smooth=False)

    def to_half(x1, x2, gamma):
        y, _, _ = npu.npu_add_rms_norm(x1, x2, gamma)
        return y.view(-1, y.size(-1)).to(torch.bfloat16)

    def other_view(x1, x2, gamma):  # view(h, -1): another shape
        y, _, _ = npu.npu_add_rms_norm(x1, x2, gamma)
        return y.view(y.size(-1), -1).to(torch.float32)

    def y_used_again(x1, x2, gamma):
        y, _, _ = npu.npu_add_rms_norm(x1, x2, gamma)
        return y.view(-1, y.size(-1)).to(torch.float32), y * 2

    for fn in (to_half, other_view, y_used_again):
        _check(fn, args, defaults.CAST, fires=False)


def test_switch_off_keeps_the_chain(tmp_path):
    _, report = _compile(_flatten_chain(True, None), *_inputs(smooth=False), fusion=False,
                         dump=("txt", tmp_path))
    text = open(next(d for d in report.dumps if "optimized" in d)).read()
    assert "npu_add_rms_norm_dynamic_quant" not in text and "npu_dynamic_quant" in text
    assert report.patterns == {} and "pattern_fusion" not in report.passes


def test_two_layers_fuse_twice():
    def fn(x1, x2, gamma, s):
        y, _, x_out = npu.npu_add_rms_norm(x1, x2, gamma)
        a, sa = npu.npu_dynamic_quant(y, smooth_scales=s)
        y2, _, x_out2 = npu.npu_add_rms_norm(x_out, x2, gamma)
        b, sb = npu.npu_dynamic_quant(y2, smooth_scales=s)
        return a, sa, b, sb, x_out2

    _, report = _compile(fn, *_inputs())
    assert report.patterns == {defaults.SMOOTH: 2}


@pytest.mark.inductor
def test_fused_graph_compiles_with_the_inductor_engine():
    config = torchair.CompilerConfig()  # default engine: Inductor
    fn = _flatten_chain(True, None)
    args = _inputs(smooth=False)
    compiled = torch.compile(fn, backend=torchair.get_npu_backend(compiler_config=config),
                             fullgraph=True)
    out = compiled(*args)
    report = torchair.graph_reports()[-1]
    assert report.engine == "inductor-cpp" and report.patterns == {defaults.FLATTEN: 1}
    _assert_same(out, fn(*args))


def test_anchor_check_skips_graphs_without_add_rms_norm():
    from torch.fx.experimental.proxy_tensor import make_fx

    with_norm = make_fx(_flatten_chain(True, None))(*_inputs(smooth=False))
    without = make_fx(lambda x: (x * 2,))(torch.randn(3))
    assert defaults.has_anchor(with_norm) and not defaults.has_anchor(without)


def test_int8_difference_bound_on_a_large_bf16_batch():
    """The documented deviation at a realistic size: at most one int8 step, few values."""
    args = _inputs(tokens=(1, 256), hidden=1024, dtype=torch.bfloat16)
    fused, _ = _compile(_smooth_chain(True, None), *args)
    unfused, _ = _compile(_smooth_chain(True, None), *args, fusion=False)
    diff = (fused[0].int() - unfused[0].int()).abs()
    assert diff.max() <= 1 and (diff > 0).float().mean() < INT8_DIFF[torch.bfloat16]


def test_moe_group_index_quant_is_not_fused_and_compiles():
    """npu_dynamic_quant with group_index (MoE) is not the pattern; checking it must not fail
    the compile (the pattern's re-trace refuses [E, H] smooth scales)."""
    def fn(x1, x2, gamma, s, gi):
        y, _, _ = npu.npu_add_rms_norm(x1, x2, gamma)
        return npu.npu_dynamic_quant(y, smooth_scales=s, group_index=gi)

    x1, x2, gamma, _ = _inputs(tokens=(6,))
    s = torch.rand(3, 32).to(DT) + 0.5
    gi = torch.tensor([2, 4, 6], dtype=torch.int32)
    _check(fn, (x1, x2, gamma, s, gi), defaults.SMOOTH, fires=False)


def test_same_tensor_for_both_addends_fuses_with_dynamic_shapes():
    def fn(x, gamma):
        y, _, x_out = npu.npu_add_rms_norm(x, x, gamma)
        h = y.size(-1)
        return y.view(-1, h).to(torch.float32), x_out

    x, _, gamma = _inputs(smooth=False)
    _check(fn, (x, gamma), defaults.CAST, dynamic=True)


def test_fused_op_carries_its_super_kernel_scope():
    def fn(x1, x2, gamma, s):
        with torchair.scope.super_kernel("sk1", "stream-fusion=1"):
            y, _, x_out = npu.npu_add_rms_norm(x1, x2, gamma)
            yq, scale = npu.npu_dynamic_quant(y, smooth_scales=s)
        return yq, scale, x_out

    _, report = _compile(fn, *_inputs())
    assert report.patterns == {defaults.SMOOTH: 1}
    (names,) = report.scopes.values()
    assert any("npu_add_rms_norm_dynamic_quant" in n for n in names), report.scopes


def test_chain_across_a_scope_boundary_is_not_fused():
    def fn(x1, x2, gamma, s):
        with torchair.scope.super_kernel("sk1"):
            y, _, x_out = npu.npu_add_rms_norm(x1, x2, gamma)
        yq, scale = npu.npu_dynamic_quant(y, smooth_scales=s)
        return yq, scale, x_out

    _check(fn, _inputs(), defaults.SMOOTH, fires=False)


def test_chain_across_a_stream_switch_is_not_fused():
    def fn(x1, x2, gamma, s):
        with torchair.scope.npu_stream_switch("side"):
            y, _, x_out = npu.npu_add_rms_norm(x1, x2, gamma)
        yq, scale = npu.npu_dynamic_quant(y, smooth_scales=s)
        return yq, scale, x_out

    _check(fn, _inputs(), defaults.SMOOTH, fires=False)
