"""npu_incre_flash_attention: reference vs an independent formula, op/twin, fake kernel, errors."""
from __future__ import annotations

import math

import pytest
import torch
from torch._dynamo.testing import CompileCounter
from torch._subclasses.fake_tensor import FakeTensorMode

import torchair.ops
from torchair.ops import get_value_dependent, value_dependent_ops
from torchair.ops.attention.incre_flash_attention import incre_flash_attention_reference

OP = torch.ops.npu.npu_incre_flash_attention
TWIN = torch.ops.npu.npu_incre_flash_attention_tensor
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5),
       torch.float16: dict(atol=2e-3, rtol=2e-3),
       torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2)}
B, N, S, D = 3, 4, 7, 8


# ---------------------------------------------------------------- independent formula (float64)

def _expected(q, k, v, scale, mask=None, lengths=None):
    """Loop over batch, head and query row; softmax over the explicitly allowed columns.

    q ``[B, N, S_q, D]``, k/v ``[B, N_kv, S, D]``, mask bool ``[B, N, S_q, S]`` (True = masked),
    lengths a list of B ints. Returns float64 ``[B, N, S_q, D]``.
    """
    q, k, v = q.double(), k.double(), v.double()
    b_, n_, s_q, d_ = q.shape
    n_kv, s_kv = k.shape[1], k.shape[2]
    out = torch.zeros(b_, n_, s_q, d_, dtype=torch.float64)
    for b in range(b_):
        for h in range(n_):
            kv = h // (n_ // n_kv)
            for i in range(s_q):
                allowed = [j for j in range(s_kv)
                           if (lengths is None or j < lengths[b])
                           and (mask is None or not bool(mask[b, h, i, j]))]
                if not allowed:
                    continue
                scores = torch.stack([q[b, h, i] @ k[b, kv, j] * scale for j in allowed])
                weights = torch.exp(scores - scores.max())
                weights = weights / weights.sum()
                out[b, h, i] = sum(w * v[b, kv, j] for w, j in zip(weights, allowed))
    return out


def _to_layout(x, layout):
    """``[B, N, S, D]`` -> layout."""
    if layout == "BSH":
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1)
    if layout == "BSND":
        return x.transpose(1, 2).contiguous()
    return x.contiguous()


def _from_layout(x, layout, n):
    """layout -> ``[B, N, S, D]``."""
    if layout == "BSH":
        return x.reshape(x.shape[0], x.shape[1], n, -1).transpose(1, 2)
    if layout == "BSND":
        return x.transpose(1, 2)
    return x


def _inputs(dtype, n_kv, s_q=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, N, s_q, D, generator=g).to(dtype)
    k = torch.randn(B, n_kv, S, D, generator=g).to(dtype)
    v = torch.randn(B, n_kv, S, D, generator=g).to(dtype)
    return q, k, v


def _random_mask(shape, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g) < 0.3


LENGTHS = {"none": None, "per_batch": [5, 2, 7], "single": [4]}


@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("lengths", list(LENGTHS))
@pytest.mark.parametrize("with_mask", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("n_kv", [4, 2, 1])
@pytest.mark.parametrize("layout", ["BSH", "BNSD", "BSND"])
def test_reference_matches_formula(layout, n_kv, with_mask, lengths, dtype):
    q, k, v = _inputs(dtype, n_kv)
    scale = 1 / math.sqrt(D)
    mask = _random_mask((B, 1, 1, S)) if with_mask else None
    lens = LENGTHS[lengths]
    out = incre_flash_attention_reference(
        _to_layout(q, layout), _to_layout(k, layout), _to_layout(v, layout),
        atten_mask=mask, actual_seq_lengths=lens, num_heads=N, scale_value=scale,
        input_layout=layout, num_key_value_heads=n_kv)
    assert out.dtype == dtype and out.shape == _to_layout(q, layout).shape
    full_mask = None if mask is None else mask.expand(B, N, 1, S)
    full_lens = None if lens is None else (lens * B if len(lens) == 1 else lens)
    expected = _expected(q, k, v, scale, full_mask, full_lens)
    torch.testing.assert_close(_from_layout(out, layout, N).double(), expected, **TOL[dtype])


@pytest.mark.parametrize("layout", ["BSH", "BNSD", "BSND"])
def test_reference_multi_row_query_with_4d_mask(layout):
    q, k, v = _inputs(torch.float32, 2, s_q=3)
    mask = _random_mask((B, N, 3, S)).to(torch.int8)
    out = incre_flash_attention_reference(
        _to_layout(q, layout), _to_layout(k, layout), _to_layout(v, layout), atten_mask=mask,
        actual_seq_lengths=[6, 3, 7], num_heads=N, scale_value=0.5, input_layout=layout,
        num_key_value_heads=2)
    expected = _expected(q, k, v, 0.5, mask.bool(), [6, 3, 7])
    torch.testing.assert_close(_from_layout(out, layout, N).double(), expected, **TOL[torch.float32])


@pytest.mark.parametrize("shape", [(B, S), (B, 1, S), (B, 1, 1, S), (B, N, 1, S), (1, S)],
                         ids=str)
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int8, torch.uint8], ids=str)
def test_mask_shapes_and_dtypes(shape, mask_dtype):
    q, k, v = _inputs(torch.float32, 2)
    mask = _random_mask(shape, seed=3)
    full = mask.reshape(shape[0], -1 if len(shape) == 4 else 1, 1, S).expand(B, N, 1, S)
    out = incre_flash_attention_reference(q, k, v, atten_mask=mask.to(mask_dtype), num_heads=N,
                                          input_layout="BNSD", num_key_value_heads=2)
    torch.testing.assert_close(out.double(), _expected(q, k, v, 1.0, full), **TOL[torch.float32])


def test_scale_value_multiplies_scores():
    q, k, v = _inputs(torch.float32, 4)
    out = incre_flash_attention_reference(q, k, v, num_heads=N, scale_value=3.0,
                                          input_layout="BNSD")
    torch.testing.assert_close(out.double(), _expected(q, k, v, 3.0), **TOL[torch.float32])


def test_fully_masked_rows_give_zeros():
    q, k, v = _inputs(torch.float16, 2)
    mask = torch.zeros(B, 1, 1, S, dtype=torch.bool)
    mask[1] = True  # batch 1: every position masked by atten_mask
    out = OP(q, k, v, atten_mask=mask, actual_seq_lengths=[3, 4, 0], num_heads=N,
             input_layout="BNSD", num_key_value_heads=2)  # batch 2: length 0
    assert not out.isnan().any()
    assert (out[1:] == 0).all() and (out[0] != 0).any()


# ---------------------------------------------------------------- the op and its tensor twin

@pytest.mark.parametrize("layout", ["BSH", "BNSD", "BSND"])
def test_op_equals_reference_and_twin_equals_op(layout):
    q, k, v = (_to_layout(t, layout) for t in _inputs(torch.bfloat16, 2))
    mask = _random_mask((B, 1, 1, S))
    kwargs = dict(atten_mask=mask, num_heads=N, scale_value=0.3, input_layout=layout,
                  num_key_value_heads=2)
    for lens in ([5, 2, 7], [3]):
        out = OP(q, k, v, actual_seq_lengths=lens, **kwargs)  # decode path: decode_attention
        ref = incre_flash_attention_reference(q, k, v, actual_seq_lengths=lens, **kwargs)
        torch.testing.assert_close(out, ref, **TOL[torch.bfloat16])
        twin = TWIN(q, k, v, actual_seq_lengths=torch.tensor(lens, dtype=torch.int64), **kwargs)
        torch.testing.assert_close(twin, out, atol=0, rtol=0)
    assert torchair.ops.npu_incre_flash_attention is OP


def test_value_dependent_registration():
    entry = get_value_dependent(OP.default)
    assert entry is not None and entry in value_dependent_ops()
    assert entry.args == ("actual_seq_lengths",) and entry.twin is TWIN.default
    assert entry.name == "npu_incre_flash_attention"


# ---------------------------------------------------------------- fake kernel and compile

@pytest.mark.parametrize("layout,shape", [("BSH", (2, 1, 32)), ("BNSD", (2, 4, 1, 8)),
                                          ("BSND", (2, 1, 4, 8))])
def test_fake_kernel_shape_and_dtype(layout, shape):
    kv_shape = {"BSH": (2, 6, 16), "BNSD": (2, 2, 6, 8), "BSND": (2, 6, 2, 8)}[layout]
    with FakeTensorMode():
        q = torch.empty(shape, dtype=torch.float16)
        k = torch.empty(kv_shape, dtype=torch.float16)
        out = OP(q, k, k, actual_seq_lengths=[3, 5], num_heads=4, input_layout=layout,
                 num_key_value_heads=2)
        assert out.shape == q.shape and out.dtype == torch.float16
        out = TWIN(q, k, k, actual_seq_lengths=torch.empty(2, dtype=torch.int64), num_heads=4,
                   input_layout=layout, num_key_value_heads=2)
        assert out.shape == q.shape and out.dtype == torch.float16
        out = OP(q, k, k, quant_scale2=torch.empty(1), num_heads=4, input_layout=layout,
                 num_key_value_heads=2)
        assert out.shape == q.shape and out.dtype == torch.int8


def test_fake_kernel_paged_cache_and_int8_output():
    with FakeTensorMode():
        q = torch.empty(2, 4, 1, 16, dtype=torch.bfloat16)
        cache3 = torch.empty(8, 16, 32, dtype=torch.int8)  # (blocknum, blocksize, H)
        cache4 = torch.empty(8, 2, 16, 16, dtype=torch.int8)  # (blocknum, N_kv, bs, D)
        table = torch.empty(2, 4, dtype=torch.int32)
        for cache in (cache3, cache4):
            out = OP(q, cache, cache, block_table=table, block_size=32,
                     actual_seq_lengths=[40, 7], antiquant_scale=torch.empty(2, 2, 1, 16),
                     quant_scale2=torch.empty(64), num_heads=4, input_layout="BNSD",
                     num_key_value_heads=2)
            assert out.shape == q.shape and out.dtype == torch.int8


def test_fake_kernel_rejects_bad_layout():
    with FakeTensorMode():
        q = torch.empty(2, 1, 32)
        with pytest.raises(ValueError, match="input_layout='BNSD' needs 4-D"):
            OP(q, q, q, num_heads=4, input_layout="BNSD")


def test_compile_dynamic_list_lengths_compiles_once():
    torch._dynamo.reset()
    counter = CompileCounter()

    def fn(q, k, v, lengths):
        return OP(q, k, v, actual_seq_lengths=lengths, num_heads=N, scale_value=0.25,
                  input_layout="BNSD", num_key_value_heads=2)

    compiled = torch.compile(fn, backend=counter, dynamic=True, fullgraph=True)
    q, k, v = _inputs(torch.float32, 2)
    for lengths in ([2, 5, 7], [3, 4, 6], [1, 1, 0], [6, 6, 6]):
        torch.testing.assert_close(compiled(q, k, v, lengths), fn(q, k, v, lengths))
    assert counter.frame_count == 1
    torch._dynamo.reset()


# ---------------------------------------------------------------- validation

def _call(q_shape=(2, 1, 32), kv_shape=(2, 6, 16), **kwargs):
    kwargs.setdefault("num_heads", 4)
    kwargs.setdefault("num_key_value_heads", 2)
    k_shape = kwargs.pop("k_shape", kv_shape)
    return OP(torch.randn(q_shape), torch.randn(k_shape), torch.randn(kv_shape), **kwargs)


@pytest.mark.parametrize("kwargs,match", [
    (dict(input_layout="SBH"), "input_layout='SBH' is not supported"),
    (dict(input_layout="BNSD"), r"input_layout='BNSD' needs 4-D"),
    (dict(q_shape=(2, 4, 1, 8), input_layout="BSH"), "input_layout='BSH' needs 3-D"),
    (dict(kv_shape=(2, 2, 6, 8), input_layout="BSH"), "ranks"),
    (dict(k_shape=(2, 5, 16)), "key and value must have the same shape"),
    (dict(num_heads=0), "num_heads=0 must be >= 1"),
    (dict(num_heads=3, num_key_value_heads=0), r"query H=32 divisible by num_heads=3"),
    (dict(num_key_value_heads=3), "num_key_value_heads=3 must divide num_heads=4"),
    (dict(num_key_value_heads=-1), "num_key_value_heads=-1 must be >= 0"),
    (dict(q_shape=(2, 1, 65 * 2), kv_shape=(2, 6, 2), num_heads=65, num_key_value_heads=1),
     "exceeds the maximum ratio 64"),
    (dict(kv_shape=(2, 6, 24)), r"key H=24 must equal num_key_value_heads \* D"),
    (dict(q_shape=(2, 4, 1, 8), kv_shape=(2, 2, 6, 8), num_heads=2, input_layout="BNSD"),
     "num_heads=2 must equal the N of query"),
    (dict(q_shape=(2, 1, 4, 8), kv_shape=(2, 6, 1, 8), input_layout="BSND"),
     "key N=1 must equal num_key_value_heads=2"),
    (dict(q_shape=(2, 4, 1, 8), kv_shape=(2, 2, 6, 4), input_layout="BNSD"),
     "key D=4 must equal query D=8"),
    (dict(kv_shape=(3, 6, 16)), "key batch B=3 must equal query batch B=2"),
    (dict(actual_seq_lengths=[1, 2, 3]), "actual_seq_lengths has 3 entries; expected B=2"),
    (dict(atten_mask=torch.zeros(2, 6)), "atten_mask dtype torch.float32 is not supported"),
    (dict(atten_mask=torch.zeros(2, 5, dtype=torch.bool)), r"atten_mask shape \[2, 5\] does not"),
    (dict(atten_mask=torch.zeros(2, 3, 1, 6, dtype=torch.bool)), r"atten_mask shape \[2, 3, 1, 6\]"),
    (dict(atten_mask=torch.zeros(6, dtype=torch.bool)), "atten_mask must be 2-D"),
    (dict(padding_mask=torch.zeros(2, 6)), "padding_mask is a reserved argument"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_validation_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _call(**kwargs)


def test_validation_errors_twin_and_dtypes():
    q, k = torch.randn(2, 1, 32), torch.randn(2, 6, 16)
    kw = dict(num_heads=4, num_key_value_heads=2)
    with pytest.raises(ValueError, match="actual_seq_lengths has 3 entries"):
        TWIN(q, k, k, actual_seq_lengths=torch.tensor([1, 2, 3]), **kw)
    with pytest.raises(ValueError, match="actual_seq_lengths must be a 1-D int64 tensor"):
        TWIN(q, k, k, actual_seq_lengths=torch.tensor([[1, 2]]), **kw)
    with pytest.raises(ValueError, match="actual_seq_lengths must be a 1-D int64 tensor"):
        TWIN(q, k, k, actual_seq_lengths=torch.tensor([1.0, 2.0]), **kw)
    with pytest.raises(ValueError, match="key dtype torch.float16 must equal query dtype"):
        OP(q, k.half(), k.half(), **kw)
    with pytest.raises(ValueError, match="query dtype torch.int64 is not supported"):
        OP(q.long(), k.long(), k.long(), **kw)


def test_empty_kv_gives_zeros():
    q, k = torch.randn(2, 1, 32), torch.randn(2, 0, 16)
    out = OP(q, k, k, num_heads=4, num_key_value_heads=2)
    assert out.shape == q.shape and (out == 0).all()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_twin_runs_inside_cuda_graph_capture():
    q, k, v = (t.cuda() for t in _inputs(torch.float16, 2))
    lengths = torch.tensor([5, 2, 7], dtype=torch.int64, device="cuda")
    kwargs = dict(num_heads=N, input_layout="BNSD", num_key_value_heads=2)
    TWIN(q, k, v, actual_seq_lengths=lengths, **kwargs)  # warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = TWIN(q, k, v, actual_seq_lengths=lengths, **kwargs)
    for lens in ([5, 2, 7], [1, 7, 3], [0, 4, 6]):
        lengths.copy_(torch.tensor(lens))
        graph.replay()
        torch.testing.assert_close(out, OP(q, k, v, actual_seq_lengths=lens, **kwargs))
