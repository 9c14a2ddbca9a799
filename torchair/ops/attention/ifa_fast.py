"""The fast path of ``npu_incre_flash_attention`` for the common CPU decode call.

A decode step calls the op with the same shapes, dtypes, strides and options every time; only
the data and the lengths change. The general path
(:mod:`torchair.ops.attention.incre_flash_attention`) re-derives everything per call:
:func:`~torchair.ops.attention.ifa_checks.validate`, the canonical views, the windows as tensors,
the kernel's strides and work split. Here that is done once per *signature* (shapes, strides,
dtypes, devices and options: the ``_signature`` tuple) and kept in a :class:`_Bound`; a call with a
known signature only

* checks the lengths' values as the general path does, with its ``ValueError`` texts: a
  negative length; for host lengths with page attention, the block table's width and the
  cache's block count (a host list or a CPU tensor is read);
* calls the launch kernel ``torchair_native::ifa_decode``
  (:mod:`torchair.ops.attention.cpu.launch_library`: C++, through the dispatcher) with the
  checked window ends, or with a tensor of lengths, which it checks itself; without a C++
  compiler, passes data pointers, the window ends and the scale to the native kernel through
  ctypes (:mod:`torchair.ops.attention.cpu.native`). Either checks every block id a window
  reads (a bad one raises the general path's ``ValueError`` naming ``block_table[b, c]``) and
  computes exactly what the general path computes (same kernel, same work split: bit-identical
  results).

Taken when: CPU tensors, one query token, float32 / bfloat16 / float16 query with key and value
of its dtype, no mask, pse_shift, antiquant, output quantization or kv padding, the native
kernel built and taking the shapes (head dim a multiple of 16, at most 64 query heads per kv
head). Everything else, and a signature seen for the first time, runs the general path; a
signature the fast path does not take is remembered as such (``None``).
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import threading
from typing import Any, Iterator, Sequence

import torch

from torchair.ops import _device_checks
from torchair.ops.attention import ifa_checks as _ifa_checks, ifa_compute as _compute
from torchair.ops.attention.cpu import launch_library as _library, native as _decode_native
from torchair.ops.attention.cpu.launch_fakes import ifa_decode
from torchair.ops.toolchain import native as _native

__all__ = ["ENABLED", "call", "clear", "disabled"]

ENABLED = True  # off inside disabled() (tests that replace a piece of the general path)
_MAX_ENTRIES = 256
_bound: dict[tuple, _Bound | None] = {}
_lock = threading.Lock()
_inside = threading.local()  # .launch: this thread is inside a launch-kernel call


@dataclasses.dataclass(frozen=True)
class _Bound:
    """Everything about a call that its signature decides."""

    fn: Any                    # the kernel (ctypes function)
    kind: int                  # K/V element kind of the kernel
    k_canon_strides: tuple     # strides of the canonical K/V views (equal for V)
    batch: int
    nkv: int
    group: int
    dim: int
    kv_len: int                # S_kv (dense) or max_blocks * block_size (paged)
    block_size: int            # 1 when dense
    num_blocks: int            # blocks of the paged cache (0 when dense)
    q_direct: bool             # float32 contiguous query: the kernel reads it in place
    q_bf16: bool
    zeros: Any                 # ctypes int64[B] of zeros: every window starts at 0
    launch: bool               # the C++ launch kernel takes the call (else ctypes)


class _Strided:
    """The three strides the kernel takes, with the cache's data pointer (no tensor built)."""

    __slots__ = ("ptr", "strides")

    def __init__(self, ptr: int, strides: tuple) -> None:
        self.ptr, self.strides = ptr, strides

    def data_ptr(self) -> int:
        return self.ptr

    def stride(self, i: int) -> int:
        return self.strides[i]


def clear() -> None:
    """Forget every signature (tests; a rebuilt kernel library), here and in the C++ entry."""
    with _lock:
        _bound.clear()
    _library.clear()


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """The general path for every call inside the block: this fast path and the C++ eager entry
    of the op (:mod:`torchair.ops.attention.cpu.launch_library`) are off."""
    global ENABLED
    old = ENABLED
    ENABLED = False
    _library.set_eager(False)
    try:
        yield
    finally:
        ENABLED = old
        _library.set_eager(old)


def _signature(query, key, value, lengths, block_table, num_heads, layout, nkv, block_size):
    if isinstance(lengths, torch.Tensor):
        length_sig: Any = ("t", lengths.dtype, tuple(lengths.shape), lengths.device.type)
    else:
        length_sig = None if lengths is None else len(lengths)
    table_sig = None if block_table is None else (
        tuple(block_table.shape), block_table.stride(), block_table.dtype,
        block_table.device.type)
    return (tuple(query.shape), query.stride(), query.dtype, tuple(key.shape), key.stride(),
            key.dtype, key.device.type, tuple(value.shape), value.stride(), value.dtype,
            value.device.type, length_sig, table_sig, num_heads, layout, nkv, block_size)


def _bind(query, key, value, lengths, block_table, num_heads, scale, layout, nkv,
          block_size) -> _Bound | None:
    """The bound call of this signature, or None when the fast path does not take it. Runs the
    general path's full validation (its errors are raised here)."""
    plan = _ifa_checks.validate(query, key, value, actual_seq_lengths=lengths,
                                block_table=block_table, num_heads=num_heads,
                                scale_value=scale, input_layout=layout,
                                num_key_value_heads=nkv, block_size=block_size)
    if (query.device.type != "cpu" or plan.kv_int8 or not _compute.decode_eligible(plan, None)
            or key.dtype != query.dtype or query.dtype not in _decode_native.KINDS
            or not _decode_native.available()):
        return None
    dims = plan.dims
    k_canon = _compute.canonical_cache(key, plan)
    v_canon = _compute.canonical_cache(value, plan)
    if (k_canon.stride() != v_canon.stride() or k_canon.stride(-1) != 1
            or dims.head_dim % 16 or dims.head_dim > _decode_native.MAX_D
            or dims.num_heads // dims.num_kv_heads > _decode_native.MAX_G
            or k_canon.data_ptr() != key.data_ptr() or v_canon.data_ptr() != value.data_ptr()):
        return None
    return _Bound(
        fn=_decode_native.kernel(), kind=_decode_native.KINDS[key.dtype],
        k_canon_strides=tuple(k_canon.stride()[:3]), batch=dims.batch, nkv=dims.num_kv_heads,
        group=dims.num_heads // dims.num_kv_heads, dim=dims.head_dim, kv_len=dims.kv_len,
        block_size=block_size if plan.paged else 1,
        num_blocks=key.shape[0] if plan.paged else 0,
        q_direct=query.dtype == torch.float32 and query.is_contiguous(),
        q_bf16=query.dtype == torch.bfloat16,
        zeros=(ctypes.c_int64 * dims.batch)(),
        launch=_library.available() and _launch_takes(lengths, block_table))


def _launch_takes(lengths, block_table) -> bool:
    """What the C++ launch kernel takes beyond the kernel's shapes (launch_ops.cpp): int64
    tensor lengths, a block table with contiguous rows."""
    if isinstance(lengths, torch.Tensor) and lengths.dtype != torch.int64:
        return False
    return block_table is None or block_table.stride(1) == 1


def _lengths(bound: _Bound, lengths, block_table) -> list[int]:
    """Per batch window end, after the general path's value checks."""
    if lengths is None:
        return [bound.kv_len] * bound.batch
    device = isinstance(lengths, torch.Tensor)  # the twin's: no table-width / blocknum checks
    host = _ifa_checks.host_lengths(lengths.tolist() if device else lengths,
                                     bound.batch)  # counts, negatives
    if block_table is not None and not device:
        _ifa_checks.check_paged_lengths(host, block_table.shape[1], bound.num_blocks,
                                        bound.block_size)
    kv_len = bound.kv_len
    return [x if x < kv_len else kv_len for x in host]


def call(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
         lengths: Sequence[int] | torch.Tensor | None, block_table: torch.Tensor | None,
         num_heads: int, scale: float, layout: str, nkv: int, block_size: int
         ) -> torch.Tensor | None:
    """The op's result, or None: the general path must run (see the module doc)."""
    if not ENABLED or not _native.enabled():
        return None
    sig = _signature(query, key, value, lengths, block_table, num_heads, layout, nkv,
                     block_size)
    try:
        bound = _bound[sig]
    except KeyError:
        bound = _bind(query, key, value, lengths, block_table, num_heads, scale, layout, nkv,
                      block_size)
        with _lock:
            if len(_bound) >= _MAX_ENTRIES:
                _bound.clear()
            _bound[sig] = bound
    if bound is None:
        return None
    if bound.launch and not getattr(_inside, "launch", False):
        # the C++ launch kernel: strides, work split and checks in C++. Arguments it does not
        # take go from C++ to the general op, which calls this function again: that call (flag
        # set) runs the general path, never the launch kernel a second time.
        tensor = isinstance(lengths, torch.Tensor)
        _inside.launch = True
        try:
            return ifa_decode()(
                query, key, value, lengths if tensor else None,
                None if tensor or lengths is None else _lengths(bound, lengths, block_table),
                block_table, num_heads, nkv, _library.LAYOUTS[layout], block_size, scale)
        finally:
            _inside.launch = False
    if getattr(_inside, "launch", False):
        return None
    ends = _lengths(bound, lengths, block_table)
    window = max(ends)
    if window <= 0:  # nothing attended anywhere: zeros, as the general path
        return query.new_zeros(query.shape)
    threads, splits = _decode_native.work_split(bound.batch, bound.nkv, window)
    qf = query if bound.q_direct else query.detach().float().contiguous()
    table = None
    if block_table is not None:
        table = block_table if block_table.is_contiguous() else block_table.contiguous()
    hi = (ctypes.c_int64 * bound.batch)(*ends)
    strides = bound.k_canon_strides
    out, _, rc, err = _decode_native.run(
        bound.fn, qf.data_ptr(), None, _Strided(key.data_ptr(), strides),
        _Strided(value.data_ptr(), strides), bound.kind,
        None if table is None else table.data_ptr(), table is not None and
        table.dtype == torch.int32, 0 if table is None else table.stride(0), bound.block_size,
        bound.num_blocks, ctypes.addressof(bound.zeros), ctypes.addressof(hi), None, 0,
        bound.batch, bound.nkv, bound.group, bound.dim, splits, threads, scale, bound.q_bf16)
    if rc == -2:
        raise _device_checks.block_id_error(_ifa_checks.OP, table, err[0], err[1],
                                            bound.num_blocks, 0, ends[err[0]])
    if rc != 0:
        return None
    if query.dtype != torch.float32:
        out = out.to(query.dtype)
    return out.view(query.shape)

