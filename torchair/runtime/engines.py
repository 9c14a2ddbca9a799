"""Engines turn an FX graph into a callable ``fn(args: list) -> list`` (the list is not consumed).

- FX engine: runs the graph's ATen ops one by one (no code generation).
- Inductor engine: generated kernels. ``inductor_fixed`` compiles a fixed-shape graph from real
  tensors (used by static launch units at their first call); ``inductor_symbolic`` compiles a
  shape-generic graph inside AOT's tracing context (dynamic builds).
If Inductor fails, the FX engine takes over with a warning naming the error.
"""
from __future__ import annotations

import copy
import time
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from torchair.core.utils import logger

Engine = Callable[[list], Sequence[Any]]


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


def inductor_fixed(gm: fx.GraphModule, example: list, what: str) -> tuple[Engine, str]:
    """Compile ``gm`` for exactly the shapes of ``example`` (real tensors)."""
    from torch._inductor.compile_fx import compile_fx

    start = time.perf_counter()
    logger.info("%s: compiling with Inductor (fixed shapes) ...", what)
    try:
        compiled = compile_fx(_fresh_copy(gm), example)
    except Exception as exc:  # noqa: BLE001 - any codegen failure falls back to the FX engine
        logger.warning("%s: Inductor could not compile the graph (%s: %s); running it with the FX "
                       "engine instead", what, type(exc).__name__, exc)
        return fx_engine(gm), "fx"
    logger.info("%s: Inductor compile took %.1f s", what, time.perf_counter() - start)
    return (lambda args: compiled(*args)), "inductor"  # compile_fx returns an unboxed callable


def inductor_symbolic(gm: fx.GraphModule, example_inputs: Sequence[Any], what: str
                      ) -> tuple[Engine, str]:
    """Compile ``gm`` shape-generically with AOT's fake example inputs (call inside AOT)."""
    from torch._inductor.compile_fx import compile_fx

    start = time.perf_counter()
    logger.info("%s: compiling with Inductor (symbolic shapes) ...", what)
    try:
        compiled = compile_fx(_fresh_copy(gm), list(example_inputs))
    except Exception as exc:  # noqa: BLE001
        logger.warning("%s: Inductor could not compile the graph (%s: %s); running it with the FX "
                       "engine instead", what, type(exc).__name__, exc)
        return fx_engine(gm), "fx"
    logger.info("%s: Inductor compile took %.1f s", what, time.perf_counter() - start)
    return (lambda args: compiled(*args)), "inductor"
