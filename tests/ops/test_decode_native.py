"""The native (C) CPU decode kernel (``torchair.ops.attention.cpu.native``, built by ``_native``)
against ``decode_attention_reference``, its fallbacks, and the build cache's safety."""
import logging
import os
import pathlib
import shutil

import pytest
import torch
from _decode_check import check_cpu_kernel as _check
from _paging import paged, to_blocks

import torchair.ops  # noqa: F401  (registers the kernels)
from torchair.ops.attention.cpu import decode as _decode_cpu, native as _decode_native
from torchair.ops.attention.cpu.decode import decode_attention_cpu
from torchair.ops.attention.decode import decode_attention_reference
from torchair.ops.toolchain import native as _native

SESSION_CACHE = os.environ[_native.ENV_CACHE]  # the session's private cache (tests/conftest.py)
HAVE_CC = shutil.which(os.environ.get("CC") or "cc") is not None
needs_cc = pytest.mark.skipif(not HAVE_CC, reason="no C compiler: the native kernel cannot be "
                              "built here (the PyTorch kernel is tested in test_decode_cpu.py)")


@pytest.fixture
def native_only(monkeypatch):
    """Force splits and threads, and fail if the BLAS path is taken."""
    monkeypatch.setattr(_decode_native, "MIN_SPLIT", 64)
    monkeypatch.setattr(_decode_native, "MIN_SPLIT_ONE", 64)
    monkeypatch.setattr(_decode_native, "_SERIAL_WORK", 0)

    def no_blas(*args, **kwargs):
        raise AssertionError("the native kernel declined these arguments")

    monkeypatch.setattr(_decode_cpu, "_blas_decode", no_blas)


@needs_cc
def test_available_with_a_compiler():
    assert _decode_native.available()


@needs_cc
@pytest.mark.parametrize("heads,nkv", [(4, 4), (6, 2), (8, 2), (16, 2), (24, 2), (64, 1)],
                         ids=["G1", "G3", "G4", "G8", "G12", "G64"])
@pytest.mark.parametrize("dim", [16, 48, 128])
@pytest.mark.parametrize("block", [None, 16], ids=["dense", "paged16"])
def test_grid_fp32(native_only, heads, nkv, dim, block):
    """Windows crossing the kernel's 256-position chunks and split over threads, left padding,
    a mask, an empty row, every head-group tile width."""
    g = torch.Generator().manual_seed(heads * 7 + dim + (block or 0))
    batch, seq = 4, 600
    q = torch.randn(batch, heads, dim, generator=g)
    k = torch.randn(batch, nkv, seq, dim, generator=g) * 2
    v = torch.randn(batch, nkv, seq, dim, generator=g)
    lengths, start = torch.tensor([600, 257, 0, 300]), torch.tensor([0, 100, 5, 299])
    table = None
    if block is not None:
        k, table = paged(k, block, g)
        v = to_blocks(v, block, table)
    logical = seq if block is None else table.shape[1] * block
    mask = torch.rand(batch, logical, generator=g) < 0.25
    out = _check(q, k, v, lengths=lengths, scale=dim ** -0.5, kv_start=start, block_table=table,
                 mask=mask)
    assert torch.all(out[2] == 0)


@needs_cc
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block", [None, 32], ids=["dense", "paged32"])
def test_half_dtypes(native_only, dtype, block):
    g = torch.Generator().manual_seed(2)
    batch, heads, nkv, seq, dim = 3, 16, 2, 700, 64
    q = torch.randn(batch, heads, dim, generator=g).to(dtype)
    k = torch.randn(batch, nkv, seq, dim, generator=g).to(dtype)
    v = torch.randn(batch, nkv, seq, dim, generator=g).to(dtype)
    table = None
    if block is not None:
        k, table = paged(k, block, g)
        v = to_blocks(v, block, table)
    _check(q, k, v, lengths=torch.tensor([700, 1, 513]), kv_start=torch.tensor([0, 699, 100]),
           scale=0.125, block_table=table)


def _cpu_has(flag: str) -> bool:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return any(line.startswith("flags") and flag in line.split() for line in f)
    except OSError:
        return False


@needs_cc
def test_bf16_dot_products_where_the_cpu_has_them():
    """-march=native builds the bf16 dot-product path exactly when the CPU has AVX512-BF16."""
    assert _decode_native.bf16_dot() == _cpu_has("avx512_bf16")


@needs_cc
@pytest.mark.parametrize("heads,nkv", [(4, 4), (8, 4), (8, 2), (16, 2), (40, 4)],
                         ids=["G1", "G2", "G4", "G8", "G10"])
@pytest.mark.parametrize("dim", [32, 128])
@pytest.mark.parametrize("block", [None, 16], ids=["dense", "paged16"])
def test_bf16_query_and_cache(native_only, heads, nkv, dim, block):
    """bf16 q with bf16 K (the dot-product path where the CPU has it) equals the reference and
    the float32-query path on the same values (same math: exact products, float32 sums)."""
    g = torch.Generator().manual_seed(heads + dim)
    batch, seq = 2, 520
    q = torch.randn(batch, heads, dim, generator=g).bfloat16()
    k = (torch.randn(batch, nkv, seq, dim, generator=g) * 2).bfloat16()
    v = torch.randn(batch, nkv, seq, dim, generator=g).bfloat16()
    table = None
    if block is not None:
        k, table = paged(k, block, g)
        v = to_blocks(v, block, table)
    kw = dict(lengths=torch.tensor([520, 300]), kv_start=torch.tensor([0, 200]), scale=0.3,
              block_table=table)
    out = _check(q, k, v, **kw)
    via_fp32_query = decode_attention_cpu(q.float(), k, v, **kw)
    torch.testing.assert_close(out.float(), via_fp32_query, atol=8e-3, rtol=8e-3)


@needs_cc
@pytest.mark.parametrize("block", [None, 32], ids=["dense", "paged32"])
def test_int8_antiquant(native_only, block):
    g = torch.Generator().manual_seed(5)
    batch, heads, nkv, seq, dim = 2, 8, 2, 300, 32
    q = torch.randn(batch, heads, dim, generator=g).half()
    k8 = torch.randint(-128, 128, (batch, nkv, seq, dim), generator=g, dtype=torch.int8)
    v8 = torch.randint(-128, 128, (batch, nkv, seq, dim), generator=g, dtype=torch.int8)
    quant = {"k_scale": torch.rand(nkv, dim, generator=g) / 50,
             "k_offset": torch.randn(nkv, dim, generator=g),
             "v_scale": torch.rand(nkv, dim, generator=g) / 50,
             "v_offset": torch.randn(nkv, dim, generator=g)}
    table = None
    if block is not None:
        k8, table = paged(k8, block, g)
        v8 = to_blocks(v8, block, table)
    out = _check(q, k8, v8, lengths=torch.tensor([300, 0]), scale=0.2, block_table=table, **quant)
    assert torch.all(out[1] == 0)


@needs_cc
def test_bsnd_view_and_large_scores(native_only):
    """A transposed [B, S, Nkv, D] cache (no copy) and scores spanning a wide range (the
    kernel's exp: below -87 it gives exactly 0)."""
    g = torch.Generator().manual_seed(9)
    q = torch.randn(2, 8, 32, generator=g) * 4
    k = (torch.randn(2, 400, 2, 32, generator=g) * 4).transpose(1, 2)
    v = torch.randn(2, 400, 2, 32, generator=g).transpose(1, 2)
    _check(q, k, v, lengths=torch.tensor([400, 3]), scale=1.0)


@needs_cc
@pytest.mark.parametrize("threads", [1, 2])
def test_thread_counts_agree_with_reference(native_only, threads):
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(1)
        q = torch.randn(1, 8, 64, generator=g)
        k = torch.randn(1, 1, 2000, 64, generator=g)
        v = torch.randn(1, 1, 2000, 64, generator=g)
        _check(q, k, v, lengths=torch.tensor([1999]), scale=0.125)
    finally:
        torch.set_num_threads(old)


def _spy_blas(monkeypatch):
    calls = []
    real = _decode_cpu._blas_decode

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_decode_cpu, "_blas_decode", spy)
    return calls


@pytest.mark.parametrize("case", ["dim8", "mixed-dtypes", "disabled"])
def test_falls_back_to_blas(monkeypatch, case):
    """Arguments the native kernel does not take run on the BLAS path, with the same results."""
    calls = _spy_blas(monkeypatch)
    g = torch.Generator().manual_seed(4)
    dim = 8 if case == "dim8" else 32
    q = torch.randn(2, 4, dim, generator=g)
    k = torch.randn(2, 2, 40, dim, generator=g)
    v = torch.randn(2, 2, 40, dim, generator=g)
    if case == "mixed-dtypes":
        v = v.bfloat16()
    if case == "disabled":
        monkeypatch.setenv(_native.ENV_DISABLE, "0")
        assert not _decode_native.available()
    out = decode_attention_cpu(q, k, v, lengths=torch.tensor([40, 7]), scale=0.3)
    ref = decode_attention_reference(q, k, v, lengths=torch.tensor([40, 7]), scale=0.3)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
    assert calls == [1]


@pytest.mark.parametrize("bad", [-1, 99])
def test_block_ids_outside_the_cache_are_an_error(bad):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 32, generator=g)
    k, table = paged(torch.randn(2, 2, 40, 32, generator=g), 16, g)
    table[1, 2] = bad
    with pytest.raises(ValueError, match=r"block_table\[1, 2\] = .* is not a block"):
        decode_attention_cpu(q, k, k, lengths=torch.tensor([40, 40]), scale=0.3,
                             block_table=table)
    # a block past the window is never read, so it may hold anything
    decode_attention_cpu(q, k, k, lengths=torch.tensor([40, 32]), scale=0.3, block_table=table)


# ---------------------------------------------------------------------------------------------
# the build cache (torchair.ops.toolchain.native)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(_native.ENV_CACHE, str(tmp_path / "kernels"))
    _native._load.cache_clear()
    yield tmp_path / "kernels"
    _native._load.cache_clear()


@needs_cc
def test_built_once_then_reused(fresh_cache, monkeypatch, torchair_log):
    assert _native.load("decode_attention") is not None
    built = list(fresh_cache.glob("decode_attention-*.so"))
    assert len(built) == 1 and (built[0].stat().st_mode & 0o777) == 0o600
    assert oct(fresh_cache.stat().st_mode & 0o777) == "0o700"
    assert any("building native CPU kernel" in r.getMessage() for r in torchair_log)
    _native._load.cache_clear()

    def no_build(*args, **kwargs):
        raise AssertionError("rebuilt a cached kernel")

    monkeypatch.setattr(_native, "_build", no_build)
    assert _native.load("decode_attention") is not None


def test_failing_compiler_warns_and_falls_back(fresh_cache, monkeypatch, torchair_log):
    fake = fresh_cache.parent / "fakecc"
    fake.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo fakecc 1.0; exit 0; fi\n"
                    "echo 'fakecc: error: no' >&2; exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    assert _native.load("decode_attention") is None
    warnings = [r.getMessage() for r in torchair_log if r.levelno == logging.WARNING]
    assert any("could not be built" in w and "fakecc: error" in w for w in warnings)
    assert not list(fresh_cache.glob("*.so")) and not list(fresh_cache.glob(".tmp-*"))


def test_missing_compiler_is_quiet(fresh_cache, monkeypatch, torchair_log):
    monkeypatch.setenv("CC", str(fresh_cache.parent / "no-such-cc"))
    assert _native.load("decode_attention") is None
    assert not [r for r in torchair_log if r.levelno >= logging.WARNING]


@needs_cc
def test_unsafe_cache_dir_is_refused(fresh_cache, torchair_log):
    fresh_cache.mkdir(mode=0o700)
    fresh_cache.chmod(0o777)
    assert _native.load("decode_attention") is None
    assert any("world-writable" in r.getMessage() for r in torchair_log)
    assert not list(fresh_cache.glob("*.so"))


def _copy_session_build(fresh_cache):
    """Fill ``fresh_cache`` with the library the test session built (built here if no test did
    yet): one real build per session instead of one per test (~25 s each on 2 cores)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(_native.ENV_CACHE, SESSION_CACHE)
        _native._load.cache_clear()
        assert _native.load("decode_attention") is not None
    _native._load.cache_clear()
    fresh_cache.mkdir(mode=0o700)
    for f in pathlib.Path(SESSION_CACHE).glob("decode_attention-*"):
        if not f.name.endswith(".lock"):
            shutil.copy2(f, fresh_cache / f.name)


@needs_cc
def test_foreign_library_file_is_refused(fresh_cache, torchair_log):
    _copy_session_build(fresh_cache)
    assert _native.load("decode_attention") is not None
    assert not any("building native CPU kernel" in r.getMessage() for r in torchair_log)
    (lib,) = fresh_cache.glob("decode_attention-*.so")
    lib.chmod(0o666)
    _native._load.cache_clear()
    assert _native.load("decode_attention") is None
    assert any("refusing to load" in r.getMessage() for r in torchair_log)
