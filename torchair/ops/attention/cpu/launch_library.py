"""The launch kernels' library: torchair's attention ops as C++ dispatcher kernels.

A static launch unit has fixed shapes, so everything its attention call needs besides the data
(checks of shapes and layouts, the kernel, its strides) is decided once.
``toolchain/csrc/launch_ops.cpp`` (built on first use by :mod:`torchair.ops.toolchain.native`
against this process's torch, cached the same safe way as the C kernels) registers the operators

    torchair_native::ifa_decode(query, key, value, actual_seq_lengths, ends, block_table,
                                num_heads, num_key_value_heads, layout, block_size, scale_value,
                                defer_errors, host_lengths)
    torchair_native::fia_prompt(...)

with PyTorch's dispatcher: C++ functions that read shapes and strides from the tensors, check
the lengths and the block ids they read (the general ops' ``ValueError`` texts) and call the
native decode kernel (``toolchain/csrc/decode_attention.c``). Inductor's generated code, its C++
wrapper and AOTInductor libraries call them like any ATen op; a call costs the dispatcher's few
microseconds, not the general op's Python. Their Python handles and fake kernels are in
:mod:`~torchair.ops.attention.cpu.launch_fakes`; which calls of a unit's graph use them is decided
by :class:`torchair.runtime.binders.attention.AttentionBinder`; the errors they defer are raised
by :mod:`~torchair.ops.attention.cpu.launch_errors`.

The same library is also the CPU kernel of ``npu_incre_flash_attention`` and its tensor twin
themselves (registered at the CPU dispatch key, ahead of the Python kernel registered for every
device): a call whose signature the general op has validated once runs the decode kernel
without entering Python; everything else goes to the general op, registered for that purpose as
``torchair_native::ifa_general[_tensor]``. The op's module hands its schemas and kernels over
with :func:`set_general` when it defines the op (this module is below it: the op's eager fast
path, :mod:`torchair.ops.attention.ifa_fast`, calls ``ifa_decode`` through this module).

Before a library is first used on a machine, a child process checks that its errors reach
Python (:func:`torchair.ops.attention.cpu.launch_probe.errors_reach_python`). This module holds
the loaded library and its ctypes entry points (the deferred-error buffer, the eager entry's
switches).

Nothing here is required: without a C++ compiler (``$CXX``, default ``c++``), with
``TORCHAIR_NATIVE_KERNELS=0`` or without the C kernel, :func:`available` is False and the units
keep the general op.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable

import torch

from torchair.base import registry as _registry
from torchair.base.log import logger
from torchair.ops.attention.cpu import launch_fakes as _fakes, native as _decode_native
from torchair.ops.attention.cpu.launch_probe import errors_reach_python
from torchair.ops.toolchain import native as _native

__all__ = ["IFA_OPS", "LAYOUTS", "SYMBOLS", "available", "clear", "library_path", "load",
           "loaded", "pending", "set_eager", "set_general", "take"]

LAYOUTS = {"BSH": 0, "BNSD": 1, "BSND": 2}
SYMBOLS = ("torchair_launch_set_decode", "torchair_launch_register",
           "torchair_launch_take_error", "torchair_launch_set_eager", "torchair_launch_clear",
           "torchair_launch_pending")
IFA_OPS = ("npu_incre_flash_attention", "npu_incre_flash_attention_tensor")
_GENERAL_NAMES = ("ifa_general", "ifa_general_tensor")

_fake_lib: Any = None
_general_lib: Any = None
_general: dict[str, tuple[str, Callable, Callable]] = {}  # npu op -> (schema, kernel, fake)
_lib: Any = None  # the loaded library (ctypes)
_take_error: Any = None  # its torchair_launch_take_error
_pending: Any = None  # its torchair_launch_pending (ctypes.c_int): threads holding an error
_tls = threading.local()  # .buf: this thread's buffer for a deferred error's text
_load_lock = threading.Lock()
_load_result: bool | None = None


def available() -> bool:
    """Whether ``torch.ops.torchair_native.ifa_decode`` is registered (built on first call)."""
    return _native.enabled() and load()


def set_general(op: str, schema: str, kernel: Callable, fake: Callable) -> None:
    """Hand over the Python implementation of ``npu::<op>`` (one of :data:`IFA_OPS`): the
    C++ entry calls it, as ``torchair_native::ifa_general[_tensor]``, for the calls it does not
    take. Called by the op's module when it defines the op."""
    if op not in IFA_OPS:
        raise ValueError(f"set_general: {op} is not one of {IFA_OPS}")
    _general[op] = (schema, kernel, fake)


def load() -> bool:
    """Load, check and register the library once per process (threads wait for the first)."""
    global _load_result
    if _load_result is None:
        with _load_lock:
            if _load_result is None:
                _load_result = _load_now()
    return _load_result


def _load_now() -> bool:
    global _fake_lib, _take_error, _lib, _pending
    if not _decode_native.available():
        return False
    lib = _native.load("launch_ops", symbols=SYMBOLS)
    if lib is None or not errors_reach_python(lib._name):
        return False
    lib.torchair_launch_set_decode.argtypes = [ctypes.c_void_p]
    lib.torchair_launch_set_decode(ctypes.cast(_decode_native.kernel(), ctypes.c_void_p))
    npu_entry = all(_registry.defined_here(name) for name in IFA_OPS)
    if not _define_general():  # ifa_decode's fallback calls it too
        return False
    err = ctypes.create_string_buffer(4096)
    lib.torchair_launch_register.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    if lib.torchair_launch_register(int(npu_entry), err, len(err)) != 0:
        logger.warning("launch kernels could not be registered with the dispatcher (%s); static "
                       "units call the general ops", err.value.decode(errors="replace"))
        return False
    _fake_lib = _fakes.register()
    lib.torchair_launch_take_error.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.torchair_launch_set_eager.argtypes = [ctypes.c_int]
    _pending = ctypes.c_int.in_dll(lib, "torchair_launch_pending")
    _take_error = lib.torchair_launch_take_error
    _lib = lib
    return True


def _define_general() -> bool:
    """``torchair_native::ifa_general[_tensor]``: the npu ops' Python implementation under
    another name, for the C++ entry to call when it does not take a call (the npu ops' own CPU
    kernel is then the C++ entry). False when the op's module has not handed it over."""
    global _general_lib
    missing = [op for op in IFA_OPS if op not in _general]
    if missing:
        logger.warning("launch kernels: the general implementation of %s was not handed over "
                       "(torchair.ops.attention.incre_flash_attention not imported); static "
                       "units call the general ops", ", ".join(missing))
        return False
    _general_lib = torch.library.Library("torchair_native", "FRAGMENT")
    for op, name in zip(IFA_OPS, _GENERAL_NAMES):
        schema, kernel, fake = _general[op]
        _general_lib.define(schema.replace(f"{op}(", f"{name}(", 1))
        _general_lib.impl(name, kernel, "CompositeExplicitAutograd")
        torch.library.register_fake(f"torchair_native::{name}", fake, lib=_general_lib)
    return True


def set_eager(on: bool) -> None:
    """Turn the C++ eager entry of ``npu_incre_flash_attention`` on or off (when loaded)."""
    if _lib is not None:
        _lib.torchair_launch_set_eager(int(on))


def clear() -> None:
    """Forget the signatures the C++ eager entry has seen validated (when loaded)."""
    if _lib is not None:
        _lib.torchair_launch_clear()


def loaded() -> bool:
    """Whether the launch kernels are registered in this process (never builds them)."""
    return _take_error is not None


def library_path() -> str | None:
    """The file of the loaded library (None when not loaded)."""
    return None if _lib is None else _lib._name


def take() -> str | None:
    """The error a deferred launch-kernel call of this thread kept, cleared (None: none)."""
    if _take_error is None:
        return None
    buf = getattr(_tls, "buf", None)
    if buf is None:
        buf = _tls.buf = ctypes.create_string_buffer(8192)
    if not _take_error(buf, len(buf)):
        return None
    return buf.value.decode(errors="replace")


def pending() -> Any:
    """The library's count of threads holding a deferred error (a ``ctypes.c_int``: read
    ``.value`` after a run;
    :func:`torchair.ops.attention.cpu.launch_errors.raise_pending` when it is not zero). None
    when not loaded."""
    return _pending
