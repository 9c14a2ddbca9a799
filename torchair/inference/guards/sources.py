"""The values a cached frame's guards read: ``L`` (the frame's locals), ``G`` (its globals) and
every source reached from them, as one flat program of getter steps.

A recorded guard names what it reads as Python text (``L['self']._modules['l']._parameters['w']``,
``G['SCALE']``); :mod:`~torchair.inference.guards.grammar` turns each such source into a slot of
:class:`Sources`, so a call reads every source once, in order, whatever number of guards look at
it. :class:`Globals` is what ``G`` means: the function's globals plus the names Dynamo adds to
them while tracing.
"""
from __future__ import annotations

import builtins
import importlib
import sys
from typing import Any, Callable

__all__ = ["Fn", "Globals", "Sources"]

Fn = Callable[[list], Any]  # a compiled check or value: reads the per-call slot values

_MISSING = object()


class Globals:
    """``G``: the function's globals, plus the names Dynamo adds to them while tracing
    (``__import_<module>`` for another module, ``__builtins_dict___<n>`` for builtins)."""

    __slots__ = ("names",)

    def __init__(self, names: dict) -> None:
        self.names = names

    def __getitem__(self, name: str) -> Any:
        if name.startswith("__import_"):
            module = name[len("__import_"):].replace("_dot_", ".")
            found = sys.modules.get(module)
            return found if found is not None else importlib.import_module(module)
        if name.startswith("__builtins_dict__"):
            return builtins.__dict__
        return self.names[name]


class Sources:
    """Every source the guards and graph inputs read, as one flat program of getter steps:
    slot 0 is ``L`` (the frame's locals), slot 1 is ``G``; each further slot is one step (an
    item, an attribute or a no-argument method call) from an earlier slot. A call evaluates all
    slots once, in order; a step that fails (missing attribute, key, index) fails the call."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {"L": 0, "G": 1}
        self.steps: list[tuple[int, Callable[[Any], Any], str]] = []
        self.items: dict[int, Any] = {}  # slot -> the key of an item step (``parent[key]``)
        self.roots: list[str] = ["L", "G"]  # slot -> the first step from L (e.g. ``L['x']``)

    def slot(self, key: str, parent: int, step: Callable[[Any], Any],
             item: Any = _MISSING) -> int:
        """The slot of source ``key``, read by ``step(<parent's value>)`` (added when new);
        ``item``: the key when the step is ``parent[item]``."""
        found = self.index.get(key)
        if found is None:
            found = self.index[key] = 2 + len(self.steps)
            self.steps.append((parent, step, key))
            self.roots.append(key if parent == 0 else self.roots[parent])
            if item is not _MISSING:
                self.items[found] = item
        return found

    def ancestors(self, slots: Any) -> list[int]:
        """The steps (indices into ``steps``) that reading ``slots`` needs, in order."""
        needed: set[int] = set()
        for slot in slots:
            while slot >= 2 and slot - 2 not in needed:
                needed.add(slot - 2)
                slot = self.steps[slot - 2][0]
        return sorted(needed)

    def evaluate_some(self, frame: dict, globals_: Globals, steps: list[int]) -> tuple[list, str]:
        """:meth:`evaluate` of the given steps only (the other slots stay None)."""
        values: list = [frame, globals_] + [None] * len(self.steps)
        all_steps = self.steps
        k = -1
        try:
            for k in steps:
                parent, step, _ = all_steps[k]
                values[k + 2] = step(values[parent])
        except Exception as error:  # noqa: BLE001 - an unreadable source fails the call
            return values, f"{all_steps[k][2]} cannot be read ({type(error).__name__}: {error})"
        return values, ""

    def evaluate(self, frame: dict, globals_: Globals) -> tuple[list, str]:
        """(every slot's value, "") for one call, or (the values so far, why a source cannot
        be read)."""
        values = [frame, globals_]
        append = values.append
        try:
            for parent, step, _ in self.steps:
                append(step(values[parent]))
        except Exception as error:  # noqa: BLE001 - an unreadable source fails the call
            key = self.steps[len(values) - 2][2]
            return values, f"{key} cannot be read ({type(error).__name__}: {error})"
        return values, ""
