"""npu_incre_flash_attention: every constraint of the contract raises a ValueError naming it."""
from __future__ import annotations

import pytest
import torch

import torchair.ops  # noqa: F401 (registers the ops)

OP = torch.ops.npu.npu_incre_flash_attention
TWIN = torch.ops.npu.npu_incre_flash_attention_tensor
F16, I8 = torch.float16, torch.int8


def _t(*shape, dtype=F16):
    if dtype == I8:
        return torch.zeros(shape, dtype=I8)
    return torch.randn(shape).to(dtype)


def _call(q=(2, 1, 32), kv=(2, 6, 16), *, q_dtype=F16, kv_dtype=F16, v_dtype=None, **kw):
    """BSH by default: B 2, N 4, N_kv 2, D 8."""
    kw.setdefault("num_heads", 4)
    kw.setdefault("num_key_value_heads", 2)
    return OP(_t(*q, dtype=q_dtype), _t(*kv, dtype=kv_dtype), _t(*kv, dtype=v_dtype or kv_dtype),
              **kw)


def _paged(cache=(8, 16, 32), q=(2, 1, 64), kv_dtype=F16, table=(2, 3), **kw):
    """Page attention, BSH by default: B 2, N 4, N_kv 2, D 16, block_size 16 (32 for int8)."""
    kw.setdefault("block_size", 32 if kv_dtype == I8 else 16)
    kw.setdefault("actual_seq_lengths", [20, 5])
    kw.setdefault("block_table", torch.zeros(table, dtype=torch.int32))
    if kv_dtype == I8 and "antiquant_scale" not in kw:
        kw["antiquant_scale"] = torch.ones(2, 32, dtype=F16)
    return _call(q, cache, kv_dtype=kv_dtype, **kw)


CASES = {
    # reserved and attributes
    "padding_mask": (lambda: _call(padding_mask=torch.zeros(2, 6)), "padding_mask is a reserved"),
    "inner_precise": (lambda: _call(inner_precise=2), "inner_precise=2 must be 0"),
    # layout and dims
    "layout_rank": (lambda: _call(input_layout="BNSD"), r"input_layout='BNSD' needs 4-D"),
    "qkv_rank": (lambda: _call(kv=(2, 2, 6, 8)), "ranks"),
    "num_heads_vs_N": (lambda: _call((2, 4, 1, 8), (2, 2, 6, 8), input_layout="BNSD",
                                     num_heads=2), "num_heads=2 must equal the N of query"),
    "kv_heads_vs_N": (lambda: _call((2, 1, 4, 8), (2, 6, 1, 8), input_layout="BSND"),
                      "key N=1 must equal num_key_value_heads=2"),
    "kv_heads_divide": (lambda: _call(num_key_value_heads=3),
                        "num_key_value_heads=3 must divide num_heads=4"),
    "gqa_ratio": (lambda: _call((2, 1, 130), (2, 6, 2), num_heads=65, num_key_value_heads=1),
                  "exceeds the maximum ratio 64"),
    # dtypes
    "int8_qkv": (lambda: _call(q_dtype=I8, kv_dtype=I8), "query, key and value all int8"),
    "int8_query": (lambda: _call(q_dtype=I8), "query dtype torch.int8 is not supported"),
    "kv_dtype_pair": (lambda: _call(kv_dtype=F16, v_dtype=torch.bfloat16),
                      "key dtype torch.float16 and value dtype torch.bfloat16 must be equal"),
    "kv_vs_query": (lambda: _call(kv_dtype=torch.bfloat16),
                    "key dtype torch.bfloat16 must equal query dtype torch.float16 or be int8"),
    # antiquant
    "int8_kv_without_scale": (lambda: _call(kv_dtype=I8), "int8 key/value need antiquant_scale"),
    "antiquant_scale_fp_kv": (lambda: _call(antiquant_scale=torch.ones(2, 16, dtype=F16)),
                              "antiquant_scale is only used with int8 key/value"),
    "antiquant_offset_fp_kv": (lambda: _call(antiquant_offset=torch.ones(2, 16, dtype=F16)),
                               "antiquant_offset is only used with int8 key/value"),
    "antiquant_shape_bsh": (lambda: _call(kv_dtype=I8, antiquant_scale=torch.ones(2, 2, 8)),
                            r"antiquant_scale shape \[2, 2, 8\] must be \[2, 16\] for "
                            r"input_layout='BSH'"),
    "antiquant_shape_bnsd": (lambda: _call((2, 4, 1, 8), (2, 2, 6, 8), kv_dtype=I8,
                                           input_layout="BNSD",
                                           antiquant_scale=torch.ones(2, 2, 8, dtype=F16)),
                             r"must be \[2, 2, 1, 8\] for input_layout='BNSD'"),
    "antiquant_shape_bsnd": (lambda: _call((2, 1, 4, 8), (2, 6, 2, 8), kv_dtype=I8,
                                           input_layout="BSND",
                                           antiquant_scale=torch.ones(2, 2, 8, dtype=F16),
                                           antiquant_offset=torch.ones(2, 16, dtype=F16)),
                             r"antiquant_offset shape \[2, 16\] must be \[2, 2, 8\] for "
                             r"input_layout='BSND'"),
    "antiquant_dtype": (lambda: _call(kv_dtype=I8, antiquant_scale=torch.ones(2, 16,
                                                                             dtype=torch.int32)),
                        "antiquant_scale dtype torch.int32 must be floating"),
    # quantization parameter combinations
    "dequant_scale1": (lambda: _call(dequant_scale1=torch.ones(1)), "dequant_scale1 must be None"),
    "quant_scale1": (lambda: _call(quant_scale1=torch.ones(1)), "quant_scale1 must be None"),
    "dequant_scale2": (lambda: _call(dequant_scale2=torch.ones(1), quant_scale2=torch.ones(1)),
                       "dequant_scale2 must be None"),
    "quant_offset2_alone": (lambda: _call(quant_offset2=torch.ones(1)),
                            "quant_offset2 needs quant_scale2"),
    "quant_scale2_dtype": (lambda: _call(quant_scale2=torch.ones(1, dtype=F16)),
                           "quant_scale2 dtype torch.float16 is not supported"),
    "quant_scale2_numel": (lambda: _call(quant_scale2=torch.ones(5)),
                           r"quant_scale2 has 5 elements .* expected 1 \(per-tensor\) or N \* D = 32"),
    "quant_offset2_numel": (lambda: _call(quant_scale2=torch.ones(1), quant_offset2=torch.ones(3)),
                            "quant_offset2 has 3 elements"),
    # page attention
    "paged_without_lengths": (lambda: _paged(actual_seq_lengths=None),
                              "page attention .* needs actual_seq_lengths"),
    "block_table_dtype": (lambda: _paged(block_table=torch.zeros(2, 3, dtype=torch.int64)),
                          "block_table dtype torch.int64 is not supported; expected torch.int32"),
    "block_table_rank": (lambda: _paged(table=(6,)), r"block_table must be 2-D .* got shape \[6\]"),
    "block_table_batch": (lambda: _paged(table=(3, 3)),
                          "block_table first dim 3 must equal the batch B=2"),
    "block_table_columns": (lambda: _paged(table=(2, 1)),
                            r"block_table second dim 1 must be >= maxBlockNumPerSeq=2 "
                            r"\(ceil\(max\(actual_seq_lengths\)=20 / block_size=16\)\)"),
    "blocknum_total": (lambda: _paged(cache=(2, 16, 32)),
                       r"KV cache blocknum 2 must be >= .* = 3"),
    "block_size_fp16": (lambda: _paged(cache=(8, 8, 32), block_size=8),
                        "block_size=8 must be a positive multiple of 16 for torch.float16"),
    "block_size_zero": (lambda: _paged(block_size=0), "block_size=0 must be a positive multiple"),
    "block_size_int8": (lambda: _paged(kv_dtype=I8, block_size=16),
                        "block_size=16 must be a positive multiple of 32 for int8"),
    "cache_4d_non_bnsd": (lambda: _paged(cache=(8, 2, 16, 16)),
                          r"\(blocknum, numKvHeads, blocksize, headDims\) .* needs "
                          r"input_layout='BNSD'; got 'BSH'"),
    "cache_shape": (lambda: _paged(cache=(8, 32, 32)),
                    r"paged key shape \[8, 32, 32\] must be \(blocknum, blocksize, H"),
    "cache_4d_shape": (lambda: _paged(cache=(8, 1, 16, 16), q=(2, 4, 1, 16),
                                      input_layout="BNSD"),
                       r"paged key shape \[8, 1, 16, 16\] must be \(blocknum, numKvHeads"),
    "cache_rank": (lambda: _paged(cache=(8, 512)), "KV cache must be"),
    # pse_shift
    "pse_dtype": (lambda: _call((2, 1, 64), (2, 6, 32), pse_shift=torch.zeros(2, 4, 1, 6)),
                  "pse_shift dtype torch.float32 must equal query dtype torch.float16"),
    "pse_d16": (lambda: _call(pse_shift=torch.zeros(2, 4, 1, 6, dtype=F16)),
                "pse_shift needs D divisible by 16 .* got D=8"),
    "pse_shape": (lambda: _call((2, 1, 64), (2, 6, 32),
                                pse_shift=torch.zeros(2, 4, 1, 5, dtype=F16)),
                  r"pse_shift shape \[2, 4, 1, 5\] does not broadcast"),
    # lengths and left padding
    "lengths_count": (lambda: _call(actual_seq_lengths=[1, 2, 3]),
                      "actual_seq_lengths has 3 entries; expected B=2"),
    "lengths_negative": (lambda: _call(actual_seq_lengths=[3, -1]),
                         r"actual_seq_lengths\[1\]=-1 must be >= 0"),
    "kv_padding_dtype": (lambda: _call(actual_seq_lengths=[3], kv_padding_size=torch.zeros(1)),
                         "kv_padding_size dtype torch.float32 is not supported"),
    "kv_padding_shape": (lambda: _call(actual_seq_lengths=[3],
                                       kv_padding_size=torch.zeros(3, dtype=torch.int64)),
                         r"kv_padding_size shape \[3\] must be \[1\] or \[B=2\]"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_constraint_raises(name):
    fn, match = CASES[name]
    with pytest.raises(ValueError, match=match):
        fn()


def test_allowed_quant_combination_runs():
    """float16 in, int8 out: quant_scale2 with or without quant_offset2 is allowed."""
    assert _call(quant_scale2=torch.ones(1)).dtype == torch.int8
    assert _call(quant_scale2=torch.ones(32), quant_offset2=torch.ones(32)).dtype == torch.int8


def test_tensor_lengths_skip_host_block_checks():
    """With device lengths the block_table columns and blocknum are not checked (not read)."""
    q, cache = torch.randn(2, 1, 64).half(), torch.randn(2, 16, 32).half()
    out = TWIN(q, cache, cache, actual_seq_lengths=torch.tensor([20, 5]),
               block_table=torch.zeros(2, 1, dtype=torch.int32), block_size=16, num_heads=4,
               num_key_value_heads=2)
    assert out.shape == q.shape
    with pytest.raises(ValueError, match="block_table second dim 1"):
        OP(q, cache, cache, actual_seq_lengths=[20, 5],
           block_table=torch.zeros(2, 1, dtype=torch.int32), block_size=16, num_heads=4,
           num_key_value_heads=2)
