"""The canonical decode reference against an independent per-sequence, per-head float64 loop."""
import pytest
import torch
from _paging import block_table, to_blocks

from torchair.ops.attention.decode import decode_attention_reference


def _loop(q, k, v, lengths, start, mask, scale):
    """Independent oracle: dense contiguous float64 K/V, Python loops, explicit softmax."""
    batch, heads, dim = q.shape
    nkv = k.shape[1]
    out = torch.zeros(batch, heads, dim, dtype=torch.float64)
    for b in range(batch):
        lo, hi = int(start[b]), int(start[b]) + int(lengths[b])
        for h in range(heads):
            kh = k[b, h // (heads // nkv)].double()
            vh = v[b, h // (heads // nkv)].double()
            rows = [p for p in range(max(lo, 0), min(hi, k.shape[2]))
                    if mask is None or not bool(mask[b, p])]
            if not rows:
                continue
            s = torch.stack([q[b, h].double() @ kh[p] * scale for p in rows])
            w = torch.softmax(s, 0)
            out[b, h] = sum(w[i] * vh[p] for i, p in enumerate(rows))
    return out


@pytest.mark.parametrize("heads,nkv", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("left_pad", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
def test_reference_matches_loop(heads, nkv, paged, left_pad, with_mask):
    g = torch.Generator().manual_seed(heads * 7 + nkv + 2 * paged + 4 * left_pad)
    batch, seq, dim, block = 3, 16, 8, 4
    q = torch.randn(batch, heads, dim, generator=g)
    k = torch.randn(batch, nkv, seq, dim, generator=g)
    v = torch.randn(batch, nkv, seq, dim, generator=g)
    lengths = torch.tensor([5, 16, 0])
    start = torch.tensor([3, 0, 2]) if left_pad else torch.zeros(3, dtype=torch.long)
    mask = (torch.rand(batch, seq, generator=g) < 0.2) if with_mask else None
    expected = _loop(q, k, v, lengths, start, mask, 0.35)
    kk, vv, table = k, v, None
    if paged:
        table = block_table(batch, seq, block, g)
        kk, vv = to_blocks(k, block, table), to_blocks(v, block, table)
    out = decode_attention_reference(q, kk, vv, lengths=lengths, scale=0.35,
                                     kv_start=start if left_pad else None,
                                     block_table=table, mask=mask)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    assert torch.all(out[2] == 0)  # nothing attended: zeros


def test_reference_antiquant_int8():
    g = torch.Generator().manual_seed(5)
    batch, nkv, seq, dim = 2, 2, 8, 4
    q = torch.randn(batch, 4, dim, generator=g)
    k8 = torch.randint(-128, 128, (batch, nkv, seq, dim), generator=g, dtype=torch.int8)
    v8 = torch.randint(-128, 128, (batch, nkv, seq, dim), generator=g, dtype=torch.int8)
    ks, ko = torch.rand(nkv, dim, generator=g) / 50, torch.randn(nkv, dim, generator=g)
    vs, vo = torch.rand(nkv, dim, generator=g) / 50, torch.randn(nkv, dim, generator=g)
    lengths = torch.tensor([8, 3])
    k = (k8.double() + ko.double()[None, :, None]) * ks.double()[None, :, None]
    v = (v8.double() + vo.double()[None, :, None]) * vs.double()[None, :, None]
    expected = _loop(q, k, v, lengths, torch.zeros(2, dtype=torch.long), None, 0.5)
    out = decode_attention_reference(q, k8, v8, lengths=lengths, scale=0.5, k_scale=ks,
                                     k_offset=ko, v_scale=vs, v_offset=vo)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
