"""npu_incre_flash_attention on parameter grids: reference and op vs the float64 oracle, twin == op.

Axes: layout x GQA x atten_mask x KV storage (dense, paged (blocknum, blocksize, H), paged
(blocknum, numKvHeads, blocksize, headDims)) x padding (all rows, right via actual_seq_lengths,
left via kv_padding_size) x int8 KV antiquant x int8 output x dtype.
"""
from __future__ import annotations

import itertools

import pytest
import torch
from test_ifa_oracle import D, N, build_case, check, expected, quantize

import torchair.ops  # noqa: F401 (registers the ops)
from torchair.ops.attention.incre_flash_attention import incre_flash_attention_reference

OP = torch.ops.npu.npu_incre_flash_attention
TWIN = torch.ops.npu.npu_incre_flash_attention_tensor
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The shapes are tiny: intra-op threads only add barrier waits (seconds on a loaded host)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _grid():
    for layout, n_kv, masked, kv, pad, antiquant, int8_out, dtype in itertools.product(
            ["BSH", "BNSD", "BSND"], [4, 1], [False, True], ["dense", "paged3", "paged4"],
            ["full", "right", "left"], [False, True], [False, True], DTYPES):
        if kv == "paged4" and layout != "BNSD":
            continue  # that cache layout is BNSD-only (tested as an error elsewhere)
        if kv != "dense" and pad == "full":
            continue  # page attention needs actual_seq_lengths
        yield pytest.param(layout, n_kv, masked, kv, pad, antiquant, int8_out, dtype,
                           id=f"{layout}-kv{n_kv}-{'mask' if masked else 'nomask'}-{kv}-{pad}"
                              f"-{'aq' if antiquant else 'fp'}-{'i8' if int8_out else 'out'}"
                              f"-{str(dtype)[6:]}")


def _twin_kwargs(kwargs):
    twin = dict(kwargs)
    if twin.get("actual_seq_lengths") is not None:
        twin["actual_seq_lengths"] = torch.tensor(twin["actual_seq_lengths"], dtype=torch.int64)
    return twin


@pytest.mark.parametrize("layout,n_kv,masked,kv,pad,antiquant,int8_out,dtype", _grid())
def test_grid(layout, n_kv, masked, kv, pad, antiquant, int8_out, dtype):
    case = build_case(layout, n_kv, dtype, masked=masked, kv=kv, pad=pad, antiquant=antiquant,
                      int8_out=int8_out)
    ref = incre_flash_attention_reference(*case.args, **case.kwargs)
    assert ref.shape == case.args[0].shape
    check(case, ref, dtype)
    out = OP(*case.args, **case.kwargs)  # decode path (decode_attention)
    check(case, out, dtype)
    twin = TWIN(*case.args, **_twin_kwargs(case.kwargs))
    torch.testing.assert_close(twin, out, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kv", ["dense", "paged3"])
@pytest.mark.parametrize("pse_batch", [3, 1])
@pytest.mark.parametrize("n_kv", [4, 2])
@pytest.mark.parametrize("layout", ["BSH", "BNSD", "BSND"])
def test_pse_shift(layout, n_kv, pse_batch, kv, dtype):
    case = build_case(layout, n_kv, dtype, masked=True, kv=kv, pse=pse_batch)
    check(case, incre_flash_attention_reference(*case.args, **case.kwargs), dtype)
    out = OP(*case.args, **case.kwargs)
    check(case, out, dtype)
    torch.testing.assert_close(TWIN(*case.args, **_twin_kwargs(case.kwargs)), out, atol=0, rtol=0)


@pytest.mark.parametrize("kv", ["dense", "paged3", "paged4"])
@pytest.mark.parametrize("pad", ["right", "left"])
@pytest.mark.parametrize("antiquant", [False, True])
def test_multi_row_query_general_path(kv, pad, antiquant):
    """S_q > 1 with a per-head, per-row mask and pse: the general (non-decode) path."""
    case = build_case("BNSD", 2, torch.float32, masked=True, mask_4d=True, kv=kv, pad=pad,
                      antiquant=antiquant, s_q=3, pse=3, int8_out=False)
    check(case, incre_flash_attention_reference(*case.args, **case.kwargs), torch.float32)
    check(case, OP(*case.args, **case.kwargs), torch.float32)


@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("per_channel", [True, False], ids=["per_channel", "per_tensor"])
@pytest.mark.parametrize("with_offset", [True, False], ids=["offset", "no_offset"])
def test_int8_output_scale_forms(per_channel, with_offset, scale_dtype):
    case = build_case("BSH", 2, torch.float16)
    qs = torch.linspace(20, 60, N * D) if per_channel else torch.full((1,), 50.0)
    qo = torch.linspace(-3, 3, qs.numel()).round() if with_offset else None
    qs, qo = qs.to(scale_dtype), None if qo is None else qo.to(scale_dtype)
    case.kwargs.update(quant_scale2=qs, quant_offset2=qo)
    case.want, case.int8_out = quantize(case.want, qs, qo), True
    check(case, incre_flash_attention_reference(*case.args, **case.kwargs), torch.int8)
    check(case, OP(*case.args, **case.kwargs), torch.int8)


def test_int8_output_saturates():
    case = build_case("BNSD", 2, torch.float32)
    qs = torch.full((1,), 1000.0)
    out = OP(*case.args, quant_scale2=qs, **case.kwargs)
    assert out.dtype == torch.int8
    assert out.max() == 127 and out.min() == -128


def test_block_table_garbage_past_needed_blocks_is_ignored():
    case = build_case("BNSD", 2, torch.float16, kv="paged4", pad="right")
    table = case.kwargs["block_table"].clone()
    table[1, 1:] = -1  # batch 1 has length 1: only its first block is read
    table[0, 1:] = 10_000  # batch 0 has length 13 < 16: one block
    case.kwargs["block_table"] = table
    check(case, incre_flash_attention_reference(*case.args, **case.kwargs), torch.float16)
    check(case, OP(*case.args, **case.kwargs), torch.float16)


def test_single_length_and_single_padding_broadcast():
    case = build_case("BSND", 2, torch.float32, pad="left")
    case.kwargs["actual_seq_lengths"] = [7]
    case.kwargs["kv_padding_size"] = torch.tensor([5], dtype=torch.int64)
    q, k, v = case.args
    want = expected(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 0.3,
                    lengths=[7] * 3, pads=[5] * 3)
    out = OP(*case.args, **case.kwargs)
    torch.testing.assert_close(out.transpose(1, 2).double(), want, atol=2e-5, rtol=2e-5)
    ref = incre_flash_attention_reference(*case.args, **case.kwargs)
    torch.testing.assert_close(ref, out, atol=2e-5, rtol=2e-5)


def test_padding_without_lengths_is_right_padding():
    """kv_padding_size alone does not enable left padding: every row is attended."""
    case = build_case("BNSD", 2, torch.float32, pad="full")
    with_pad = OP(*case.args, kv_padding_size=torch.tensor([5, 5, 5]), **case.kwargs)
    torch.testing.assert_close(with_pad, OP(*case.args, **case.kwargs), atol=0, rtol=0)


@pytest.mark.parametrize("kw", [
    dict(layout="BSH", kv="paged3", pad="left", antiquant=True, int8_out=True, masked=True),
    dict(layout="BNSD", kv="paged4", pad="right", antiquant=False, masked=True),
    dict(layout="BSND", kv="dense", pad="left", pse=3, masked=True),
    dict(layout="BNSD", kv="dense", pad="right", s_q=3, masked=True, mask_4d=True),
], ids=["decode-paged3", "decode-paged4", "general-pse", "general-multirow"])
def test_tensor_lengths_never_read_on_host(kw, monkeypatch):
    """With device lengths the eager kernel and the reference stay capturable: no .item(),
    .tolist(), bool(tensor), nonzero... (the CPU stand-in of a CUDA graph capture). The decode
    step goes to the canonical decode reference: a CPU fast kernel may plan on the host (a CPU
    is never graph-captured); what is checked here is the op's own code around it."""
    from torchair.ops.attention import decode as _decode, ifa_compute as _ifa_compute, ifa_fast as _ifa_fast
    from torchair.ops.attention.incre_flash_attention import _eager
    from torchair.runtime.capture import NoHostSync
    monkeypatch.setattr(_ifa_compute, "decode_attention", _decode.decode_attention_reference)
    monkeypatch.setattr(_ifa_fast, "ENABLED", False)  # the CPU fast path reads CPU lengths
    case = build_case(n_kv=2, dtype=torch.float16, **kw)
    twin_kwargs = _twin_kwargs(case.kwargs)
    with NoHostSync():
        out = _eager(*case.args, **twin_kwargs)
        ref = incre_flash_attention_reference(*case.args, **twin_kwargs)
    check(case, out, torch.float16)
    check(case, ref, torch.float16)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kv", ["paged3", "paged4"])
def test_twin_with_every_feature_in_cuda_graph(kv):
    case = build_case("BNSD", 2, torch.float16, kv=kv, pad="left", antiquant=True,
                      int8_out=True, masked=True)
    args = [a.cuda() for a in case.args]
    kwargs = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in case.kwargs.items()}
    lengths = torch.tensor(kwargs.pop("actual_seq_lengths"), dtype=torch.int64, device="cuda")
    TWIN(*args, actual_seq_lengths=lengths, **kwargs)  # warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = TWIN(*args, actual_seq_lengths=lengths, **kwargs)
    for lens in ([13, 1, 20], [30, 9, 2], [0, 40, 5]):
        lengths.copy_(torch.tensor(lens))
        graph.replay()
        want = OP(*args, actual_seq_lengths=lens, **kwargs)
        assert (out.int() - want.int()).abs().max() <= 1
