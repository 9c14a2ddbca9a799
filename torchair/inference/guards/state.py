"""The process-wide state a cached frame was traced under, and its check on warm calls.

Dynamo guards two things that belong to no source: its GLOBAL_STATE guard (autocast, default
dtype, deterministic algorithms, TF32, torch-function enabling; here :func:`global_state`, less
the thread count and grad mode, which do not change what a graph computes) and the
TORCH_FUNCTION_MODE_STACK guard (here the stack's depth and each registered mode's tag).
:class:`ProcessState` compares both with what the cold start recorded; on per-call checks it
first asks PyTorch's own one-call snapshot of the process state whether anything changed.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from torchair.core import function_modes

__all__ = ["ProcessState", "global_state"]


def global_state() -> dict:
    """Process-wide settings that change what a traced graph computes (Dynamo's GLOBAL_STATE
    guard, less the thread count and grad mode, which do not)."""
    autocast = {d: [bool(torch.is_autocast_enabled(d)), str(torch.get_autocast_dtype(d))]
                for d in ("cpu", "cuda")}
    return {"autocast": autocast, "default_dtype": str(torch.get_default_dtype()),
            "deterministic": [torch.are_deterministic_algorithms_enabled(),
                              torch.is_deterministic_algorithms_warn_only_enabled()],
            "tf32": [bool(torch.backends.cuda.matmul.allow_tf32), _cudnn_tf32()],
            "torch_function": bool(torch._C._is_torch_function_enabled())}


def _state_snapshot() -> Any:
    """PyTorch's own snapshot of the process state (the one Dynamo's GLOBAL_STATE guard
    compares in C++), or None where this PyTorch has none."""
    guards = getattr(torch._C, "_dynamo", None)
    snapshot = getattr(getattr(guards, "guards", None), "GlobalStateGuard", None)
    return snapshot() if snapshot is not None else None


def _snapshot_blind_spots() -> tuple:
    """What :func:`global_state` compares that PyTorch's snapshot does not: the autocast dtypes
    (they matter only while autocast is on) and cuDNN's TF32 switch."""
    on = _any_autocast()
    dtypes = (torch.get_autocast_dtype("cpu"), torch.get_autocast_dtype("cuda")) if on else ()
    return dtypes, _cudnn_tf32()


_any_autocast = torch._C._is_any_autocast_enabled

# what torch.backends.cudnn.allow_tf32 reads, without the module property on the per-call path
_cudnn_allow_tf32 = getattr(torch._C, "_get_cudnn_allow_tf32",
                            lambda: torch.backends.cudnn.allow_tf32)


def _cudnn_tf32() -> bool | str:
    """cuDNN's TF32 switch; "mixed" where PyTorch refuses to read it as one switch (its newer
    per-operation precision settings set differently)."""
    try:
        return bool(_cudnn_allow_tf32())
    except RuntimeError:
        return "mixed"


def _stack_text() -> str:
    """The current torch-function mode stack and process-wide modes, for a warning."""
    modes = function_modes.stack_modes() + function_modes.process_modes()
    if not modes:
        return "now no mode"
    texts = []
    for mode in modes:
        try:
            texts.append(function_modes.tag_of(mode))
        except function_modes.UnknownMode as unknown:
            texts.append(str(unknown))
    return "now " + ", ".join(texts)


class ProcessState:
    """The recorded GLOBAL_STATE (``state``, None when not guarded) and torch-function mode
    stack (``modes``: its depth, None when not guarded; ``mode_tags``: the tags of the stack's
    modes, then of the process-wide ones, see :func:`function_modes.process_modes`), compared
    with this thread's."""

    def __init__(self, state: dict | None = None, modes: int | None = None,
                 mode_tags: list[str] | None = None) -> None:
        self.state = state
        self.modes = modes
        self.mode_tags: list[str] = list(mode_tags or ())  # tags of the (cacheable) modes
        self._modes_seen: tuple = ((), ())  # the modes whose tags matched last, their attributes
        self._snapshot: Any = None  # PyTorch's snapshot after the last full comparison held
        self._blind_spots: tuple = ()  # what that snapshot does not see, at the same time

    def _modes_differ(self) -> str:
        """Why this thread's torch-function mode stack, with the process-wide modes, is not the
        one traced under ("" when it is): the same depth, and each mode a registered one with
        an equal tag."""
        if self.modes is None:
            return ""
        stack = function_modes.stack_modes()
        if len(stack) != self.modes:
            if not self.modes and not self.mode_tags:
                return "a TorchFunctionMode is active (e.g. torch.device as a context manager)"
            return (f"the TorchFunctionMode stack differs from the one traced under "
                    f"({', '.join(self.mode_tags) or 'no mode'}): {_stack_text()}")
        modes = stack + function_modes.process_modes()
        if not modes and not self.mode_tags:
            return ""  # traced and called without any mode (the plain process)
        seen, states = self._modes_seen  # the modes whose tags matched last, their attributes
        if modes == seen:  # (modes compare by identity)
            for mode, state in zip(modes, states):
                if mode.__dict__ != state:
                    break
            else:
                return ""
        try:
            tags = function_modes.stack_tags(modes)
        except function_modes.UnknownMode:
            tags = None
        if tags != self.mode_tags:
            return (f"the TorchFunctionMode stack differs from the one traced under "
                    f"({', '.join(self.mode_tags) or 'no mode'}): {_stack_text()}")
        self._modes_seen = (modes, tuple(dict(vars(m)) for m in modes))
        return ""

    def differs(self) -> str:
        """Why the process state is not the one traced under ("" when it is)."""
        why = self._modes_differ()
        if why:
            return why
        if self.state is not None:
            now = global_state()
            if now != self.state:
                diff = sorted(k for k in now if now[k] != self.state.get(k))
                return f"global state changed: {', '.join(diff)}"
        return ""

    def per_call_lines(self, bind: Callable[[Any, str], str]) -> list[str]:
        """The lines of the generated per-call check (:mod:`.codegen`) that pass exactly when
        :meth:`differs_per_call` would pass without a full comparison: PyTorch's snapshot taken
        after the last full comparison still holds, its blind spots are as they were then
        (autocast off and the same cuDNN TF32 switch; a call under autocast takes the general
        path), and the torch-function modes are as traced. Any other case ends the generated
        function with ``return None`` (the general path then compares in full); so does an
        error, through the function's ``except``. ``bind(value, prefix)`` names a value the
        lines use. The same checks inline, not four nested calls: on a decode step they run
        right after the previous step's weights went through the caches."""
        p = bind(self, "p")
        lines = []
        if self.state is not None:
            lines += [f"s = {p}._snapshot",
                      f"if s is None or not s.check() or {bind(_any_autocast, 'f')}() or "
                      f"{p}._blind_spots != ((), {bind(bool, 'f')}({bind(_cudnn_allow_tf32, 'f')}())):",
                      "    return None"]
        if self.modes == 0 and not self.mode_tags:  # traced without any mode, as most calls
            lines += [f"if {bind(function_modes.stack_depth, 'f')}():", "    return None",
                      f"for a in {bind(function_modes.process_actives(), 'c')}:",
                      "    if a() is not None:", "        return None"]
        elif self.modes is not None:
            lines += [f"if {bind(self._modes_differ, 'f')}():", "    return None"]
        return lines

    def differs_per_call(self) -> str:
        """:meth:`differs` through a snapshot of the whole process state taken after the last
        full comparison (one C++ call); a difference there (including ones the guard ignores,
        such as the thread count) falls back to the full comparison."""
        if self.state is None:
            return self.differs()
        if self._modes_differ():
            return self.differs()
        if (self._snapshot is not None and self._snapshot.check()
                and _snapshot_blind_spots() == self._blind_spots):
            return ""
        why = self.differs()
        if not why:
            self._snapshot = _state_snapshot()
            self._blind_spots = _snapshot_blind_spots()
        return why
