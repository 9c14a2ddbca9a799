"""The independent float64 oracle of npu_incre_flash_attention and the input builders of the grids.

Imported by the other ``test_ifa_*`` files (pytest's default ``prepend`` import mode puts this
folder on ``sys.path``). The oracle loops over batch, head and query row and builds each row's
attended KV positions explicitly from the contract's words; it shares no code with torchair.
"""
from __future__ import annotations

import dataclasses

import torch

B, N, D = 3, 4, 16
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5),
       torch.float16: dict(atol=3e-3, rtol=3e-3),
       torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def expected(q, k, v, scale, *, lengths=None, pads=None, mask=None, pse=None):
    """float64 ``[B, N, S_q, D]``.

    q ``[B, N, S_q, D]``; k/v the logical float KV ``[B, N_kv, S, D]`` (already dequantized);
    lengths a list of B ints; pads a list of B ints (left padding, with lengths); mask bool
    broadcastable to ``[B, N, S_q, S]`` (True = masked); pse broadcastable to ``[B, N, S_q, S]``.
    """
    q, k, v = q.double(), k.double(), v.double()
    b_, n_, s_q, d_ = q.shape
    n_kv, s_kv = k.shape[1], k.shape[2]
    if mask is not None:
        mask = mask.bool().expand(b_, n_, s_q, s_kv)
    if pse is not None:
        pse = pse.double().expand(b_, n_, s_q, s_kv)
    out = torch.zeros(b_, n_, s_q, d_, dtype=torch.float64)
    for b in range(b_):
        if lengths is None:
            lo, hi = 0, s_kv
        elif pads is None:
            lo, hi = 0, min(lengths[b], s_kv)
        else:  # "Smax - kv_padding_size - actual_seq_lengths" to "Smax - kv_padding_size"
            hi = s_kv - max(pads[b], 0)
            lo = hi - lengths[b]
            if lo < 0 or hi < 0:
                continue  # out-of-range window: zeros
        for h in range(n_):
            kv = h // (n_ // n_kv)
            for i in range(s_q):
                rows = [j for j in range(lo, hi) if mask is None or not mask[b, h, i, j]]
                if not rows:
                    continue
                scores = k[b, kv, rows] @ q[b, h, i] * scale
                if pse is not None:
                    scores = scores + pse[b, h, i, rows]
                weights = torch.softmax(scores, 0)
                out[b, h, i] = weights @ v[b, kv, rows]
    return out


def quantize(out64, scale, offset):
    """``clamp(round(out * scale + offset), -128, 127)`` in float64; scale/offset ``[1 or N*D]``."""
    def ch(t):
        t = t.double().reshape(-1)
        return t.view(1, 1, 1, 1) if t.numel() == 1 else t.view(1, N, 1, D)
    y = out64 * ch(scale) + (0 if offset is None else ch(offset))
    return torch.round(y).clamp(-128, 127)


def to_layout(x, layout):
    """``[B, N, S, D]`` -> layout."""
    if layout == "BSH":
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1)
    if layout == "BSND":
        return x.transpose(1, 2).contiguous()
    return x.contiguous()


def from_layout(x, layout, n=N):
    """layout -> ``[B, N, S, D]``."""
    if layout == "BSH":
        return x.reshape(x.shape[0], x.shape[1], n, -1).transpose(1, 2)
    if layout == "BSND":
        return x.transpose(1, 2)
    return x


def antiquant_param(t, layout, n_kv):
    """``[2, N_kv, D]`` -> the contract's shape for ``layout``."""
    return {"BNSD": t.view(2, n_kv, 1, D), "BSH": t.reshape(2, n_kv * D),
            "BSND": t.contiguous()}[layout]


def paged_cache(kv, block_size, cache_layout, generator):
    """Scatter logical ``[B, N_kv, S, D]`` into shuffled blocks; return (cache, block_table)."""
    b_, s = kv.shape[0], kv.shape[2]
    max_blocks = s // block_size
    num_blocks = b_ * max_blocks + 2  # two spare blocks
    table = torch.randperm(num_blocks, generator=generator)[:b_ * max_blocks]
    table = table.view(b_, max_blocks).to(torch.int32)
    return _scatter_like(kv, table, block_size, cache_layout, num_blocks), table


@dataclasses.dataclass
class Case:
    """One grid point: op keyword arguments, positional q/k/v and the float64 expectation."""

    args: tuple
    kwargs: dict
    want: torch.Tensor  # float64 [B, N, S_q, D], quantized values when int8 output
    layout: str
    int8_out: bool


def build_case(layout="BNSD", n_kv=2, dtype=torch.float32, *, masked=False, kv="dense",
               pad="right", antiquant=False, int8_out=False, pse=None, s_q=1, seed=0,
               mask_4d=False, per_channel=True):
    """Inputs for one grid point (see the grid tests for the meaning of each axis)."""
    g = torch.Generator().manual_seed(seed)
    block_size = 32 if antiquant else 16
    s_kv = 40 if kv == "dense" else 3 * block_size
    q = torch.randn(B, N, s_q, D, generator=g).to(dtype)
    kwargs = dict(num_heads=N, num_key_value_heads=n_kv, input_layout=layout, scale_value=0.3)
    if antiquant:
        k_int = torch.randint(-128, 128, (B, n_kv, s_kv, D), generator=g).to(torch.int8)
        v_int = torch.randint(-128, 128, (B, n_kv, s_kv, D), generator=g).to(torch.int8)
        scale = (torch.rand(2, n_kv, D, generator=g) * 0.02 + 0.01).to(dtype)
        offset = torch.randint(-8, 8, (2, n_kv, D), generator=g).to(dtype)
        k_log, v_log = ((x.double() + offset[i].double()[None, :, None])
                        * scale[i].double()[None, :, None] for i, x in enumerate((k_int, v_int)))
        k_store, v_store = k_int, v_int
        kwargs.update(antiquant_scale=antiquant_param(scale, layout, n_kv),
                      antiquant_offset=antiquant_param(offset, layout, n_kv))
    else:
        k_store = torch.randn(B, n_kv, s_kv, D, generator=g).to(dtype)
        v_store = torch.randn(B, n_kv, s_kv, D, generator=g).to(dtype)
        k_log, v_log = k_store, v_store
    if kv == "dense":
        key, value = to_layout(k_store, layout), to_layout(v_store, layout)
    else:
        key, table = paged_cache(k_store, block_size, kv, g)
        value = _scatter_like(v_store, table, block_size, kv, key.shape[0])
        kwargs.update(block_table=table, block_size=block_size)
    lengths = pads = None
    if pad != "full":
        lengths = [13, 1, 20]
        kwargs["actual_seq_lengths"] = lengths
    if pad == "left":
        pads = [3, -4, s_kv - 10]  # batch 2: start = 10 - 20 < 0 -> zeros
        kwargs["kv_padding_size"] = torch.tensor(pads, dtype=torch.int64)
    mask = None
    if masked:
        shape = (B, N, s_q, s_kv) if mask_4d else (B, 1, 1, s_kv)
        mask = torch.rand(shape, generator=g) < 0.3
        kwargs["atten_mask"] = mask
    pse_t = None
    if pse is not None:
        pse_t = torch.randn(pse, N, 1, s_kv, generator=g).to(dtype)
        kwargs["pse_shift"] = pse_t
    want = expected(q, k_log, v_log, 0.3, lengths=lengths, pads=pads, mask=mask, pse=pse_t)
    if int8_out:
        numel = N * D if per_channel else 1
        qs = torch.rand(numel, generator=g) * 20 + 30
        qo = torch.randn(numel, generator=g).round()
        kwargs.update(quant_scale2=qs, quant_offset2=qo)
        want = quantize(want, qs, qo)
    return Case((to_layout(q, layout), key, value), kwargs, want, layout, int8_out)


def _scatter_like(kv, table, block_size, cache_layout, num_blocks):
    """Write logical ``[B, N_kv, S, D]`` into blocks ``table``; (blocknum, blocksize, H) for paged3."""
    b_, n_kv, _, d = kv.shape
    cache = torch.zeros(num_blocks, n_kv, block_size, d, dtype=kv.dtype)
    for b in range(b_):
        for m in range(table.shape[1]):
            cache[table[b, m]] = kv[b, :, m * block_size:(m + 1) * block_size]
    if cache_layout == "paged3":
        cache = cache.permute(0, 2, 1, 3).reshape(num_blocks, block_size, n_kv * d)
    return cache


def check(case: Case, out: torch.Tensor, dtype) -> None:
    """``out`` (in the case's layout) against the float64 expectation."""
    got = from_layout(out, case.layout).double()
    if case.int8_out:
        assert out.dtype == torch.int8
        diff = (got - case.want).abs()
        assert diff.max() <= 1, f"int8 output off by {diff.max()}"
        # off by one only near rounding boundaries (bfloat16 rounds the attention output first
        # on the decode path: 8 mantissa bits)
        floor = 0.7 if case.args[0].dtype == torch.bfloat16 else 0.9
        assert (diff == 0).float().mean() >= floor
    else:
        assert out.dtype == dtype
        torch.testing.assert_close(got, case.want, **TOL[dtype])


def test_oracle_matches_sdpa_without_masks():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 1, 16, generator=g, dtype=torch.float64) for _ in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.5)
    torch.testing.assert_close(expected(q, k, v, 0.5), want)


def test_paged_cache_builder_roundtrip():
    g = torch.Generator().manual_seed(0)
    kv = torch.randn(3, 2, 48, 16, generator=g)
    cache, table = paged_cache(kv, 16, "paged4", g)
    rebuilt = cache[table.long()].permute(0, 2, 1, 3, 4).reshape(3, 2, 48, 16)
    torch.testing.assert_close(rebuilt, kv)
