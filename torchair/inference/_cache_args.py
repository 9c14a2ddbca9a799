"""A ``cache_compile`` call's arguments as the guards see them, and the static marks on them.

``Frame`` builds the frame Dynamo's guards read (``L``) from a call's arguments, so a warm process
checks the saved guards without Dynamo. ``mark_static`` is ``torch._dynamo.mark_static`` without
importing Dynamo: it only marks the tensor, and ``apply_static_marks`` hands the marks to Dynamo
when a call is traced.
"""
from __future__ import annotations

import contextlib
import inspect
import sys
from typing import Callable

import torch

__all__ = ["Frame", "apply_static_marks", "mark_static"]

_STATIC_MARK = "_torchair_static"


def mark_static(*tensors: torch.Tensor) -> None:
    """``torch._dynamo.mark_static`` for the arguments of a ``cache_compile`` function, without
    importing Dynamo (about 1.5 s of a warm start, which never traces).

    The marks are applied with Dynamo's ``mark_static`` when the function is traced (the cold
    start, or a call that does not fit the cached graph). With plain ``torch.compile`` use
    ``torch._dynamo.mark_static``; if Dynamo is already imported this calls it right away too."""
    dynamo = sys.modules.get("torch._dynamo")
    for k, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"mark_static: argument {k} is {type(t).__name__}, expected a tensor")
        setattr(t, _STATIC_MARK, True)
        if dynamo is not None:
            dynamo.mark_static(t)


def apply_static_marks(args: tuple, kwargs: dict) -> None:
    """Apply Dynamo's ``mark_static`` to every tensor in ``args``/``kwargs`` that ``mark_static``
    marked; called just before a trace (imports Dynamo)."""
    import torch.utils._pytree as pytree

    for leaf in pytree.tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor) and getattr(leaf, _STATIC_MARK, False):
            torch._dynamo.mark_static(leaf)


class Frame:
    """Builds the frame Dynamo's guards read (``L``): ``self``, the bound arguments (defaults
    applied) and the function's free variables."""

    def __init__(self, func: Callable) -> None:
        self.module = func.__self__
        code = func.__func__.__code__
        self.self_name = code.co_varnames[0]
        self.signature = inspect.signature(func)
        params = list(self.signature.parameters.values())
        simple = all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params)
        self.names = tuple(p.name for p in params) if simple else None
        # how many positional arguments make a call whose frame is just them and ``self``
        # (-1: none; a free variable or another kind of parameter takes __call__)
        self.positional = len(params) if simple and not code.co_freevars else -1
        self.defaults = {p.name: p.default for p in params if p.default is not p.empty}
        self.arguments = tuple(p.name for p in params)  # what changes from call to call
        self.freevars = code.co_freevars
        self.closure = func.__func__.__closure__ or ()
        self.globals = func.__func__.__globals__

    def __call__(self, args: tuple, kwargs: dict) -> dict:
        if self.names is not None and not kwargs and len(args) == len(self.names):
            frame = dict(zip(self.names, args))  # the common call: positional, no defaults
        else:
            bound = self.signature.bind(*args, **kwargs)
            bound.apply_defaults()
            frame = dict(bound.arguments)
        frame[self.self_name] = self.module
        for name, cell in zip(self.freevars, self.closure):
            with contextlib.suppress(ValueError):  # an empty cell: guards on it fail
                frame[name] = cell.cell_contents
        return frame
