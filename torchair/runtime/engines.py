"""Engines turn an FX graph into a callable ``fn(args: list) -> outputs`` (the list is kept).

- FX engine: runs the graph's ATen ops one by one (no code generation).
- Inductor engine: generated kernels, compiled for the shapes of the example inputs: real tensors
  for a static launch unit (fixed shapes, compiled at its first call), AOT's fake tensors and
  SymInts for a dynamic build (shape-generic, compiled inside AOT's tracing context).
If Inductor fails, the FX engine takes over with a warning naming the error.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from torchair.core.utils import logger, progress

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


def inductor_engine(gm: fx.GraphModule, example_inputs: Sequence[Any], what: str
                    ) -> tuple[Engine, str]:
    """Compile ``gm`` with Inductor for ``example_inputs``; returns (engine, engine name)."""
    from torch._inductor.compile_fx import compile_fx

    try:
        with progress(f"{what}: compiling with Inductor"):
            compiled = compile_fx(_fresh_copy(gm), _static_fakes(example_inputs))
    except Exception as exc:  # noqa: BLE001 - any codegen failure falls back to the FX engine
        restart = getattr(torch._dynamo.exc, "RestartAnalysis", ())
        if isinstance(exc, restart) and torch._guards.TracingContext.try_get() is not None:
            raise  # Dynamo's signal to retrace (e.g. specialize a float): let Dynamo handle it
        logger.warning("%s: Inductor could not compile the graph (%s: %s); running it with the FX "
                       "engine instead", what, type(exc).__name__, exc)
        return fx_engine(gm), "fx"
    return (lambda args: compiled(*args)), "inductor"  # compile_fx returns an unboxed callable
