"""Capture a launch function once and replay it: a CUDA graph, or its CPU emulation for tests.

Both return ``(replay, static_outputs, first_outputs)``. The first call's real run doubles as the
warm-up (kernels loaded and autotuned outside the capture) and is the only run that executes
before ``replay``: an input mutated in place (a KV cache) is updated exactly once, and no snapshot
of it is needed. ``replay()`` reruns the captured work on the same buffers and refreshes
``static_outputs`` in place.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torchair.ops import _device_checks
from torchair.plan.analysis import HOST_SYNC_OPS


class NoHostSync(TorchDispatchMode):
    """Rejects ops that read device data on the host: the CPU emulation's stand-in for what a
    CUDA graph capture forbids, so CPU tests catch an uncapturable launch function."""

    emulates_capture = True  # value checks of ops (torchair.ops._device_checks) use device flags

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in HOST_SYNC_OPS:
            raise RuntimeError(f"{func} reads tensor data on the host, which a CUDA graph "
                               f"capture cannot do; the captured launch must stay on the device")
        with _device_checks.emulating_capture():  # the op's own checks see the capture
            return func(*args, **(kwargs or {}))


def storage_groups(outputs: list) -> list[list[int]]:
    """Positions of outputs that share one storage (views of each other), groups of 2 or more."""
    by_storage: dict[int, list[int]] = {}
    for i, o in enumerate(outputs):
        if isinstance(o, torch.Tensor):
            by_storage.setdefault(o.untyped_storage().data_ptr(), []).append(i)
    return [g for g in by_storage.values() if len(g) > 1]


def copy_outputs(outputs: list, groups: list[list[int]]) -> list:
    """Fresh copies of ``outputs`` that keep the aliasing between them: each storage shared by
    a group of outputs is copied once and the group's views are rebuilt on the copy."""
    shared = {i for group in groups for i in group}
    result = [o.clone() if isinstance(o, torch.Tensor) and i not in shared else o
              for i, o in enumerate(outputs)]
    for group in groups:
        storage = outputs[group[0]].untyped_storage().clone()
        for i in group:
            o = outputs[i]
            result[i] = torch.empty(0, dtype=o.dtype, device=o.device).set_(
                storage, o.storage_offset(), o.size(), o.stride())
    return result


def capture_emulated(fn: Callable, args: list):
    """CPU stand-in for a CUDA graph: same buffers, same static outputs, replay reruns ``fn``
    under :class:`NoHostSync`."""
    first = list(fn(args))
    static_outputs = copy_outputs(first, storage_groups(first))

    def replay() -> None:
        with _device_checks.collect() as checks, NoHostSync():
            outputs = fn(args)
        _device_checks.raise_captured_errors(checks)  # a bad value raises as in eager
        for buf, out in zip(static_outputs, outputs):
            if isinstance(buf, torch.Tensor):
                buf.copy_(out)

    return replay, static_outputs, first


def capture_cuda(fn: Callable, args: list, pool: Any, device: torch.device):
    """Run ``fn(args)`` once for real on a side stream, then capture it as one CUDA graph."""
    with torch.cuda.device(device):
        current = torch.cuda.current_stream()
        stream = torch.cuda.Stream()
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            first = list(fn(args))
        current.wait_stream(stream)
        for out in first:
            if isinstance(out, torch.Tensor):
                out.record_stream(current)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            with _device_checks.collect() as checks:
                static_outputs = list(fn(args))
            # every check's (any, index) in one tensor: one device-to-host read per replay
            flags = torch.cat([c.summary for c in checks]) if len(checks) > 1 else None
    if not checks:
        return graph.replay, static_outputs, first

    def replay() -> None:
        graph.replay()
        # value checks of ops: flags read here
        _device_checks.raise_captured_errors(checks, summaries=flags)

    return replay, static_outputs, first
