"""SuperKernel compile options: ``"opt1=v1:opt2=v2"``, parsed when a graph is compiled.

The option names and values follow TorchAir's user guide ("图内标定SuperKernel范围", table 1:
``feed-sync-all``, ``stream-fusion``, ``strict-scope-check``) and the CANN SuperKernel compiler's
option parser, which accepts the further names below (``preload-code``, ``early-start``,
``split-mode``, the ``debug-*`` switches, ...). As in TorchAir, ``super_kernel`` accepts any
options string and keeps it as given; a part that is not understood (an unknown name, a bad value)
is ignored, with a warning at compile time that lists the valid choices.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class _Option:
    """One option: ``check(value)`` is True for a valid value; ``expected`` says which are."""

    check: Callable[[str], bool]
    expected: str
    meaning: str


def _one_of(*values: str) -> Callable[[str], bool]:
    return lambda v: v in values


def _int_in(low: int, high: int | None) -> Callable[[str], bool]:
    return lambda v: v.isdigit() and int(v) >= low and (high is None or int(v) <= high)


def _power_of_two_or_zero(v: str) -> bool:
    return v.isdigit() and (int(v) == 0 or (int(v) >= 2 and int(v) & (int(v) - 1) == 0))


def _non_empty(v: str) -> bool:
    return bool(v.strip())


_BINARY = ("0", "1")
OPTIONS: dict[str, _Option] = {
    # TorchAir user guide, table 1
    "feed-sync-all": _Option(_one_of(*_BINARY), "0 (default) or 1",
                             "pad SyncAll on the cores a sub-kernel leaves idle"),
    "stream-fusion": _Option(_one_of(*_BINARY), "0 (default: at most two streams) or 1 (any "
                             "number of streams)", "streams allowed inside one SuperKernel"),
    "strict-scope-check": _Option(_one_of("bypass", "abort"), "bypass or abort",
                                  "what to do when a scope cannot be fused as marked"),
    # CANN SuperKernel compiler
    "preload-code": _Option(_one_of("max", "none", "per-func"), "max, none or per-func",
                            "instruction-cache preload"),
    "early-start": _Option(_one_of("0", "1", "2"), "0, 1 or 2",
                           "start a sub-kernel before the previous one ends"),
    "split-mode": _Option(_int_in(1, 64), "an integer in 1..64", "SuperKernel split mode"),
    "func-align": _Option(_power_of_two_or_zero, "0 or a power of two >= 2",
                          "code alignment of sub-kernels"),
    "debug-dcci-all": _Option(_one_of(*_BINARY), "0 or 1", "flush the data cache after each op"),
    "debug-sync-all": _Option(_one_of(*_BINARY), "0 or 1", "SyncAll after each op"),
    "profiling": _Option(_one_of(*_BINARY), "0 or 1", "per-sub-kernel profiling"),
    "debug-aic-num": _Option(_int_in(0, None), "a non-negative integer", "cube cores to launch"),
    "debug-aiv-num": _Option(_int_in(0, None), "a non-negative integer",
                             "vector cores to launch"),
    "compile-options": _Option(_non_empty, "a non-empty string", "extra compiler flags"),
    "dcci-before-kernel-start": _Option(_non_empty, "a non-empty string",
                                        "ops whose data cache is flushed before they start"),
    "dcci-after-kernel-end": _Option(_non_empty, "a non-empty string",
                                     "ops whose data cache is flushed after they end"),
    "dcci-disable-on-kernel": _Option(_non_empty, "a non-empty string",
                                      "ops that skip the data cache flush"),
}


def _valid_list() -> str:
    return "; ".join(f"{name}={o.expected}" for name, o in OPTIONS.items())


def check_options(options: str) -> tuple[dict[str, str], list[str]]:
    """``"stream-fusion=1:feed-sync-all=0"`` -> ``({"stream-fusion": "1", "feed-sync-all": "0"},
    problems)``.

    TorchAir accepts any string (it hands the text to Ascend's SuperKernel compiler unchecked), so
    nothing here raises for a string: the parts understood are returned, and each part that is
    not (no ``=``, an unknown name, a repeated name, a bad value) is described in ``problems``,
    which :class:`~torchair.passes.SuperKernelScopePass` logs as a warning. Empty parts and spaces
    around names and values are ignored.
    """
    if not isinstance(options, str):
        raise TypeError(f"super_kernel options must be a str like 'stream-fusion=1', got "
                        f"{type(options).__name__} {options!r}")
    parsed: dict[str, str] = {}
    problems: list[str] = []
    for part in (p.strip() for p in options.split(":")):
        if not part:
            continue
        name, sep, value = (s.strip() for s in part.partition("="))
        if not sep or not name or not value:
            problems.append(f"{part!r} is not 'name=value' (write options as 'opt1=v1:opt2=v2')")
        elif name not in OPTIONS:
            problems.append(f"unknown option {name!r} (valid options: {_valid_list()})")
        elif name in parsed:
            problems.append(f"option {name!r} is given twice (the first, {name}="
                            f"{parsed[name]}, is used)")
        elif not OPTIONS[name].check(value):
            problems.append(f"{name}={value!r} is not valid ({name} expects "
                            f"{OPTIONS[name].expected})")
        else:
            parsed[name] = value
    return parsed, problems


def parse_options(options: str) -> dict[str, str]:
    """The options of ``options`` that are understood (see :func:`check_options`)."""
    return check_options(options)[0]


def format_options(parsed: dict[str, str]) -> str:
    """The canonical text of parsed options (``"stream-fusion=1:feed-sync-all=0"``)."""
    return ":".join(f"{name}={value}" for name, value in parsed.items())

