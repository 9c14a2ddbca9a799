"""The key of a ``cache_compile`` entry, and where the entry lives.

The entry directory's hash covers what is known before tracing: the module's class and
structure (submodule types, parameter and buffer names, shapes, dtypes), ``func``'s source, the
compile config, ``dynamic``, custom decompositions, the user's fusion patterns (names and
sources), torch / Python versions, a hash of torchair's own sources (passes, patterns, kernels)
the device kind and the torch-function modes the call runs under (the torch_npu
emulation's device mapping); with ``ge_cache`` (an entry holding a library compiled for this machine)
also the CPU's model and feature flags and ``$ATEN_CPU_CAPABILITY``. Functions Dynamo inlines
while tracing are only known afterwards: the entry records their source files with hashes, and
a warm start checks them (any change: rebuild). The guards Dynamo produced are recorded in the
entry and checked on every warm call (:mod:`torchair.inference.guards`).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import os
import pathlib
import platform
from typing import Any, Callable

import torch

from torchair.base.log import env_switch
from torchair.base.version import VERSION
from torchair.configs._option import portable


def _sha(text: str | bytes) -> str:
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


_SOURCE_SUFFIXES = (".py", ".c", ".cpp", ".h")  # Python, and the kernels built on first use


@functools.lru_cache(maxsize=2)
def torchair_source_hash(root: pathlib.Path | None = None) -> str:
    """A hash of every source file of the torchair package (``root``: another copy of it), the
    C/C++ kernels' included (editing torchair invalidates; an entry's library calls the launch
    kernels by their schema)."""
    root = root or pathlib.Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in _SOURCE_SUFFIXES
                       and p.is_file()):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def module_structure(module: torch.nn.Module) -> list:
    """Submodule types and every parameter / buffer name, shape, dtype (not values)."""
    parts: list = [[name, type(m).__module__ + "." + type(m).__qualname__]
                   for name, m in module.named_modules()]
    for kind, items in (("param", module.named_parameters()), ("buffer", module.named_buffers())):
        parts += [[kind, name, list(t.shape), str(t.dtype)] for name, t in items]
    return parts


def _source(fn: Callable) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        return repr(code.co_code) if code is not None else repr(fn)


def _patterns() -> list:
    from torchair.patterns import replacement

    return [[name, _sha(src)] for name, src in replacement.registered_sources()]


def device_kind(module: torch.nn.Module) -> str:
    for t in (*module.parameters(), *module.buffers()):
        if t.device.type == "cuda":
            return f"cuda:{torch.cuda.get_device_name(t.device)}"
        if t.device.type != "cpu":
            return t.device.type
    return "cpu"


def cpu_signature() -> str:
    """This CPU's model and feature flags and the ISA override, hashed: an ahead-of-time library
    is compiled with ``-march=native`` and the vector ISA Inductor picks from exactly these
    (``$ATEN_CPU_CAPABILITY`` caps it), so it only runs where they match. Hashing the inputs of
    the pick, not the pick, keeps Inductor (and its ISA probe) out of a warm start."""
    from torchair.ops.toolchain import native as _native

    capability = os.environ.get("ATEN_CPU_CAPABILITY", "")
    return _sha(_native.cpu_signature() + "\nATEN_CPU_CAPABILITY=" + capability)[:16]


def mode_tags() -> list[str]:
    """The cacheable torch-function modes the call runs under (the torch_npu emulation's device
    mode: the device playing the NPU), so an entry traced under one device mapping lives apart
    from one traced under another or none. Other modes (a user's, ``with torch.device(...)``)
    are left out: the entry's TORCH_FUNCTION_MODE_STACK check refuses them on warm calls, and a
    cold start under one does not cache (see :mod:`torchair.inference.guards.record`)."""
    from torchair.core import function_modes

    tags = []
    for mode in function_modes.stack_modes():
        with contextlib.suppress(function_modes.UnknownMode):
            tags.append(function_modes.tag_of(mode))
    # the emulation's process-wide patches, also seen from a thread whose stack is empty
    tags += ["process: " + function_modes.tag_of(m) for m in function_modes.process_modes()]
    return tags


def key_parts(func: Callable, config: Any, dynamic: bool, decompositions: dict | None,
              ge_cache: bool = False) -> dict:
    module = func.__self__
    parts = {
        "module_class": type(module).__module__ + "." + type(module).__qualname__,
        "module_structure": _sha(json.dumps(module_structure(module))),
        "func": func.__func__.__qualname__,
        "func_source": _sha(_source(func.__func__)),
        "config": {k: portable(v) for k, v in sorted(config.options().items())},
        "dynamic": None if dynamic is None else bool(dynamic),  # None: torch.compile's automatic
        "custom_decompositions": sorted([str(k), _sha(_source(v))]
                                        for k, v in (decompositions or {}).items()),
        "patterns": _patterns(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "torchair": VERSION,
        "torchair_sources": torchair_source_hash(),
        "device": device_kind(module),
        "function_modes": mode_tags(),
    }
    if ge_cache:  # the entry may hold native code built for this machine
        parts["cpu"] = cpu_signature()
        parts["build_switches"] = build_switches()
    return parts


def build_switches() -> dict[str, bool]:
    """The environment switches that change what an engine builds from the same graph (which
    ops a CPU unit binds to C++ kernels, whether quant ops are lowered): an entry that holds the
    build (``ge_cache``) is only right under the same switches. Entries without it keep the
    traced graph, and each process builds it under its own switches."""
    from torchair.ops.matmul import cpu as _matmul
    from torchair.ops.toolchain import native as _native
    from torchair.runtime import engines as _engines

    return {name: env_switch(name) for name in sorted(
        (_matmul.ENV_SWITCH, _matmul.GROUP_SWITCH, _native.ENV_DISABLE,
         _engines.ENV_LOWER_QUANT))}


def key_hash(parts: dict) -> str:
    return _sha(json.dumps(parts, sort_keys=True, default=str))[:16]


def rank_dir(global_rank: int | None, tp_rank: int | None, pp_rank: int | None) -> str:
    """``[world{W}global_rank{r}][_tp_rank{t}][_pp_rank{p}]`` ("" when no rank is known)."""
    dist = torch.distributed
    initialized = dist.is_available() and dist.is_initialized()
    if global_rank is None and initialized:
        global_rank = dist.get_rank()
    parts = []
    if global_rank is not None:
        world = f"world{dist.get_world_size()}" if initialized else ""
        parts.append(f"{world}global_rank{global_rank}")
    if tp_rank is not None:
        parts.append(f"tp_rank{tp_rank}")
    if pp_rank is not None:
        parts.append(f"pp_rank{pp_rank}")
    return "_".join(parts)


def entry_dir(root: pathlib.Path, func: Callable, parts: dict, ranks: str) -> pathlib.Path:
    """``{root}/{ModuleClass}_{dynamic|static}_{hash}/[ranks/]{func name}``."""
    module = type(func.__self__).__name__
    top = root / f"{module}_{'dynamic' if parts['dynamic'] else 'static'}_{key_hash(parts)}"
    return (top / ranks if ranks else top) / func.__func__.__name__


def file_hashes(code_files: list[str]) -> dict[str, str]:
    """sha256 of each traced source file (recorded at cold start, checked at warm start)."""
    hashes = {}
    for name in sorted(set(code_files)):
        if os.path.isfile(name):
            hashes[name] = _sha(pathlib.Path(name).read_bytes())
    return hashes
