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
import re
from typing import Any, Dict, Iterator, List, Optional, Tuple, Type

from torchair.base.log import logger

__all__ = ["ANY", "BOOL", "CALLABLE", "DIR", "FILE", "INT_LIST", "JSON_FILE", "NOT_SUPPORTED",
           "NO_EFFECT", "OUT_DIR", "PATH", "STR", "WORKS", "ConfigNode", "IntRange", "Option", "OptionValue",
           "Regex", "SubConfig"]

_MISSING = object()

# Value kinds for options that are not restricted to a fixed set of values. Error texts start
# with TorchAir's (configs/_option_base.py) so its tests' ``in str(err)`` checks hold here too,
# and end by naming the option.
BOOL = "bool"
PATH = "path"
OUT_DIR = "output dir"
CALLABLE = "callable"
STR = "str"
INT_LIST = "int list"
FILE = "file"
DIR = "dir"
JSON_FILE = "json file"
ANY = "any"
_KINDS = {
    BOOL: "bool (True or False)",
    PATH: "str or os.PathLike or None",
    OUT_DIR: "None or a directory this process can write (created if missing)",
    CALLABLE: "a callable or None",
    STR: "str or None",
    INT_LIST: "a list of ints or None",
    FILE: "an existing file or None",
    DIR: "an existing directory",
    JSON_FILE: "an existing '.json' file or None",
    ANY: "any value (not checked)",
}
# Read back as the raw value (TorchAir: properties and plain attributes), not as an OptionValue.
_PLAIN_KINDS = (PATH, OUT_DIR, ANY)
_INT64_MAX = 2**63 - 1

WORKS, NO_EFFECT, NOT_SUPPORTED = "works", "no effect here", "not supported"
_EFFECTS = (WORKS, NO_EFFECT, NOT_SUPPORTED)
_logged: set = set()


class IntRange:
    """Kind of an int option in ``[low, high]`` (``None`` allowed when ``none_ok``)."""

    def __init__(self, low: int, high: int = _INT64_MAX, *, none_ok: bool = False) -> None:
        self.low, self.high, self.none_ok = low, high, none_ok

    def text(self) -> str:
        high = "2**63-1" if self.high == _INT64_MAX else str(self.high)
        return f"int in [{self.low}, {high}]" + (" or None" if self.none_ok else "")

    def check(self, value: Any) -> Any:
        if value is None and self.none_ok:
            return value
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"Please set integer type, but got {type(value)}")
        if not self.low <= value <= self.high:
            raise ValueError(f"Please set value in [{self.low}, {self.high}], {value} is out of "
                             "range.")
        return value


class Regex:
    """Kind of a str option that must match ``pattern`` (``example`` shows a valid one)."""

    def __init__(self, pattern: str, example: str) -> None:
        self.pattern, self.example = pattern, example

    def text(self) -> str:
        return f"str matching {self.pattern} (e.g. {self.example!r})"

    def check(self, value: Any) -> Any:
        if not isinstance(value, str) or re.match(self.pattern, value) is None:
            raise ValueError(f"Please set legal regex value format match {self.pattern}, {value} "
                             f"is Illegal format, correct example:{self.example}.")
        return value


def _check_kind(kind: str, value: Any) -> Any:
    """The normalized ``value`` for ``kind``, or raise with TorchAir's text for that kind."""
    if kind == BOOL:
        if isinstance(value, bool):
            return value
        raise ValueError(f"Value {value!r} (type: {type(value)}) not in optional list "
                         f"[True, False] (type: {bool}).")
    if kind == PATH:
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, os.PathLike) and isinstance(os.fspath(value), str):
            return os.fspath(value)
        raise ValueError(f"invalid value {value!r} (type {type(value).__name__}); expected "
                         f"{_KINDS[PATH]}")
    if kind == OUT_DIR:
        return _check_out_dir(_check_kind(PATH, value))
    if kind == CALLABLE:
        if value is None or callable(value):
            return value
        raise TypeError(f"value must be Callable or None, got {type(value)}")
    if kind == STR:
        if value is None or isinstance(value, str):
            return value
        raise TypeError(f"value must be str or None, got {type(value)}")
    if kind == INT_LIST:
        if value is None:
            return []
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"the set value must be None or list, got {type(value)}")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise TypeError(f"the set value must be int list, got list type: "
                            f"{[type(v) for v in value]}")
        return list(value)
    if kind == FILE:
        if value is None or (isinstance(value, (str, os.PathLike)) and os.path.isfile(value)):
            return value if value is None else os.fspath(value)
        raise FileNotFoundError(f"Please set legal file path, {value} is not found or is not a "
                                "file!")
    if kind == DIR:
        if isinstance(value, (str, os.PathLike)) and os.path.isdir(value):
            return os.fspath(value)
        raise FileNotFoundError(f"Please set legal dir path, {value} is not found or is not a "
                                "file directory!")
    if kind == JSON_FILE:
        if value is None:
            return value
        if value == "":
            raise ValueError("File path cannot be empty!")
        if (isinstance(value, (str, os.PathLike)) and os.path.isfile(value)
                and os.fspath(value).endswith(".json")):
            return os.fspath(value)
        raise FileNotFoundError(f"Please set legal file path, {value} is not found or is not "
                                "'.json' file!")
    return value  # ANY


def _check_out_dir(value: str | None) -> str | None:
    """An output directory, checked when the option is set instead of failing at every call:
    TorchAir's type and text for a bad directory (``FileNotFoundError``: the path or a parent is
    a file; ``PermissionError``: the nearest existing directory is not writable), then what is
    wrong and the fix. A missing directory is fine: the dumps create it. Stored as its real path,
    as TorchAir stores its dump paths (a later ``os.chdir`` does not move the dumps)."""
    if value is None:
        return None
    path = os.path.realpath(value)
    probe = path
    while not os.path.exists(probe):  # the nearest existing ancestor (at worst "/")
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        where = (f"{value} is an existing file" if probe == path else
                 f"{probe} is a file, so no directory {value} can be created under it")
        raise FileNotFoundError(f"Please set legal dir path, {value} is not found or is not a file "
                                f"directory! {where}: set the path of a directory (a missing one "
                                f"is created).")
    if not os.access(probe, os.W_OK | os.X_OK):
        what = f"{value}" if probe == path else f"{probe}, where {value} would be created,"
        raise PermissionError(f"The path permission check failed: {probe}. {what} is not "
                              f"writable by this process: choose a directory it can write.")
    return path


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _same_value(a: Any, b: Any) -> bool:
    # ``1 == True`` and ``0 == False`` in Python; an allowed-values check
    # must not let an int through where the bool (or vice versa) is listed.
    return type(a) is type(b) and a == b


class Option:
    """One validated configuration option.

    Exactly one of ``allowed`` (a tuple of permitted values) or ``kind`` (one of the kind names
    above, or an :class:`IntRange` / :class:`Regex`) must be given.

    * ``BOOL`` accepts only real ``bool`` values (not ``0``/``1``, not ``"yes"``).
    * ``PATH`` accepts ``None``, ``str`` or an ``os.PathLike`` whose ``os.fspath`` is a ``str``;
      path-likes are stored as ``str`` so that equal configurations hash equally.
    * ``OUT_DIR`` is a ``PATH`` that output is written to: checked when set (not a file, not
      under a file, writable where it exists or will be created) and stored as its real path.

    ``effect`` says what the option does here: ``"works"``, ``"no effect here"`` (an Ascend-only
    option, accepted and validated for TorchAir compatibility) or ``"not supported"`` (it means
    something off Ascend too, but torchair does not implement it); ``why`` says why. Setting a
    non-works option to a non-default value is logged once per process (INFO / WARNING).
    """

    def __init__(
        self,
        default: Any,
        *,
        allowed: Optional[Tuple[Any, ...]] = None,
        kind: Any = None,
        doc: str,
        effect: str = WORKS,
        why: str = "",
    ) -> None:
        if (allowed is None) == (kind is None):
            raise TypeError("Option needs exactly one of 'allowed' or 'kind'")
        if kind is not None and not isinstance(kind, (IntRange, Regex)) and kind not in _KINDS:
            raise TypeError(f"unknown option kind {kind!r}; expected one of {sorted(_KINDS)}")
        if allowed is not None:
            allowed = tuple(allowed)
            if not allowed:
                raise TypeError("Option 'allowed' must not be empty")
        if "\n" in doc or "\n" in why:
            raise TypeError("Option doc and why must be single lines")
        if effect not in _EFFECTS:
            raise TypeError(f"Option effect must be one of {_EFFECTS}, got {effect!r}")
        if effect != WORKS and not why:
            raise TypeError("an Option whose effect is not 'works' needs a 'why'")
        self.default = default
        self.allowed = allowed
        self.kind = kind
        self.doc = doc
        self.effect = effect
        self.why = why
        self.name: str = "<unbound>"

    @property
    def plain(self) -> bool:
        """Read back as the raw value (TorchAir: a property or plain attribute)."""
        return self.kind in _PLAIN_KINDS

    # -- descriptor protocol -------------------------------------------------
    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        # The default must pass the option's own validation.
        if not (isinstance(self.kind, IntRange) or self.kind == DIR):
            self.default = self.validate(self.default, name)

    def __get__(self, instance: Optional["ConfigNode"], owner: type = None) -> Any:
        if instance is None:
            return self
        if self.plain:
            return instance.__dict__["_values"][self.name]
        return OptionValue(instance, self)

    def __set__(self, instance: "ConfigNode", value: Any) -> None:
        full = _join(instance._prefix, self.name)
        value = self.validate(value, full)
        instance.__dict__["_values"][self.name] = value
        if self.effect != WORKS and not _same_value(value, self.default) and full not in _logged:
            _logged.add(full)
            log = logger.info if self.effect == NO_EFFECT else logger.warning
            log("config option '%s' = %r is accepted for TorchAir compatibility but has %s: %s",
                full, value, "no effect here" if self.effect == NO_EFFECT else
                "no effect (not supported by torchair)", self.why)

    # -- validation ----------------------------------------------------------
    def allowed_text(self) -> str:
        """Human-readable description of the accepted values."""
        if self.allowed is not None:
            return " | ".join(repr(v) for v in self.allowed)
        if isinstance(self.kind, (IntRange, Regex)):
            return self.kind.text()
        return _KINDS[self.kind]

    def validate(self, value: Any, full_name: str) -> Any:
        """Return the (normalized) value, or raise (TorchAir's error type and text, then the
        option's name)."""
        if isinstance(value, OptionValue):
            value = value.raw
        if self.allowed is not None:
            if any(_same_value(value, a) for a in self.allowed):
                return value
            listed = [a for a in self.allowed if a is not None]
            raise ValueError(
                f"Value {value!r} (type: {type(value)}) not in optional list {listed!r} "
                f"(type: {type(listed[0]) if listed else None}). Option '{full_name}' allows: "
                f"{', '.join(repr(v) for v in self.allowed)}"
            )
        try:
            if isinstance(self.kind, (IntRange, Regex)):
                return self.kind.check(value)
            return _check_kind(self.kind, value)
        except (ValueError, TypeError, FileNotFoundError, PermissionError) as err:
            raise type(err)(f"{err} Option '{full_name}' expects {self.allowed_text()}.") from None

    def __repr__(self) -> str:
        return f"Option({self.name}, default={self.default!r}, allowed={self.allowed_text()})"


class OptionValue:
    """How an option reads back (TorchAir's ``OptionValue``): ``.value`` is TorchAir's text
    form (``True`` -> ``"1"``, ``False`` -> ``"0"``, ints as ``str``, None stays None; callables
    and int lists as they are), ``.value = v`` sets the option (validated), ``bool(opt)`` and
    ``opt == v`` use the raw value, ``.default`` / ``.optional`` describe the option."""

    __slots__ = ("_node", "_option")

    def __init__(self, node: "ConfigNode", option: Option) -> None:
        self._node = node
        self._option = option

    @property
    def raw(self) -> Any:
        """The value as set (``True``, ``64``, a callable, ...)."""
        return self._node.__dict__["_values"][self._option.name]

    @property
    def value(self) -> Any:
        raw = self.raw
        if raw is None or self._option.kind in (CALLABLE, INT_LIST):
            return raw
        if isinstance(raw, bool):
            return "1" if raw else "0"
        return str(raw)

    @value.setter
    def value(self, value: Any) -> None:
        setattr(self._node, self._option.name, value)

    @property
    def default(self) -> Any:
        return self._option.default

    @property
    def optional(self) -> Optional[List[Any]]:
        allowed = self._option.allowed
        if allowed is None:
            return [True, False] if self._option.kind == BOOL else None
        return [a for a in allowed if a is not None]

    def __bool__(self) -> bool:
        return bool(self.raw)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, OptionValue):
            other = other.raw
        return _same_value(self.raw, other) if isinstance(other, bool) or isinstance(
            self.raw, bool) else self.raw == other

    def __hash__(self) -> int:
        return hash(self.raw)

    def __repr__(self) -> str:
        return f"OptionValue({_join(self._node._prefix, self._option.name)}={self.raw!r})"

    def __str__(self) -> str:
        return str(self.raw)


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
        names = self._names()
        msg = (f"{self._peer_name()} has no option {name}, all options {names}: unknown option "
               f"'{full}'")
        close = difflib.get_close_matches(name, names, n=1)
        if close:
            msg += f"; did you mean '{_join(self._prefix, close[0])}'?"
        return msg

    @classmethod
    def _peer_name(cls) -> str:
        """The class name TorchAir's messages use for this level."""
        return getattr(cls, "peer_name", cls.__name__)

    def get(self, dotted: str) -> Any:
        """The raw value of the option ``dotted`` below this node (``"debug.run_eagerly"``)."""
        node: ConfigNode = self
        *parents, leaf = dotted.split(".")
        for part in parents:
            if part not in node._child_decls:
                raise AttributeError(node._unknown_message(part))
            node = node._children[part]
        if leaf not in node._option_decls:
            raise AttributeError(node._unknown_message(leaf))
        return node._values[leaf]

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
        """Stable sha256 hex digest of the sorted flat options (a cache key). A callable counts
        by its qualified name and source text."""
        payload = json.dumps(
            sorted((k, portable(v)) for k, v in self.options().items()),
            separators=(",", ":"), ensure_ascii=True,
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
    def registry(cls) -> Dict[str, Option]:
        """``{dotted name: Option}`` of every option (the option table of docs/options.md is checked
        against this)."""
        return dict(cls._iter_decls())

    @classmethod
    def describe(cls) -> str:
        """Text table of every option: name, default, allowed values, effect here, doc."""
        header = ("option", "default", "allowed", "effect", "doc")
        rows = [
            (name, repr(opt.default), opt.allowed_text(), opt.effect,
             opt.doc if opt.effect == WORKS else f"{opt.doc} [{opt.why}]")
            for name, opt in cls._iter_decls()
        ]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]

        def fmt(row: Tuple[str, ...]) -> str:
            cells = [row[i].ljust(widths[i]) for i in range(4)]
            return "  ".join([*cells, row[4]]).rstrip()

        sep = "  ".join(["-" * w for w in widths] + ["-" * len(header[4])])
        return "\n".join([fmt(header), sep, *(fmt(r) for r in rows)])


def portable(value: Any) -> Any:
    """``value`` as JSON-able data: a callable becomes ``module.qualname#sha256(source)[:16]``."""
    if callable(value):
        import inspect

        try:
            source = inspect.getsource(value)
        except (OSError, TypeError):
            source = repr(value)
        name = f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', repr(value))}"
        return f"{name}#{hashlib.sha256(source.encode()).hexdigest()[:16]}"
    if isinstance(value, (list, tuple)):
        return [portable(v) for v in value]
    return value
