"""Few-row matrix products of CPU static units: ``torchair_native::gemv``.

A decode step's linear layers are ``mm(x, W.t())`` (``addmm`` with a bias) whose ``x`` has as
many rows as the batch: each product reads the whole weight once and does little arithmetic per
weight value, so its time is the time to stream the weight. ``toolchain/csrc/small_gemm.cpp``
(built on first use by :mod:`torchair.ops.toolchain.native` against this process's torch, cached
the same safe way as the other native kernels) registers

    torchair_native::gemv(Tensor x, Tensor w_t, Tensor? bias=None, int abi=0) -> Tensor

with PyTorch's dispatcher: ``mm(x, w_t)`` (plus ``bias``), computed by a kernel that splits W's
rows over PyTorch's threads (its OpenMP runtime and thread count) and streams each row once for
up to 8 rows of ``x`` held in vector registers (AVX-512, else AVX2). Each output is one thread's
sum in a fixed order, whatever the thread count. Calls it cannot take (another dtype, a layout
whose rows are not contiguous in k, a bias that is not N contiguous values) are ATen's
``mm``/``addmm`` inside the same operator, so no call is refused.

Static units call it for a product with :data:`MIN_ROWS` to :data:`MAX_ROWS` rows (a linear
layer's ``mm(x, W.t())`` in the graph of a CPU static unit built by the Inductor engine, bound by
:class:`torchair.runtime.binders.small_products.SmallProductBinder`). ``MIN_ROWS`` is 4 on an
Intel CPU with MKL, whose GEMV of fewer rows already reads the weight at the memory's speed, and
1 elsewhere (:func:`default_min_rows`); above ``MAX_ROWS`` a BLAS's blocked GEMM is the faster
one (``bench/bench_small_gemm.py``). The kernel sums in another order than the BLAS, so a bound
unit's products can differ from eager's in the last bits (as Inductor's fused kernels do);
``TORCHAIR_SMALL_GEMM=0`` keeps ATen's ``mm``.

Nothing here is required: without a C++ compiler, with ``TORCHAIR_NATIVE_KERNELS=0`` or on a CPU
without AVX2/AVX-512 the products stay ATen's.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any

import torch

from torchair.base.log import env_switch, logger
from torchair.ops.toolchain import native as _native

__all__ = ["ENV_SWITCH", "GROUP_SWITCH", "MAX_ROWS", "MIN_ROWS", "available", "binds_rows",
           "default_min_rows", "gemv", "gemv_cat", "reference", "set_prefetch", "vector_bits"]


def default_min_rows(vendor: str | None = None, mkl: bool | None = None) -> int:
    """The fewest rows static units bind (:data:`MIN_ROWS`): 4 on an Intel CPU whose torch has
    MKL, else 1. ATen's GEMV of 1-3 rows is MKL's, which takes its vectorized kernels on Intel
    CPUs only. bench/bench_small_gemm.py, the decode bench's 14 weights (23 MiB):

    * Intel Xeon, AVX-512 (2 cores): F.linear streams the weights at the read bandwidth at 1-3
      rows (the kernel: 0.94-1.02x at 1-2 rows, 0.83x at 3); the kernel is 1.23-1.66x faster at
      4-16 rows, 1.16-1.17x at 32, equal at 48, slower at 64;
    * AMD EPYC, AVX-512 (2 cores): MKL runs its generic ``mkl_blas_def_xsgemv`` (profiled) and
      the kernel is 2.9-4.3x faster at 1-3 rows over two runs (2.0-2.3x on the demo's 4-layer,
      hidden-256 weights).

    ``vendor`` (``/proc/cpuinfo``'s ``vendor_id``) and ``mkl`` default to this machine's."""
    if vendor is None:
        vendor = _cpu_vendor()
    if mkl is None:
        mkl = torch.backends.mkl.is_available()
    return 4 if vendor == "GenuineIntel" and mkl else 1


def _cpu_vendor() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return "GenuineIntel" if "intel" in platform.processor().lower() else platform.processor()


# Rows of x a static unit's products are bound for: from default_min_rows() (1 or 4) to 32 (a
# BLAS's blocked GEMM wins above, once arithmetic dominates).
MIN_ROWS = default_min_rows()
MAX_ROWS = 32
ENV_SWITCH = "TORCHAIR_SMALL_GEMM"  # 0: static units keep ATen's mm (eager's products, bit for bit)
# 0: products of the same x stay one gemv call each instead of one gemv_cat (the same sums)
GROUP_SWITCH = "TORCHAIR_GEMV_GROUPS"
_SYMBOLS = ("torchair_gemm_register", "torchair_gemm_vector_bits", "torchair_gemm_set_prefetch")
_lock = threading.Lock()
_result: bool | None = None
_bits = 0
_fake_lib: Any = None
_lib: Any = None


def available() -> bool:
    """Whether ``torch.ops.torchair_native.gemv`` is registered with a vector fast path (built
    and loaded on the first call)."""
    global _result
    if _result is None:
        with _lock:
            if _result is None:
                _result = _native.enabled() and _load_now()
    return _result


def binds_rows(rows: int) -> bool:
    """Whether static units bind float32 products of ``rows`` rows here: the row count is in
    ``[MIN_ROWS, MAX_ROWS]``, ``TORCHAIR_SMALL_GEMM`` is not 0 and the kernel is available."""
    return MIN_ROWS <= rows <= MAX_ROWS and env_switch(ENV_SWITCH) and available()


def vector_bits() -> int:
    """The fast path's vector width (512 or 256), 0 when there is none."""
    return _bits if available() else 0


def _load_now() -> bool:
    global _bits, _fake_lib, _lib
    lib = _native.load("small_gemm", symbols=_SYMBOLS)
    if lib is None:
        return False
    bits = lib.torchair_gemm_vector_bits()
    if bits == 0:
        logger.info("small products: this CPU has neither AVX-512 nor AVX2+FMA (as the compiler "
                    "sees it); static units keep ATen's mm")
        return False
    err = ctypes.create_string_buffer(4096)
    lib.torchair_gemm_register.argtypes = [ctypes.c_char_p, ctypes.c_int]
    if lib.torchair_gemm_register(err, len(err)) != 0:
        logger.warning("torchair_native::gemv could not be registered with the dispatcher (%s); "
                       "static units keep ATen's mm", err.value.decode(errors="replace"))
        return False
    _fake_lib = torch.library.Library("torchair_native", "FRAGMENT")
    torch.library.register_fake("torchair_native::gemv", _gemv_fake, lib=_fake_lib)
    torch.library.register_fake("torchair_native::gemv_cat", _gemv_cat_fake, lib=_fake_lib)
    _bits, _lib = bits, lib
    return True


def set_prefetch(on: bool) -> None:
    """Whether products prefetch the next block of the weight (into L2) while they
    compute (on by default; ``available()`` must be True). For benches that time the kernel
    with and without it in one process (``bench_small_gemm.py``)."""
    if not available():
        raise RuntimeError("torchair_native::gemv is not available here")
    _lib.torchair_gemm_set_prefetch(ctypes.c_int(1 if on else 0))


def _gemv_fake(x, w_t, bias=None, abi=0):
    torch._check(x.dim() == 2 and w_t.dim() == 2 and x.shape[1] == w_t.shape[0],
                 lambda: f"gemv: x {tuple(x.shape)} and w_t {tuple(w_t.shape)} do not multiply")
    return x.new_empty((x.shape[0], w_t.shape[1]))  # contiguous, as the kernel's


def _gemv_cat_fake(x, w0, w1, w2=None, b0=None, b1=None, b2=None, abi=0):
    weights = [w for w in (w0, w1, w2) if w is not None]
    torch._check(w2 is not None or b2 is None, lambda: "gemv_cat: b2 is given without w2")
    for w in weights:
        torch._check(x.dim() == 2 and w.dim() == 2 and x.shape[1] == w.shape[0],
                     lambda w=w: f"gemv_cat: x {tuple(x.shape)} and {tuple(w.shape)} do not multiply")
    return x.new_empty((x.shape[0], sum(w.shape[1] for w in weights)))


def gemv() -> Any:
    """The operator (``available()`` must be True)."""
    return torch.ops.torchair_native.gemv.default


def gemv_cat() -> Any:
    """``torchair_native::gemv_cat(x, w0, w1, w2=None, b0=None, b1=None, b2=None, abi=0)``: the
    products of one ``x`` with 2 or 3 weights side by side, ``cat([x @ w_i (+ b_i)], 1)``, in one
    parallel region, each output the sum :func:`gemv` computes (``available()`` must be True)."""
    return torch.ops.torchair_native.gemv_cat.default


def reference(x: torch.Tensor, w_t: torch.Tensor, bias: torch.Tensor | None = None
              ) -> torch.Tensor:
    """The product in float64 (the tests' reference), as ``x``'s dtype."""
    out = x.double() @ w_t.double()
    if bias is not None:
        out = out + bias.double()
    return out.to(x.dtype)
