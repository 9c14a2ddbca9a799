"""The Triton split-KV decode kernel against ``decode_attention_reference``.

Without a GPU the kernels run in Triton's interpreter, which must be chosen before triton is
imported (``TRITON_INTERPRET=1``; Triton decides compiled vs interpreted when it decorates). Other
tests of the same pytest process import torchair.ops (and so triton) first, so the interpreter
tests here run in-process only when the whole process was started with TRITON_INTERPRET=1;
otherwise ``test_interpreter_suite_subprocess`` re-runs this module in a child pytest with it set.
The ``cuda`` tests compare realistic shapes and CUDA-graph replay on a GPU (compiled kernels).
"""
import pathlib
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

from _interpreter import run_interpreted
from _paging import block_table, to_blocks

from torchair.ops.attention.decode import _kernels, decode_attention_reference
from torchair.ops.attention.triton import decode as dt

INTERPRETED = dt.interpreted()
ROOT = pathlib.Path(__file__).resolve().parents[2]

interp = pytest.mark.skipif(
    not INTERPRETED, reason="interpreter tests run in test_interpreter_suite_subprocess "
    "(TRITON_INTERPRET=1 must be set before triton is imported)")
cuda = pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED,
                          reason="needs a CUDA GPU and compiled (not interpreted) Triton")

TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _case(batch=2, heads=4, nkv=1, seq=32, dim=16, dtype=torch.float32, int8=False, seed=0,
          device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, dim, generator=g).to(dtype)
    extra = {}
    if int8:
        k = torch.randint(-128, 128, (batch, nkv, seq, dim), generator=g, dtype=torch.int8)
        v = torch.randint(-128, 128, (batch, nkv, seq, dim), generator=g, dtype=torch.int8)
        extra = {"k_scale": torch.rand(nkv, dim, generator=g) * 0.02 + 0.005,
                 "k_offset": torch.randn(nkv, dim, generator=g) * 3,
                 "v_scale": torch.rand(nkv, dim, generator=g) * 0.02 + 0.005,
                 "v_offset": torch.randn(nkv, dim, generator=g) * 3}
        extra = {n: t.to(dtype).to(device) for n, t in extra.items()}
    else:
        k = torch.randn(batch, nkv, seq, dim, generator=g).to(dtype)
        v = torch.randn(batch, nkv, seq, dim, generator=g).to(dtype)
    return q.to(device), k.to(device), v.to(device), extra, g


def _check(q, k, v, *, tol=None, num_splits=None, block_n=None, **kw):
    out = dt.decode_attention_triton(q, k, v, num_splits=num_splits, block_n=block_n, **kw)
    ref = decode_attention_reference(q, k, v, **kw)
    assert out.dtype == q.dtype and out.shape == q.shape
    tol = TOL[q.dtype] if tol is None else tol
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)
    return out


# ---------------------------------------------------------------- interpreter (CPU) --------------

@interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("heads,nkv", [(4, 1), (2, 2)])
@pytest.mark.parametrize("dim", [16, 24])
def test_contiguous(dtype, heads, nkv, dim):
    q, k, v, _, _ = _case(heads=heads, nkv=nkv, dim=dim, dtype=dtype, seed=dim + heads)
    lengths = torch.tensor([19, 32])
    _check(q, k, v, lengths=lengths, scale=dim ** -0.5, num_splits=3, block_n=16)


@interp
@pytest.mark.parametrize("block_size", [16, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("heads,nkv", [(4, 1), (2, 2)])
def testto_blocks(block_size, dtype, heads, nkv):
    q, k, v, _, g = _case(heads=heads, nkv=nkv, seq=30, dim=24, dtype=dtype, seed=block_size)
    table = block_table(2, 30, block_size, g)
    kp, vp = to_blocks(k, block_size, table), to_blocks(v, block_size, table)
    lengths = torch.tensor([30, 13])
    out = _check(q, kp, vp, lengths=lengths, scale=0.2, block_table=table, num_splits=2,
                 block_n=16)
    # the paged kernel sees exactly the contiguous cache
    dense = dt.decode_attention_triton(q, k, v, lengths=lengths, scale=0.2, num_splits=2,
                                       block_n=16)
    torch.testing.assert_close(out.float(), dense.float(), atol=TOL[dtype], rtol=TOL[dtype])


@interp
@pytest.mark.parametrize("block_size", [0, 8, 16, 32])  # 0: contiguous cache
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_left_padding_and_mask(block_size, dtype):
    # block_n 16: blocks of 8 take the per-position gather; 16 and 32 the one-block-per-chunk
    # path, with windows starting inside a chunk (kv_start 23 and 3).
    q, k, v, _, g = _case(heads=4, nkv=2, seq=32, dim=16, dtype=dtype, seed=5)
    kw = {}
    if block_size:
        table = block_table(2, 32, block_size, g)
        k, v = to_blocks(k, block_size, table), to_blocks(v, block_size, table)
        kw = {"block_table": table}
    mask = torch.rand(2, 32, generator=g) < 0.3
    mask[1, 20:] = True  # a whole split fully masked
    _check(q, k, v, lengths=torch.tensor([9, 25]), kv_start=torch.tensor([23, 3]), mask=mask,
           scale=0.25, num_splits=3, block_n=16, **kw)


@interp
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_int8_antiquant(paged, dtype):
    q, k, v, extra, g = _case(heads=4, nkv=2, seq=32, dim=24, dtype=dtype, int8=True, seed=7)
    kw = dict(extra)
    if paged:
        table = block_table(2, 32, 16, g)
        k, v = to_blocks(k, 16, table), to_blocks(v, 16, table)
        kw["block_table"] = table
    _check(q, k, v, lengths=torch.tensor([32, 11]), kv_start=torch.tensor([0, 4]), scale=0.1,
           num_splits=2, block_n=16, **kw)
    # scale only (no offsets)
    _check(q, k, v, lengths=torch.tensor([32, 11]), scale=0.1, k_scale=kw["k_scale"],
           v_scale=kw["v_scale"], block_table=kw.get("block_table"), num_splits=2, block_n=16)


@interp
def test_empty_rows_and_out_of_range_windows():
    q, k, v, _, _ = _case(batch=2, heads=4, nkv=2, seq=32, dim=16, dtype=torch.float16, seed=3)
    # length 0, window partly past S, negative start
    _check(q, k, v, lengths=torch.tensor([0, 40]), kv_start=torch.tensor([5, 10]), scale=0.3,
           num_splits=4, block_n=16)
    _check(q, k, v, lengths=torch.tensor([6, 3]), kv_start=torch.tensor([-4, 31]), scale=0.3,
           num_splits=2, block_n=16)
    # everything masked or empty: exact zeros, not NaN
    out = _check(q, k, v, lengths=torch.tensor([0, 32]), mask=torch.ones(2, 32, dtype=torch.bool),
                 scale=0.3, num_splits=3, block_n=16)
    assert torch.equal(out, torch.zeros_like(out))


@interp
@pytest.mark.parametrize("num_splits", [1, 2, 5, 8])
def test_split_counts(num_splits):
    """More splits than chunks leaves empty splits; the merge must ignore them."""
    q, k, v, _, _ = _case(batch=2, heads=4, nkv=1, seq=32, dim=16, seed=num_splits)
    _check(q, k, v, lengths=torch.tensor([32, 17]), scale=0.25, num_splits=num_splits,
           block_n=16)


@interp
@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("block_size", [0, 16, 8])  # 0: contiguous cache
def test_masked_garbage_never_reaches_the_result(block_size, value):
    """NaN/+inf in every position outside the windows, under the mask and in unused blocks (K
    and V) give the reference's result on the caches with those positions zeroed."""
    q, k, v, _, g = _case(heads=4, nkv=2, seq=32, seed=7)
    lengths, start = torch.tensor([9, 20]), torch.tensor([5, 12])
    mask = torch.rand(2, 32, generator=g) < 0.3
    pos = torch.arange(32)[None]
    window = (pos >= start[:, None]) & (pos < (start + lengths)[:, None])
    keep = window & ~mask
    kw = dict(lengths=lengths, kv_start=start, mask=mask, scale=0.25)
    ref = decode_attention_reference(q, k.masked_fill(~keep[:, None, :, None], 0),
                                     v.masked_fill(~keep[:, None, :, None], 0), **kw)
    kp = k.masked_fill(~keep[:, None, :, None], value)
    vp = v.masked_fill(~keep[:, None, :, None], value)
    if block_size:
        table = block_table(2, 32, block_size, g)
        used = window.reshape(2, -1, block_size).any(-1)
        kp = to_blocks(kp, block_size, table).fill_(value)
        kp[table[used].long()] = to_blocks(k.masked_fill(~keep[:, None, :, None], value),
                                           block_size, table)[table[used].long()]
        vp_blocks = to_blocks(vp, block_size, table)
        vp = torch.full_like(vp_blocks, value)
        vp[table[used].long()] = vp_blocks[table[used].long()]
        kw["block_table"] = table.masked_fill(~used, -1)  # unused columns: any id
    out = dt.decode_attention_triton(q, kp, vp, num_splits=2, block_n=16, **kw)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


@interp
def test_default_heuristics_and_strided_q():
    """Default launch parameters (no overrides) and a non-contiguous q (a BSH-style view)."""
    q, k, v, _, _ = _case(batch=2, heads=4, nkv=2, seq=32, dim=16, dtype=torch.float16, seed=11)
    q_strided = q.transpose(0, 1).contiguous().transpose(0, 1)
    assert not q_strided.is_contiguous()
    _check(q_strided, k, v, lengths=torch.tensor([32, 1]), scale=0.25)


# ---------------------------------------------------------------- host-only ----------------------

def test_registered_for_cuda():
    assert _kernels.get("cuda") is dt.decode_attention_triton


def test_launch_heuristics_are_static_and_fill_an_h100():
    cfg = dt.choose_launch(batch=8, nkv=4, group=8, seq=32768, dim=128, sm_count=132)
    assert cfg["BLOCK_D"] == 128 and cfg["BLOCK_G"] == 16 and cfg["BLOCK_N"] == 64
    assert 8 * 4 * cfg["num_splits"] >= 2 * 132
    cfg = dt.choose_launch(batch=1, nkv=1, group=1, seq=16, dim=24, sm_count=132)
    assert cfg["num_splits"] == 1 and cfg["BLOCK_D"] == 32 and cfg["BLOCK_N"] == 16
    cfg = dt.choose_launch(batch=64, nkv=8, group=8, seq=4096, dim=128, sm_count=132)
    assert cfg["num_splits"] == 2


def test_cpu_tensors_without_interpreter_fail_clearly():
    if INTERPRETED:
        pytest.skip("interpreter active")
    q, k, v, _, _ = _case()
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        dt.decode_attention_triton(q, k, v, lengths=torch.tensor([1, 2]), scale=1.0)


def test_import_without_triton_subprocess():
    code = ("import sys; sys.modules['triton'] = None; sys.modules['triton.language'] = None\n"
            "from torchair.ops.attention.triton import decode as dt\n"
            "from torchair.ops.attention.decode import _kernels\n"
            "assert not dt.HAS_TRITON and 'cuda' not in _kernels\n"
            "import torchair.ops\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-3000:]


def test_interpreter_suite_subprocess():
    if INTERPRETED:
        pytest.skip("the interpreter tests ran in this process")
    run_interpreted(__file__, min_passed=30)


# ---------------------------------------------------------------- GPU ----------------------------

def _gpu_case(dtype, paged, seed=0, batch=8, heads=32, nkv=4, seq=4096, dim=128, block_size=128):
    q, k, v, _, g = _case(batch=batch, heads=heads, nkv=nkv, seq=seq, dim=dim, dtype=dtype,
                          seed=seed, device="cuda")
    lengths = torch.randint(1, seq + 1, (batch,), generator=g)
    lengths[0], lengths[1] = 0, seq
    start = torch.randint(0, 64, (batch,), generator=g)
    start[:2] = 0
    lengths = torch.minimum(lengths, seq - start)
    kw = {"lengths": lengths.cuda(), "kv_start": start.cuda(), "scale": dim ** -0.5}
    if paged:
        table = block_table(batch, seq, block_size, g).cuda()
        k, v, kw["block_table"] = to_blocks(k, block_size, table), to_blocks(v, block_size, table), table
    return q, k, v, kw


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("paged", [False, True])
def test_cuda_matches_reference(dtype, paged):
    q, k, v, kw = _gpu_case(dtype, paged)
    _check(q, k, v, **kw)
    g = torch.Generator().manual_seed(1)
    kw["mask"] = (torch.rand(8, 4096, generator=g) < 0.1).cuda()
    _check(q, k, v, **kw)


@pytest.mark.cuda
@cuda
def test_cuda_int8_antiquant():
    q, k, v, extra, _ = _case(batch=8, heads=32, nkv=4, seq=4096, dim=128, dtype=torch.float16,
                              int8=True, device="cuda")
    lengths = torch.tensor([0, 4096, 1, 17, 1000, 2049, 4000, 3333], device="cuda")
    _check(q, k, v, lengths=lengths, scale=128 ** -0.5, **extra)


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("paged", [False, True])
def test_cuda_graph_replay_follows_device_lengths(paged):
    q, k, v, kw = _gpu_case(torch.float16, paged, seed=3)
    lengths = kw.pop("lengths").clone()

    def run():
        return dt.decode_attention_triton(q, k, v, lengths=lengths, **kw)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # compile + warm up outside the capture
            run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()

    graph.replay()
    torch.cuda.synchronize()
    first = out.clone()
    ref = decode_attention_reference(q, k, v, lengths=lengths, **kw)
    torch.testing.assert_close(first.float(), ref.float(), atol=2e-3, rtol=2e-3)

    new_lengths = torch.tensor([4000, 0, 1, 2048, 17, 3000, 64, 4032], device="cuda")
    lengths.copy_(torch.minimum(new_lengths, 4096 - kw["kv_start"]))
    graph.replay()
    torch.cuda.synchronize()
    ref2 = decode_attention_reference(q, k, v, lengths=lengths, **kw)
    torch.testing.assert_close(out.float(), ref2.float(), atol=2e-3, rtol=2e-3)
    assert not torch.allclose(out.float(), first.float())
    assert torch.equal(out[1], torch.zeros_like(out[1]))
