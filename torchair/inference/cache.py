"""``cache_compile``: compile a module method once, start later processes from disk.

The first process (cold) compiles ``func`` with Dynamo and the torchair backend as usual and saves
what the backend built (see :mod:`torchair.inference._cache_io`). A later process (warm) with
the same key (:mod:`torchair.inference._cache_key`) loads the entry and calls the launch unit
directly: no Dynamo tracing and no guard evaluation. Instead of guards, every warm call is
checked against the call signature the graph was compiled for (tensor shapes / dtypes /
devices, constant arguments); a call that does not fit is compiled with Dynamo (warning once),
never run on the cached graph. With ``ge_cache=True`` the build is cached too: a static launch
unit is compiled ahead of time (AOTInductor) into a shared library that the entry keeps, and a warm
start runs it through PyTorch's C++ runner (no Inductor import, no code generation, no compiler);
other Inductor builds keep Inductor's own cache in the entry's directory.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import sys
import threading
from typing import Any, Callable, Iterator

import torch
import torch.utils._pytree as pytree

from torchair.configs.compiler_config import CompilerConfig
from torchair.core import recorder
from torchair.core.utils import logger
from torchair.inference import _cache_key as keys
from torchair.inference import _cache_store as store
from torchair.inference._cache_io import (NotCacheable, accessor, build_output, info_from_json,
                                          info_to_json, leaf_mismatch, leaf_spec, output_spec,
                                          program_from_graph, program_to_graph)
from torchair.inference._graph_io import (UnserializableGraph, graph_code, graph_from_json,
                                          graph_to_json)
from torchair.plan.report import GraphReport, add_report, next_graph_id
from torchair.runtime import engines, units
from torchair.runtime.engines import fx_engine

FORMAT = 1
_VALUE_GUARDS = ("CONSTANT_MATCH", "EQUALS_MATCH", "ID_MATCH")
_RANDOM_OPS = {"aten::rand", "aten::rand_like", "aten::randn", "aten::randn_like",
               "aten::randint", "aten::randint_like", "aten::randperm", "aten::bernoulli",
               "aten::bernoulli_", "aten::normal", "aten::normal_", "aten::uniform",
               "aten::uniform_", "aten::exponential", "aten::exponential_", "aten::multinomial",
               "aten::native_dropout", "aten::poisson", "aten::cauchy_", "aten::geometric_",
               "aten::log_normal_", "aten::random_"}


def cache_compile(func: Callable, *, config: CompilerConfig | None = None, dynamic: bool = True,
                  cache_dir: str | None = None, global_rank: int | None = None,
                  tp_rank: int | None = None, pp_rank: int | None = None,
                  custom_decompositions: dict | None = None, ge_cache: bool = False,
                  **kwargs: Any) -> Callable:
    """Compile ``func`` (a bound method of an ``nn.Module``) with a compile cache on disk.

    Entries live in ``{cache_dir or $TORCHAIR_CACHE_HOME or ./.torchair_cache}/
    {ModuleClass}_{dynamic|static}_{hash}/[world{W}global_rank{r}][_tp_rank{t}][_pp_rank{p}]/
    {func name}/``. ``ge_cache=True`` also caches the engine's build (Inductor code). Extra
    keyword arguments go to ``torch.compile``. Inference only; ``func`` must form one graph.
    """
    _check_func(func)
    if config is not None and not isinstance(config, CompilerConfig):
        raise TypeError(f"cache_compile: config must be a torchair.CompilerConfig, got "
                        f"{type(config).__name__}")
    reserved = sorted({"backend", "fullgraph"} & set(kwargs))
    if reserved:
        raise TypeError(f"cache_compile: {reserved} are set by cache_compile (backend=torchair, "
                        f"fullgraph=True); remove them")
    return CachedFunction(func, (config or CompilerConfig()).copy(), dynamic, cache_dir,
                          keys.rank_dir(global_rank, tp_rank, pp_rank), custom_decompositions,
                          ge_cache, kwargs)


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


class CachedFunction:
    """The callable ``cache_compile`` returns (see the module doc)."""

    def __init__(self, func: Callable, config: CompilerConfig, dynamic: bool,
                 cache_dir: str | None, ranks: str, decompositions: dict | None,
                 ge_cache: bool, compile_kwargs: dict) -> None:
        self.func, self.config, self.dynamic = func, config, dynamic
        self.cache_dir, self.ranks, self.decompositions = cache_dir, ranks, decompositions
        self.ge_cache, self.compile_kwargs = ge_cache, compile_kwargs
        self.name = f"{type(func.__self__).__name__}.{func.__func__.__name__}"
        self.self_name = next(iter(inspect.signature(func.__func__).parameters))
        self.signature = inspect.signature(func)
        self.entry: Any = None  # the entry directory, known at the first call
        self.root: Any = None
        self.vec_isa: str | None = None  # the CPU vector ISA Inductor picked at the cold start
        self.runtime: _Runtime | None = None
        self.compiled: Callable | None = None  # Dynamo-compiled func (cold start, fallback)
        self.warned: set[str] = set()
        self._lock = threading.Lock()
        functools.update_wrapper(self, func)

    # ------------------------------------------------------------------ calls
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        runtime = self.runtime
        if runtime is not None:
            frame = self._frame(args, kwargs)
            why, flat = runtime.check(frame)
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
        return self(*args, **kwargs)

    def _frame(self, args: tuple, kwargs: dict) -> dict:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return {self.self_name: self.func.__self__, **bound.arguments}

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self.warned:
            self.warned.add(key)
            logger.warning("%s", message)

    def _dynamo(self) -> Callable:
        if self.compiled is None:
            from torchair.core.backend import get_npu_backend

            backend = get_npu_backend(compiler_config=self.config,
                                      custom_decompositions=self.decompositions)
            self.compiled = torch.compile(self.func, backend=backend, dynamic=self.dynamic,
                                          fullgraph=True, **self.compile_kwargs)
        return self.compiled

    def _first_call(self, args: tuple, kwargs: dict) -> Any:
        if torch.is_grad_enabled() and any(p.requires_grad for p in
                                           self.func.__self__.parameters()):
            raise RuntimeError(f"cache_compile({self.name}) caches inference graphs only and "
                               f"gradients are enabled: call it under torch.no_grad() or "
                               f"torch.inference_mode()")
        parts = keys.key_parts(self.func, self.config, self.dynamic, self.decompositions)
        root = store.cache_root(self.cache_dir)
        self.entry = keys.entry_dir(root, self.func, parts, self.ranks)
        store.ensure_dir(self.entry.parent, root=root)
        self.root = root
        self.runtime = self._load(parts)
        if self.runtime is not None:
            return self(*args, **kwargs)
        return self._cold(args, kwargs, parts)

    # ------------------------------------------------------------------ warm
    def _load(self, parts: dict) -> _Runtime | None:
        try:
            files = store.read_entry(self.entry)
            if files is None:
                return None
            meta = json.loads(files["meta.json"])
            stale = _stale(meta, parts)
            if stale:
                logger.warning("cache_compile(%s): cache entry %s is stale (%s): rebuilding",
                               self.name, self.entry, stale)
                store.discard_entry(self.entry)
                return None
            runtime = _Runtime.load(meta, files, self.entry)
        except store.BrokenCacheError as error:
            logger.warning("cache_compile(%s): broken cache %s (%s): rebuilding", self.name,
                           self.entry, error)
            store.discard_entry(self.entry)
            return None
        except (KeyError, ValueError, NotCacheable, UnserializableGraph) as error:
            logger.warning("cache_compile(%s): broken cache %s (%s: %s): rebuilding", self.name,
                           self.entry, type(error).__name__, error)
            store.discard_entry(self.entry)
            return None
        logger.info("cache_compile(%s): loaded %s (no Dynamo trace, no guards)", self.name,
                    self.entry)
        self.vec_isa = runtime.meta.get("vec_isa")
        if not runtime.meta["unit"].get("library"):  # Inductor builds again (from its cache)
            runtime.first_call_context = self._engine_cache
        return runtime

    # ------------------------------------------------------------------ cold
    def _cold(self, args: tuple, kwargs: dict, parts: dict) -> Any:
        state = _ColdState()
        _apply_static_marks(args, kwargs)
        backend = _recording_backend(self, state)
        self.compiled = torch.compile(self.func, backend=backend, dynamic=self.dynamic,
                                      fullgraph=True, **self.compile_kwargs)
        try:
            with recorder.recording() as records, self._engine_cache(ahead_of_time=True):
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
        try:
            files = self._payload(state, parts, self._frame(args, kwargs), result)
            files.update(self._library(state))
            published = store.write_entry(self.entry, files)
            logger.info("cache_compile(%s): %s %s", self.name,
                        "saved" if published else "another process saved", self.entry)
        except NotCacheable as error:
            logger.warning("cache_compile(%s): not cached, compiled as usual: %s", self.name,
                           error)
        finally:
            for rec in state.records:
                rec.outputs = []  # release the first call's outputs (kept only to map them)
                built = getattr(rec.launch_unit, "files", {})
                for path in built.values():
                    with contextlib.suppress(OSError):
                        os.unlink(path)  # the entry holds its own copy
                if built:
                    with contextlib.suppress(OSError):
                        os.rmdir(os.path.dirname(next(iter(built.values()))))
        return result

    @staticmethod
    def _library(state: _ColdState) -> dict[str, bytes]:
        """The static unit's ahead-of-time library (ge_cache), as entry files."""
        unit = state.records[0].launch_unit if len(state.records) == 1 else None
        built = getattr(unit, "files", {})
        out = {}
        for name, path in built.items():
            with open(path, "rb") as f:
                out[name] = f.read()
        return out

    def _payload(self, state: _ColdState, parts: dict, frame: dict, result: Any) -> dict:
        if state.compiles != 1 or len(state.records) != 1:
            raise NotCacheable(f"Dynamo produced {len(state.records)} graphs; one is needed")
        rec = state.records[0]
        if rec.kind == "gears":
            raise NotCacheable("graphs with gears (set_dim_gears) are not cached yet")
        _check_aot(rec)
        if rec.outputs is None:
            raise NotCacheable("the compiled graph was not called")
        inputs = rec.report.inputs
        if len(inputs) != len(state.sources):
            raise NotCacheable(f"the graph has {len(inputs)} inputs but Dynamo passed "
                               f"{len(state.sources)}")
        for source in state.sources:
            accessor(source)  # parses, or NotCacheable
        leaves, treespec = pytree.tree_flatten_with_path(frame_args(frame, self.self_name))
        by_source = {s: state.shapes[i] for i, s in enumerate(state.sources)}
        specs = [leaf_spec(v, by_source.get(_source_of(path)), _source_of(path) in state.guarded)
                 for path, v in leaves]
        if rec.kind == "host":  # shapes may depend on int inputs: keep Dynamo's 0/1 rule
            for spec in specs:
                if spec["t"] == "int":
                    spec["min"] = 2
        graph, tensors = graph_to_json(rec.gm)
        files = {"graph.json": json.dumps(graph).encode(), "code.py": graph_code(rec.gm).encode()}
        unit = {"kind": rec.kind}
        if rec.kind == "static":
            u = rec.unit
            library = engines.LIBRARY in getattr(rec.launch_unit, "files", {})
            unit.update(kept=list(u["kept"]), engine=u["engine"], capture=u["capture"],
                        library=library,
                        borrowed=sorted(u["borrowed"]), mutated=sorted(u["mutated"]),
                        names=list(u["names"]))
            if u["program"] is not None:
                program, _ = graph_to_json(program_to_graph(u["program"]))
                unit["program"] = {"graph": program,
                                   "input_indices": list(u["program"].input_indices),
                                   "input_names": list(u["program"].input_names)}
        if tensors:
            files["constants.pt"] = store.dump_tensors(tensors)
        report = rec.report
        meta = {
            "format": FORMAT, "name": self.name, "key": parts, "key_hash": keys.key_hash(parts),
            "traced_files": keys.file_hashes(state.code_files),
            "sources": state.sources, "as_tensor": state.as_tensor,
            "inputs": [info_to_json(i) for i in inputs],
            "treespec": pytree.treespec_dumps(treespec), "leaves": specs,
            "output": output_spec(result, rec.outputs), "unit": unit, "ge_cache": self.ge_cache,
            "report": {"fx_static": report.fx_static, "ir_static": report.ir_static,
                       "build_static": report.build_static, "reasons": report.reasons,
                       "value_dependent_ops": report.value_dependent_ops,
                       "launch": report.launch, "sunk_inputs": report.sunk_inputs,
                       "patterns": report.patterns, "scopes": report.scopes},
        }
        meta["vec_isa"] = self.vec_isa
        files["meta.json"] = json.dumps(meta, indent=1, default=str).encode()
        return files

    @contextlib.contextmanager
    def _engine_cache(self, ahead_of_time: bool = False) -> Iterator[None]:
        """With ge_cache, Inductor's artifacts go to (and come from) the entry's directory; with
        ``ahead_of_time`` (the cold start) static units are built into a shared library that the
        entry keeps, so a warm start loads it without Inductor."""
        if not self.ge_cache or self.entry is None:
            yield
            return
        directory = store.ensure_dir(self.entry.parent / f"{self.entry.name}.inductor",
                                     root=self.root)
        old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(directory)
        try:
            from torch._inductor import config as inductor_config

            if self.vec_isa is None and not torch.cuda.is_available():  # cold start: probe
                from torch._inductor import cpu_vec_isa

                self.vec_isa = str(cpu_vec_isa.pick_vec_isa())
            aot = (engines.ahead_of_time(directory / "aot") if ahead_of_time
                   else contextlib.nullcontext())
            with inductor_config.patch(fx_graph_cache=True), _known_vec_isa(self.vec_isa), aot:
                yield
        finally:
            if old is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = old


@contextlib.contextmanager
def _known_vec_isa(recorded: str | None) -> Iterator[None]:
    """Skip Inductor's vector-ISA probe (it compiles test programs: ~1.5 s per process) when the
    cold start recorded the probed pick: trust the CPU flags, and if that picks another ISA than
    the recorded one, forget it so Inductor probes as usual. Cold and warm builds both run under
    this setting, so Inductor's cache keys (which include its config) agree."""
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
        self.sources: list[str] = []
        self.shapes: list[Any] = []  # per graph input: IR-like shape, symbol names for dims
        self.code_files: list[str] = []
        self.records: list = []
        self.guarded: set[str] = set()  # sources Dynamo guarded by value
        self.as_tensor: list[bool] = []


def _recording_backend(owner: CachedFunction, state: _ColdState) -> Callable:
    from torchair.core.backend import get_npu_backend

    inner = get_npu_backend(compiler_config=owner.config,
                            custom_decompositions=owner.decompositions)

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        described = [_describe(x) for x in example_inputs]
        placeholders = list(gm.graph.find_nodes(op="placeholder"))
        sources = [n.meta["grapharg"].source.name for n in placeholders]
        if state.compiles:
            old = dict(zip(state.sources, state.shapes))
            changed = [f"{s}: {new} (was {old[s]})" for s, new in zip(sources, described)
                       if s in old and new != old[s]]
            logger.warning("cache_compile(%s): func recompiled (Dynamo guards failed%s); the "
                           "cache is not used for it", owner.name,
                           f": {'; '.join(changed[:3])}" if changed else "")
            state.compiles += 1
            if owner.entry is not None:
                store.discard_entry(owner.entry)
            return inner(gm, example_inputs)
        # a restarted trace (e.g. Dynamo specializing a float) calls again: start over each time
        del state.records[:]
        state.sources, state.shapes = sources, described
        # Python floats Dynamo passes to the graph as 0-d tensors (unspecialized floats)
        state.as_tensor = [bool(getattr(n.meta["grapharg"], "pass_arg_as_tensor", False))
                           for n in placeholders]
        context = torch._guards.TracingContext.try_get()
        guards = getattr(getattr(context, "guards_context", None), "dynamo_guards", None) or ()
        state.guarded = {g.name for g in guards if g.create_fn_name() in _VALUE_GUARDS}
        state.code_files = [c.co_filename for c in getattr(context, "traced_code", None) or []]
        compiled = inner(gm, example_inputs)
        state.compiles += 1
        for rec in state.records:
            random = sorted({_op_name(n.target) for n in rec.gm.graph.nodes
                             if n.op == "call_function" and _op_name(n.target) in _RANDOM_OPS})
            if random:
                raise ValueError(f"cache_compile({owner.name}): the graph uses random ops "
                                 f"{random}; a cached graph cannot reproduce the RNG state: "
                                 f"remove the randomness from func or use torch.compile")
        return compiled

    return backend


def _describe(x: Any) -> Any:
    """A Dynamo input as the warm check sees it: tensor shape (symbol names for symbolic dims),
    ``()`` for a SymInt."""
    if isinstance(x, torch.Tensor):
        return tuple(str(d.node.expr) if isinstance(d, torch.SymInt) and d.node.maybe_as_int()
                     is None else int(d) for d in x.shape)
    return ()


def _op_name(target: Any) -> str:
    schema = getattr(target, "_schema", None)
    return schema.name if schema is not None else ""


def _check_aot(rec: recorder.GraphRecord) -> None:
    """AOT's runtime wrapper must pass our outputs through unchanged (no regenerated aliases,
    no metadata mutations of inputs), or the entry could not reproduce the call."""
    meta = rec.fw_metadata
    if meta is None:
        raise NotCacheable("AOT's metadata is not available")
    kinds = {str(getattr(o, "output_type", "")) for o in getattr(meta, "output_info", [])}
    if any("non_alias" not in k for k in kinds):
        raise NotCacheable(f"outputs alias inputs or each other ({sorted(kinds)}); return "
                           f"fresh tensors (e.g. .clone())")
    for info in getattr(meta, "input_info", []):
        if getattr(info, "mutates_metadata", False):
            raise NotCacheable("an input's metadata is mutated in place (resize_/as_strided_)")
        if "OUT_GRAPH" in str(getattr(info, "mutation_type", "")):
            raise NotCacheable("an input is mutated outside the graph (AOT applies it after "
                               "the graph runs)")


def frame_args(frame: dict, self_name: str) -> dict:
    return {k: v for k, v in frame.items() if k != self_name}


def _source_of(path: tuple) -> str:
    """A pytree key path of the arguments dict as Dynamo writes a source: ``L['x'][0]``."""
    text = "L"
    for key in path:
        if isinstance(key, pytree.MappingKey):
            text += f"[{key.key!r}]"
        elif isinstance(key, pytree.SequenceKey):
            text += f"[{key.idx}]"
        else:
            text += str(key)
    return text


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


def _as_tensor(get: Callable[[dict], Any], dtype: str) -> Callable[[dict], Any]:
    """A Python number Dynamo passed to the graph as a 0-d tensor: do the same."""
    torch_dtype = getattr(torch, dtype)

    def get_tensor(frame: dict) -> Any:
        value = get(frame)
        return value if isinstance(value, torch.Tensor) else torch.tensor(value,
                                                                          dtype=torch_dtype)

    return get_tensor


class _InputCheck:
    def __init__(self, info: Any) -> None:
        self.kind, self.name, self.shape, self.dtype = info.kind, info.name, info.shape, info.dtype
        self.torch_dtype = getattr(torch, info.dtype, None)
        self.device_type = torch.device(info.device).type


class _Runtime:
    """A warm entry: checks a call against the cached signature and runs the launch unit."""

    def __init__(self, meta: dict, unit: Callable, inputs: list) -> None:
        self.meta = meta
        self.unit = unit
        self.accessors = [_as_tensor(accessor(s), info["dtype"]) if wrap else accessor(s)
                          for s, wrap, info in zip(meta["sources"], meta["as_tensor"],
                                                   meta["inputs"])]
        self.inputs = [_InputCheck(info) for info in inputs]
        self.treespec = meta["treespec"]
        self.known_spec: Any = None  # a TreeSpec seen to serialize to ``treespec``
        self.leaves = meta["leaves"]
        self.first_call_context: Callable | None = None

    @classmethod
    def load(cls, meta: dict, files: dict, entry: Any) -> _Runtime:
        tensors = store.load_tensors(files["constants.pt"]) if "constants.pt" in files else {}
        gm = graph_from_json(json.loads(files["graph.json"]), tensors)
        inputs = [info_from_json(i) for i in meta["inputs"]]
        saved = meta["report"]
        report = GraphReport(graph_id=next_graph_id(), fx_static=saved["fx_static"],
                             ir_static=saved["ir_static"], build_static=saved["build_static"],
                             inputs=inputs, value_dependent_ops=saved["value_dependent_ops"],
                             reasons=saved["reasons"], sunk_inputs=saved["sunk_inputs"],
                             patterns=saved["patterns"], scopes=saved.get("scopes", {}))
        u = meta["unit"]
        if u["kind"] == "static":
            program = None
            if "program" in u:
                p = u["program"]
                program = program_from_graph(graph_from_json(p["graph"], {}), p["input_indices"],
                                             p["input_names"])
            if u["capture"] == "cuda" and not torch.cuda.is_available():
                raise NotCacheable("the entry replays a CUDA graph but CUDA is not available")
            report.launch = saved["launch"] + " (from cache_compile)"
            library = None
            if u.get("library"):
                if engines.LIBRARY not in files:
                    raise NotCacheable(f"the entry's {engines.LIBRARY} is missing")
                library = str(entry / engines.LIBRARY)  # read_entry verified its sha256
            unit = units.StaticUnit(gm, kept_inputs=u["kept"], program=program,
                                    engine=u["engine"], capture=u["capture"],
                                    borrowed=set(u["borrowed"]), mutated=set(u["mutated"]),
                                    names=u["names"], report=report, library=library)
        else:
            report.launch = "host-scheduled, shape-generic (from cache_compile)"
            report.engine = "fx"
            unit = units.HostUnit(fx_engine(gm))
        add_report(report)
        return cls(meta, unit, inputs)

    def check(self, frame: dict) -> tuple[str, list]:
        """("", graph inputs) when the call fits the cached graph, else (why, [])."""
        why = self._leaves_mismatch(frame)
        if why:
            return why, []
        flat = [get(frame) for get in self.accessors]
        for value, info in zip(flat, self.inputs):
            if info.kind == "symint":
                continue
            if (not isinstance(value, torch.Tensor) or value.dtype != info.torch_dtype
                    or value.device.type != info.device_type or value.dim() != len(info.shape)
                    or any(d not in (-1, s) for d, s in zip(info.shape, value.shape))):
                got = (f"{str(value.dtype).replace('torch.', '')}{list(value.shape)} on "
                       f"{value.device.type}" if isinstance(value, torch.Tensor) else
                       type(value).__name__)
                return (f"graph input `{info.name}` is {got}, compiled for {info.dtype}"
                        f"{list(info.shape)} on {info.device_type}"), []
        return "", flat

    def _leaves_mismatch(self, frame: dict) -> str:
        leaves, spec = pytree.tree_flatten(frame_args(frame, next(iter(frame))))
        if self.known_spec is None or spec != self.known_spec:  # serialize only on a change
            if pytree.treespec_dumps(spec) != self.treespec:
                return "the arguments' structure differs (e.g. a list of another length)"
            self.known_spec = spec
        symbols: dict[str, int] = {}
        for k, (leaf, want) in enumerate(zip(leaves, self.leaves)):
            why = leaf_mismatch(want, leaf)
            if why:
                return f"argument leaf {k}: {why}"
            if want["t"] == "tensor":
                for dim, size in zip(want["shape"], leaf.shape):
                    if isinstance(dim, str):  # symbolic: Dynamo's 0/1 specialization, equal dims
                        if int(size) < 2 or symbols.setdefault(dim, int(size)) != int(size):
                            return (f"argument leaf {k}: size {int(size)} breaks the traced "
                                    f"relation of dim {dim}")
        return ""

    def __call__(self, flat: list) -> Any:
        if self.first_call_context is not None:
            with self.first_call_context():
                outputs = self.unit(flat)
            self.first_call_context = None
        else:
            outputs = self.unit(flat)
        return build_output(self.meta["output"], outputs)


def readable_cache(cache_bin: str | os.PathLike, print_output: bool = True,
                   file: str | os.PathLike | None = None) -> str:
    """Describe a cache entry: metadata, key parts, input signature and the graph's code.

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
    lines.append("  graph inputs (Dynamo source -> IR Data):")
    for source, info in zip(meta["sources"], meta["inputs"]):
        lines.append(f"    {source}  ->  {info['kind']} {info['dtype']}{list(info['shape'])}"
                     + (" (mutated in place)" if info.get("mutated") else ""))
    lines.append("  call signature (argument leaves):")
    lines += [f"    {k}: {spec}" for k, spec in enumerate(meta["leaves"])]
    unit = meta["unit"]
    lines.append(f"  launch unit: {unit['kind']}, {meta['report']['launch']}"
                 + (f", engine {unit.get('engine')}" if unit.get("engine") else ""))
    if unit.get("library"):
        lines.append(f"  built: {engines.LIBRARY} ({len(files[engines.LIBRARY])} bytes, "
                     f"AOTInductor shared library"
                     + (f"; custom-op calls in {engines.LIBRARY_OPS})" if engines.LIBRARY_OPS
                        in files else ")"))
    lines.append("  code:")
    lines += ["    " + line for line in files["code.py"].decode().splitlines()]
    text = "\n".join(lines) + "\n"
    if file is not None:
        pathlib.Path(file).write_text(text, encoding="utf-8")
    if print_output:
        print(text, end="")  # noqa: T201 - printing is this function's purpose
    return text
