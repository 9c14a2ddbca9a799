"""The native (C) CPU decode attention kernel: argument checks and the ctypes call.

``toolchain/csrc/decode_attention.c`` (built by :mod:`torchair.ops.toolchain.native`) streams every
K and V row of each (batch, kv head) window once, with register tiles for the ``G`` query heads that
share it, an online softmax in float32 and K/V converted from float32 / bfloat16 / float16 / int8 in
registers; work items (sequence, split of its window: all its kv heads, so that the K/V rows of a
position are read together) run on ``torch.get_num_threads()`` OpenMP threads (PyTorch's own pool
in a PyTorch process).
:func:`decode` returns ``None`` when the kernel does not take the arguments (library not
available, head dim not a multiple of 16, more than 64 query heads per kv head, K and V of
different dtypes or strides, a strided head dim); the caller then uses its PyTorch path.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from torchair.ops import _device_checks
from torchair.ops.toolchain import native as _native

__all__ = ["KINDS", "MAX_D", "MAX_G", "MIN_SPLIT", "MIN_SPLIT_ONE", "available", "decode",
           "kernel", "run", "work_split"]

KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.int8: 3}  # K/V dtypes
MAX_G, MAX_D = 64, 512  # query heads per kv head, head dim
MIN_SPLIT = 128            # fewest positions in one split of a sequence's window (batch > 1)
MIN_SPLIT_ONE = 64         # ... of the one sequence of a batch-1 call
_SERIAL_WORK = 256         # rows x positions under which one thread is used


# every function of the library called here: a library lacking one is rebuilt or refused by load
_SYMBOLS = ("torchair_decode_attention", "torchair_decode_attention_bf16_dot")


def _library():
    return _native.load("decode_attention", symbols=_SYMBOLS)


def kernel():
    """The kernel's ctypes function (None when the library is not available)."""
    return _function()


@functools.lru_cache(maxsize=None)
def _function():
    lib = _library()
    if lib is None:
        return None
    fn = lib.torchair_decode_attention
    p, i, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    fn.argtypes = [p, p, p, p, i, i64, i64, i64, p, i, i64, i64, i64, p, p, p, i64,
                   i, i, i, i, i, i, p, p, p, p, p, ctypes.c_float, i, p]
    fn.restype = ctypes.c_int
    return fn


def bf16_dot() -> bool:
    """Whether the built kernel multiplies bf16 K by a bf16 query with bf16 dot products
    (AVX512-BF16: exact products, float32 sums)."""
    if not available():
        return False
    return bool(_library().torchair_decode_attention_bf16_dot())


def available() -> bool:
    """Whether the native kernel is built and loaded (it is built on the first call)."""
    return _native.enabled() and _function() is not None


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def decode(qf: torch.Tensor, score_bias: torch.Tensor | None, scale: float,
           k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor | None,
           lo_b: torch.Tensor, hi_b: torch.Tensor, mask_b: torch.Tensor | None,
           q_bf16: bool = False) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Softmax-weighted V of every row, or None (see the module doc).

    Scores are ``(qf . k + score_bias) * scale``: ``qf`` float32 ``[B * Nkv, G, D]`` b-major,
    ``score_bias`` ``[rows, G, 1]`` or None; ``q_bf16``: ``qf`` holds bfloat16 values exactly
    (then bf16 K may use bf16 dot products);
    caches dense ``[B, Nkv, S, D]`` or paged ``[num_blocks, Nkv, block_size, D]`` (ids already
    checked); ``lo_b`` / ``hi_b`` int64 ``[B]`` windows; ``mask_b`` bool ``[B, S]`` (True =
    masked out) or None. Returns (``[rows, G, D]`` normalized, ``[rows, G]`` softmax sums).
    """
    rows, group, dim = qf.shape
    kind = KINDS.get(k_cache.dtype)
    if (kind is None or v_cache.dtype != k_cache.dtype or k_cache.stride() != v_cache.stride()
            or k_cache.stride(-1) != 1 or dim % 16 or dim > MAX_D or group > MAX_G
            or k_cache.device.type != "cpu" or v_cache.device.type != "cpu"):
        return None
    if not available():
        return None
    fn = _function()
    batch = lo_b.shape[0]
    nkv = rows // batch
    lo = lo_b.contiguous()
    hi = hi_b.contiguous()
    table = block_table.detach().to("cpu", torch.long).contiguous() \
        if block_table is not None else None
    mask_u8 = mask_b.contiguous().view(torch.uint8) if mask_b is not None else None
    if mask_u8 is not None and mask_u8.shape[1] < int(hi.max()):
        return None  # a mask narrower than the windows: the PyTorch path reports it
    bias = score_bias.reshape(rows, group).contiguous() if score_bias is not None else None

    window = int((hi - lo).clamp_min(0).max())
    threads, splits = work_split(batch, nkv, window)
    block_size = k_cache.shape[2] if table is not None else 1
    out, out_l, rc, err = run(fn, qf.data_ptr(), _ptr(bias), k_cache, v_cache, kind, _ptr(table),
                              False, table.shape[1] if table is not None else 0, block_size,
                              k_cache.shape[0], lo.data_ptr(), hi.data_ptr(), _ptr(mask_u8),
                              mask_u8.shape[1] if mask_u8 is not None else 0, batch, nkv, group,
                              dim, splits, threads, scale, q_bf16)
    if rc == -2:  # the callers check the ids first; the kernel checks them again
        raise _device_checks.block_id_error(None, table, err[0], err[1], k_cache.shape[0],
                                            int(lo[err[0]]), int(hi[err[0]]))
    if rc != 0:
        return None
    return out, out_l


def work_split(batch: int, nkv: int, window: int) -> tuple[int, int]:
    """(threads, splits per sequence) for ``batch`` sequences of ``nkv`` kv heads and at most
    ``window`` positions. A work item is one split of one sequence's window, all its kv heads
    (their K/V rows are adjacent in BSH). One sequence is split into one equal part per thread
    (of at least ``MIN_SPLIT_ONE`` positions): more parts only add streams to prefetch (measured
    slower, cold KV most). Several sequences, whose windows may differ, are split when there are
    fewer than four items per thread, into splits of at least ``MIN_SPLIT`` positions and so that
    every thread gets as many items. Under ``_SERIAL_WORK`` rows x positions one thread runs the
    call (measured on 2 cores: two threads gain from about 128 rows x positions on)."""
    threads = max(1, torch.get_num_threads())
    if batch * nkv * window < _SERIAL_WORK:
        threads = 1
    splits = 1
    if threads > 1 and batch == 1:
        splits = max(1, min(threads, window // MIN_SPLIT_ONE))
    elif threads > 1 and batch < 4 * threads:
        splits = max(1, min(-(-4 * threads // batch), window // MIN_SPLIT))
        while splits > 1 and (batch * splits) % threads:
            splits -= 1
    return threads, splits


def run(fn, q_ptr: int, bias_ptr: int | None, k_cache: torch.Tensor, v_cache: torch.Tensor,
        kind: int, table_ptr: int | None, table_i32: bool, table_stride: int, block_size: int,
        num_blocks: int, lo_ptr: int, hi_ptr: int, mask_ptr: int | None, mask_stride: int,
        batch: int, nkv: int, group: int, dim: int, splits: int, threads: int, scale: float,
        q_bf16: bool) -> tuple[torch.Tensor, torch.Tensor, int, list[int]]:
    """One kernel call: ``(out [rows, G, D], softmax sums [rows, G], return code, err)``."""
    rows = batch * nkv
    items = rows * splits
    # one scratch allocation: part_m [items, G], part_l [items, G], part_acc [items, G, D]
    scratch = torch.empty(items * group * (dim + 2))
    base = scratch.data_ptr()
    out = torch.empty(rows, group, dim)
    out_l = torch.empty(rows, group)
    err = (ctypes.c_int64 * 3)()
    rc = fn(q_ptr, bias_ptr, k_cache.data_ptr(), v_cache.data_ptr(), kind,
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), table_ptr, int(table_i32),
            table_stride, block_size, num_blocks, lo_ptr, hi_ptr, mask_ptr, mask_stride,
            batch, nkv, group, dim, splits, threads, base, base + 4 * items * group,
            base + 8 * items * group, out.data_ptr(), out_l.data_ptr(), float(scale),
            int(q_bf16), ctypes.addressof(err))
    return out, out_l, rc, list(err)
