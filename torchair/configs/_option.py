"""Validated configuration options and the ``ConfigNode`` tree they live in.

An :class:`Option` is a data descriptor declared on a :class:`ConfigNode`
subclass.  It carries a default, either a tuple of allowed values or an
expected value kind, and a one-line doc.  A :class:`SubConfig` declares a
child node.  Every node knows its dotted prefix (``"debug.graph_dump"``), so
error messages always name the full option (``"debug.graph_dump.type"``).

Assignments are validated eagerly: an unknown name, a value outside the
allowed set or a value of the wrong type raises :class:`ValueError` at the
point of assignment, never later at compile time.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from typing import Any, Dict, Iterator, List, Optional, Tuple, Type

__all__ = ["Option", "SubConfig", "ConfigNode", "BOOL", "PATH"]

_MISSING = object()

# Value kinds for options that are not restricted to a fixed set of values.
BOOL = "bool"
PATH = "path"
_KINDS = {
    BOOL: "bool (True or False)",
    PATH: "str or os.PathLike or None",
}


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _same_value(a: Any, b: Any) -> bool:
    # ``1 == True`` and ``0 == False`` in Python; an allowed-values check
    # must not let an int through where the bool (or vice versa) is listed.
    return type(a) is type(b) and a == b


class Option:
    """One validated configuration option.

    Exactly one of ``allowed`` (a tuple of permitted values) or ``kind``
    (:data:`BOOL` or :data:`PATH`) must be given.

    * ``BOOL`` accepts only real ``bool`` values (not ``0``/``1``, not
      ``"yes"``).
    * ``PATH`` accepts ``None``, ``str`` or an ``os.PathLike`` whose
      ``os.fspath`` is a ``str``; path-likes are stored as ``str`` so that
      equal configurations hash equally.
    """

    def __init__(
        self,
        default: Any,
        *,
        allowed: Optional[Tuple[Any, ...]] = None,
        kind: Optional[str] = None,
        doc: str,
    ) -> None:
        if (allowed is None) == (kind is None):
            raise TypeError("Option needs exactly one of 'allowed' or 'kind'")
        if kind is not None and kind not in _KINDS:
            raise TypeError(f"unknown option kind {kind!r}; expected one of {sorted(_KINDS)}")
        if allowed is not None:
            allowed = tuple(allowed)
            if not allowed:
                raise TypeError("Option 'allowed' must not be empty")
        if "\n" in doc:
            raise TypeError("Option doc must be a single line")
        self.default = default
        self.allowed = allowed
        self.kind = kind
        self.doc = doc
        self.name: str = "<unbound>"

    # -- descriptor protocol -------------------------------------------------
    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        # The default must pass the option's own validation.
        self.default = self.validate(self.default, name)

    def __get__(self, instance: Optional["ConfigNode"], owner: type = None) -> Any:
        if instance is None:
            return self
        return instance.__dict__["_values"][self.name]

    def __set__(self, instance: "ConfigNode", value: Any) -> None:
        full = _join(instance._prefix, self.name)
        instance.__dict__["_values"][self.name] = self.validate(value, full)

    # -- validation ----------------------------------------------------------
    def allowed_text(self) -> str:
        """Human-readable description of the accepted values."""
        if self.allowed is not None:
            return " | ".join(repr(v) for v in self.allowed)
        return _KINDS[self.kind]

    def validate(self, value: Any, full_name: str) -> Any:
        """Return the (normalized) value, or raise ``ValueError``."""
        if self.allowed is not None:
            if any(_same_value(value, a) for a in self.allowed):
                return value
            raise ValueError(
                f"invalid value {value!r} for option '{full_name}'; "
                f"allowed values: {', '.join(repr(v) for v in self.allowed)}"
            )
        if self.kind == BOOL:
            if isinstance(value, bool):
                return value
        elif self.kind == PATH:
            if value is None or isinstance(value, str):
                return value
            if isinstance(value, os.PathLike):
                path = os.fspath(value)
                if isinstance(path, str):
                    return path
        raise ValueError(
            f"invalid value {value!r} (type {type(value).__name__}) for option "
            f"'{full_name}'; expected {_KINDS[self.kind]}"
        )

    def __repr__(self) -> str:
        return f"Option({self.name}, default={self.default!r}, allowed={self.allowed_text()})"


class SubConfig:
    """Declares a child :class:`ConfigNode` of a node; it cannot be reassigned."""

    def __init__(self, node_cls: Type["ConfigNode"], *, doc: str = "") -> None:
        self.node_cls = node_cls
        self.doc = doc
        self.name: str = "<unbound>"

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: Optional["ConfigNode"], owner: type = None) -> Any:
        if instance is None:
            return self
        return instance.__dict__["_children"][self.name]

    def __set__(self, instance: "ConfigNode", value: Any) -> None:
        full = _join(instance._prefix, self.name)
        raise ValueError(
            f"'{full}' is a group of options and cannot be assigned; "
            f"set its options instead (valid options of '{full}': "
            f"{', '.join(self.node_cls._names())})"
        )

    def __repr__(self) -> str:
        return f"SubConfig({self.name}, {self.node_cls.__name__})"


class ConfigNode:
    """A level of the configuration tree: options plus child nodes.

    Subclasses declare :class:`Option` and :class:`SubConfig` class attributes.
    Any other attribute assignment raises ``ValueError`` naming the full
    dotted option and listing the valid names at that level.
    """

    _option_decls: Dict[str, Option] = {}
    _child_decls: Dict[str, SubConfig] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        options: Dict[str, Option] = {}
        children: Dict[str, SubConfig] = {}
        # Walk the MRO base-first so declarations keep definition order and
        # subclasses may override a base declaration.
        for klass in reversed(cls.__mro__):
            for name, attr in vars(klass).items():
                if isinstance(attr, Option):
                    children.pop(name, None)
                    options[name] = attr
                elif isinstance(attr, SubConfig):
                    options.pop(name, None)
                    children[name] = attr
        cls._option_decls = options
        cls._child_decls = children

    # -- construction --------------------------------------------------------
    def __init__(self) -> None:
        self._setup("")

    @classmethod
    def _make(cls, prefix: str) -> "ConfigNode":
        node = cls.__new__(cls)
        node._setup(prefix)
        return node

    def _setup(self, prefix: str) -> None:
        d = self.__dict__
        d["_prefix"] = prefix
        d["_values"] = {name: opt.default for name, opt in self._option_decls.items()}
        d["_children"] = {
            name: sub.node_cls._make(_join(prefix, name))
            for name, sub in self._child_decls.items()
        }

    # -- attribute guards ----------------------------------------------------
    @classmethod
    def _names(cls) -> List[str]:
        return list(cls._option_decls) + list(cls._child_decls)

    def _unknown_message(self, name: str) -> str:
        full = _join(self._prefix, name)
        level = f"of '{self._prefix}'" if self._prefix else "at top level"
        names = self._names()
        msg = f"unknown option '{full}'; valid options {level}: {', '.join(names)}"
        close = difflib.get_close_matches(name, names, n=1)
        if close:
            msg += f"; did you mean '{_join(self._prefix, close[0])}'?"
        return msg

    def __setattr__(self, name: str, value: Any) -> None:
        cls = type(self)
        if name in cls._option_decls or name in cls._child_decls:
            object.__setattr__(self, name, value)  # goes through the descriptor
            return
        raise ValueError(self._unknown_message(name))

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails.
        if name.startswith("__") or "_prefix" not in self.__dict__:
            raise AttributeError(name)
        raise AttributeError(self._unknown_message(name))

    def __delattr__(self, name: str) -> None:
        full = _join(self.__dict__.get("_prefix", ""), name)
        raise AttributeError(f"cannot delete configuration option '{full}'")

    # -- views ---------------------------------------------------------------
    def _iter_options(self, prefix: str = "") -> Iterator[Tuple[str, Option, Any]]:
        for name, opt in self._option_decls.items():
            yield _join(prefix, name), opt, self._values[name]
        for name, child in self._children.items():
            yield from child._iter_options(_join(prefix, name))

    def as_dict(self) -> Dict[str, Any]:
        """Nested plain dict of the current values (children as dicts)."""
        out: Dict[str, Any] = dict(self._values)
        for name, child in self._children.items():
            out[name] = child.as_dict()
        return out

    def options(self) -> Dict[str, Any]:
        """Flat dict ``{"dotted.name": value}``; names are relative to this node."""
        return {name: value for name, _, value in self._iter_options()}

    def non_default_options(self) -> Dict[str, Any]:
        """Flat dict of the options whose value differs from the default."""
        return {
            name: value
            for name, opt, value in self._iter_options()
            if not _same_value(value, opt.default)
        }

    def compute_hash(self) -> str:
        """Stable sha256 hex digest of the sorted flat options (a cache key)."""
        payload = json.dumps(
            sorted(self.options().items()), separators=(",", ":"), ensure_ascii=True
        )
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()

    def copy(self) -> "ConfigNode":
        """Independent deep copy (same prefix, same values)."""
        new = type(self)._make(self._prefix)
        new.__dict__["_values"] = dict(self._values)
        new.__dict__["_children"] = {name: child.copy() for name, child in self._children.items()}
        return new

    __copy__ = copy

    def __deepcopy__(self, memo: Dict[int, Any]) -> "ConfigNode":
        return self.copy()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ConfigNode):
            return NotImplemented
        # Values are validated on assignment, so plain equality is exact
        # (an int can never stand in for a bool here).
        return self.options() == other.options()

    __hash__ = None  # mutable; use compute_hash() for a cache key

    def __repr__(self) -> str:
        changed = ", ".join(f"{k}={v!r}" for k, v in self.non_default_options().items())
        return f"{type(self).__name__}({changed})"

    # -- documentation -------------------------------------------------------
    @classmethod
    def _iter_decls(cls, prefix: str = "") -> Iterator[Tuple[str, Option]]:
        for name, opt in cls._option_decls.items():
            yield _join(prefix, name), opt
        for name, sub in cls._child_decls.items():
            yield from sub.node_cls._iter_decls(_join(prefix, name))

    @classmethod
    def describe(cls) -> str:
        """Text table of every option: name, default, allowed values, doc."""
        header = ("option", "default", "allowed", "doc")
        rows = [
            (name, repr(opt.default), opt.allowed_text(), opt.doc)
            for name, opt in cls._iter_decls()
        ]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]

        def fmt(row: Tuple[str, ...]) -> str:
            cells = [row[i].ljust(widths[i]) for i in range(3)]
            return "  ".join([*cells, row[3]]).rstrip()

        sep = "  ".join(["-" * w for w in widths] + ["-" * len(header[3])])
        return "\n".join([fmt(header), sep, *(fmt(r) for r in rows)])
