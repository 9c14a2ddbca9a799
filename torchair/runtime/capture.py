"""Capture a launch function once and replay it: a CUDA graph, or its CPU emulation for tests.

Both return ``(replay, static_outputs)``: ``replay()`` reruns the captured work on the same
buffers and refreshes ``static_outputs`` in place. Capturing first warms up (kernels are loaded and
autotuned outside the capture); inputs mutated in place are restored after the warm-up so the
first call's mutation happens exactly once.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

WARMUP_RUNS = 2


def _snapshot(args: Sequence[Any], mutated: set[int]) -> dict[int, torch.Tensor]:
    return {i: args[i].clone() for i in mutated}


def _restore(args: Sequence[Any], saved: dict[int, torch.Tensor]) -> None:
    for i, value in saved.items():
        args[i].copy_(value)


def capture_emulated(fn: Callable, args: list, mutated: set[int]):
    """CPU stand-in for a CUDA graph: same buffers, same static outputs, replay reruns ``fn``."""
    saved = _snapshot(args, mutated)
    static_outputs = [o.clone() if isinstance(o, torch.Tensor) else o for o in fn(args)]
    _restore(args, saved)

    def replay() -> None:
        for buf, out in zip(static_outputs, fn(args)):
            if isinstance(buf, torch.Tensor):
                buf.copy_(out)

    return replay, static_outputs


def capture_cuda(fn: Callable, args: list, mutated: set[int], pool: Any = None):
    """Capture ``fn(args)`` as one CUDA graph on ``args``'s buffers."""
    saved = _snapshot(args, mutated)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(WARMUP_RUNS):
            fn(args)
    torch.cuda.current_stream().wait_stream(stream)
    _restore(args, saved)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        static_outputs = list(fn(args))
    return graph.replay, static_outputs
