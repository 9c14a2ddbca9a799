"""The eager fast path of npu_incre_flash_attention (torchair/ops/attention/ifa_fast.py): for every
signature it takes, bit-identical to the general path (the same kernel and work split), the
same ValueErrors for bad lengths and block ids, never stale when a stride, dtype or shape
changes, and off when the native kernel is disabled. Every test runs twice: through the C++
launch kernel (torchair/ops/attention/cpu/launch_library.py) and through the ctypes call (no C++
compiler)."""
import pytest
import torch

from tests.ops._paging import paged
from torchair.ops.attention import ifa_checks as _ifa_checks, ifa_fast as _ifa_fast
from torchair.ops.attention.cpu import launch_library as _launch, native as _decode_native
from torchair.ops.attention.incre_flash_attention import incre_flash_attention_reference
from torchair.ops.toolchain import native as _native

pytestmark = pytest.mark.skipif(not _decode_native.available(),
                                reason="needs the native kernel (a C compiler)")
IFA = torch.ops.npu.npu_incre_flash_attention
TWIN = torch.ops.npu.npu_incre_flash_attention_tensor


@pytest.fixture(autouse=True, params=["launch", "ctypes"])
def route(request, monkeypatch):
    """Which call the bound fast path makes."""
    if request.param == "ctypes":
        monkeypatch.setattr(_launch, "available", lambda: False)
    elif not _launch.available():
        pytest.skip("the C++ launch kernel is not available (no C++ compiler)")
    _ifa_fast.clear()
    yield request.param
    _ifa_fast.clear()


def _general(fn, *args, **kwargs):
    """The op through the general path."""
    with _ifa_fast.disabled():
        return fn(*args, **kwargs)


def _case(layout, dtype, batch=3, heads=8, nkv=2, dim=64, seq=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, 1, dim, generator=g).to(dtype)
    k = torch.randn(batch, nkv, seq, dim, generator=g).to(dtype)
    v = torch.randn(batch, nkv, seq, dim, generator=g).to(dtype)
    if layout == "BSH":
        return (q.transpose(1, 2).reshape(batch, 1, heads * dim),
                k.transpose(1, 2).reshape(batch, seq, nkv * dim),
                v.transpose(1, 2).reshape(batch, seq, nkv * dim))
    if layout == "BSND":
        return q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(), \
            v.transpose(1, 2).contiguous()
    return q, k, v


@pytest.mark.parametrize("layout", ["BSH", "BNSD", "BSND"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("lengths", [[40, 7, 0], [13], None, [99, 1, 40]],
                         ids=["mixed", "shared", "none", "past-end"])
def test_bit_identical_to_the_general_path(layout, dtype, lengths):
    q, k, v = _case(layout, dtype)
    kw = dict(actual_seq_lengths=lengths, num_heads=8, num_key_value_heads=2,
              scale_value=0.125, input_layout=layout)
    _ifa_fast.clear()
    for _ in range(2):  # the first call binds, the second runs bound
        fast = IFA(q, k, v, **kw)
        assert fast.shape == q.shape and fast.dtype == dtype
        assert torch.equal(fast, _general(IFA, q, k, v, **kw))
    ref = incre_flash_attention_reference(q, k, v, **kw)
    torch.testing.assert_close(fast.float(), ref.float(), atol=2e-2 if dtype != torch.float32
                               else 1e-5, rtol=1e-2 if dtype != torch.float32 else 1e-5)


@pytest.mark.parametrize("cache", ["paged3", "paged4"])
def test_paged_and_twin_bit_identical(cache):
    g = torch.Generator().manual_seed(1)
    q, k, v = _case("BNSD", torch.float32, seq=64)
    kb, table = paged(k, 16, g)
    vb = paged(v, 16, torch.Generator().manual_seed(1))[0]
    assert torch.equal(paged(v, 16, torch.Generator().manual_seed(1))[1], table)
    layout = "BNSD"
    if cache == "paged3":  # (blocknum, blocksize, H)
        kb = kb.permute(0, 2, 1, 3).reshape(kb.shape[0], 16, -1)
        vb = vb.permute(0, 2, 1, 3).reshape(vb.shape[0], 16, -1)
        q = q.transpose(1, 2).reshape(3, 1, -1)
        layout = "BSH"
    lengths = [64, 17, 33]
    kw = dict(num_heads=8, num_key_value_heads=2, scale_value=0.125, input_layout=layout,
              block_table=table, block_size=16)
    for _ in range(2):
        out = IFA(q, kb, vb, actual_seq_lengths=lengths, **kw)
        assert torch.equal(out, _general(IFA, q, kb, vb, actual_seq_lengths=lengths, **kw))
        twin = TWIN(q, kb, vb, actual_seq_lengths=torch.tensor(lengths), **kw)
        assert torch.equal(twin, out)
    ref = incre_flash_attention_reference(q, kb, vb, actual_seq_lengths=lengths, **kw)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_validation_runs_once_per_signature_and_never_goes_stale(monkeypatch):
    calls = []
    real = _ifa_checks.validate
    monkeypatch.setattr(_ifa_checks, "validate", lambda *a, **k: calls.append(1) or real(*a, **k))
    _ifa_fast.clear()
    q, k, v = _case("BNSD", torch.float32)
    kw = dict(actual_seq_lengths=[40, 20, 10], num_heads=8, num_key_value_heads=2,
              scale_value=0.125, input_layout="BNSD")
    for _ in range(3):
        IFA(q, k, v, **kw)
    assert len(calls) == 1  # bound once, then only pointers and lengths
    # another stride of the same shape: a new signature, the right result
    k2 = k.transpose(2, 3).contiguous().transpose(2, 3)  # [B, N, S, D] with S innermost
    out = IFA(q, k2, v, **kw)  # not the kernel's layout: the general path (BLAS) runs
    assert torch.equal(out, _general(IFA, q, k2, v, **kw))
    torch.testing.assert_close(out, incre_flash_attention_reference(q, k, v, **kw), atol=1e-5,
                               rtol=1e-5)
    # a sliced (offset) cache view: data pointers move, strides stay
    big_k = torch.cat([torch.randn_like(k), k], 2)[:, :, 40:]
    big_v = torch.cat([torch.randn_like(v), v], 2)[:, :, 40:]
    assert torch.equal(IFA(q, big_k, big_v, **kw), _general(IFA, q, k, v, **kw))
    # a non-contiguous query (copied to float32 per call)
    qt = q.transpose(0, 1).contiguous().transpose(0, 1)
    assert torch.equal(IFA(qt, k, v, **kw), _general(IFA, q, k, v, **kw))


def test_bad_values_raise_as_the_general_path():
    q, k, v = _case("BNSD", torch.float32)
    kw = dict(num_heads=8, num_key_value_heads=2, scale_value=0.125, input_layout="BNSD")
    IFA(q, k, v, actual_seq_lengths=[1, 2, 3], **kw)  # bound
    for bad in ([5, -1, 3], torch.tensor([5, -1, 3])):
        with pytest.raises(ValueError, match=r"actual_seq_lengths\[1\]=-1 must be >= 0"):
            (TWIN if isinstance(bad, torch.Tensor) else IFA)(q, k, v, actual_seq_lengths=bad,
                                                               **kw)
    with pytest.raises(ValueError, match="has 2 entries; expected B=3"):
        IFA(q, k, v, actual_seq_lengths=[1, 2], **kw)


def test_bad_block_ids_raise_naming_the_entry_and_unused_columns_may_hold_anything():
    q, k, v = _case("BNSD", torch.float32, seq=64)
    kb, table = paged(k, 16, torch.Generator().manual_seed(2))
    vb = paged(v, 16, torch.Generator().manual_seed(2))[0]
    kw = dict(num_heads=8, num_key_value_heads=2, scale_value=0.125, input_layout="BNSD",
              block_table=table, block_size=16)
    lengths = [64, 17, 16]
    good = IFA(q, kb, vb, actual_seq_lengths=lengths, **kw)
    loose = table.clone()
    loose[2, 1:] = -1  # sequence 2 reads one block: its other columns are unused
    loose[1, 2:] = 10**6
    assert torch.equal(IFA(q, kb, vb, actual_seq_lengths=lengths, **{**kw, "block_table": loose}),
                       good)
    for value in (-1, kb.shape[0]):
        bad = table.clone()
        bad[1, 1] = value  # sequence 1 reads columns 0 and 1
        for fn in (IFA, lambda *a, **k: _general(IFA, *a, **k)):
            with pytest.raises(ValueError, match=rf"block_table\[1, 1\] = {value} is not a "
                                                 rf"block of the KV cache"):
                fn(q, kb, vb, actual_seq_lengths=lengths, **{**kw, "block_table": bad})
    wide = {**kw, "block_table": table.repeat(1, 2)}  # 8 columns, ids all valid
    for fn in (IFA, lambda *a, **k: _general(IFA, *a, **k)):  # 3 x 8 blocks > the cache's 15
        with pytest.raises(ValueError, match="blocknum 15 must be >= the blocks needed"):
            fn(q, kb, vb, actual_seq_lengths=[128, 128, 128], **wide)


def test_off_when_native_kernels_are_disabled(monkeypatch):
    q, k, v = _case("BNSD", torch.float32)
    kw = dict(actual_seq_lengths=[40, 20, 10], num_heads=8, num_key_value_heads=2,
              scale_value=0.125, input_layout="BNSD")
    IFA(q, k, v, **kw)
    monkeypatch.setenv(_native.ENV_DISABLE, "0")
    assert _ifa_fast.call(q, k, v, [40, 20, 10], None, 8, 0.125, "BNSD", 2, 0) is None
    torch.testing.assert_close(IFA(q, k, v, **kw), incre_flash_attention_reference(q, k, v, **kw),
                               atol=1e-5, rtol=1e-5)
