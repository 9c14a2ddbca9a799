"""Launch units: what a compiled graph runs on each call.

- :class:`HostUnit` (dynamic build): shape-generic code scheduled op by op from the host.
- :class:`StaticUnit` (static build): fixed shapes, built at its first call from the real inputs;
  the sunk scalars are copied into one int64 buffer before each launch. On CUDA the whole graph is
  captured once as a CUDA graph and replayed on staged inputs; on CPU it is one compiled callable.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.fx as fx
from torch.utils._python_dispatch import _disable_current_modes

from torchair.core.utils import logger
from torchair.plan.report import GraphReport
from torchair.plan.sink import HostScalarProgram
from torchair.runtime import capture as _capture
from torchair.runtime.engines import Engine, fx_engine, inductor_engine
from torchair.runtime.staging import InputStager, SunkScalars

_capture_override: list[str | None] = []


@contextlib.contextmanager
def capture_mode(mode: str | None) -> Iterator[None]:
    """Force how static units capture: "cuda", "emulate" (CPU stand-in, for tests) or None."""
    if mode not in ("cuda", "emulate", None):
        raise ValueError(f"capture_mode: expected 'cuda', 'emulate' or None, got {mode!r}")
    _capture_override.append(mode)
    try:
        yield
    finally:
        _capture_override.pop()


def default_capture(device: torch.device) -> str | None:
    if _capture_override:
        return _capture_override[-1]
    return "cuda" if device.type == "cuda" else None


class HostUnit:
    """Dynamic build: the engine runs shape-generic code, reading scalars on the host."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def __call__(self, args: list) -> Sequence[Any]:
        return self.engine(args)


class StaticUnit:
    """Static build: one launch unit with fixed shapes (see module doc)."""

    def __init__(self, gm: fx.GraphModule, *, kept_inputs: Sequence[int],
                 program: HostScalarProgram | None, engine: str, capture: str | None,
                 borrowed: set[int], mutated: set[int], names: Sequence[str],
                 report: GraphReport, frozen: bool = False) -> None:
        self.gm = gm
        self.kept = tuple(kept_inputs)
        self.program = program
        self.engine_name = engine
        self.capture = capture
        # positions below are in the unit's own argument list (kept inputs, then the buffer)
        where = {orig: pos for pos, orig in enumerate(self.kept)}
        self.borrowed = {where[i] for i in borrowed if i in where}
        self.mutated = {where[i] for i in mutated if i in where}
        self.frozen = self.borrowed if frozen else set()
        self.names = [names[i] for i in self.kept] + (["sunk_scalars"] if program else [])
        self.report = report
        self.sunk: SunkScalars | None = None
        self.run: Callable[[list], Sequence[Any]] | None = None

    def __call__(self, args: list) -> Sequence[Any]:
        unit_args = [args[i] for i in self.kept]
        if self.sunk is not None:
            unit_args.append(self.sunk.stage(args))
        if self.run is None:
            return self._build(args, unit_args)
        return self.run(unit_args)

    def _build(self, args: list, unit_args: list) -> Sequence[Any]:
        start = time.perf_counter()
        what = f"graph {self.report.graph_id}"
        if self.program is not None and self.sunk is None:
            self.sunk = SunkScalars(self.program, _device_of(unit_args))
            unit_args.append(self.sunk.stage(args))
        if self.engine_name == "inductor":
            # AOT's runtime may have a dispatch mode active on this call; compile outside it
            with _disable_current_modes():
                engine, self.engine_name = inductor_engine(self.gm, unit_args, what)
        else:
            engine = fx_engine(self.gm)
        if self.capture is None:
            self.run = engine
            outputs = engine(unit_args)
        else:
            self.run = self._captured(engine, unit_args)
            outputs = self.run(unit_args)
        self.report.engine = self.engine_name
        self.report.build_seconds = time.perf_counter() - start
        logger.info("%s: built static launch unit (%s) in %.2f s", what, self.report.launch,
                    self.report.build_seconds)
        return outputs

    def _captured(self, engine: Engine, unit_args: list) -> Callable[[list], list]:
        stager = InputStager(unit_args, borrowed=self.borrowed | self._sunk_position(),
                             mutated=self.mutated, names=self.names, frozen=self.frozen)
        static_args = stager.static
        if self.capture == "cuda":
            replay, static_outputs = _capture.capture_cuda(engine, static_args, self.mutated)
        else:
            replay, static_outputs = _capture.capture_emulated(engine, static_args, self.mutated)
        self.stager = stager

        def run(call_args: list) -> list:
            write_back = stager.stage(call_args)
            replay()
            stager.write_back(call_args, write_back)
            return [o.clone() if isinstance(o, torch.Tensor) else o for o in static_outputs]

        return run

    def _sunk_position(self) -> set[int]:
        return {len(self.kept)} if self.program is not None else set()


def _device_of(args: Sequence[Any]) -> torch.device:
    """The compute device of a graph: an accelerator if any input is on one, else CPU."""
    devices = [a.device for a in args if isinstance(a, torch.Tensor)]
    return next((d for d in devices if d.type != "cpu"), torch.device("cpu"))
