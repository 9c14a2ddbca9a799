"""The ``torch.compile`` backend: ``get_npu_backend`` and ``get_compiler``.

Dynamo's graph goes through AOT autograd (functionalized, input mutations such as in-place
KV-cache writes kept as ``copy_`` into the input) and then through :mod:`torchair.core.pipeline`.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from torchair.base.gears import get_dim_gears
from torchair.base.log import env_switch, logger
from torchair.configs.compiler_config import CompilerConfig
from torchair.core.pipeline import GraphSignature, compile_graph

ENV_SPECIALIZE_FLOATS = "TORCHAIR_SPECIALIZE_ATTRIBUTE_FLOATS"


def _check_config(compiler_config: Any) -> CompilerConfig:
    if compiler_config is None:
        return CompilerConfig()
    if not isinstance(compiler_config, CompilerConfig):
        raise TypeError(f"compiler_config must be a torchair.CompilerConfig, got "
                        f"{type(compiler_config).__name__}; create one with "
                        f"torchair.CompilerConfig()")
    return compiler_config.copy()


def get_compiler(compiler_config: CompilerConfig | None = None) -> Callable:
    """A compiler for ATen graphs from AOT autograd: ``compiler(gm, example_inputs)``."""
    config = _check_config(compiler_config)

    def compiler(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        return compile_graph(gm, example_inputs, config)

    return compiler


def _signature(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> GraphSignature:
    """Names and kinds of AOT's flat inputs: the module's own parameters and buffers first,
    then Dynamo's graph inputs in order."""
    params = [n for n, _ in gm.named_parameters(remove_duplicate=False)]
    buffers = [n for n, _ in gm.named_buffers(remove_duplicate=False)]
    names = params + buffers
    kinds = ["parameter"] * len(params) + ["tensor"] * len(buffers)
    gear_dims = []
    for node, value in zip(gm.graph.find_nodes(op="placeholder"), example_inputs):
        gears = get_dim_gears(_real_input(node))
        for dim, sizes in (gears or {}).items():
            gear_dims.append((len(names), dim, sizes))
        names.append(str(node.target))
        if isinstance(value, torch.nn.Parameter):
            kinds.append("parameter")
        elif isinstance(value, torch.Tensor):
            kinds.append("tensor")
        else:
            kinds.append("symint")
    return GraphSignature(tuple(names), tuple(kinds), tuple(gear_dims))


def _real_input(node: fx.Node) -> Any:
    """The caller's tensor behind a Dynamo placeholder (where set_dim_gears recorded gears)."""
    grapharg = node.meta.get("grapharg")
    try:
        return getattr(grapharg, "example", None)
    except Exception:  # noqa: BLE001 - a released weak reference: no gears to read
        return None


def get_npu_backend(*, compiler_config: CompilerConfig | None = None,
                    custom_decompositions: dict | None = None) -> Callable:
    """A ``torch.compile`` backend: ``torch.compile(model, backend=get_npu_backend(...))``.

    ``compiler_config`` is copied: later changes to the object do not affect this backend.
    ``custom_decompositions`` maps ATen ops to Python decompositions applied during AOT tracing.
    Floats read from attributes or globals become constants of the graph
    (:func:`_specialize_attribute_floats`).
    """
    return npu_backend(compiler_config, custom_decompositions, specialize_floats=True)


def npu_backend(compiler_config: CompilerConfig | None, custom_decompositions: dict | None, *,
                specialize_floats: bool) -> Callable:
    """:func:`get_npu_backend`; ``specialize_floats=False`` keeps every float a graph input
    (``cache_compile``, whose per-call checks read the call's arguments, not attributes)."""
    from torch._functorch.aot_autograd import aot_module_simplified

    config = _check_config(compiler_config)
    if custom_decompositions is not None and not isinstance(custom_decompositions, dict):
        raise TypeError(f"custom_decompositions must be a dict mapping an OpOverload to a "
                        f"function, got {type(custom_decompositions).__name__}")
    decompositions = dict(custom_decompositions or {})

    def backend(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        if specialize_floats:
            _specialize_attribute_floats(gm)
        signature = _signature(gm, example_inputs)
        # AOT's runtime wrapper turns autocast off around a graph compiled under it
        built: dict[str, Any] = {"autocast": torch._C._is_any_autocast_enabled()}

        def compiler(aot_gm: fx.GraphModule, aot_inputs: Sequence[Any]) -> Callable:
            return compile_graph(aot_gm, aot_inputs, config, signature)

        def inference_compiler(aot_gm: fx.GraphModule, aot_inputs: Sequence[Any]) -> Callable:
            # only an inference graph may be called without AOT's wrapper: a training forward
            # returns the tensors saved for backward too, and the wrapper builds the autograd node
            unit = compiler(aot_gm, aot_inputs)
            context = torch._guards.TracingContext.try_get()
            built.update(unit=unit, meta=getattr(context, "fw_metadata", None),
                         placeholders=len(aot_gm.graph.find_nodes(op="placeholder")))
            return unit

        if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad
                                           for x in example_inputs):
            logger.warning("torchair compiles inference graphs; inputs require grad under grad "
                           "mode, so the forward graph is compiled and the backward runs op by "
                           "op. Wrap inference in torch.no_grad() or torch.inference_mode().")
        try:
            compiled = aot_module_simplified(
                gm, example_inputs, fw_compiler=compiler, bw_compiler=_eager_compiler,
                inference_compiler=inference_compiler, decompositions=decompositions,
                keep_inference_input_mutations=(
                    config.experimental_config.keep_inference_input_mutations.raw))
        except _restart_types():
            raise  # a retrace of this frame still needs the floats it specializes
        except BaseException:
            _forget_ours()
            raise
        _forget_ours()  # this retrace (and AOT's own float pass) has used them
        return _direct_call(built, example_inputs) or compiled

    backend.compiler_config = config  # type: ignore[attr-defined]
    return backend


def _direct_call(built: dict, example_inputs: Sequence[Any]) -> Callable | None:
    """The launch unit called without AOT autograd's runtime wrapper when that wrapper would only
    pass the arguments through (:func:`torchair.runtime.engines.plain_aot_call`: no input
    mutation left to it, no aliased output, no autocast at build time, ...): about 7 us of
    wrapper per step, more inside a decode loop. Like the wrapper it turns grad mode off around
    the call, bumps the version of inputs the graph mutates that autograd tracks, and marks
    outputs with symbolic dims (:func:`torchair.runtime.engines.dynamic_output_marks`).
    ``TORCHAIR_DIRECT_CALL=0`` keeps the wrapper. None when the wrapper is needed."""
    from torchair.runtime import engines as _engines

    if "unit" not in built or not env_switch(_engines.ENV_DIRECT):
        return None
    if not all(type(x) in (torch.Tensor, torch.nn.Parameter) for x in example_inputs
               if isinstance(x, torch.Tensor)):
        return None  # a tensor subclass is unwrapped by the wrapper
    meta = built["meta"]
    marked = _engines.dynamic_output_marks(meta) if getattr(meta, "dynamic_outputs", False) \
        else None
    bump = _engines.plain_aot_call(meta, built["placeholders"], len(example_inputs),
                                   built["autocast"], dynamic_outputs=marked is not None)
    if bump is None:
        return None
    mark, marks = marked if marked is not None else (None, ())
    unit = built["unit"]
    set_grad = torch._C._set_grad_enabled
    if bump:
        from torch.autograd.graph import increment_version

    def run(*args: Any) -> Any:
        grad = torch.is_grad_enabled()
        if grad:
            set_grad(False)
        try:
            outputs = unit(list(args))
        finally:
            if grad:
                set_grad(True)
        if bump:
            increment_version([args[i] for i in bump])
        for i, dims in marks:  # as the wrapper: symbolic dims stay dynamic in the next graph
            mark(outputs[i], dims)
        return outputs

    run.direct = True  # type: ignore[attr-defined]
    return run


def _attribute_float(node: fx.Node) -> tuple[str, str, float] | None:
    """``(symbol, source name, value)`` of a float that Dynamo passes as a 0-d tensor (it does
    so with ``dynamic=True``: ``specialize_float`` is off) when the float is read from an
    attribute or a global (``self.eps``, ``self.cfg.scale``, ``EPS``), not a call argument;
    None otherwise."""
    grapharg = node.meta.get("grapharg")
    if (grapharg is None or not getattr(grapharg, "pass_arg_as_tensor", False)
            or getattr(grapharg, "is_tensor", True)):
        return None
    source = getattr(grapharg, "source", None)
    name, attribute = getattr(source, "name", None), False
    while source is not None:  # an attribute anywhere on the chain, or a global at its root
        kind = type(source).__name__
        attribute = attribute or kind == "AttrSource" or kind.startswith("Global")
        source = getattr(source, "base", None)
    if not attribute or not node.users or any(u.target != "item" for u in node.users):
        return None
    memo = getattr(node.meta.get("example_value"), "item_memo", None)
    symbol = getattr(getattr(getattr(memo, "node", None), "_expr", None), "name", None)
    try:
        value = float(grapharg.example)
    except Exception:  # noqa: BLE001 - no real value to remember: leave the float an input
        return None
    if not isinstance(symbol, str) or not isinstance(name, str):
        return None
    return symbol, name, value


# per code object: source name -> the value its float was specialized to, or _DYNAMIC once the
# value changed (automatic dynamic, as Dynamo does for ints: constant until it changes)
_DYNAMIC = object()
_float_history: "weakref.WeakKeyDictionary[Any, dict[str, Any]]" = weakref.WeakKeyDictionary()


# symbols this module asked Dynamo to specialize: PyTorch keeps TensorifyState's set after a
# successful compile, and symbol names (zf0, ...) repeat in every compile, so ours are taken
# out again once the retrace and AOT's own float pass have used them (after the backend's AOT
# call; Dynamo's end-of-compile callback as a backstop, which does not run while another
# thread holds a compile-callback session)
_ours: set[str] = set()
_registered = False  # _forget_ours was registered as an end-of-compile callback


def _forget_ours(*_: Any) -> None:
    try:
        from torch._dynamo.symbolic_convert import TensorifyState
    except ImportError:
        return
    for symbol in list(_ours):
        TensorifyState.force_specializations.discard(symbol)
    _ours.clear()


def _on_compile_end() -> bool:
    """Have :func:`_forget_ours` run when each Dynamo compile ends; False when this PyTorch has
    no end-of-compile callbacks (then nothing is specialized). ``torch._dynamo.reset()`` drops
    the callbacks: that is also when the values remembered per code object are forgotten."""
    handler = getattr(torch._dynamo, "callback_handler", None)
    callbacks = getattr(handler, "end_callbacks", None)
    register = getattr(handler, "register_end_callback", None)
    if register is None or not isinstance(callbacks, list):
        return False
    global _registered
    if _forget_ours not in callbacks:
        if _registered:  # registered before and dropped: Dynamo was reset
            _float_history.clear()
            _forget_ours()
        register(_forget_ours)
        _registered = True
    return True


def _restart_types() -> tuple:
    restart = getattr(torch._dynamo.exc, "RestartAnalysis", None)
    return (restart,) if isinstance(restart, type) else ()


def _frame_code() -> Any:
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
        return getattr(tx, "f_code", None)
    except Exception:  # noqa: BLE001 - not inside Dynamo's tracing (a direct backend call)
        return None


def _specialize_attribute_floats(gm: fx.GraphModule) -> None:
    """Floats read from attributes or globals (an RMSNorm's ``eps``) become constants of the
    graph: Dynamo retraces with them specialized (``TensorifyScalarRestartAnalysis``, PyTorch's
    own mechanism for floats it cannot keep as tensors), guarded by value. Left as inputs, each
    is converted to a 0-d tensor and checked for NaN by a Python guard on every call; TorchAir
    (PyTorch 2.1, floats specialized) bakes them in too. Floats passed as call arguments stay
    inputs, and so does a float whose value changed since an earlier compile of the same code
    (a per-request temperature: one more graph, not one per value).
    ``TORCHAIR_SPECIALIZE_ATTRIBUTE_FLOATS=0`` keeps every float an input."""
    if not env_switch(ENV_SPECIALIZE_FLOATS):
        return
    try:
        from torch._dynamo.exc import TensorifyScalarRestartAnalysis
        from torch._dynamo.symbolic_convert import TensorifyState
    except ImportError:  # a PyTorch without the mechanism: floats stay inputs
        return
    from torch._dynamo.output_graph import OutputGraph

    if (not hasattr(TensorifyState, "force_specializations")
            or not hasattr(OutputGraph, "remove_tensorify_specialized_graphargs")
            or not _on_compile_end()):
        return
    if torch._dynamo.config.assume_static_by_default:
        # dynamic=None/False: Dynamo keeps floats constant itself and passes one as an input
        # only after it saw its value change (automatic dynamic): it stays an input
        return
    code = _frame_code()
    try:
        history = _float_history.setdefault(code, {}) if code is not None else {}
    except TypeError:  # not weak-referenceable
        history = {}
    symbols = []
    for node in gm.graph.find_nodes(op="placeholder"):
        found = _attribute_float(node)
        if found is None or TensorifyState.should_specialize(found[0]):
            continue
        symbol, name, value = found
        if value == 0.0:  # the value guard cannot tell 0.0 from -0.0 (1 / x differs): an input
            continue
        seen = history.get(name)
        if seen is _DYNAMIC:
            continue
        if seen is not None and seen != value:
            history[name] = _DYNAMIC
            logger.info("%s changed value (%r -> %r) since it was compiled as a constant: it "
                        "stays a graph input from now on", name, seen, value)
            continue
        history[name] = value
        symbols.append(symbol)
    if not symbols:
        return
    for symbol in symbols:
        TensorifyState.specialize(symbol)
        _ours.add(symbol)
    logger.debug("%d float(s) read from attributes or globals specialized (constants of the "
                 "graph, guarded by value); Dynamo retraces the frame", len(symbols))
    raise TensorifyScalarRestartAnalysis


def _eager_compiler(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    from torch._functorch.aot_autograd import make_boxed_func

    return make_boxed_func(gm.forward)


def torchair_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], *,
                     mode: str | None = None, options: dict | None = None) -> Callable:
    """``torch.compile(model, backend="torchair")`` (registered by the ``torch_dynamo_backends``
    entry point of torchair's package metadata): :func:`get_npu_backend` with a default
    ``CompilerConfig``. ``torch.compile``'s ``mode=`` sets ``config.mode`` ("default" keeps it)
    and ``options={"debug.run_eagerly": True, ...}`` sets options by dotted name."""
    config = CompilerConfig()
    if mode not in (None, "default"):
        config.mode = mode
    for dotted, value in (options or {}).items():
        node: Any = config
        *parents, leaf = str(dotted).split(".")
        for part in parents:
            node = getattr(node, part)
        setattr(node, leaf, value)
    return get_npu_backend(compiler_config=config)(gm, example_inputs)
