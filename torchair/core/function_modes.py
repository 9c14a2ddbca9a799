"""Torch-function modes whose effect on tracing is known and repeatable (a registry).

Dynamo guards a compiled frame on the torch-function mode stack (its
``TORCH_FUNCTION_MODE_STACK`` guard). ``cache_compile`` cannot restore an arbitrary user mode in
another process, so it refuses to cache a function traced under one. A mode registered here is
different: its class and its own attributes fully decide what it does to a traced call (the
``torch_npu`` emulation's device mode maps ``"npu"`` to one fixed device), so an entry traced
under it can be served to a process whose stack holds an equal mode. :func:`stack_tags`
describes the current stack as text tags that go into the entry's key and its guards;
:func:`process_modes` adds the modes whose effect is process-wide (the emulation's, seen from a
thread whose own stack is empty).

This module sits low in the layer stack: ``torchair.compat`` registers its mode here and
``torchair.inference`` reads the stack, without either importing the other.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["UnknownMode", "process_actives", "process_modes", "register_cacheable_mode",
           "register_process_mode", "stack_depth", "stack_modes", "stack_tags", "tag_of"]

_KNOWN: dict[type, Callable[[Any], str]] = {}
_stack_depth = torch._C._len_torch_function_stack
stack_depth = _stack_depth  # how many torch-function modes this thread's stack holds (C, no frame)
_stack_at = torch._C._get_function_stack_at
_PROCESS: list[Callable[[], Any]] = []


class UnknownMode(Exception):
    """The stack holds a mode that is not registered (its class is ``mode_type``)."""

    def __init__(self, mode_type: type) -> None:
        super().__init__(f"{mode_type.__module__}.{mode_type.__qualname__}")
        self.mode_type = mode_type


def _state_tag(mode: Any) -> str:
    """``module.Class(attr=value, ...)``: the class and every instance attribute, sorted; a
    class-valued attribute by its qualified name (its repr holds an address)."""
    def text(value: Any) -> str:
        if isinstance(value, type):
            return f"{value.__module__}.{value.__qualname__}"
        return repr(value)

    state = sorted((k, text(v)) for k, v in vars(mode).items())
    cls = type(mode)
    return f"{cls.__module__}.{cls.__qualname__}(" + ", ".join(f"{k}={v}" for k, v in state) + ")"


def register_cacheable_mode(cls: type, tag: Callable[[Any], str] | None = None) -> type:
    """Declare that a mode of ``cls`` acts on traced calls only through ``tag(mode)`` (default:
    its class and instance attributes), so graphs traced under it may be cached. ``tag`` must
    depend on nothing but the mode's class and instance attributes: a warm call whose modes are
    the very objects last checked, with equal attributes, is not described again. Returns
    ``cls`` (usable as a class decorator). A second registration of the same class raises."""
    if not isinstance(cls, type):
        raise TypeError(f"register_cacheable_mode: cls must be a class, got {cls!r}")
    if cls in _KNOWN:
        raise ValueError(f"register_cacheable_mode: {cls.__qualname__} is already registered")
    _KNOWN[cls] = tag or _state_tag
    return cls


def register_process_mode(active: Callable[[], Any]) -> None:
    """Register ``active()``: the registered mode whose effect reaches every thread of the
    process, or None. The torch_npu emulation's mode lives on one thread's stack, but what it
    installs beside it (the ``torch.device`` stand-in that folds ``"npu"`` while tracing) acts
    in every thread; a thread started before the emulation traces under it with an empty stack,
    so the cache keys and checks this too."""
    _PROCESS.append(active)


def process_modes() -> tuple:
    """The process-wide modes (see :func:`register_process_mode`) active now."""
    if len(_PROCESS) == 1:  # the emulation's: the per-call check's common case
        mode = _PROCESS[0]()
        return () if mode is None else (mode,)
    return tuple(mode for mode in (active() for active in _PROCESS) if mode is not None)


def process_actives() -> list[Callable[[], Any]]:
    """The registered ``active()`` functions themselves (see :func:`register_process_mode`):
    the live list, so that a check bound to it sees later registrations too."""
    return _PROCESS


def stack_modes() -> tuple:
    """This thread's torch-function modes, bottom first."""
    depth = _stack_depth()
    if depth == 1:  # the emulation's mode alone: the per-call check's common case
        return (_stack_at(0),)
    return tuple(_stack_at(i) for i in range(depth)) if depth else ()


def tag_of(mode: Any) -> str:
    """The tag of a registered mode; :class:`UnknownMode` for any other."""
    describe = _KNOWN.get(type(mode))
    if describe is None:
        raise UnknownMode(type(mode))
    return describe(mode)


def stack_tags(modes: tuple | None = None) -> list[str]:
    """Tags of ``modes`` (default: this thread's stack), bottom first; :class:`UnknownMode` when
    one is not registered."""
    return [tag_of(m) for m in (stack_modes() if modes is None else modes)]
