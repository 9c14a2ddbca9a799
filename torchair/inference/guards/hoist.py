"""Module state read once, then served again while the dicts it came from are unchanged.

A served call's generated check (:mod:`.codegen`) reads module state on every call: the chain of
submodules from ``self`` to each module whose attribute is a graph input (a norm's ``eps``), and
each parameter and buffer from its module's ``_parameters`` / ``_buffers`` dict. In a decode loop
these few dozen dependent lookups run with the caches the step's weights evicted, so each costs a
trip to memory. What they read depends only on dicts and types: an attribute ``obj.name`` held in
``obj.__dict__`` (no data descriptor of that name on its type) is that dict's entry while the
dict, ``type(obj)`` and the type's version tag are unchanged; ``d[key]`` of a dict is its entry
while the dict is unchanged. CPython changes a dict's version tag on every change to it, and a
type's on every change to it or a base (:func:`torchair.runtime.unit_call.state_watch`).

So :class:`StateHoist` keeps the values the last full read produced with a watch of every dict
and object that read went through; the generated check serves them again while one C call says
the watch is unchanged, and reads everything again (and takes a new watch) when it is not. A
chain the watch cannot cover (an attribute that comes from ``__getattr__`` or a descriptor, an
item of a list) takes no watch, and a check whose watch keeps changing (a loop that assigns a
module attribute every step, say) stops taking them: either way every call reads the state as
before. Where the tags cannot be had (no C compiler, ``TORCHAIR_NATIVE_KERNELS=0``, a Python
without them, or ``TORCHAIR_STATE_HOIST=0``) nothing is hoisted.
"""
from __future__ import annotations

import threading
from typing import Any, Sequence

from torchair.base.log import env_switch, logger
from torchair.runtime.unit_call import state_watch

__all__ = ["ATTR", "ENV_HOIST", "ITEM", "StateHoist", "available"]

# module state read once and served again while unchanged (0: read on every call)
ENV_HOIST = "TORCHAIR_STATE_HOIST"

ATTR, ITEM = "attr", "item"  # the kinds of a hoisted step: ``parent.name``, ``parent[key]``

# a watch replaced this many times in a row with fewer than _MIN_SERVED calls served from it in
# between: the state changes every call or so, and the hoist stops (one read per call, as before;
# the first watch counts as replacing none)
_MAX_FRUITLESS = 4
_MIN_SERVED = 2


def available() -> Any:
    """The C helper (``watch`` / ``unchanged``), or None when state is read on every call."""
    if not env_switch(ENV_HOIST):
        return None
    return state_watch()


def _class_attribute(tp: type, name: str) -> Any:
    """What ``name`` is on the type (the first class of its MRO that has it), else _NOTHING."""
    for klass in tp.__mro__:
        found = klass.__dict__.get(name, _NOTHING)
        if found is not _NOTHING:
            return found
    return _NOTHING


def _data_descriptor(tp: type, name: str) -> bool:
    """Whether ``name`` on instances of ``tp`` goes through a data descriptor of the type (which
    takes precedence over the instance dict)."""
    kind = type(_class_attribute(tp, name))
    return hasattr(kind, "__set__") or hasattr(kind, "__delete__")


_NOTHING = object()


class StateHoist:
    """The hoisted module state of one generated check (see the module doc).

    ``steps``: per hoisted value, ``(kind, parent, name)``: ``parent`` the index of the value it
    is read from (-1: the root module), ``name`` the attribute name (:data:`ATTR`) or the key
    (:data:`ITEM`); the parameter values follow them in a record's ``values``, each read from its
    dict with the key of ``param_keys``. ``keep``: the indices of the values a call uses (set by
    the generator). The generated check reads :attr:`current`, ``(root, tensor dicts, watch, the
    kept values, what the watch points at)``, and calls :meth:`record` after each full read."""

    __slots__ = ("steps", "param_keys", "keep", "current", "unchanged", "_watch", "hits",
                 "_fruitless", "enabled", "records", "_lock")

    def __init__(self, steps: Sequence[tuple[str, int, Any]], helper: Any,
                 param_keys: Sequence[Any] = ()) -> None:
        self.steps = tuple(steps)
        self.param_keys = tuple(param_keys)
        self.keep: tuple[int, ...] = ()
        self.current: tuple | None = None
        self.unchanged = helper.unchanged
        self._watch = helper.watch
        self.hits = _MIN_SERVED  # calls served from the watch since it was taken (the check counts)
        self._fruitless = 0
        self.enabled = True
        self.records = 0  # watches taken (a test reads it: one for a steady serving loop)
        self._lock = threading.Lock()

    def record(self, root: Any, tensor_dicts: Any, values: tuple, param_dicts: tuple) -> None:
        """After a full read: keep ``values`` with a watch of what they were read through
        (``root``: the module the chains start at; ``param_dicts``: per parameter value, the dict
        it was read from). The tags are taken first and the values compared with what the dicts
        hold after, so a change another thread makes meanwhile is either in the values or changes
        the tags. Never raises: a read it cannot watch stays a read."""
        if not self.enabled:
            return
        with self._lock:
            watch = anchors = None
            try:
                anchors = self._watched(root, values, param_dicts)
                watch = self._watch(*anchors[:3]) if anchors is not None else None
                held = watch is not None and self._still_held(root, values, param_dicts)
            except Exception as error:  # noqa: BLE001 - a read it cannot watch stays a read
                logger.debug("cache_compile: module state is read per call (%s: %s)",
                             type(error).__name__, error)
                watch = None
            self._fruitless = self._fruitless + 1 if self.hits < _MIN_SERVED else 0
            self.hits = 0
            self.records += 1
            if watch is None or not held or self._fruitless >= _MAX_FRUITLESS:
                self.current = None
                if watch is None or self._fruitless >= _MAX_FRUITLESS:
                    self.enabled = False
                    logger.debug("cache_compile: module state is read on every call (%s)",
                                 "a read it cannot watch" if watch is None else
                                 "it changed at every call")
                return
            # the watch holds no references: the tuple keeps what it points at alive (and is
            # visible to the garbage collector, unlike a capsule's references)
            self.current = (root, tensor_dicts, watch, tuple(values[i] for i in self.keep),
                            anchors)

    def _watched(self, root: Any, values: tuple, param_dicts: tuple) -> tuple | None:
        """(dicts, objects, (object, its __dict__) pairs, types) the values were read through,
        or None when one step cannot be watched."""
        dicts: dict[int, Any] = {}
        objects: dict[int, Any] = {}
        owners: dict[int, tuple] = {}
        for kind, parent, name in self.steps:
            obj = root if parent < 0 else values[parent]
            if kind == ATTR:
                tp = type(obj)
                own = getattr(obj, "__dict__", None)
                # (the descriptor test also gives its type a version tag, read by the watch)
                if (tp.__getattribute__ is not object.__getattribute__ or type(own) is not dict
                        or _data_descriptor(tp, name)):
                    return None
                dicts[id(own)] = own
                objects[id(obj)] = obj
                owners[id(obj)] = (obj, own)
                found = _class_attribute(tp, name)
                if found is not _NOTHING:  # its type's tag: a descriptor class made a data one
                    objects[id(found)] = found
            elif type(obj) is dict:
                dicts[id(obj)] = obj
            elif type(obj) is not tuple:  # a tuple's items never change; a list's may
                return None
        for d in param_dicts:
            if type(d) is not dict:
                return None
            dicts[id(d)] = d
        kept = tuple(objects.values())
        return (tuple(dicts.values()), kept, tuple(owners.values()),
                tuple(type(o) for o in kept))

    def _still_held(self, root: Any, values: tuple, param_dicts: tuple) -> bool:
        """Whether every value is what its dict (or tuple) holds now, each attribute read from
        the instance dict (no data descriptor of its name on the type)."""
        for (kind, parent, name), value in zip(self.steps, values):
            obj = root if parent < 0 else values[parent]
            if kind == ATTR:
                tp = type(obj)
                if (tp.__getattribute__ is not object.__getattribute__
                        or _data_descriptor(tp, name)
                        or obj.__dict__.get(name, _NOTHING) is not value):
                    return False
            elif type(obj) is dict and obj.get(name, _NOTHING) is not value:
                return False
        params = values[len(self.steps):]
        return all(d.get(key, _NOTHING) is value
                   for d, key, value in zip(param_dicts, self.param_keys, params))
