"""Helpers shared by the Triton kernel modules (``torchair.ops.attention.triton.decode``,
``torchair.ops.norm.triton``, ``torchair.ops.quant.triton``).

* :func:`next_pow2`: the smallest power of two ``>= x`` (1 for ``x <= 1``), for block sizes.
* :func:`interpreted`: whether ``triton.jit`` produced interpreted functions in this process, i.e.
  ``TRITON_INTERPRET=1`` was set before triton was imported (Triton decides at decoration time,
  and every kernel module is decorated in the same import of ``torchair.ops``).
* :func:`rint`: ``@triton.jit`` round half to even of a float32 tensor, exact for every float32
  value (compiled and interpreted); the one rounding of every float -> int8 store of the kernels.
* :func:`launch_mode`: the one device check of every kernel wrapper: interpreted or compiled
  launch, or a ``RuntimeError`` naming the fix. Inside
  :func:`torchair.ops.toolchain.triton_aot.compile_only` a compiled launch is also allowed for
  tensors off the GPU (meta tensors): the launches only compile, for a GPU target, without a GPU.
* :func:`sm_count`: the streaming-multiprocessor count the launch heuristics plan for.

Importing this module never fails without Triton (``HAS_TRITON`` says whether it is there).
"""
from __future__ import annotations

import contextvars
import functools

import torch

try:  # Triton is optional: without it the ops fall back to their reference / CPU kernels.
    import triton
    import triton.language as tl
    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only where triton is absent
    triton = None
    tl = None
    HAS_TRITON = False

__all__ = ["HAS_TRITON", "interpreted", "launch_mode", "next_pow2", "rint", "sm_count"]

# Set by torchair.ops.toolchain.triton_aot.compile_only: the SM count of the GPU compiled for, while
# launches compile for it without running (None otherwise).
COMPILE_ONLY_SMS: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "torchair_triton_compile_only_sms", default=None)
_INTERPRETER_SMS = 4  # stand-in SM count in the interpreter (keeps decode splits > 1)


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


def launch_mode(device, what: str) -> bool:
    """Whether a launch of ``what``'s kernels on ``device`` is interpreted (True) or compiled.

    Raises ``RuntimeError`` naming the fix without Triton, or for a non-CUDA device outside the
    interpreter (unless :func:`torchair.ops.toolchain.triton_aot.compile_only` is active).
    """
    if not HAS_TRITON:
        raise RuntimeError(f"{what} needs the 'triton' package; install triton, or run on CPU "
                           f"(the ops pick their CPU kernels there)")
    if interpreted():
        return True
    if device.type == "cuda" or COMPILE_ONLY_SMS.get() is not None:
        return False
    raise RuntimeError(f"{what} got a tensor on {device}; its kernels need CUDA tensors, or "
                       f"Triton's interpreter: set TRITON_INTERPRET=1 before triton and "
                       f"torchair.ops are imported")


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device) -> int:
    """The SM count of ``device`` (CUDA), of the target of an active ``compile_only``, or a small
    stand-in for the interpreter."""
    if device.type == "cuda":
        return _cuda_sm_count(device.index if device.index is not None
                              else torch.cuda.current_device())
    sms = COMPILE_ONLY_SMS.get()
    return sms if sms is not None else _INTERPRETER_SMS
