"""Masked KV positions never reach the result; bad block ids and negative lengths raise.

Every KV position a sequence does not attend (past its length, outside its left-padded window,
masked by atten_mask, in blocks no sequence uses) is filled with NaN or +inf, in K and V (and in
pse_shift); each path must give the reference's result on the same caches with those positions
zeroed. Block ids of columns a sequence reads must be blocks of the cache (ValueError naming
``block_table[b, c]``), in eager and in a compiled static unit; ids of unused columns may be
anything. Negative ``actual_seq_lengths`` raise the same ValueError in eager and compiled.
"""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend

import torchair
from torchair.ops.attention.cpu import decode as _decode_cpu, native as _decode_native
from torchair.ops.attention.cpu.decode import decode_attention_cpu
from torchair.ops.attention.decode import decode_attention_reference
from torchair.runtime.units import capture_mode

IFA = torch.ops.npu.npu_incre_flash_attention
FIA = torch.ops.npu.npu_fused_infer_attention_score
POISONS = [float("nan"), float("inf")]
B, N, N_KV, D, BS = 3, 4, 2, 16, 16


def _poison(clean: torch.Tensor, keep: torch.Tensor, value: float) -> torch.Tensor:
    """``clean`` [B, Nkv, S, D] with ``value`` at every position ``keep`` [B, S] drops."""
    return clean.masked_fill(~keep[:, None, :, None], value)


def _zeroed(clean: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return _poison(clean, keep, 0.0)


def _page(dense: torch.Tensor, window: torch.Tensor, value: float, spare: int = 2):
    """``(blocks, table)``: the blocks of the columns each sequence's ``window`` [B, S] reads,
    shuffled, every other block and slot ``value``; columns outside the window hold -1."""
    batch, nkv, seq, dim = dense.shape
    cols = seq // BS
    used = window.reshape(batch, cols, BS).any(-1)  # [B, cols]
    g = torch.Generator().manual_seed(3)
    count = int(used.sum())
    order = torch.randperm(count + spare, generator=g)[:count]
    table = torch.full((batch, cols), -1, dtype=torch.int32)
    table[used] = order.to(torch.int32)
    blocks = torch.full((count + spare, nkv, BS, dim), value, dtype=dense.dtype)
    chunks = dense.reshape(batch, nkv, cols, BS, dim).permute(0, 2, 1, 3, 4)  # [B, cols, ...]
    blocks[table[used].long()] = chunks[used]
    return blocks, table


def _canonical(seq=64, dtype=torch.float32, left=False, masked=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, N, D, generator=g).to(dtype)
    k = torch.randn(B, N_KV, seq, D, generator=g).to(dtype)
    v = torch.randn(B, N_KV, seq, D, generator=g).to(dtype)
    lengths = torch.tensor([seq - 7, 18, 1])
    start = torch.tensor([3, seq - 18 - 5, 40]) if left else None
    pos = torch.arange(seq)[None]
    first = start[:, None] if left else 0
    keep = window = (pos >= first) & (pos < first + lengths[:, None])
    mask = None
    if masked:
        mask = torch.rand(B, seq, generator=g) < 0.3
        mask[2] = False
        keep = keep & ~mask
    return q, k, v, lengths, start, mask, keep, window


def _blas(q, k, v, **kw):
    """decode_attention_cpu with the native kernel declined (the BLAS path)."""
    return decode_attention_cpu(q, k, v, **kw)


@pytest.fixture
def no_native(monkeypatch):
    monkeypatch.setattr(_decode_native, "decode", lambda *a, **k: None)
    monkeypatch.setattr(_decode_cpu, "CHUNK_SIZE", 16)  # several chunks, partial ones too


@pytest.fixture
def native_only(monkeypatch):
    if not _decode_native.available():
        pytest.skip("the native decode kernel is not available (no C compiler)")
    monkeypatch.setattr(_decode_native, "MIN_SPLIT", 16)
    monkeypatch.setattr(_decode_native, "MIN_SPLIT_ONE", 16)
    monkeypatch.setattr(_decode_native, "_SERIAL_WORK", 0)

    def no_blas(*a, **k):
        raise AssertionError("the BLAS path ran; the native kernel should have")
    monkeypatch.setattr(_decode_cpu, "_blas_decode", no_blas)


_KERNELS = {"reference": (decode_attention_reference, None), "blas": (_blas, "no_native"),
            "native": (decode_attention_cpu, "native_only")}


@pytest.mark.parametrize("value", POISONS, ids=["nan", "inf"])
@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
@pytest.mark.parametrize("left,masked", [(False, False), (True, False), (False, True),
                                         (True, True)], ids=["right", "left", "mask", "left-mask"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("kernel", list(_KERNELS))
def test_canonical_decode_ignores_masked_garbage(kernel, dtype, left, masked, paged, value,
                                                 request):
    fn, fixture = _KERNELS[kernel]
    if fixture:
        request.getfixturevalue(fixture)
    q, k, v, lengths, start, mask, keep, window = _canonical(dtype=dtype, left=left,
                                                             masked=masked)
    kw = dict(lengths=lengths, scale=0.25, kv_start=start, mask=mask)
    expected = decode_attention_reference(q, _zeroed(k, keep), _zeroed(v, keep), **kw)
    kp, vp = _poison(k, keep, value), _poison(v, keep, value)
    if paged:
        kp, table = _page(kp, window, value)
        vp, _ = _page(vp, window, value)
        kw["block_table"] = table
    out = fn(q, kp, vp, **kw)
    assert torch.isfinite(out.float()).all()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), expected.float(), atol=tol, rtol=tol)


# ------------------------------------------------------------------------------ IFA / FIA


def _bnsd(s_q=1, seq=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, N, s_q, D, generator=g), torch.randn(B, N_KV, seq, D, generator=g),
            torch.randn(B, N_KV, seq, D, generator=g))


def _ifa_case(s_q, left, masked, seq=64):
    q, k, v = _bnsd(s_q, seq)
    lens = [seq - 7, 18, 1]
    pos = torch.arange(seq)[None]
    kw = dict(num_heads=N, num_key_value_heads=N_KV, input_layout="BNSD", scale_value=0.25,
              actual_seq_lengths=lens)
    if left:
        pad = torch.tensor([0, 9, 30])
        end = seq - pad
        window = (pos < end[:, None]) & (pos >= (end - torch.tensor(lens))[:, None])
        kw["kv_padding_size"] = pad
    else:
        window = pos < torch.tensor(lens)[:, None]
    keep = window
    if masked:
        mask = torch.rand(B, seq, generator=torch.Generator().manual_seed(4)) < 0.3
        mask[2] = False
        kw["atten_mask"] = mask.view(B, 1, 1, seq) if s_q == 1 else mask.view(B, 1, seq)
        keep = keep & ~mask
    return q, k, v, kw, keep, window


def _to_bsh_paged(kp, window, value):
    """Paged (blocknum, block_size, H) cache of a BNSD dense cache, unused columns -1."""
    blocks, table = _page(kp, window, value)
    nb = blocks.shape[0]
    return blocks.permute(0, 2, 1, 3).reshape(nb, BS, N_KV * D), table


@pytest.mark.parametrize("value", POISONS, ids=["nan", "inf"])
@pytest.mark.parametrize("s_q,pse", [(1, False), (3, False), (1, True)],
                         ids=["decode", "multirow", "pse"])
@pytest.mark.parametrize("left,masked", [(False, False), (True, True)], ids=["right", "left-mask"])
@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
def test_ifa_ignores_masked_garbage(s_q, pse, left, masked, paged, value):
    q, k, v, kw, keep, window = _ifa_case(s_q, left, masked)
    clean = dict(kw)
    if pse:
        bias = torch.randn(B, N, 1, k.shape[2])
        clean["pse_shift"] = bias.masked_fill(~keep[:, None, None, :], 0.0)
        kw["pse_shift"] = bias.masked_fill(~keep[:, None, None, :], value)
    expected = IFA(q, _zeroed(k, keep), _zeroed(v, keep), **clean)
    kp, vp = _poison(k, keep, value), _poison(v, keep, value)
    if paged:
        kp, table = _to_bsh_paged(kp, window, value)
        vp, _ = _to_bsh_paged(vp, window, value)
        q = q.transpose(1, 2).reshape(B, s_q, N * D)
        kw.update(block_table=table, block_size=BS, input_layout="BSH")
        if "atten_mask" in kw and s_q == 1:
            kw["atten_mask"] = kw["atten_mask"].view(B, -1)
        expected = expected.transpose(1, 2).reshape(B, s_q, N * D)
    out = IFA(q, kp, vp, **kw)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("value", POISONS, ids=["nan", "inf"])
@pytest.mark.parametrize("s_q", [1, 4], ids=["decode", "prompt"])
@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
def test_fia_ignores_masked_garbage(s_q, paged, value):
    q, k, v, kw, keep, window = _ifa_case(s_q, left=True, masked=False)
    fkw = dict(num_heads=N, num_key_value_heads=N_KV, input_layout="BNSD", scale=0.25,
               actual_seq_lengths_kv=kw["actual_seq_lengths"],
               kv_padding_size=kw["kv_padding_size"], softmax_lse_flag=s_q > 1)
    expected, lse = FIA(q, _zeroed(k, keep), _zeroed(v, keep), **fkw)
    kp, vp = _poison(k, keep, value), _poison(v, keep, value)
    if paged:
        kp, table = _page(kp, window, value)
        vp, _ = _page(vp, window, value)
        fkw.update(block_table=table, block_size=BS)
    out, out_lse = FIA(q, kp, vp, **fkw)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_lse, lse, atol=1e-5, rtol=1e-5)


def test_reference_equals_independent_formula_on_clean_rows():
    """The reference itself (on clean caches) against softmax(q k^T) v per row, float64."""
    q, k, v, lengths, start, mask, keep, _ = _canonical(left=True, masked=True)
    out = decode_attention_reference(q, _poison(k, keep, float("nan")),
                                      _poison(v, keep, float("nan")), lengths=lengths, scale=0.25,
                                      kv_start=start, mask=mask)
    for b in range(B):
        idx = keep[b].nonzero().flatten()
        for h in range(N):
            kk, vv = k[b, h // 2, idx].double(), v[b, h // 2, idx].double()
            w = torch.softmax(q[b, h].double() @ kk.T * 0.25, -1)
            torch.testing.assert_close(out[b, h].double(), w @ vv, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------ block ids


def _paged_ifa(bad_value=None, unused=-1):
    """A paged IFA call: (args, kwargs); batch 1 reads columns 0 and 1, batch 0 column 0 only."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 1, N * D, generator=g)
    blocks = torch.randn(5, BS, N_KV * D, generator=g)
    table = torch.tensor([[0, unused], [1, 2]], dtype=torch.int32)
    if bad_value is not None:
        table[1, 1] = bad_value
    kw = dict(num_heads=N, num_key_value_heads=N_KV, input_layout="BSH", block_size=BS,
              block_table=table, actual_seq_lengths=[10, 20], scale_value=0.25)
    return (q, blocks, blocks.clone()), kw


@pytest.mark.parametrize("bad", [5, 1000, -1, -7], ids=["num_blocks", "far", "minus1", "neg"])
def test_bad_block_id_raises_in_eager(bad):
    args, kw = _paged_ifa(bad)
    with pytest.raises(ValueError, match=rf"npu_incre_flash_attention: block_table\[1, 1\] = "
                                         rf"{bad} is not a block"):
        IFA(*args, **kw)
    kw["actual_seq_lengths"] = torch.tensor(kw["actual_seq_lengths"])  # the twin
    with pytest.raises(ValueError, match=r"block_table\[1, 1\]"):
        torch.ops.npu.npu_incre_flash_attention_tensor(*args, **kw)
    fkw = dict(num_heads=N, num_key_value_heads=N_KV, input_layout="BSH", block_size=BS,
               block_table=kw["block_table"], actual_seq_lengths_kv=[10, 20])
    with pytest.raises(ValueError, match=r"npu_fused_infer_attention_score: block_table\[1, 1\]"):
        FIA(*args, **fkw)
    with pytest.raises(ValueError, match=r"npu_fused_infer_attention_score: block_table\[1, 1\]"):
        FIA(args[0].view(2, 1, N * D).expand(2, 2, N * D).contiguous(), *args[1:], **fkw)


@pytest.mark.parametrize("fn", [decode_attention_reference, decode_attention_cpu],
                         ids=["reference", "cpu"])
def test_bad_block_id_raises_in_canonical_kernels(fn):
    q = torch.randn(2, N, D)
    blocks = torch.randn(5, N_KV, BS, D)
    table = torch.tensor([[0, -1], [1, 9]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"block_table\[1, 1\] = 9 is not a block"):
        fn(q, blocks, blocks, lengths=torch.tensor([10, 20]), scale=0.25, block_table=table)


@pytest.mark.parametrize("unused", [-1, 1000], ids=["minus1", "stale"])
def test_unused_columns_may_hold_anything(unused):
    args, kw = _paged_ifa(unused=unused)
    out = IFA(*args, **kw)
    kw["block_table"] = torch.tensor([[0, 4], [1, 2]], dtype=torch.int32)
    torch.testing.assert_close(out, IFA(*args, **kw), atol=0, rtol=0)


# ------------------------------------------------------------------------------ compiled (path 4)


class _Paged(torch.nn.Module):
    def forward(self, q, kc, vc, table, lens):
        out = IFA(q, kc, vc, actual_seq_lengths=lens, block_table=table, block_size=BS,
                  num_heads=N, num_key_value_heads=N_KV, input_layout="BSH", scale_value=0.25)
        return out * 2


def _compiled(run_eagerly=True):
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = run_eagerly
    config.experimental_config.tiling_schedule_optimize = True
    backend = CompileCounterWithBackend(torchair.get_npu_backend(compiler_config=config))
    return torch.compile(_Paged(), backend=backend, dynamic=True, fullgraph=True), backend


def _run_static(compiled, args, lens):
    for t in args:
        torch._dynamo.mark_static(t)
    with torch.no_grad():
        return compiled(*args, lens)


def _check_compiled(compiled, backend):
    (q, kc, vc), kw = _paged_ifa()
    good = kw["block_table"]
    ref = IFA(q, kc, vc, **kw) * 2
    torch.testing.assert_close(_run_static(compiled, (q, kc, vc, good), [10, 20]), ref)
    report = torchair.graph_reports()[-1]
    assert report.path == 4 and report.build_static, str(report)
    from torchair.ops.attention.cpu import launch_library as _launch
    from torchair.runtime.units import default_capture

    # on CPU without a capture the unit calls the C++ launch kernel: it raises the errors below
    bound = default_capture(q.device) is None and _launch.available()
    assert report.launch_kernels == (1 if bound else 0), str(report)
    for bad in (5, -3):
        table = good.clone()
        table[1, 1] = bad
        with pytest.raises(ValueError, match=rf"block_table\[1, 1\] = {bad} is not a block"):
            _run_static(compiled, (q, kc, vc, table), [10, 20])
    with pytest.raises(ValueError, match=r"npu_incre_flash_attention: actual_seq_lengths\[1\]=-1 "
                                         r"must be >= 0"):
        _run_static(compiled, (q, kc, vc, good), [10, -1])
    # -1 in an unused column (batch 0 reads column 0 only) is still accepted
    torch.testing.assert_close(_run_static(compiled, (q, kc, vc, good), [10, 20]), ref)
    assert backend.frame_count == 1


@pytest.mark.parametrize("capture", [None, "emulate"], ids=["no-capture", "emulated-capture"])
def test_compiled_static_unit_raises_like_eager(capture):
    compiled, backend = _compiled()
    if capture is None:
        _check_compiled(compiled, backend)
    else:
        with capture_mode(capture):
            _check_compiled(compiled, backend)


@pytest.mark.inductor
def test_compiled_static_unit_raises_like_eager_inductor():
    compiled, backend = _compiled(run_eagerly=False)
    _check_compiled(compiled, backend)


def test_negative_lengths_raise_in_eager():
    q, k, v = _bnsd()
    kw = dict(num_heads=N, num_key_value_heads=N_KV, input_layout="BNSD")
    msg = r"npu_incre_flash_attention: actual_seq_lengths\[1\]=-1 must be >= 0"
    with pytest.raises(ValueError, match=msg):
        IFA(q, k, v, actual_seq_lengths=[3, -1, 2], **kw)
    with pytest.raises(ValueError, match=msg):
        torch.ops.npu.npu_incre_flash_attention_tensor(
            q, k, v, actual_seq_lengths=torch.tensor([3, -1, 2]), **kw)
    fmsg = r"npu_fused_infer_attention_score: actual_seq_lengths_kv\[1\]=-1 must be >= 0"
    with pytest.raises(ValueError, match=fmsg):
        FIA(q, k, v, actual_seq_lengths_kv=[3, -1, 2], **kw)
    with pytest.raises(ValueError, match=fmsg):
        torch.ops.npu.npu_fused_infer_attention_score_tensor(
            q, k, v, actual_seq_lengths_kv=torch.tensor([3, -1, 2]), **kw)
