"""Helpers shared by the Triton kernel modules (``_decode_triton``, ``_norm_triton``,
``_quant_triton``).

* :func:`next_pow2`: the smallest power of two ``>= x`` (1 for ``x <= 1``), for block sizes.
* :func:`interpreted`: whether ``triton.jit`` produced interpreted functions in this process, i.e.
  ``TRITON_INTERPRET=1`` was set before triton was imported (Triton decides at decoration time,
  and every kernel module is decorated in the same import of ``torchair.ops``).
* :func:`rint`: ``@triton.jit`` round half to even of a float32 tensor, exact for every float32
  value (compiled and interpreted); the one rounding of every float -> int8 store of the kernels.

Importing this module never fails without Triton (``HAS_TRITON`` says whether it is there).
"""
from __future__ import annotations

try:  # Triton is optional: without it the ops fall back to their reference / CPU kernels.
    import triton
    import triton.language as tl
    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only where triton is absent
    triton = None
    tl = None
    HAS_TRITON = False

__all__ = ["HAS_TRITON", "interpreted", "next_pow2", "rint"]


def next_pow2(x: int) -> int:
    """The smallest power of two ``>= x`` (1 for ``x <= 1``)."""
    return 1 << (max(int(x), 1) - 1).bit_length()


def rint(v):
    """Round half to even of a float32 tensor, portable (compiled and interpreted) and exact for
    every float32 (no ``1.5 * 2**23`` magic-number trick, which needs ``|v| < 2**22`` and an
    addition the compiler does not reassociate)."""
    f = tl.floor(v)
    d = v - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0.0
    return tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)


if HAS_TRITON:
    rint = triton.jit(rint)


def interpreted() -> bool:
    """Whether the kernels run in Triton's interpreter (TRITON_INTERPRET=1 at import time)."""
    if not HAS_TRITON:
        return False
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(rint, InterpretedFunction)
