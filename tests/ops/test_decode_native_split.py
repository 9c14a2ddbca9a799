"""The native CPU decode kernel's work split: one work item per (sequence, split of its window),
reading every kv head of a position in one pass (decode_attention.c). Against the reference:
window lengths around the kernel's chunk widths (which depend on the kv heads and head dim), one
position, rows with length 0, 1/2/4 kv heads, BSH and BNSD, dense and paged, split windows; the
launch kernel (``torchair_native::ifa_decode``, C++ work split) bit-identical to the Python path
(Python work split) and to itself run to run."""
import os
import shutil

import pytest
import torch
from _decode_check import check_cpu_kernel as _check
from _paging import paged, to_blocks

import torchair.ops  # noqa: F401  (registers the kernels)
from torchair.ops.attention import ifa_fast
from torchair.ops.attention.cpu import decode as _decode_cpu, native as _decode_native
from torchair.ops.attention.incre_flash_attention import incre_flash_attention_reference

HAVE_CC = shutil.which(os.environ.get("CC") or "cc") is not None
needs_cc = pytest.mark.skipif(not HAVE_CC, reason="no C compiler: no native kernel")
# chunk widths of fp32 windows (decode_attention.c: CHUNK_BYTES / (nkv * D * 4 * 2), 16..256):
# nkv 1: 256, nkv 2: 192, nkv 4: 96 positions at D 64
LENGTHS = [1, 0, 95, 96, 97, 191, 192, 193, 255, 256, 257, 385, 500]


@pytest.fixture
def threads():
    """Run with 2 torch threads (work split over threads), restored afterwards."""
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    yield 2
    torch.set_num_threads(old)


@pytest.fixture
def native_only(monkeypatch):
    monkeypatch.setattr(_decode_native, "_SERIAL_WORK", 0)

    def no_blas(*args, **kwargs):
        raise AssertionError("the native kernel declined these arguments")

    monkeypatch.setattr(_decode_cpu, "_blas_decode", no_blas)


def test_work_split(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert _decode_native.work_split(8, 2, 500) == (2, 1)   # 8 items: no split
    assert _decode_native.work_split(3, 2, 500) == (2, 2)   # 3 splits of >= 128: even shares
    assert _decode_native.work_split(2, 2, 200) == (2, 1)   # too short to split
    # one sequence: one split per thread, of >= 64 positions
    assert _decode_native.work_split(1, 2, 600) == (2, 2)
    assert _decode_native.work_split(1, 2, 128) == (2, 2)
    assert _decode_native.work_split(1, 8, 100) == (2, 1)   # too short to split
    assert _decode_native.work_split(1, 2, 100) == (1, 1)   # little work: one thread
    monkeypatch.setattr(torch, "get_num_threads", lambda: 16)
    assert _decode_native.work_split(1, 2, 600) == (16, 9)  # 9 splits of >= 64 positions
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert _decode_native.work_split(1, 2, 5000) == (1, 1)  # one thread: never split


@needs_cc
@pytest.mark.parametrize("nkv", [1, 2, 4])
@pytest.mark.parametrize("block", [None, 16], ids=["dense", "paged16"])
@pytest.mark.parametrize("splits", [1, 3], ids=["whole", "split3"])
def test_lengths_around_the_chunks(native_only, threads, monkeypatch, nkv, block, splits):
    """Every length of LENGTHS in one batch (row 1 has length 0), windows whole or in 3 splits
    (some of them empty)."""
    monkeypatch.setattr(_decode_native, "work_split", lambda batch, nkv, window: (2, splits))
    g = torch.Generator().manual_seed(nkv * 31 + (block or 0) + splits)
    batch, heads, seq, dim = len(LENGTHS), 8, 520, 64
    q = torch.randn(batch, heads, dim, generator=g)
    k = torch.randn(batch, nkv, seq, dim, generator=g) * 2
    v = torch.randn(batch, nkv, seq, dim, generator=g)
    table = None
    if block is not None:
        k, table = paged(k, block, g)
        v = to_blocks(v, block, table)
    out = _check(q, k, v, lengths=torch.tensor(LENGTHS), scale=dim ** -0.5, block_table=table)
    assert torch.all(out[1] == 0)


@needs_cc
@pytest.mark.parametrize("batch", [1, 2, 5])
def test_split_windows_with_a_mask_and_starts(native_only, threads, monkeypatch, batch):
    """Few sequences: windows split into several items, each over all kv heads."""
    monkeypatch.setattr(_decode_native, "MIN_SPLIT", 32)
    monkeypatch.setattr(_decode_native, "MIN_SPLIT_ONE", 32)
    g = torch.Generator().manual_seed(batch)
    heads, nkv, seq, dim = 12, 4, 700, 32
    q = torch.randn(batch, heads, dim, generator=g)
    k = torch.randn(batch, nkv, seq, dim, generator=g)
    v = torch.randn(batch, nkv, seq, dim, generator=g)
    mask = torch.rand(batch, seq, generator=g) < 0.3
    lengths = torch.tensor([700, 333, 1, 64, 129][:batch])
    start = torch.tensor([0, 300, 600, 5, 71][:batch])
    _check(q, k, v, lengths=lengths, kv_start=start, scale=0.2, mask=mask)


@pytest.fixture
def launch():
    from torchair.ops.attention.cpu import launch_fakes, launch_library

    if not launch_library.available():
        pytest.skip("needs the launch kernels (a C and a C++ compiler)")
    return launch_fakes.ifa_decode(), launch_library.LAYOUTS


@pytest.mark.parametrize("layout", ["BSH", "BNSD"])
@pytest.mark.parametrize("nkv", [1, 2, 4])
@pytest.mark.parametrize("lengths", [[500], [130], [60], [500, 0, 1, 193, 256, 97, 512, 300]],
                         ids=["1x500", "1x130", "1x60", "8"])
def test_launch_kernel_split(launch, threads, layout, nkv, lengths):
    """The launch kernel's C++ work split gives the Python path's bits (the general op, its
    fast path off: ``native.work_split``), the twin's (which runs the launch kernel too), the
    reference's values, and the same bits run to run. Batch 1 around the thresholds: one
    thread, or one split per thread (1x130 with 2 kv heads or more)."""
    op, layouts = launch
    heads, seq, dim = 8, 512, 64
    batch = len(lengths)
    g = torch.Generator().manual_seed(nkv + batch + lengths[0])
    q = torch.randn(batch, heads, 1, dim, generator=g)
    k = torch.randn(batch, nkv, seq, dim, generator=g)
    v = torch.randn(batch, nkv, seq, dim, generator=g)
    if layout == "BSH":
        q, k, v = (t.transpose(1, 2).reshape(batch, t.shape[2], -1) for t in (q, k, v))
    lt = torch.tensor(lengths)
    out = op(q, k, v, lt, None, None, heads, nkv, layouts[layout], 0, 0.125, False)
    again = op(q, k, v, lt, None, None, heads, nkv, layouts[layout], 0, 0.125, False)
    assert torch.equal(out, again)
    twin = torch.ops.npu.npu_incre_flash_attention_tensor(
        q, k, v, actual_seq_lengths=lt, num_heads=heads, num_key_value_heads=nkv,
        input_layout=layout, scale_value=0.125)
    assert torch.equal(out, twin)
    with ifa_fast.disabled():
        general = torch.ops.npu.npu_incre_flash_attention(
            q, k, v, actual_seq_lengths=lengths, num_heads=heads, num_key_value_heads=nkv,
            input_layout=layout, scale_value=0.125)
    assert torch.equal(out, general)
    ref = incre_flash_attention_reference(q, k, v, actual_seq_lengths=lengths, num_heads=heads,
                                          num_key_value_heads=nkv, input_layout=layout,
                                          scale_value=0.125)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
