"""The error raised when a script touches an Ascend-only part of ``torch_npu``."""
from __future__ import annotations

__all__ = ["NotEmulatedError", "module_getattr", "not_emulated"]


class NotEmulatedError(NotImplementedError, AttributeError):
    """An Ascend-only ``torch_npu`` name the emulation cannot honour.

    It is also an ``AttributeError`` so that ``hasattr(torch_npu, name)`` and ``getattr(...,
    default)`` keep working for code that probes for optional features.
    """


def not_emulated(module: str, name: str) -> NotEmulatedError:
    """The error for ``<module>.<name>``: what is missing and what to do instead."""
    return NotEmulatedError(
        f"{module}.{name} is Ascend-only and not emulated by torchair run; the emulation "
        "provides the torchair op library (torch_npu.npu_*), npu_format_cast, 'npu' device "
        "arguments, Tensor.npu / Module.npu, and torch.npu's device, stream, event, seed and "
        "memory functions and Ascend switches (config, set_option, set_compile_mode). Remove "
        "the call or guard it for non-Ascend runs.")


def module_getattr(module: str):
    """A module-level ``__getattr__`` (PEP 562) that names what is not emulated.

    Dunder names raise a plain ``AttributeError``: they are probes by Python and tools, not
    Ascend calls.
    """

    def __getattr__(name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        raise not_emulated(module, name)

    return __getattr__
