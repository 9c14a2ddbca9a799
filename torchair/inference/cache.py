"""``cache_compile``: compile a module method once, start later processes from disk.

The first process (cold) compiles ``func`` with Dynamo and the torchair backend as usual and saves
what the backend built (see :mod:`torchair.inference._cache_io`) together with every guard
Dynamo produced for the frame (:mod:`torchair.inference._guards`); its later calls run the launch
unit it built the way a warm process runs the entry. A later process (warm) with the same key
(:mod:`torchair.inference._cache_key`) loads the entry and checks those guards without Dynamo
(:mod:`torchair.inference._guard_eval`): all of them on the first call and after any parameter,
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
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import secrets
import shutil
import sys
import threading
from typing import Any, Callable, Iterator

import torch

from torchair.configs.compiler_config import CompilerConfig
from torchair.core import recorder
from torchair.base.log import logger
from torchair.inference import _cache_key as keys
from torchair.inference import _cache_store as store
from torchair.inference._cache_io import (NotCacheable, aot_outputs_spec, info_from_json,
                                          info_to_json, output_spec, program_to_graph,
                                          tensor_stores)
from torchair.inference._cache_runtime import Runtime
from torchair.inference._graph_io import UnserializableGraph, graph_code, graph_to_json
from torchair.inference.guards import GuardSet, UnsupportedGuard
from torchair.runtime import engines

FORMAT = 2
_RANDOM_OPS = {"aten::rand", "aten::rand_like", "aten::randn", "aten::randn_like",
               "aten::randint", "aten::randint_like", "aten::randperm", "aten::bernoulli",
               "aten::bernoulli_", "aten::normal", "aten::normal_", "aten::uniform",
               "aten::uniform_", "aten::exponential", "aten::exponential_", "aten::multinomial",
               "aten::native_dropout", "aten::poisson", "aten::cauchy_", "aten::geometric_",
               "aten::log_normal_", "aten::random_"}
_RNG_MESSAGE = "Cache compile dose not support operator that depend on RNG, input index: {}."


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


def _apply_static_marks(args: tuple, kwargs: dict) -> None:
    import torch.utils._pytree as pytree

    for leaf in pytree.tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor) and getattr(leaf, _STATIC_MARK, False):
            torch._dynamo.mark_static(leaf)


def _check_func(func: Any) -> None:
    if not inspect.ismethod(func) or not isinstance(func.__self__, torch.nn.Module):
        raise TypeError(f"cache_compile: func must be a method of an nn.Module instance "
                        f"(e.g. self.decode), got {func!r}; wrap free functions in a module")
    if hasattr(func.__func__, "__wrapped__"):
        raise TypeError(f"cache_compile: {func.__func__.__qualname__} is decorated; cache the "
                        f"undecorated method (the cache key is its own source)")


class _Frame:
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


class CachedFunction:
    """The callable ``cache_compile`` returns (see the module doc)."""

    def __init__(self, func: Callable, config: CompilerConfig, dynamic: bool,
                 cache_dir: str | None, ranks: str, decompositions: dict | None,
                 ge_cache: bool) -> None:
        self.func, self.config, self.dynamic = func, config, dynamic
        self.cache_dir, self.ranks, self.decompositions = cache_dir, ranks, decompositions
        self.ge_cache = ge_cache
        self.name = f"{type(func.__self__).__name__}.{func.__func__.__name__}"
        self.frame = _Frame(func)
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
                return runtime(flat)
            self._warn_once(why, f"cache_compile({self.name}): this call does not fit the cached "
                                 f"graph ({why}); compiling it with Dynamo")
            _apply_static_marks(args, kwargs)
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
            stale = _stale(meta, parts)
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
        if not _has_library(runtime.meta["unit"]) and not _fx_only(runtime.meta):
            runtime.first_call_context = self._warm_build  # an Inductor unit builds again
        return runtime

    def _discard(self) -> None:
        try:
            store.discard_entry(self.entry)
        except OSError as error:  # a read-only cache: the entry stays, this process compiles
            logger.warning("cache_compile(%s): could not remove %s (%s)", self.name, self.entry,
                           error)

    @contextlib.contextmanager
    def _warm_build(self) -> Iterator[None]:
        with _known_vec_isa(self.vec_isa):
            yield

    # ------------------------------------------------------------------ cold
    def _cold(self, args: tuple, kwargs: dict, parts: dict, entry: Any) -> Any:
        from torchair.inference.guards import record as _guards

        if entry is not None:
            _sweep(entry)
        state = _ColdState()
        _apply_static_marks(args, kwargs)
        code = self.func.__func__.__code__
        before = {id(e.code) for e in _guards.entries(code)}
        backend = _recording_backend(self, state)
        self.compiled = torch.compile(self.func, backend=backend, dynamic=self.dynamic,
                                      fullgraph=True)
        with self._build_dir(entry) as build, _releasing(state):
            try:
                with recorder.recording() as records, _ahead_of_time(build, state):
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

    def _save(self, state: _ColdState, parts: dict, code: Any, before: set, args: tuple,
              kwargs: dict, result: Any) -> None:
        from torchair.inference.guards import record as _guards

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
            files = self._payload(state, parts, guards, result)
            files.update(_library_files(state.records[0]))
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
        if self.guard_mode == "arguments":
            runtime.watch_arguments(self.frame.arguments)

    def _payload(self, state: _ColdState, parts: dict, guards: list, result: Any) -> dict:
        records = state.records
        if records and records[0].kind == "gears":
            records = records[:1]  # the others: gears built during the call
        if state.compiles != 1 or len(records) != 1:
            raise NotCacheable(f"Dynamo produced {len(records)} graphs; one is needed")
        rec = records[0]
        if rec.outputs is None or state.aot_outputs is None:
            raise NotCacheable("the compiled graph was not called")
        inputs = rec.report.inputs
        if len(inputs) != len(state.sources):
            raise NotCacheable(f"the graph has {len(inputs)} inputs but Dynamo passed "
                               f"{len(state.sources)} (e.g. inline_inbuilt_nn_modules=False "
                               f"lifts parameters into the graph)")
        aot = aot_outputs_spec(rec.fw_metadata, len(rec.outputs))
        output = output_spec(result, state.aot_outputs, state.flat_inputs,
                             _numbers_that_may_vary(state, guards))
        files, unit = _unit_files(rec)
        report = rec.report
        meta = {
            "format": FORMAT, "name": self.name, "key": parts, "key_hash": keys.key_hash(parts),
            "traced_files": keys.file_hashes(state.code_files), "guards": guards,
            "sources": state.sources, "as_tensor": state.as_tensor, "writes": state.writes,
            "inputs": [info_to_json(i) for i in inputs], "aot": aot, "output": output,
            "unit": unit, "ge_cache": self.ge_cache, "vec_isa": self.vec_isa,
            "report": {"fx_static": report.fx_static, "ir_static": report.ir_static,
                       "build_static": report.build_static, "reasons": report.reasons,
                       "value_dependent_ops": report.value_dependent_ops,
                       "launch": report.launch, "sunk_inputs": report.sunk_inputs,
                       "patterns": report.patterns, "scopes": report.scopes,
                       "gears": [dict(g, built=False, build_seconds=None)
                                 for g in report.gears]},
        }
        files["meta.json"] = json.dumps(meta, indent=1, default=str).encode()
        return files

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


def _fx_only(meta: dict) -> bool:
    """Whether every launch unit of the entry runs on the FX engine (``debug.run_eagerly``, or
    static units built by it): no Inductor build, so no vector-ISA pick to restore (and no
    Inductor import) on a warm start."""
    if meta["key"]["config"].get("debug.run_eagerly") is True:
        return True
    unit = meta["unit"]
    units = unit["gears"] if unit["kind"] == "gears" else [unit]
    return bool(units) and all(u.get("engine") == "fx" for u in units)


def _has_library(unit: dict) -> bool:
    if unit["kind"] == "gears":
        return bool(unit["gears"]) and all(g.get("library") for g in unit["gears"])
    return bool(unit.get("library"))


@contextlib.contextmanager
def _ahead_of_time(build: str | None, state: _ColdState) -> Iterator[None]:
    if build is None:
        yield
        return
    with engines.ahead_of_time(os.path.join(build, "aot")) as failures:
        state.aot_failures = failures
        yield


def _sweep(entry: Any) -> None:
    """Remove what killed processes left next to the entry (temp and trash directories, build
    directories) once older than ``$TORCHAIR_CACHE_LEFTOVER_SECONDS`` (default an hour)."""
    try:
        store.sweep_leftovers(entry.parent)
        legacy = entry.parent / f"{entry.name}.inductor" / "aot"
        if legacy.is_dir():
            store.sweep_leftovers(legacy, prefixes=("unit-",))
    except store.UnsafeCacheError:
        raise
    except OSError as error:
        logger.debug("cache_compile: sweeping %s failed (%s)", entry.parent, error)


def _library_files(rec: recorder.GraphRecord) -> dict[str, bytes]:
    """The ahead-of-time libraries the cold start built (ge_cache), as entry files."""
    out = {}
    if rec.kind == "gears":
        built = getattr(rec.launch_unit, "units", {})
        pairs = [(f"gear{k}.", getattr(u, "files", {})) for k, u in built.items()]
    else:
        pairs = [("", getattr(rec.launch_unit, "files", {}))]
    for prefix, files in pairs:
        for name, path in files.items():
            with open(path, "rb") as f:
                out[prefix + name] = f.read()
    return out


def _unit_json(gm: Any, unit: dict, kind: str, launch_unit: Any) -> tuple[dict, dict]:
    """A launch unit's graph and constructor arguments as entry files and JSON."""
    graph, tensors = graph_to_json(gm)
    files = {"graph.json": json.dumps(graph).encode(), "code.py": graph_code(gm).encode()}
    out: dict = {"kind": kind}
    if kind == "static":
        library = engines.LIBRARY in getattr(launch_unit, "files", {})
        out.update(kept=list(unit["kept"]), engine=unit["engine"], capture=unit["capture"],
                   library=library, borrowed=sorted(unit["borrowed"]),
                   mutated=sorted(unit["mutated"]), names=list(unit["names"]))
        if unit["program"] is not None:
            program, _ = graph_to_json(program_to_graph(unit["program"]))
            out["program"] = {"graph": program,
                              "input_indices": list(unit["program"].input_indices),
                              "input_names": list(unit["program"].input_names)}
    return files, out if not tensors else dict(out, _tensors=tensors)


def _unit_files(rec: recorder.GraphRecord) -> tuple[dict, dict]:
    """Entry files and the unit's JSON; a graph with gears keeps one static unit per gear."""
    tensors: dict = {}
    if rec.kind != "gears":
        files, unit = _unit_json(rec.gm, rec.unit, rec.kind, rec.launch_unit)
        tensors.update(unit.pop("_tensors", {}))
    else:
        files, unit = {}, {"kind": "gears", "gears": []}
        table = rec.unit["table"]
        unit["table"] = {"dims": [[d.input_index, d.input_name, d.dim, list(d.sizes)]
                                  for d in table.dims],
                         "gears": [list(g) for g in table.gears], "policy": table.policy}
        built = getattr(rec.launch_unit, "units", {})
        for k in range(len(table.gears)):
            with recorder.recording() as records:
                rec.unit["build"](k, None)  # plans the gear's static unit (builds nothing)
            if len(records) != 1 or records[0].kind != "static":
                raise NotCacheable(f"gear {k} did not plan one static launch unit")
            gear_files, gear = _unit_json(records[0].gm, records[0].unit, "static", built.get(k))
            for name, tensor in gear.pop("_tensors", {}).items():
                if name in tensors and tensors[name] is not tensor:
                    raise NotCacheable(f"gear graphs disagree on the constant {name}")
                tensors[name] = tensor
            files.update({f"gear{k}.{n}": data for n, data in gear_files.items()})
            unit["gears"].append(gear)
    if tensors:
        files["constants.pt"] = store.dump_tensors(tensors)
    return files, unit


def _numbers_that_may_vary(state: _ColdState, guards: list) -> Callable[[Any], bool]:
    """Which returned numbers (not graph outputs) might not be constants of the compiled code.

    Dynamo returns a number computed from symbolic values as a graph output; one it does not
    return that way is either a constant (specialized, guarded by value) or an unspecialized
    input handed back unchanged (rebuilt from its source on every call). An int is suspect when
    it equals a SymInt graph input's cold value or some int is guarded by type only; a float
    when any float reached the graph as a tensor or is guarded by type only."""
    int_values = {v for v, shape in zip(state.flat_inputs, state.shapes)
                  if shape is None and isinstance(v, int)}
    typed = {tuple(g["type"]) for g in guards if g.get("type")}
    loose_ints = ("builtins", "int") in typed
    loose_floats = ("builtins", "float") in typed or any(state.as_tensor)

    def may_vary(x: Any) -> bool:
        if isinstance(x, float):
            return loose_floats
        return loose_ints or x in int_values

    return may_vary


@contextlib.contextmanager
def _known_vec_isa(recorded: str | None) -> Iterator[None]:
    """Skip Inductor's vector-ISA probe (it compiles test programs: ~1.5 s per process) when the
    cold start recorded the probed pick: trust the CPU flags, and if that picks another ISA than
    the recorded one, forget it so Inductor probes as usual."""
    if not recorded or torch.cuda.is_available():
        yield
        return
    from torch._inductor import config as inductor_config
    from torch._inductor import cpu_vec_isa

    with inductor_config.patch({"cpp.vec_isa_ok": True}):
        same = str(cpu_vec_isa.pick_vec_isa()) == recorded
    if not same:
        cpu_vec_isa.valid_vec_isa_list.cache_clear()
        yield
        return
    with inductor_config.patch({"cpp.vec_isa_ok": True}):
        yield


class _ColdState:
    def __init__(self) -> None:
        self.compiles = 0
        self.aot_failures: list[str] = []  # ge_cache: libraries that failed to build
        self.sources: list[str] = []
        self.shapes: list[Any] = []  # per graph input: a shape, None for a SymInt
        self.code_files: list[str] = []
        self.records: list = []
        self.as_tensor: list[bool] = []
        self.aot_outputs: list | None = None  # what the compiled graph returned to Dynamo
        self.flat_inputs: list = []
        # the first call's inputs and outputs were captured (and, after the cold call,
        # released): later calls through the compiled function keep nothing
        self.captured = False
        self.not_cacheable = ""
        # attribute writes a warm call replays: constants, and tensors stored on modules
        self.writes: list[list] = []


@contextlib.contextmanager
def _releasing(state: _ColdState) -> Iterator[None]:
    """After the cold call (saved or not, raised or not), drop the first call's inputs and
    outputs: Dynamo's compiled function, kept for calls the entry does not fit, holds the
    backend and so the state for the life of the process (a prefill's logits, say)."""
    try:
        yield
    finally:
        state.captured = True
        state.aot_outputs, state.flat_inputs = None, []
        for rec in state.records:
            rec.outputs = []  # (the graph records' copies, kept only to map them)


def _recording_backend(owner: CachedFunction, state: _ColdState) -> Callable:
    from torchair.core.backend import npu_backend
    from torchair.inference.guards import record as _guards

    # floats stay inputs: the per-call checks read arguments, not attributes
    inner = npu_backend(owner.config, owner.decompositions, specialize_floats=False)

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        placeholders = list(gm.graph.find_nodes(op="placeholder"))
        sources = [n.meta["grapharg"].source.name for n in placeholders]
        shapes = [tuple(str(d) for d in x.shape) if isinstance(x, torch.Tensor) else None
                  for x in example_inputs]
        if state.compiles:
            old = dict(zip(state.sources, state.shapes))
            changed = [f"{s}: {list(new)} (was {list(old[s])})" for s, new in zip(sources, shapes)
                       if old.get(s) is not None and new is not None and new != old[s]]
            logger.warning("cache_compile(%s): func recompiled (Dynamo guards failed%s); the "
                           "cache is not used for it", owner.name,
                           f": {'; '.join(changed[:3])}" if changed else "")
            state.compiles += 1
            if owner.entry is not None:
                owner._discard()
            return inner(gm, example_inputs)
        # a restarted trace (e.g. Dynamo specializing a float) calls again: start over each time
        del state.records[:]
        state.sources = sources
        state.shapes = shapes
        # Python floats Dynamo passes to the graph as 0-d tensors (unspecialized floats)
        state.as_tensor = [bool(getattr(n.meta["grapharg"], "pass_arg_as_tensor", False))
                           for n in placeholders]
        context = torch._guards.TracingContext.try_get()
        state.code_files = [c.co_filename for c in getattr(context, "traced_code", None) or []]
        state.not_cacheable = ""
        state.writes = _guards.side_effects(lambda why: setattr(state, "not_cacheable", why))
        _refuse_random(gm)
        compiled = inner(gm, example_inputs)
        state.compiles += 1
        return _capturing(compiled, state)

    return backend


def _refuse_random(gm: torch.fx.GraphModule) -> None:
    """TorchAir's refusal of RNG-dependent graphs (its exception type and text), with the ops."""
    random = []
    for node in gm.graph.nodes:
        if node.op == "call_function":
            name = _op_name(node.target) or getattr(node.target, "__name__", "")
            if name in _RANDOM_OPS or f"aten::{name}" in _RANDOM_OPS:
                random.append(name)
    if random:
        index = len(list(gm.graph.find_nodes(op="placeholder")))
        raise AssertionError(_RNG_MESSAGE.format(index) + f" The graph uses random ops "
                             f"{sorted(set(random))}, whose RNG state a cached graph cannot "
                             f"reproduce: remove the randomness from func or use torch.compile")


def _capturing(compiled: Callable, state: _ColdState) -> Callable:
    """The compiled graph, keeping its first call's inputs and outputs (to map the return
    value onto graph outputs and inputs)."""
    boxed = getattr(compiled, "_boxed_call", False)

    def run(*args: Any) -> Any:
        if state.captured:
            return compiled(*args)
        packed = boxed and len(args) == 1 and isinstance(args[0], list)
        inputs = list(args[0]) if packed else list(args)  # before a boxed callee clears it
        outputs = compiled(*args)
        state.captured = True
        state.aot_outputs, state.flat_inputs = list(outputs), inputs
        return outputs

    run._boxed_call = boxed  # type: ignore[attr-defined]
    return run


def _op_name(target: Any) -> str:
    schema = getattr(target, "_schema", None)
    return schema.name if schema is not None else ""


def _stale(meta: dict, parts: dict) -> str:
    if meta.get("format") != FORMAT:
        return f"entry format {meta.get('format')} (expected {FORMAT})"
    if meta.get("key") != json.loads(json.dumps(parts, default=str)):
        return "its key differs from this call's"
    now = keys.file_hashes(list(meta["traced_files"]))
    for name, digest in meta["traced_files"].items():
        if now.get(name) != digest:
            return f"source file {name} changed"
    return ""


def readable_cache(cache_bin: str | os.PathLike, print_output: bool = True,
                   file: str | os.PathLike | None = None) -> str:
    """Describe a cache entry: metadata, key parts, guards, graph inputs and the graph's code.

    ``cache_bin`` is an entry directory (or a file in it). The text is printed when
    ``print_output``, written to ``file`` when given, and returned.
    """
    import pathlib

    path = pathlib.Path(cache_bin)
    entry = path if path.is_dir() else path.parent
    files = store.read_entry(entry)
    if files is None:
        raise FileNotFoundError(f"readable_cache: no cache entry at {entry}")
    meta = json.loads(files["meta.json"])
    lines = [f"cache entry {entry}", f"  function: {meta['name']}  (format {meta['format']}, "
             f"key {meta['key_hash']}, ge_cache={meta['ge_cache']})", "  key:"]
    lines += [f"    {k}: {v}" for k, v in meta["key"].items()]
    lines.append("  traced source files:")
    lines += [f"    {name}  sha256 {digest[:16]}" for name, digest in meta["traced_files"].items()]
    lines.append(f"  guards ({len(meta['guards'])}, checked on every warm call unless "
                 f"advisory):")
    for g in meta["guards"]:
        text = "; ".join(g.get("code", [])) if "state" not in g else json.dumps(g["state"])
        lines.append(f"    {g['kind']}: {text}" + (f"  [advisory: {g['advisory']}]"
                                                    if g.get("advisory") else ""))
    for source, attr, value in meta.get("writes", []):
        value = (f"graph output {value['out']}" if isinstance(value, dict) and "out" in value
                 else f"graph input {value['in']}" if isinstance(value, dict) else repr(value))
        lines.append(f"    after each call: {source}.{attr} = {value}  (as Dynamo replays it)")
    lines.append("  graph inputs (Dynamo source -> IR Data):")
    for source, info in zip(meta["sources"], meta["inputs"]):
        lines.append(f"    {source}  ->  {info['kind']} {info['dtype']}{list(info['shape'])}"
                     + (" (mutated in place)" if info.get("mutated") else ""))
    unit = meta["unit"]
    lines.append(f"  launch unit: {unit['kind']}, {meta['report']['launch']}"
                 + (f", engine {unit.get('engine')}" if unit.get("engine") else ""))
    for name in sorted(n for n in files if n.endswith(engines.LIBRARY)):
        lines.append(f"  built: {name} ({len(files[name])} bytes, AOTInductor shared library, "
                     f"vec_isa {meta.get('vec_isa')})")
    for name in sorted(n for n in files if n.endswith("code.py")):
        lines.append(f"  code ({name}):")
        lines += ["    " + line for line in files[name].decode().splitlines()]
    text = "\n".join(lines) + "\n"
    if file is not None:
        pathlib.Path(file).write_text(text, encoding="utf-8")
    if print_output:
        print(text, end="")  # noqa: T201 - printing is this function's purpose
    return text
