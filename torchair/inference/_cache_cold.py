"""The cold start of ``cache_compile``: recording what Dynamo and the backend built.

The first process compiles ``func`` with Dynamo and a *recording backend*: the torchair backend,
plus a record (``ColdState``) of the graph inputs' Dynamo sources and shapes, the source files
Dynamo traced, the side effects Dynamo's code does after the graph, and the first call's inputs
and outputs (captured once, then ``releasing`` drops them, so the compiled function kept for
fallback calls holds nothing). Graphs using RNG ops are refused as in TorchAir. With ge_cache the
launch units are built ahead of time (``ahead_of_time``). ``sweep_entry`` removes what killed
cold starts left next to an entry. ``torchair.inference.cache`` turns the record into an entry
(``torchair.inference._cache_payload``).
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator

import torch

from torchair.base.log import logger
from torchair.configs.compiler_config import CompilerConfig
from torchair.inference import _cache_store as store
from torchair.inference.guards import record as _guards
from torchair.runtime import engines

__all__ = ["ColdState", "ahead_of_time", "recording_backend", "releasing", "sweep_entry"]

_RANDOM_OPS = {"aten::rand", "aten::rand_like", "aten::randn", "aten::randn_like",
               "aten::randint", "aten::randint_like", "aten::randperm", "aten::bernoulli",
               "aten::bernoulli_", "aten::normal", "aten::normal_", "aten::uniform",
               "aten::uniform_", "aten::exponential", "aten::exponential_", "aten::multinomial",
               "aten::native_dropout", "aten::poisson", "aten::cauchy_", "aten::geometric_",
               "aten::log_normal_", "aten::random_"}
_RNG_MESSAGE = "Cache compile dose not support operator that depend on RNG, input index: {}."


class ColdState:
    """What the recording backend saw during the cold call (see ``recording_backend``)."""

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
def releasing(state: ColdState) -> Iterator[None]:
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


def recording_backend(config: CompilerConfig, decompositions: dict | None, name: str,
                      state: ColdState, on_recompile: Callable[[], None]) -> Callable:
    """The torchair backend, recording into ``state`` what the entry needs (graph inputs' sources
    and shapes, traced files, side effects) and capturing the first call's inputs and outputs;
    a recompile (a Dynamo guard failed) calls ``on_recompile`` and is not recorded."""
    from torchair.core.backend import npu_backend
    # floats stay inputs: the per-call checks read arguments, not attributes
    inner = npu_backend(config, decompositions, specialize_floats=False)

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
                           "cache is not used for it", name,
                           f": {'; '.join(changed[:3])}" if changed else "")
            state.compiles += 1
            on_recompile()
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


def _capturing(compiled: Callable, state: ColdState) -> Callable:
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


@contextlib.contextmanager
def ahead_of_time(build: str | None, state: ColdState) -> Iterator[None]:
    """With ge_cache (``build`` a directory), build the launch units ahead of time into it;
    ``state.aot_failures`` lists the libraries that failed."""
    if build is None:
        yield
        return
    with engines.ahead_of_time(os.path.join(build, "aot")) as failures:
        state.aot_failures = failures
        yield


def sweep_entry(entry: Any) -> None:
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
