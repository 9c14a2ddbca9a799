"""Engines turn an FX graph into a callable ``fn(args: list) -> outputs`` (the list is kept).

- FX engine: runs the graph's ATen ops one by one (no code generation).
- Inductor engine: generated kernels, compiled for the shapes of the example inputs: real tensors
  for a static launch unit (fixed shapes, compiled at its first call), AOT's fake tensors and
  SymInts for a dynamic build (shape-generic, compiled inside AOT's tracing context).
- Ahead-of-time Inductor engine (static units inside ``ahead_of_time(directory)``, used by
  ``cache_compile(ge_cache=True)``): the same kernels plus a C++ wrapper linked into one shared
  library (AOTInductor) saved in ``directory``. :func:`load_library` runs such a library in a later
  process through PyTorch's C++ runner: no Inductor import, no code generation, no compiler.
If Inductor fails, the FX engine takes over with a warning naming the error.
"""
from __future__ import annotations

import contextlib
import contextvars
import copy
import json
import os
import pathlib
import shutil
import tempfile
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.fx as fx

from torchair.base.log import env_switch, logger, progress
from torchair.ops.attention.cpu import launch_library as _launch
from torchair.ops.matmul import cpu as _matmul
from torchair.runtime._blas_strides import blas_strides

Engine = Callable[[list], Sequence[Any]]

LIBRARY = "unit.so"  # the ahead-of-time library of a static unit
LIBRARY_OPS = "unit.json"  # its custom-op calls (read by PyTorch's runner next to the library)
AOT_ENGINE = "inductor-aot"
ENV_CPP_WRAPPER = "TORCHAIR_CPP_WRAPPER"
# static units call Inductor's compiled graph without compile_fx's AOT runtime wrapper where that
# wrapper has nothing to do (0: always through the wrapper)
ENV_DIRECT = "TORCHAIR_DIRECT_CALL"
# CPU static units trace the quantization ops' formulas into the generated code (0: call the
# ops' eager kernels, bit-exact with eager)
ENV_LOWER_QUANT = "TORCHAIR_LOWER_QUANT"
CPP_ENGINE = "inductor-cpp"  # Inductor's kernels called from its C++ wrapper

_aot_dir: contextvars.ContextVar[str | None] = contextvars.ContextVar("torchair_aot_dir",
                                                                     default=None)
# the ahead-of-time builds that failed inside the current ahead_of_time() block
_aot_failures: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "torchair_aot_failures", default=None)


def fx_engine(gm: fx.GraphModule) -> Engine:
    def run(args: list) -> Sequence[Any]:
        return gm(*args)

    return run


def _fresh_copy(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` without the fake values of the trace it came from, so Inductor retraces it."""
    graph = copy.deepcopy(gm.graph)
    for node in graph.nodes:
        node.meta = {}
    return fx.GraphModule(gm, graph)


def _formulas(quant: bool = True) -> dict:
    """npu ops whose reference kernel is a plain ATen formula that Inductor can fuse with its
    neighbours (a custom op stays an opaque call in generated code); ``quant``: with the
    quantization ops (CPU units: their eager kernels are Python; CUDA keeps Triton's)."""
    from torchair.ops.norm import rms_norm as norm

    npu = torch.ops.npu
    table = {npu.npu_rms_norm.default: norm.rms_norm_reference,
             npu.npu_add_rms_norm.default: norm.add_rms_norm_reference,
             npu.npu_add_rms_norm_cast.default: norm.add_rms_norm_cast_reference}
    if quant:
        from torchair.ops.quant import dequant_swiglu_quant as swiglu, dynamic_quant as dq, lowered

        table.update({
            npu.npu_dynamic_quant.default: dq.dynamic_quant_reference,
            npu.npu_add_rms_norm_dynamic_quant.default: dq.add_rms_norm_dynamic_quant_reference,
            npu.npu_quant_matmul.default: lowered.quant_matmul_formula,
            npu.npu_dequant_swiglu_quant.default: swiglu.dequant_swiglu_quant_reference})
    return table


def _decide_int8_gemms(gm: fx.GraphModule) -> None:
    """Before tracing the formulas: time the int8 GEMM choice of each ``npu_quant_matmul`` call
    of a CPU graph whose operand shapes the trace recorded (see
    :func:`torchair.ops.quant.lowered.decide_int8_gemm`)."""
    from torchair.ops.quant import lowered as quant

    target = torch.ops.npu.npu_quant_matmul.default
    for node in gm.graph.find_nodes(op="call_function", target=target):
        vals = [getattr(a, "meta", {}).get("val") for a in node.args[:2]]
        if all(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in vals):
            try:
                quant.decide_int8_gemm(tuple(int(d) for d in vals[0].shape),
                                       tuple(int(d) for d in vals[1].shape))
            except (TypeError, RuntimeError, ValueError) as error:  # symbolic or odd shapes
                logger.debug("int8 GEMM choice for %s not timed (%s)", node.name, error)


def _on_cpu(gm: fx.GraphModule) -> bool:
    """Whether every tensor the graph takes (as the trace recorded them) is on the CPU."""
    vals = [n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")]
    tensors = [v for v in vals if isinstance(v, torch.Tensor)]
    return bool(tensors) and all(v.device.type == "cpu" for v in tensors)


def lower_to_formulas(gm: fx.GraphModule, quant: bool = True) -> int:
    """Replace, in place, the calls of :func:`_formulas`' ops by their fp32 reference formula,
    for a fixed-shape Inductor build (the formula's shape checks would guard on symbolic
    shapes); ``quant=False`` leaves the quantization ops as calls. Returns how many calls were
    replaced."""
    table = _formulas(quant)
    count = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in table:
            if "self" in node.kwargs:  # the schema's name of npu_rms_norm's input
                kwargs = dict(node.kwargs)
                node.args = (kwargs.pop("self"), *node.args)
                node.kwargs = kwargs
            node.target = table[node.target]
            count += 1
    if count:
        gm.recompile()
    return count


def _for_inductor(gm: fx.GraphModule, static: bool, what: str) -> fx.GraphModule:
    # quant formulas replace the CPU kernels (CUDA keeps Triton's)
    cpu = static and _on_cpu(gm) and env_switch(ENV_LOWER_QUANT)
    if cpu:
        _decide_int8_gemms(gm)
    fresh = _fresh_copy(gm)
    if static:
        count = lower_to_formulas(fresh, quant=cpu)
        if count:
            logger.debug("%s: %d norm / quant op(s) lowered to their formula for Inductor to "
                         "fuse", what, count)
    return fresh


def _static_fakes(example_inputs: Sequence[Any]) -> list:
    """Real example inputs as fake tensors of a fresh shape environment (static shapes).

    Inductor reuses its on-disk FX graph cache only for graphs traced with a shape environment;
    with real tensors it would regenerate and recompile the code every time (``cache_compile``'s
    ``ge_cache`` depends on the reuse). Fake inputs (a dynamic build) are passed unchanged.
    """
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    if any(isinstance(x, FakeTensor) for x in example_inputs):
        return list(example_inputs)
    mode = FakeTensorMode(shape_env=ShapeEnv())
    return [mode.from_tensor(x, static_shapes=True) if isinstance(x, torch.Tensor) else x
            for x in example_inputs]


def cpp_wrapper_enabled() -> bool:
    """Whether CPU static units compile with Inductor's C++ wrapper (``$TORCHAIR_CPP_WRAPPER``,
    default on; ``0`` turns it off)."""
    return env_switch(ENV_CPP_WRAPPER)


class _Inner:
    """Inductor's compile of the graph inside ``compile_fx``'s own AOT pass, kept so that a
    static unit can call it without that pass's runtime wrapper (see :meth:`direct`)."""

    def __init__(self) -> None:
        # AOT's runtime wrapper turns autocast off around a graph compiled under it
        self.autocast = torch._C._is_any_autocast_enabled()
        self.compiled: Any = None
        self.metadata: Any = None
        self.placeholders = -1

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Any:
        from torch._inductor.compile_fx import compile_fx_inner

        self.compiled = compile_fx_inner(gm, example_inputs, **kwargs)
        context = torch._guards.TracingContext.try_get()
        self.metadata = getattr(context, "fw_metadata", None)
        self.placeholders = len(gm.graph.find_nodes(op="placeholder"))
        return self.compiled

    def direct(self, n_inputs: int) -> Callable | None:
        """The compiled graph itself, when ``compile_fx``'s runtime wrapper would only pass the
        arguments through (and the version bump of inputs mutated in the graph that autograd
        tracks, done here too): every input mutation stays in the graph, no output aliases an input or an intermediate, no effect tokens,
        no tensor subclass, not compiled under autocast, and the graph takes exactly the unit's
        arguments (no deduplicated or synthetic-base inputs). None otherwise."""
        if self.compiled is None:
            return None
        bump = plain_aot_call(self.metadata, self.placeholders, n_inputs, self.autocast)
        return None if bump is None else _direct_engine(self.compiled, bump)


def dynamic_output_marks(meta: Any) -> tuple[Callable[[Any, set], None],
                                             tuple[tuple[int, set], ...]] | None:
    """What AOT autograd's runtime wrapper does to outputs with symbolic dims (it stamps them
    with PyTorch's internal mark, so that Dynamo treats those dims as dynamic when the tensor
    comes back as an input, e.g. the next decode step's tokens): ``(mark, ((output index,
    dims), ...))`` with PyTorch's own marking function, or None when this PyTorch does it some
    other way (then the wrapper must run)."""
    try:
        from torch._functorch._aot_autograd.runtime_wrappers import mark_dynamo_propagated_dynamic_indices as mark
        marks = tuple((i, set(o.dynamic_dims)) for i, o in enumerate(meta.output_info)
                      if o.dynamic_dims is not None)  # an empty set is marked too, as there
    except (ImportError, AttributeError, TypeError):
        return None
    return mark, marks


def plain_aot_call(meta: Any, placeholders: int, n_inputs: int, autocast: bool, *,
                   dynamic_outputs: bool = False) -> tuple[int, ...] | None:
    """Whether AOT autograd's runtime wrapper around a graph compiled with forward metadata
    ``meta`` (``TracingContext.fw_metadata``) would only pass the arguments through: every input
    mutation stays in the graph, no output aliases an input or an intermediate, no effect tokens,
    no tensor subclass, no functionalized RNG, not compiled under autocast, and the graph takes
    exactly the caller's ``n_inputs`` arguments (no deduplicated or synthetic-base inputs), no
    output with dimensions to mark dynamic (``dynamic_outputs``: the caller marks them, see
    :func:`dynamic_output_marks`), no grad-mode change to replay.
    Returns the indices of inputs mutated in the graph that autograd tracks (the wrapper bumps
    their version counter; so must a direct caller), or None when the wrapper does more."""
    if meta is None or placeholders != n_inputs or autocast:
        return None
    try:
        plain = (not meta.mutated_inp_runtime_indices and not meta.tokens
                 and all(o.output_type.name == "non_alias" for o in meta.output_info)
                 and meta.num_intermediate_bases == 0
                 and not getattr(meta, "is_rng_op_functionalized", False)
                 and (dynamic_outputs or not getattr(meta, "dynamic_outputs", False))
                 and getattr(meta, "grad_enabled_mutation", None) is None
                 and not any(type(m).__name__ == "SubclassCreationMeta"
                             for m in (meta.subclass_inp_meta or ()))
                 and not any(type(m).__name__ == "SubclassCreationMeta"
                             for m in (meta.subclass_fw_graph_out_meta or ())))
    except AttributeError:  # another PyTorch's metadata: keep the wrapper
        return None
    if not plain:
        return None
    return tuple(getattr(meta, "mutated_graph_handled_indices_seen_by_autograd", ()) or ())


# fewest elements of a static unit's C++ kernel run on several threads (Inductor's own rule
# asks only cpp.min_chunk_size = 512 per thread: 1024 elements on 2 threads); see
# unit_parallel_options
UNIT_PARALLEL_ELEMENTS = 16384
ENV_INDUCTOR_MIN_CHUNK = "TORCHINDUCTOR_CPP_MIN_CHUNK_SIZE"


def unit_parallel_options(threads: int | None = None) -> dict[str, int]:
    """Inductor options for a static unit's C++ kernels: a kernel runs on several threads only
    from :data:`UNIT_PARALLEL_ELEMENTS` elements on, not from 512 per thread. A decode step's
    kernels (norms, rotary, SwiGLU's product on a few rows) each take a microsecond or two on
    one thread, about what opening and joining a parallel region costs: at batch 8 on two
    threads Inductor made all 7 of the bench decoder's kernels parallel, with this none
    (measured: 3-12 us less a step, one process, interleaved). The threshold is a total, so
    many threads keep Inductor's 512 per thread. {} when the user set
    ``$TORCHINDUCTOR_CPP_MIN_CHUNK_SIZE`` (theirs holds) or Inductor's value is already larger."""
    if ENV_INDUCTOR_MIN_CHUNK in os.environ:
        return {}
    import torch._inductor.config as inductor_config

    threads = max(1, torch.get_num_threads() if threads is None else threads)
    chunk = UNIT_PARALLEL_ELEMENTS // threads
    if chunk <= inductor_config.cpp.min_chunk_size:
        return {}
    return {"cpp.min_chunk_size": chunk}


def _compile(gm: fx.GraphModule, example_inputs: Sequence[Any], what: str, static: bool,
             cpp_wrapper: bool, size_asserts: bool = True) -> tuple[Callable, bool, Callable | None]:
    """(compiled callable, whether it has Inductor's C++ wrapper, the compiled graph to call
    directly or None; see :class:`_Inner`). ``size_asserts=False``: without Inductor's per-input
    size and stride asserts (the caller checks, :mod:`~torchair.runtime.input_layout`)."""
    from torch._inductor.compile_fx import compile_fx

    # a tensor subclass input is unwrapped by the wrapper (AOT's metadata here describes the
    # unwrapped graph): only plain tensors go to the graph directly
    plain_inputs = all(type(x) in (torch.Tensor, torch.nn.Parameter)
                       for x in example_inputs if isinstance(x, torch.Tensor))

    def build(cpp: bool) -> tuple[Callable, bool, Callable | None]:
        import torch._inductor.config as inductor_config

        inner = _Inner()
        with contextlib.ExitStack() as stack:
            stack.enter_context(blas_strides())
            if cpp:
                stack.enter_context(inductor_config.patch(cpp_wrapper=True))
            if not size_asserts:
                stack.enter_context(inductor_config.patch(size_asserts=False))
            if static:
                stack.enter_context(inductor_config.patch(unit_parallel_options()))
                # AOT's own cache would hand back a wrapped function without calling
                # inner_compile; Inductor's FX-graph cache (inside it) still serves a rebuild
                stack.enter_context(_patch_functorch(enable_autograd_cache=False))
            compiled = compile_fx(_for_inductor(gm, static, what), _static_fakes(example_inputs),
                                  **({"inner_compile": inner} if static else {}))
        direct = inner.direct(len(example_inputs)) if static and plain_inputs else None
        return compiled, cpp, direct

    if cpp_wrapper:
        try:
            return build(True)
        except Exception as exc:  # noqa: BLE001 - the Python wrapper is the fallback
            restart = getattr(torch._dynamo.exc, "RestartAnalysis", ())
            if isinstance(exc, restart):
                raise
            logger.warning("%s: Inductor's C++ wrapper could not be built (%s: %s); using its "
                           "Python wrapper (about 0.1 ms more per call; %s=0 skips the attempt)",
                           what, type(exc).__name__, exc, ENV_CPP_WRAPPER)
    return build(False)


def _patch_functorch(**changes: Any) -> Any:
    import torch._functorch.config as functorch_config

    known = {k: v for k, v in changes.items() if hasattr(functorch_config, k)}
    return functorch_config.patch(known) if known else contextlib.nullcontext()


def inductor_engine(gm: fx.GraphModule, example_inputs: Sequence[Any], what: str, *,
                    cpp_wrapper: bool = False, size_asserts: bool = True) -> tuple[Engine, str]:
    """Compile ``gm`` with Inductor for ``example_inputs``; returns (engine, engine name).
    ``cpp_wrapper``: for a static CPU build, generate the code that calls the kernels in C++
    (Inductor's ``cpp_wrapper``: no Python between the kernels; falls back to the Python
    wrapper with a warning). ``size_asserts=False``: a static build without Inductor's
    per-input size and stride asserts, for a caller that checks the inputs itself
    (:class:`~torchair.runtime.input_layout.InputLayout`)."""
    try:
        with progress(f"{what}: compiling with Inductor"):
            from torch._subclasses.fake_tensor import FakeTensor

            static = not any(isinstance(x, (FakeTensor, torch.SymInt)) for x in example_inputs)
            compiled, cpp, direct = _compile(gm, example_inputs, what, static,
                                             cpp_wrapper and static, size_asserts or not static)
    except Exception as exc:  # noqa: BLE001 - any codegen failure falls back to the FX engine
        restart = getattr(torch._dynamo.exc, "RestartAnalysis", ())
        if isinstance(exc, restart) and torch._guards.TracingContext.try_get() is not None:
            raise  # Dynamo's signal to retrace (e.g. specialize a float): let Dynamo handle it
        logger.warning("%s: Inductor could not compile the graph (%s: %s); running it with the FX "
                       "engine instead", what, type(exc).__name__, exc)
        return fx_engine(gm), "fx"
    name = CPP_ENGINE if cpp else "inductor"
    if direct is not None and env_switch(ENV_DIRECT):
        return direct, name
    # compile_fx returns an unboxed callable
    return (lambda args: compiled(*args)), name


def _direct_engine(graph: Callable, bump: tuple = ()) -> Engine:
    """Calls Inductor's compiled graph without ``compile_fx``'s AOT runtime wrapper (about 30 µs
    per call less on 2 cores; see :meth:`_Inner.direct` for when); ``bump``: the arguments whose
    version counter the wrapper would increment (mutated in place, seen by autograd)."""
    if bump:
        from torch.autograd.graph import increment_version

        def run(args: list) -> Any:
            outputs = graph(list(args))
            increment_version([args[i] for i in bump])
            return outputs
    else:
        def run(args: list) -> Any:
            return graph(list(args))

    run.direct = True  # type: ignore[attr-defined]
    run.graph, run.bump = graph, bump  # type: ignore[attr-defined]
    return run


def compiled_entry(engine: Engine) -> tuple[Callable[[list], Any], tuple] | None:
    """``(entry, bump)`` for an engine from :func:`_direct_engine` whose compiled graph has
    Inductor's generated entry (``current_callable``: it takes the argument list and clears
    it): calling ``entry`` is calling the engine, less ``CompiledFxGraph.__call__`` (profiler
    label, first-call autotune bookkeeping: call the engine once before). ``bump``: as
    :func:`_direct_engine`'s. None for any other engine."""
    graph = getattr(engine, "graph", None)
    entry = getattr(graph, "current_callable", None)
    if not getattr(engine, "direct", False) or not callable(entry):
        return None
    return entry, engine.bump  # type: ignore[attr-defined]


# what Inductor's C++-wrapper entry (``_wrap_func``'s ``g``) reads: its inputs' handles, the
# compiled entry ``f``, the outputs' tensors; nothing else (no weights appended as inputs, no
# output read back as a number)
_PLAIN_CPP_ENTRY_NAMES = frozenset({"torch", "_C", "_aoti", "unsafe_alloc_void_ptrs_from_tensors",
                                    "clear", "alloc_tensors_by_stealing_from_void_ptrs"})


def cpp_entry_parts(entry: Callable) -> tuple[Callable, Callable, Callable] | None:
    """``(handles, f, tensors)`` for Inductor's C++-wrapper entry ``entry`` when calling
    ``tensors(f(handles(args)))`` on a list of tensors is calling ``entry(args)`` less its Python
    (a list comprehension over the inputs, about 0.15 us per input); None for any other entry.
    ``handles``/``tensors`` are PyTorch's own conversions the entry calls."""
    code = getattr(entry, "__code__", None)
    cells = getattr(entry, "__closure__", None)
    aoti = getattr(torch._C, "_aoti", None)
    if (code is None or not cells or code.co_freevars != ("f",) or aoti is None
            or frozenset(code.co_names) != _PLAIN_CPP_ENTRY_NAMES):
        return None
    f = cells[0].cell_contents
    handles = getattr(aoti, "unsafe_alloc_void_ptrs_from_tensors", None)
    tensors = getattr(aoti, "alloc_tensors_by_stealing_from_void_ptrs", None)
    if not callable(f) or handles is None or tensors is None:
        return None
    return handles, f, tensors


@contextlib.contextmanager
def ahead_of_time(directory: str | os.PathLike) -> Iterator[list[str]]:
    """Static units built inside this block compile with AOTInductor into ``directory``.

    Yields a list that collects one line per build that failed (and fell back to the in-process
    Inductor build): a cache must not keep such a unit as if its library were built."""
    failures: list[str] = []
    token = _aot_dir.set(os.fspath(directory))
    failed = _aot_failures.set(failures)
    try:
        yield failures
    finally:
        _aot_failures.reset(failed)
        _aot_dir.reset(token)


def aot_directory() -> str | None:
    return _aot_dir.get()


def _tuple_output(gm: fx.GraphModule) -> fx.GraphModule:
    """AOTInductor wants the graph to return a tuple (ours may return a list)."""
    output = next(iter(reversed(gm.graph.nodes)))
    if not isinstance(output.args[0], tuple):
        value = output.args[0]
        output.args = (tuple(value) if isinstance(value, list) else (value,),)
        gm.recompile()
    return gm


def aot_engine(gm: fx.GraphModule, example_inputs: Sequence[Any], what: str, directory: str
               ) -> tuple[Engine, str, dict[str, str]]:
    """Compile ``gm`` for ``example_inputs`` (real tensors) into a shared library in ``directory``.

    Returns (engine, engine name, {file name: path}) with the library and, when the graph calls
    custom ops, the JSON that tells PyTorch's runner how to call them. A unit whose inputs are not
    all tensors, or a failed build, falls back to :func:`inductor_engine` (files: {})."""
    if not all(isinstance(x, torch.Tensor) for x in example_inputs):
        logger.info("%s: not built ahead of time (a non-tensor input); compiling in-process", what)
        engine, name = inductor_engine(gm, example_inputs, what)
        return engine, name, {}
    from torch._inductor import aot_compile

    out = None
    try:  # (a full disk fails here as well as in the build)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        out = tempfile.mkdtemp(dir=directory, prefix="unit-")  # the unit's files (caller keeps)
        with tempfile.TemporaryDirectory(dir=out, prefix=".build-") as tmp:
            library = os.path.join(tmp, LIBRARY)
            with progress(f"{what}: compiling a shared library with AOTInductor"), \
                    blas_strides():
                aot_compile(_tuple_output(_for_inductor(gm, True, what)), tuple(example_inputs),
                            options={"aot_inductor.output_path": library,
                                     **unit_parallel_options()})
            files = {LIBRARY: os.path.join(out, LIBRARY)}
            shutil.move(library, files[LIBRARY])
            calls = sorted(pathlib.Path(tmp).glob("*.wrapper.json"))
            if calls:
                files[LIBRARY_OPS] = os.path.join(out, LIBRARY_OPS)
                shutil.move(os.fspath(calls[0]), files[LIBRARY_OPS])
        engine = load_library(files[LIBRARY], _device(example_inputs))
    except Exception as exc:  # noqa: BLE001 - any AOT failure: the in-process Inductor build
        if out is not None:
            shutil.rmtree(out, ignore_errors=True)
        logger.warning("%s: AOTInductor could not build the graph (%s: %s); compiling it "
                       "in-process instead (a warm start will compile again)", what,
                       type(exc).__name__, exc)
        failures = _aot_failures.get()
        if failures is not None:
            failures.append(f"{what}: {type(exc).__name__}: {exc}")
        engine, name = inductor_engine(gm, example_inputs, what)
        return engine, name, {}
    return engine, AOT_ENGINE, files


def load_library(path: str | os.PathLike, device: str) -> Engine:
    """Run a library built by :func:`aot_engine` on ``device`` ("cpu", "cuda:0", ...); its
    ``unit.json`` (custom-op calls), if any, must sit next to it."""
    path, kind = os.fspath(path), torch.device(device).type
    _load_launch_kernels(path)
    if kind == "cuda":
        runner = torch._C._aoti.AOTIModelContainerRunnerCuda(path, 1, str(torch.device(device)))
    elif kind == "cpu":
        runner = torch._C._aoti.AOTIModelContainerRunnerCpu(path, 1)
    else:
        raise ValueError(f"load_library: no ahead-of-time runner for device {device!r}")

    def run(args: list) -> Sequence[Any]:
        return runner.run(args)

    return run


def library_calls(path: str | os.PathLike) -> list[str]:
    """The custom ops (``"torchair_native::gemv"``, ...) that the library at ``path`` calls, one
    entry per call, read from the ``unit.json`` beside it; ``[]`` without one. A file that
    cannot be read as that JSON raises ``RuntimeError``: the library cannot be run safely."""
    ops = pathlib.Path(path).with_name(LIBRARY_OPS)
    try:
        raw = ops.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    try:
        return [str(n["node"]["target"]) for n in json.loads(raw)["nodes"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise RuntimeError(f"{ops}: not the list of custom-op calls PyTorch writes beside an "
                           f"ahead-of-time library ({type(exc).__name__}: {exc})") from exc


# torchair.ops.matmul.cpu's few-row product kernels; every other torchair_native op a library
# calls is an attention launch kernel (torchair.ops.attention.cpu.launch_library)
GEMV_OP = "torchair_native::gemv"
GEMV_CAT_OP = "torchair_native::gemv_cat"


def bound_calls(calls: Sequence[str]) -> tuple[int, int]:
    """``(attention launch-kernel calls, few-row product kernel calls)`` among a library's
    custom-op calls (:func:`library_calls`)."""
    gemv = sum(c in (GEMV_OP, GEMV_CAT_OP) for c in calls)
    return sum(c.startswith("torchair_native::") for c in calls) - gemv, gemv


def _load_launch_kernels(path: str) -> None:
    """Register torchair's launch kernels (:mod:`torchair.ops.attention.cpu.launch_library`,
    :mod:`torchair.ops.matmul.cpu`) before PyTorch's runner resolves the custom ops that the
    library at ``path`` calls, when it calls them."""
    launch, gemv = bound_calls(library_calls(path))
    if not (launch or gemv):
        return
    if gemv and not _matmul.available():
        raise RuntimeError(f"{path} calls torchair's C++ small-product kernel "
                           f"(torchair_native::gemv), which could not be built or loaded here "
                           f"(a C++ compiler, TORCHAIR_NATIVE_KERNELS=0, a CPU without AVX2?; see "
                           f"the warnings above); rebuild the cache entry on this machine")
    if launch and not _launch.available():
        raise RuntimeError(f"{path} calls torchair's C++ launch kernels (torchair_native ops), "
                           f"which could not be built or loaded here (a C/C++ compiler, "
                           f"TORCHAIR_NATIVE_KERNELS=0?; see the warnings above); rebuild the "
                           f"cache entry on this machine")


def _device(args: Sequence[Any]) -> str:
    devices = [a.device for a in args if isinstance(a, torch.Tensor)]
    return str(next((d for d in devices if d.type != "cpu"), torch.device("cpu")))
