"""``torchair_native::gemv`` (torchair/ops/matmul/cpu.py, toolchain/csrc/small_gemm.cpp): the
few-row product kernel against a float64 reference (itself checked against a sum written out),
over row counts that take every register tile and tail, odd K and N, strided operands, NaN/inf,
one and two threads; the calls it does not take fast are ATen's exactly. The binder rewrites a
static unit's few-row float32 products (and only those) without touching the traced graph; an
Inductor-engine unit calls the kernel from its generated code; an FX-engine unit keeps eager's
products bit for bit."""
import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend

import torchair
from torchair.ops.matmul import cpu as _mm
from torchair.ops.toolchain import native as _native
from torchair.runtime.binders.small_products import SmallProductBinder

pytestmark = pytest.mark.skipif(not _mm.available(),
                                reason="needs the small-product kernel (a C++ compiler, AVX2)")


def _gemv(x, w_t, bias=None):
    return _mm.gemv()(x, w_t, bias)


def _operands(m, k, n, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    return x, w, b


def _close(out, x, w_t, b=None):
    ref = _mm.reference(x, w_t, b)
    k = x.shape[1]
    # fp32 sums of k products of N(0, 1) values, in another order than the reference's
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=2e-6 * max(k, 1) ** 0.5 * 8)


def test_reference_is_the_written_out_sum():
    x, w, b = _operands(3, 5, 4, seed=1)
    ref = _mm.reference(x, w.t(), b)
    for m in range(3):
        for n in range(4):
            want = math.fsum(float(x[m, i]) * float(w[n, i]) for i in range(5)) + float(b[n])
            assert abs(float(ref[m, n]) - want) < 1e-5, (m, n)
    assert ref.dtype == torch.float32 and ref.shape == (3, 4)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 16, 17])
@pytest.mark.parametrize("k, n", [(2, 1), (15, 5), (16, 4), (17, 13), (64, 3), (100, 257),
                                  (512, 129)])
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_matches_the_reference(m, k, n, bias):
    x, w, b = _operands(m, k, n, seed=m * 1000 + k + n, bias=bias)
    out = _gemv(x, w.t(), b)
    assert out.shape == (m, n) and out.is_contiguous() and out.dtype == torch.float32
    _close(out, x, w.t(), b)


def test_wide_weights_split_over_threads_give_the_same_bits():
    """Each output is one thread's sum whatever the split: 1 and 2 threads agree bit for bit."""
    x, w, b = _operands(8, 512, 1536, seed=3)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _gemv(x, w.t(), b)
        torch.set_num_threads(2)
        two = _gemv(x, w.t(), b)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
    _close(two, x, w.t(), b)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 12])
def test_the_weight_prefetch_changes_no_bit(m):
    """Every product prefetches the next block of W; with it off the same products come
    out bit for bit. The weights here end their buffer (the last block's prefetch reads past
    it: prefetches never fault) or are a slice of a wider one (rows ldw apart)."""
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, 300, generator=g)
    end = torch.randn(1, 4099 * 300, generator=g)[:, -257 * 300:].view(257, 300)
    wide = torch.randn(130, 700, generator=g)[:, 100:400]
    for w in (end, wide):
        _mm.set_prefetch(False)
        try:
            without = _gemv(x, w.t())
        finally:
            _mm.set_prefetch(True)
        with_prefetch = _gemv(x, w.t())
        assert torch.equal(with_prefetch, without)
        _close(with_prefetch, x, w.t())


def test_strided_operands():
    """Row strides wider than K (slices of wider tensors) and repeated rows (stride 0)."""
    g = torch.Generator().manual_seed(4)
    xw = torch.randn(5, 80, generator=g)
    ww = torch.randn(33, 90, generator=g)
    x, w = xw[:, 3:70], ww[:, 10:77]  # K = 67, row strides 80 and 90
    assert x.stride() == (80, 1) and w.t().stride() == (1, 90)
    _close(_gemv(x, w.t()), x, w.t())
    rows = torch.randn(1, 67, generator=g).expand(6, 67)  # stride (0, 1)
    _close(_gemv(rows, w.t()), rows, w.t())
    same = torch.randn(67, 1, generator=g).expand(67, 9)  # every column of w_t the same
    _close(_gemv(x, same), x, same)


@pytest.mark.parametrize("case", ["w_t-row-major", "float64", "bias-2d", "bias-strided",
                                  "x-column-major", "bfloat16"])
def test_calls_off_the_fast_path_are_atens(case):
    x, w, b = _operands(3, 40, 24, seed=5)
    w_t = w.t()
    if case == "w_t-row-major":
        w_t = w.t().contiguous()
    elif case == "float64":
        x, w_t, b = x.double(), w_t.double(), b.double()
    elif case == "bias-2d":
        b = b[None]
    elif case == "bias-strided":
        b = torch.randn(48)[::2]
    elif case == "x-column-major":
        x = x.t().contiguous().t()
    elif case == "bfloat16":
        x, w_t, b = x.bfloat16(), w_t.bfloat16(), b.bfloat16()
    out = _gemv(x, w_t, b)
    assert torch.equal(out, torch.addmm(b, x, w_t))
    if not case.startswith("bias"):  # without the bias these are off the fast path too
        assert torch.equal(_gemv(x, w_t), torch.mm(x, w_t))


def test_shape_errors_are_atens():
    x, w, _ = _operands(2, 8, 4)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        _gemv(x, w)  # [2, 8] @ [4, 8]


def test_empty_products():
    assert _gemv(torch.randn(0, 8), torch.randn(4, 8).t()).shape == (0, 4)
    assert _gemv(torch.randn(3, 8), torch.randn(0, 8).t()).shape == (3, 0)


def test_nan_and_inf_reach_the_rows_and_columns_they_belong_to():
    x, w, b = _operands(4, 33, 10, seed=6)
    x[1, 32] = float("nan")  # the last, tail-lane column of row 1
    w[7, 0] = float("inf")  # every row meets it in column 7
    out = _gemv(x, w.t(), b)
    assert torch.isnan(out[1]).all()
    others = [0, 2, 3]
    assert torch.isinf(out[others, 7]).all()
    keep = torch.ones(10, dtype=torch.bool)
    keep[7] = False
    _close(out[others][:, keep], x[others], w[keep].t(), b[keep])


# ------------------------------------------------------------------------------ static units

class _Linears(torch.nn.Module):
    def __init__(self, dim=48, hidden=72, bias=False):
        super().__init__()
        self.up = torch.nn.Linear(dim, hidden, bias=bias)
        self.down = torch.nn.Linear(hidden, dim, bias=True)

    def forward(self, x):
        return self.down(F.silu(self.up(x))) + x


def _unit(module, run_eagerly=True):
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = run_eagerly
    backend = CompileCounterWithBackend(torchair.get_npu_backend(compiler_config=config))
    return torch.compile(module, backend=backend, fullgraph=True), backend


def _traced(module, x):
    """The ATen graph a static unit of ``module`` holds and the arguments it calls it with (an
    FX-engine unit, built and run once)."""
    from torchair.runtime import units

    seen = {}
    real = units.StaticUnit._engine

    def spy(self, unit_args, what):
        seen["gm"], seen["args"] = self.gm, list(unit_args)
        return real(self, unit_args, what)

    units.StaticUnit._engine = spy
    try:
        compiled, _ = _unit(module)
        with torch.no_grad():
            compiled(x)
    finally:
        units.StaticUnit._engine = real
    return seen["gm"], seen["args"]


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("batch", [_mm.MIN_ROWS, 8, _mm.MAX_ROWS])
@pytest.mark.parametrize("bias", [False, True])
def test_bind_rewrites_few_row_products(batch, bias):
    torch.manual_seed(0)
    module = _Linears(bias=bias)
    gm, args = _traced(module, torch.randn(batch, 1, 48))
    before = _targets(gm)
    bound, count = SmallProductBinder()(gm)
    assert count == 2 and bound is not gm
    assert _targets(gm) == before  # the traced graph (what the compile cache saves) is kept
    aten = torch.ops.aten
    assert _targets(bound).count(_mm.gemv()) == 2
    assert aten.mm.default not in _targets(bound) and aten.addmm.default not in _targets(bound)
    with torch.no_grad():
        torch.testing.assert_close(bound(*args), gm(*args), rtol=1e-5, atol=1e-5)
    abi = [n.args[-1] for n in bound.graph.nodes if n.target is _mm.gemv()]
    assert abi == [_native.abi_number(_mm.gemv())] * 2


def test_chained_products_are_all_bound():
    """A product whose operand is another bound product (Linear after Linear, x @ A.t() @ B.t())
    reads the new node: the graph is well formed and computes the same."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 32, bias=False),
                                 torch.nn.Linear(32, 16))
    gm, args = _traced(module, torch.randn(8, 64))
    bound, count = SmallProductBinder()(gm)
    assert count == 3
    bound.graph.lint()
    with torch.no_grad():
        torch.testing.assert_close(bound(*args), gm(*args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch", [1, 3, _mm.MAX_ROWS + 1])
def test_other_row_counts_stay_mm(batch, monkeypatch):
    """Below MIN_ROWS (4 on an Intel CPU with MKL, whose GEMV reads at the memory's speed
    already) and above MAX_ROWS (a blocked GEMM wins) the product stays mm."""
    monkeypatch.setattr(_mm, "MIN_ROWS", 4)
    gm, _ = _traced(_Linears(), torch.randn(batch, 1, 48))
    assert not _mm.binds_rows(batch)
    assert SmallProductBinder()(gm) == (gm, 0)


@pytest.mark.parametrize("vendor, mkl, rows", [("GenuineIntel", True, 4), ("GenuineIntel", False, 1),
                                               ("AuthenticAMD", True, 1), ("", True, 1)])
def test_min_rows_follows_the_cpu_whose_blas_runs_few_rows_fast(vendor, mkl, rows):
    assert _mm.default_min_rows(vendor, mkl) == rows


def test_one_row_products_are_bound_where_min_rows_is_one(monkeypatch):
    """A decode step at batch 1 (AMD's MKL runs a generic GEMV: the kernel is 2-4x faster)."""
    monkeypatch.setattr(_mm, "MIN_ROWS", 1)
    torch.manual_seed(0)
    gm, args = _traced(_Linears(bias=True), torch.randn(1, 1, 48))
    bound, count = SmallProductBinder()(gm)
    assert count == 2 and _targets(bound).count(_mm.gemv()) == 2
    with torch.no_grad():
        torch.testing.assert_close(bound(*args), gm(*args), rtol=1e-5, atol=1e-5)


def test_float64_products_stay_mm():
    gm, _ = _traced(_Linears().double(), torch.randn(8, 1, 48, dtype=torch.float64))
    assert SmallProductBinder()(gm) == (gm, 0)


def test_a_weight_that_is_not_transposed_stays_mm():
    """``x @ W`` with W [K, N] row-major: its rows are not contiguous in k."""
    class _Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(48, 40))

        def forward(self, x):
            return x @ self.w

    gm, _ = _traced(_Plain(), torch.randn(8, 48))
    assert torch.ops.aten.mm.default in _targets(gm)
    assert SmallProductBinder()(gm) == (gm, 0)


def test_the_switch_and_disabled_native_kernels_keep_mm(monkeypatch):
    gm, _ = _traced(_Linears(), torch.randn(8, 1, 48))
    assert SmallProductBinder()(gm)[1] == 2
    monkeypatch.setenv(_mm.ENV_SWITCH, "0")
    assert not _mm.binds_rows(8) and SmallProductBinder()(gm) == (gm, 0)
    monkeypatch.delenv(_mm.ENV_SWITCH)
    monkeypatch.setenv(_native.ENV_DISABLE, "0")
    monkeypatch.setattr(_mm, "_result", None)  # asked again (the undo puts the loaded one back)
    assert not _mm.binds_rows(8) and SmallProductBinder()(gm) == (gm, 0)


def test_fx_engine_units_keep_eagers_products():
    """``debug.run_eagerly`` runs eager's kernels: bit for bit eager's products."""
    torch.manual_seed(0)
    module = _Linears(bias=True)
    compiled, backend = _unit(module)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(8, 1, 48)
            assert torch.equal(compiled(x), module(x))
    report = torchair.graph_reports()[-1]
    assert report.small_products == 0 and "small products" not in str(report)
    assert backend.frame_count == 1


@pytest.mark.inductor
def test_inductor_unit_calls_the_kernel_with_its_schema_number():
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    module = _Linears(bias=True)
    compiled, backend = _unit(module, run_eagerly=False)
    x = torch.randn(8, 1, 48)
    with torch.no_grad():
        out, codes = run_and_get_code(lambda: compiled(x))
        torch.testing.assert_close(out, module(x), rtol=1e-5, atol=1e-5)
        for _ in range(2):
            x2 = torch.randn(8, 1, 48)
            torch.testing.assert_close(compiled(x2), module(x2), rtol=1e-5, atol=1e-5)
    report = torchair.graph_reports()[-1]
    assert report.small_products == 2 and "small products: 2 call(s)" in str(report)
    assert backend.frame_count == 1
    abi = _native.abi_number(_mm.gemv())
    assert len(codes) == 1 and "torchair_native.gemv" in codes[0] and str(abi) in codes[0]


def _calls_file(path, *targets):
    nodes = [{"name": f"buf{i}", "node": {"target": t, "inputs": [], "outputs": []}}
             for i, t in enumerate(targets)]
    path.write_text(json.dumps({"nodes": nodes}))


def test_a_warm_library_that_calls_the_kernel_registers_it_first(tmp_path, monkeypatch):
    """An ahead-of-time library (cache_compile's ge_cache entry) lists its custom-op calls
    beside it (unit.json, PyTorch's format); loading it registers the kernels it names, and
    says so when one cannot be had."""
    from torchair.ops.attention.cpu import launch_library as _launch
    from torchair.runtime import engines

    library, calls = tmp_path / "unit.so", tmp_path / engines.LIBRARY_OPS
    _calls_file(calls, "torchair_native::gemv", "torchair_native::gemv", "npu::other")
    assert engines.library_calls(library) == ["torchair_native::gemv"] * 2 + ["npu::other"]
    assert engines.GEMV_OP == _mm.gemv()._schema.name
    assert engines.bound_calls(engines.library_calls(library)) == (0, 2)
    assert engines.bound_calls(["torchair_native::fia_prompt", "torchair_native::gemv"]) == (1, 1)
    asked = []
    monkeypatch.setattr(_mm, "available", lambda: asked.append("gemv") or True)
    monkeypatch.setattr(_launch, "available", lambda: asked.append("launch") or True)
    engines._load_launch_kernels(str(library))
    assert asked == ["gemv"]  # the attention kernels are not needed by this library
    monkeypatch.setattr(_mm, "available", lambda: False)
    with pytest.raises(RuntimeError, match=r"torchair_native::gemv.*rebuild the cache entry"):
        engines._load_launch_kernels(str(library))
    _calls_file(calls, "torchair_native::ifa_decode")
    asked.clear()
    engines._load_launch_kernels(str(library))
    assert asked == ["launch"]
    calls.write_text('{"torchair_native::gemv": {}}')  # not PyTorch's format: not guessed at
    with pytest.raises(RuntimeError, match="not the list of custom-op calls"):
        engines._load_launch_kernels(str(library))
    calls.unlink()
    assert engines.library_calls(library) == []
    engines._load_launch_kernels(str(library))  # a library without custom ops: nothing to do


_WARM_SCRIPT = """
import json, sys
import torch, torchair
from torchair.inference import cache_compile

torch.manual_seed(0)
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 96, bias=False)
        self.c = torch.nn.Linear(64, 64)
        self.b = torch.nn.Linear(96, 64)
    def forward(self, x):  # a and c: one gemv_cat call
        return self.b(torch.nn.functional.silu(self.a(x))) + self.c(x)
m = M().eval()
config = torchair.CompilerConfig()
config.debug.run_eagerly = False
f = cache_compile(m.forward, config=config, cache_dir=sys.argv[1], ge_cache=True, dynamic=False)
x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    out, ref = f(x), m(x)
report = torchair.graph_reports()[-1] if torchair.graph_reports() else None
torch.save({"out": out, "ref": ref}, sys.argv[2])
print(json.dumps({"engine": report and report.engine, "small": report and report.small_products,
                  "compiles": len(torchair.graph_reports())}))
"""


@pytest.mark.inductor
def test_a_cached_library_is_served_under_its_own_switch(tmp_path):
    """cache_compile(ge_cache=True): a warm process runs the library (its kernel calls counted
    in the report: a gemv_cat for the two products of x, a gemv); a process with
    TORCHAIR_SMALL_GEMM=0 gets its own entry, built with mm, whose result is eager's bit for
    bit, not the library that calls the kernel."""
    import json
    import os
    import subprocess
    import sys

    script = tmp_path / "step.py"
    script.write_text(_WARM_SCRIPT)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def run(name, **env):
        full = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""),
                    **env)
        done = subprocess.run([sys.executable, str(script), str(tmp_path / "c"),
                               str(tmp_path / f"{name}.pt")], capture_output=True, text=True,
                              timeout=300, env=full, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1]), torch.load(tmp_path / f"{name}.pt")

    cold, cold_out = run("cold")
    warm, warm_out = run("warm")
    assert cold["small"] == 2 and warm["small"] == 2 and warm["engine"] == "inductor-aot"
    from torchair.runtime import engines

    lists = [engines.library_calls(f) for f in (tmp_path / "c").rglob(engines.LIBRARY_OPS)]
    assert [sorted(c) for c in lists] == [[engines.GEMV_OP, engines.GEMV_CAT_OP]]
    assert torch.equal(warm_out["out"], cold_out["out"])
    torch.testing.assert_close(cold_out["out"], cold_out["ref"], rtol=1e-5, atol=1e-5)
    off, off_out = run("off", TORCHAIR_SMALL_GEMM="0")
    assert off["small"] == 0 and torch.equal(off_out["out"], off_out["ref"])
    assert len([p for p in (tmp_path / "c").iterdir() if p.is_dir()]) == 2  # two entries
