"""``cache_compile``: compile a module method once, start later processes from disk.

The first process (cold) compiles ``func`` with Dynamo and the torchair backend as usual and saves
what the backend built (see :mod:`torchair.inference._cache_io`) together with every guard
Dynamo produced for the frame (:mod:`torchair.inference.guards.record`); its later calls run the launch
unit it built the way a warm process runs the entry. A later process (warm) with the same key
(:mod:`torchair.inference._cache_key`) loads the entry and checks those guards without Dynamo
(:mod:`torchair.inference.guards`): all of them on the first call and after any parameter,
buffer or submodule assignment, on the other calls those on the call's arguments and the process
state, plus the unit's own checks of every input (``$TORCHAIR_CACHE_GUARDS=all``: every guard on
every call, so that a call that passes is one Dynamo would have served from the traced graph). A
call that fails a check is compiled with Dynamo (warning once, naming the guard), never run on the
cached graph. What ``arguments`` does not see after the first call (module attributes and globals
changed by plain assignment, submodules reordered in their container) is listed in docs/cache_compile.md. A guard that cannot be checked in another process makes the function uncacheable
(compiled as usual, with a warning naming that guard). Calls run under ``torch.no_grad()``, as in
TorchAir. What Dynamo's code does after the graph is done again after each call when it can be:
constants set on existing objects, and tensors stored on modules' attributes (set to the call's
own graph outputs or inputs); other Python side effects make the function uncacheable.

With ``ge_cache=True`` the build is cached too: a static launch unit is compiled ahead of time
(AOTInductor) into a shared library that the entry keeps, and a warm start runs it through
PyTorch's C++ runner (no Inductor import, no code generation, no compiler).

A cache directory that cannot be written (read-only, full disk) degrades to "compiled, not
cached" with one warning; an unsafe one (symlink, foreign owner, loose permissions) raises.

This module holds the public API and the per-call dispatch (warm, cold, fallback); the cold
start's recording is :mod:`torchair.inference._cache_cold`, the entry's contents
:mod:`torchair.inference._cache_payload`, the call's frame and static marks
:mod:`torchair.inference._cache_args`, and ``readable_cache``
:mod:`torchair.inference._cache_readable` (all importable from here as before).
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import secrets
import shutil
import threading
from typing import Any, Callable, Iterator

import torch

from torchair.base.log import logger
from torchair.configs.compiler_config import CompilerConfig
from torchair.core import recorder
from torchair.inference import _cache_key as keys, _cache_store as store
from torchair.inference._cache_args import Frame, apply_static_marks, mark_static
from torchair.inference._cache_cold import ColdState, ahead_of_time, recording_backend, releasing, sweep_entry
from torchair.inference._cache_io import NotCacheable, info_from_json, tensor_stores
from torchair.inference._cache_payload import (
    FORMAT,
    entry_files,
    fx_only,
    has_library,
    known_vec_isa,
    library_files,
    stale_reason,
)
from torchair.inference._cache_readable import readable_cache
from torchair.inference._cache_runtime import MISS, InputsRefused, Runtime
from torchair.inference._graph_io import UnserializableGraph
from torchair.inference.guards import GuardSet, UnsupportedGuard, record as _guards

__all__ = ["FORMAT", "CachedFunction", "cache_compile", "mark_static", "readable_cache"]


def cache_compile(func: Callable, *, config: CompilerConfig | None = None,
                  backend: Any = None, dynamic: bool | None = True, cache_dir: str | None = None,
                  global_rank: int | None = None, tp_rank: int | None = None,
                  pp_rank: int | None = None, custom_decompositions: dict | None = None,
                  ge_cache: bool = False, **kwargs: Any) -> Callable:
    """Compile ``func`` (a bound method of an ``nn.Module``) with a compile cache on disk.

    Entries live in ``{cache_dir or $TORCHAIR_CACHE_HOME or ./.torchair_cache}/
    {ModuleClass}_{dynamic|static}_{hash}/[world{W}global_rank{r}][_tp_rank{t}][_pp_rank{p}]/
    {func name}/``. ``backend`` (from ``torchair.get_npu_backend``) supplies the config when
    ``config`` is not given; both given must agree (TorchAir's ``ValueError``). ``dynamic`` goes
    to ``torch.compile`` and into the key (``False``: static shapes; a call with another shape
    fails a guard and is compiled again, never served from the entry). ``ge_cache=True`` also
    caches the engine's build (an ahead-of-time library). ``fullgraph`` is accepted as TorchAir
    accepts it: ``func`` is always compiled as one graph (``fullgraph=False`` is noted in the log
    and changes nothing); any other keyword raises ``TypeError``. Inference only (calls run
    under ``torch.no_grad()``).
    """
    _check_func(func)
    config = _config_of(config, backend)
    _check_keywords(func, dynamic, kwargs)
    return CachedFunction(func, config.copy(), dynamic, cache_dir,
                          keys.rank_dir(global_rank, tp_rank, pp_rank), custom_decompositions,
                          ge_cache)


_ACCEPTED = ("config", "backend", "dynamic", "cache_dir", "global_rank", "tp_rank", "pp_rank",
             "custom_decompositions", "ge_cache", "fullgraph")


def _check_keywords(func: Callable, dynamic: Any, kwargs: dict) -> None:
    """TorchAir's extra keywords: ``fullgraph`` (implied: cache_compile always compiles one
    graph, as TorchAir's does); anything else is refused rather than silently dropped."""
    if dynamic is not None and not isinstance(dynamic, bool):
        raise TypeError(f"cache_compile: dynamic must be True, False or None (as for "
                        f"torch.compile), got {dynamic!r}")
    unknown = sorted(set(kwargs) - {"fullgraph"})
    if unknown:
        raise TypeError(f"cache_compile: unexpected keyword argument {unknown[0]!r} "
                        f"(={kwargs[unknown[0]]!r}); cache_compile accepts "
                        f"{', '.join(_ACCEPTED)}; pass other torch.compile options through "
                        f"config, or use torch.compile for them")
    fullgraph = kwargs.get("fullgraph", True)
    if not isinstance(fullgraph, bool):
        raise TypeError(f"cache_compile: fullgraph must be True or False, got {fullgraph!r}")
    if not fullgraph:
        logger.info("cache_compile(%s): fullgraph=False is ignored, as in TorchAir: func is "
                    "compiled as one graph (a graph break raises ValueError)",
                    getattr(func, "__qualname__", func))


def _config_of(config: Any, backend: Any) -> CompilerConfig:
    if config is not None and not isinstance(config, CompilerConfig):
        raise TypeError(f"cache_compile: config must be a torchair.CompilerConfig, got "
                        f"{type(config).__name__}")
    if backend is None:
        return config or CompilerConfig()
    found = getattr(backend, "compiler_config", None)
    if found is None and isinstance(getattr(backend, "keywords", None), dict):
        found = backend.keywords.get("compiler_config")  # a functools.partial, as TorchAir's
    if not isinstance(found, CompilerConfig):
        raise TypeError(f"cache_compile: backend must come from torchair.get_npu_backend(...) "
                        f"(it carries the CompilerConfig to cache with), got {backend!r}")
    if config is not None and config.as_dict() != found.as_dict():
        raise ValueError("config in current backend is different from the config during cache "
                         "generation.")
    return found


def _check_func(func: Any) -> None:
    if not inspect.ismethod(func) or not isinstance(func.__self__, torch.nn.Module):
        raise TypeError(f"cache_compile: func must be a method of an nn.Module instance "
                        f"(e.g. self.decode), got {func!r}; wrap free functions in a module")
    if hasattr(func.__func__, "__wrapped__"):
        raise TypeError(f"cache_compile: {func.__func__.__qualname__} is decorated; cache the "
                        f"undecorated method (the cache key is its own source)")


class CachedFunction:
    """The callable ``cache_compile`` returns (see the module doc)."""

    def __init__(self, func: Callable, config: CompilerConfig, dynamic: bool,
                 cache_dir: str | None, ranks: str, decompositions: dict | None,
                 ge_cache: bool) -> None:
        self.func, self.config, self.dynamic = func, config, dynamic
        self.cache_dir, self.ranks, self.decompositions = cache_dir, ranks, decompositions
        self.ge_cache = ge_cache
        self.name = f"{type(func.__self__).__name__}.{func.__func__.__name__}"
        self.frame = Frame(func)
        self.entry: Any = None  # the entry directory, known at the first call (None: no cache)
        self.root: Any = None
        self.vec_isa: str | None = None  # the CPU vector ISA Inductor picked at the cold start
        self.runtime: Runtime | None = None
        self.compiled: Callable | None = None  # Dynamo-compiled func (cold start, fallback)
        self.warned: set[str] = set()
        self.guard_mode = _guard_mode()
        self._lock = threading.Lock()
        functools.update_wrapper(self, func)

    # ------------------------------------------------------------------ calls
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():  # the serving loop's case: no context object to build
            runtime, frame = self.runtime, self.frame
            if runtime is not None and not kwargs and len(args) == frame.positional:
                fast = runtime.fast
                if fast is not None:  # the served call as one generated function
                    out = fast(*args)
                else:  # the common served call, with no layer between the check and the unit
                    # (Frame.__call__'s common case, inline)
                    local = dict(zip(frame.names, args))
                    local[frame.self_name] = frame.module
                    out = runtime.serve(local, frame.globals)
                if out is not MISS:
                    return out
            try:
                return self._call(args, kwargs)
            finally:
                if torch.is_grad_enabled():  # turned on inside: off again, as no_grad() would
                    torch._C._set_grad_enabled(False)
        self._warn_once("grad", f"cache_compile({self.name}) runs inference graphs under "
                                f"torch.no_grad(), as TorchAir does: its results do not "
                                f"require grad and backward() through them fails")
        with torch.no_grad():
            return self._call(args, kwargs)

    def _call(self, args: tuple, kwargs: dict) -> Any:
        runtime = self.runtime
        if runtime is not None:
            why, flat = runtime.check(self.frame(args, kwargs), self.frame.globals)
            if not why:
                try:
                    return runtime(flat)
                except InputsRefused as refused:
                    why = str(refused)
            self._warn_once(why, f"cache_compile({self.name}): this call does not fit the cached "
                                 f"graph ({why}); compiling it with Dynamo")
            apply_static_marks(args, kwargs)
            return self._dynamo()(*args, **kwargs)
        if self.compiled is not None:
            return self.compiled(*args, **kwargs)
        with self._lock:
            if self.runtime is None and self.compiled is None:
                return self._first_call(args, kwargs)
        return self._call(args, kwargs)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self.warned:
            self.warned.add(key)
            logger.warning("%s", message)

    def _dynamo(self) -> Callable:
        if self.compiled is None:
            from torchair.core.backend import npu_backend

            # floats stay inputs: the per-call checks read arguments, not attributes
            backend = npu_backend(self.config, self.decompositions, specialize_floats=False)
            self.compiled = torch.compile(self.func, backend=backend, dynamic=self.dynamic,
                                          fullgraph=True)
        return self.compiled

    def _first_call(self, args: tuple, kwargs: dict) -> Any:
        parts = keys.key_parts(self.func, self.config, self.dynamic, self.decompositions,
                               ge_cache=self.ge_cache)
        root = store.cache_root(self.cache_dir)
        entry = keys.entry_dir(root, self.func, parts, self.ranks)
        try:
            store.ensure_dir(entry.parent, root=root)
        except store.UnsafeCacheError:
            raise
        except OSError as error:  # read-only or full: compile, do not cache
            self._not_cached(f"the cache directory {entry.parent} cannot be used ({error})")
            return self._cold(args, kwargs, parts, entry=None)
        self.entry, self.root = entry, root
        self.runtime = self._load(parts)
        if self.runtime is not None:
            return self._call(args, kwargs)
        return self._cold(args, kwargs, parts, entry=entry)

    def _not_cached(self, why: str) -> None:
        self._warn_once("not cached", f"cache_compile({self.name}): compiled, not cached: {why}")

    # ------------------------------------------------------------------ warm
    def _load(self, parts: dict) -> Runtime | None:
        try:
            files = store.read_entry(self.entry)
            if files is None:
                return None
            meta = json.loads(files["meta.json"])
            stale = stale_reason(meta, parts)
            if stale:
                logger.warning("cache_compile(%s): cache entry %s is stale (%s): rebuilding",
                               self.name, self.entry, stale)
                self._discard()
                return None
            runtime = Runtime.load(meta, files, self.entry)
        except store.UnsafeCacheError:
            raise
        except store.BrokenCacheError as error:
            logger.warning("cache_compile(%s): broken cache %s (%s): rebuilding", self.name,
                           self.entry, error)
            self._discard()
            return None
        except (KeyError, ValueError, TypeError, NotCacheable, UnserializableGraph,
                UnsupportedGuard, OSError) as error:
            logger.warning("cache_compile(%s): broken cache %s (%s: %s): rebuilding", self.name,
                           self.entry, type(error).__name__, error)
            self._discard()
            return None
        self._watch(runtime)
        logger.info("cache_compile(%s): loaded %s (no Dynamo trace; %d guards, %s)", self.name,
                    self.entry, len(runtime.guards), _GUARD_MODES[self.guard_mode])
        self.vec_isa = runtime.meta.get("vec_isa")
        if not has_library(runtime.meta["unit"]) and not fx_only(runtime.meta):
            runtime.first_call_context = self._warm_build  # an Inductor unit builds again
        return runtime

    def _discard(self) -> None:
        try:
            store.discard_entry(self.entry)
        except OSError as error:  # a read-only cache: the entry stays, this process compiles
            logger.warning("cache_compile(%s): could not remove %s (%s)", self.name, self.entry,
                           error)

    def _drop_entry(self) -> None:
        """Dynamo recompiled func (a guard failed): its entry, if any, no longer fits."""
        if self.entry is not None:
            self._discard()

    @contextlib.contextmanager
    def _warm_build(self) -> Iterator[None]:
        with known_vec_isa(self.vec_isa):
            yield

    # ------------------------------------------------------------------ cold
    def _cold(self, args: tuple, kwargs: dict, parts: dict, entry: Any) -> Any:
        if entry is not None:
            sweep_entry(entry)
        state = ColdState()
        apply_static_marks(args, kwargs)
        code = self.func.__func__.__code__
        before = {id(e.code) for e in _guards.entries(code)}
        backend = recording_backend(self.config, self.decompositions, self.name, state,
                                    self._drop_entry)
        self.compiled = torch.compile(self.func, backend=backend, dynamic=self.dynamic,
                                      fullgraph=True)
        with self._build_dir(entry) as build, releasing(state):
            try:
                with recorder.recording() as records, ahead_of_time(build, state):
                    state.records = records
                    result = self.compiled(*args, **kwargs)
            except torch._dynamo.exc.Unsupported as error:
                self.compiled = None
                raise ValueError(f"cache_compile({self.name}) needs func to form one graph "
                                 f"(fullgraph); Dynamo stopped at: {error}") from error
            except torch._dynamo.exc.BackendCompilerFailed as error:
                self.compiled = None
                inner = error.__cause__ or getattr(error, "inner_exception", None)
                if isinstance(inner, (ValueError, RuntimeError, TypeError)):
                    raise inner from error
                raise
            if entry is not None:
                self._save(state, parts, code, before, args, kwargs, result)
        return result

    def _save(self, state: ColdState, parts: dict, code: Any, before: set, args: tuple,
              kwargs: dict, result: Any) -> None:
        try:
            if state.not_cacheable:
                raise NotCacheable(state.not_cacheable)
            if state.aot_failures:  # saved, every warm start would compile in-process again
                raise NotCacheable(f"the ahead-of-time build (ge_cache) did not finish "
                                   f"({state.aot_failures[0]}); the next process compiles "
                                   f"and tries to save again")
            frame = self.frame(args, kwargs)
            guards = _guards.harvest(_guards.new_entry(code, before), frame, self.frame.globals)
            why, targets = GuardSet([], [w[0] for w in state.writes]).check(
                frame, self.frame.globals)
            if why:
                raise NotCacheable(f"an object whose attribute func sets cannot be found again "
                                   f"({why})")
            if state.writes:
                tensor_stores(state.writes, targets, state.aot_outputs, state.flat_inputs)
            files = entry_files(state, parts, guards, result, name=self.name,
                                ge_cache=self.ge_cache, vec_isa=self.vec_isa)
            files.update(library_files(state.records[0]))
            self._serve_from(files["meta.json"], state.records[0])
            published = store.write_entry(self.entry, files)
            logger.info("cache_compile(%s): %s %s (%d guards)", self.name,
                        "saved" if published else "another process saved", self.entry,
                        len(guards))
        except (NotCacheable, UnsupportedGuard, UnserializableGraph) as error:
            self._not_cached(str(error))
        except store.UnsafeCacheError:
            raise
        except OSError as error:  # a full or read-only disk: the entry is not saved
            self._not_cached(f"writing {self.entry} failed ({error})")

    def _serve_from(self, meta_json: bytes, rec: recorder.GraphRecord) -> None:
        """Later calls in this process run as a warm process's do: the entry's guards, then
        the launch unit the cold call built (no second build), without Dynamo. A call that fails
        a guard still goes to Dynamo (which then recompiles and drops the entry)."""
        if rec.launch_unit is None:
            return
        try:
            meta = json.loads(meta_json)
            inputs = [info_from_json(i) for i in meta["inputs"]]
            runtime = Runtime(meta, rec.launch_unit, inputs)
            runtime.served = True  # this process's Dynamo trace read the marks (Runtime.check)
            self._watch(runtime)
        except Exception as error:  # noqa: BLE001 - Dynamo keeps serving this process's calls
            logger.warning("cache_compile(%s): later calls in this process go through Dynamo (%s: "
                           "%s)", self.name, type(error).__name__, error)
            return
        self.runtime = runtime

    def _watch(self, runtime: Runtime) -> None:
        frame = self.frame
        if self.guard_mode == "arguments":
            if frame.positional >= 0:
                runtime.serve_positional(frame.names, frame.self_name, frame.module, frame.globals)
            runtime.watch_arguments(frame.arguments, frame.self_name)

    @contextlib.contextmanager
    def _build_dir(self, entry: Any) -> Iterator[str | None]:
        """With ge_cache, a private directory for the ahead-of-time build (named like a store
        temp directory, so a killed build's leftovers are swept by a later cold start)."""
        if not self.ge_cache:
            yield None
            return
        if entry is None:
            yield None
            return
        path = entry.parent / f".tmp-build-{entry.name}-{os.getpid()}-{secrets.token_hex(6)}"
        try:
            os.mkdir(path, 0o700)
        except OSError as error:
            self._not_cached(f"no room for the ahead-of-time build in {entry.parent} ({error})")
            yield None
            return
        try:
            if not torch.cuda.is_available():  # recorded in the entry (readable_cache)
                from torch._inductor import cpu_vec_isa

                self.vec_isa = str(cpu_vec_isa.pick_vec_isa())
            yield str(path)
        finally:
            shutil.rmtree(path, ignore_errors=True)


_GUARD_MODES = {
    "arguments": "per call: the guards on the call's arguments and the process state; all of "
                 "them on the first call and after a parameter, buffer or submodule assignment",
    "all": "all of them on every call",
}


def _guard_mode() -> str:
    """$TORCHAIR_CACHE_GUARDS: which guards a call served from the entry checks."""
    mode = os.environ.get("TORCHAIR_CACHE_GUARDS", "arguments").strip().lower()
    if mode not in _GUARD_MODES:
        raise ValueError(f"TORCHAIR_CACHE_GUARDS={mode!r} is not valid; use one of "
                         f"{sorted(_GUARD_MODES)} (default 'arguments')")
    return mode
