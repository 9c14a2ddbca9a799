"""The CPU decode kernel (``torchair.ops.attention.cpu.decode``) against
``decode_attention_reference``."""

import pytest
import torch
from _decode_check import TOL, check_cpu_kernel as _check
from _paging import paged, to_blocks

import torchair.ops  # noqa: F401  (registers the kernels)
from torchair.ops.attention import decode as _decode
from torchair.ops.attention.cpu import decode as _decode_cpu
from torchair.ops.attention.cpu.decode import decode_attention_cpu
from torchair.ops.attention.decode import decode_attention, decode_attention_reference


@pytest.fixture(params=[None, 8], ids=["auto-chunk", "chunk8"])
def chunk(request, monkeypatch):
    """The automatic chunk size (one chunk at these sizes) and 8 positions (many chunks)."""
    monkeypatch.setattr(_decode_cpu, "CHUNK_SIZE", request.param)
    return request.param


@pytest.mark.parametrize("heads,nkv", [(4, 4), (4, 2), (4, 1), (8, 1)])
@pytest.mark.parametrize("block", [None, 4, 16], ids=["contiguous", "paged4", "paged16"])
@pytest.mark.parametrize("left_pad", [False, True], ids=["nopad", "leftpad"])
@pytest.mark.parametrize("with_mask", [False, True], ids=["nomask", "mask"])
def test_grid_fp32(chunk, heads, nkv, block, left_pad, with_mask):
    g = torch.Generator().manual_seed(heads * 31 + nkv + (block or 0) + 2 * left_pad)
    batch, seq, dim = 4, 37, 8
    q = torch.randn(batch, heads, dim, generator=g)
    k = torch.randn(batch, nkv, seq, dim, generator=g)
    v = torch.randn(batch, nkv, seq, dim, generator=g)
    lengths = torch.tensor([5, seq, 0, 20])
    start = torch.tensor([3, 0, 2, 17]) if left_pad else None
    table = None
    if block is not None:
        k, table = paged(k, block, g)
        v = to_blocks(v, block, table)
    logical = seq if block is None else table.shape[1] * block  # mask covers [0, S)
    mask = (torch.rand(batch, logical, generator=g) < 0.3) if with_mask else None
    out = _check(q, k, v, lengths=lengths, scale=0.4, kv_start=start, block_table=table,
                 mask=mask)
    assert torch.all(out[2] == 0)  # nothing attended: zeros


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block", [None, 16], ids=["contiguous", "paged16"])
def test_dtypes(chunk, dtype, block):
    g = torch.Generator().manual_seed(11)
    batch, heads, nkv, seq, dim = 3, 8, 2, 50, 16
    q = torch.randn(batch, heads, dim, generator=g).to(dtype)
    k = torch.randn(batch, nkv, seq, dim, generator=g).to(dtype)
    v = torch.randn(batch, nkv, seq, dim, generator=g).to(dtype)
    lengths, start = torch.tensor([50, 1, 23]), torch.tensor([0, 49, 9])
    table = None
    if block is not None:
        k, table = paged(k, block, g)
        v = to_blocks(v, block, table)
    logical = seq if block is None else table.shape[1] * block
    mask = torch.rand(batch, logical, generator=g) < 0.2
    _check(q, k, v, lengths=lengths, scale=0.25, kv_start=start, block_table=table, mask=mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block", [None, 32], ids=["contiguous", "paged32"])
@pytest.mark.parametrize("parts", ["both", "scale-only", "k-only"])
def test_int8_antiquant(chunk, dtype, block, parts):
    g = torch.Generator().manual_seed(5)
    batch, heads, nkv, seq, dim = 3, 8, 2, 40, 16
    q = torch.randn(batch, heads, dim, generator=g).to(dtype)
    k8 = torch.randint(-128, 128, (batch, nkv, seq, dim), generator=g, dtype=torch.int8)
    v8 = torch.randint(-128, 128, (batch, nkv, seq, dim), generator=g, dtype=torch.int8)
    ks, ko = torch.rand(nkv, dim, generator=g) / 50, torch.randn(nkv, dim, generator=g)
    vs, vo = torch.rand(nkv, dim, generator=g) / 50, torch.randn(nkv, dim, generator=g)
    quant = {"k_scale": ks, "k_offset": ko, "v_scale": vs, "v_offset": vo}
    if parts == "scale-only":
        quant = {"k_scale": ks, "v_scale": vs}
    elif parts == "k-only":
        quant = {"k_scale": ks, "k_offset": ko}  # v: plain int8 values, no antiquant
    lengths, start = torch.tensor([40, 0, 17]), torch.tensor([0, 5, 20])
    table = None
    if block is not None:
        k8, table = paged(k8, block, g)
        v8 = to_blocks(v8, block, table)
    out = _check(q, k8, v8, lengths=lengths, scale=0.3, kv_start=start, block_table=table,
                 **quant)
    assert torch.all(out[1] == 0)


@pytest.mark.parametrize("lengths,start", [([0, 0], None), ([3, 0], [50, 0]), ([4, 2], [-3, 1]),
                                           ([64, 64], None), ([70, 1], [0, 63])],
                         ids=["all-empty", "out-of-range", "negative-start", "full", "overrun"])
def test_lengths_edges(chunk, lengths, start):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 8, generator=g)
    k = torch.randn(2, 2, 64, 8, generator=g)
    v = torch.randn(2, 2, 64, 8, generator=g)
    _check(q, k, v, lengths=torch.tensor(lengths),
           kv_start=None if start is None else torch.tensor(start), scale=0.5)


def test_fully_masked_row_is_zero(chunk):
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 4, 8, generator=g)
    k = torch.randn(2, 1, 20, 8, generator=g)
    v = torch.randn(2, 1, 20, 8, generator=g)
    mask = torch.zeros(2, 20, dtype=torch.bool)
    mask[0] = True
    out = _check(q, k, v, lengths=torch.tensor([20, 20]), scale=0.5, mask=mask)
    assert torch.all(out[0] == 0)


@pytest.mark.parametrize("size", [1, 3, 8, 1000])
def test_chunk_boundaries(monkeypatch, size):
    """Chunk sizes that split / do not split the window, with a window not starting at 0."""
    monkeypatch.setattr(_decode_cpu, "CHUNK_SIZE", size)
    g = torch.Generator().manual_seed(size)
    q = torch.randn(3, 8, 16, generator=g)
    k = torch.randn(3, 2, 100, 16, generator=g) * 3
    v = torch.randn(3, 2, 100, 16, generator=g)
    _check(q, k, v, lengths=torch.tensor([30, 71, 9]), kv_start=torch.tensor([20, 29, 50]),
           scale=0.7)
    kb, table = paged(k, 4, g)
    vb = to_blocks(v, 4, table)
    _check(q, kb, vb, lengths=torch.tensor([30, 71, 9]), kv_start=torch.tensor([20, 29, 50]),
           scale=0.7, block_table=table)


def test_noncontiguous_cache_view(chunk):
    """A [B, S, Nkv, D] cache viewed as [B, Nkv, S, D] (BSND layout) needs no copy of the whole
    cache and gives the reference's result."""
    g = torch.Generator().manual_seed(9)
    q = torch.randn(2, 8, 16, generator=g).bfloat16()
    k = torch.randn(2, 30, 2, 16, generator=g).bfloat16().transpose(1, 2)
    v = torch.randn(2, 30, 2, 16, generator=g).bfloat16().transpose(1, 2)
    _check(q, k, v, lengths=torch.tensor([30, 12]), scale=0.25)
    _check(q.float(), k.float(), v.float(), lengths=torch.tensor([30, 12]), scale=0.25)


def test_dispatch_to_cpu_kernel(monkeypatch):
    assert _decode._kernels["cpu"] is decode_attention_cpu
    calls = []

    def spy(*args, **kwargs):
        calls.append(1)
        return decode_attention_cpu(*args, **kwargs)

    monkeypatch.setitem(_decode._kernels, "cpu", spy)
    q, k = torch.randn(1, 4, 8), torch.randn(1, 2, 5, 8)
    out = decode_attention(q, k, k, lengths=torch.tensor([5]), scale=0.5)
    assert calls == [1]
    torch.testing.assert_close(out, decode_attention_reference(q, k, k, lengths=torch.tensor([5]),
                                                               scale=0.5))


def test_registered_on_import():
    from torchair import ops
    assert ops.attention.cpu.decode is _decode_cpu
    with pytest.raises(RuntimeError, match="already registered"):
        _decode.register_decode_kernel("cpu")(decode_attention_cpu)


def test_auto_chunk_sizes(monkeypatch):
    """Automatic chunk: ~16 MiB of float32 K in place, ~4 MiB per float32 conversion buffer
    (converted dtypes), clamped, whole blocks when paged."""
    monkeypatch.setattr(_decode_cpu, "CHUNK_SIZE", None)
    pos = _decode_cpu._chunk_positions
    assert pos(32, 128, 1) == 1024
    assert pos(32, 128, 1, converted=True) == 256
    assert pos(4, 128, 1, converted=True) == 2048
    assert pos(10_000, 128, 1, converted=True) == 64
    assert pos(10_000, 128, 1) == 256
    assert pos(32, 128, 48, converted=True) == 240  # whole 48-position blocks
    assert pos(1, 128, 1) == 8192


def test_auto_chunk_converted_crosses_chunks(monkeypatch):
    """bf16 cache long enough for several automatic (converted) chunks, with ragged lengths."""
    monkeypatch.setattr(_decode_cpu, "_CONVERT_CHUNK_BYTES", 64 * 1024)  # 64 positions here
    monkeypatch.setattr(_decode_cpu, "CHUNK_SIZE", None)
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(2, 8, 64, generator=gen).bfloat16()
    k = torch.randn(2, 2, 300, 64, generator=gen).bfloat16()
    v = torch.randn(2, 2, 300, 64, generator=gen).bfloat16()
    lengths = torch.tensor([300, 131])
    out = decode_attention_cpu(q, k, v, lengths=lengths, scale=0.125)
    ref = decode_attention_reference(q, k, v, lengths=lengths, scale=0.125)
    torch.testing.assert_close(out.float(), ref.float(), **TOL[torch.bfloat16])
