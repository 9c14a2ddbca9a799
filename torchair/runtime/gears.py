"""GearUnit: one static launch unit per gear of a graph traced once with gear dims.

At each call the gear is picked from the input sizes (a dict lookup); a gear's unit is built at
its first use (specialized graph, analysis, scalar sinking, a :class:`StaticUnit`; on CUDA its
own CUDA graph in a memory pool shared by all gears, safe because outputs are copied out after
every replay and replays never overlap). Sizes outside the gears raise ``ValueError`` naming the
input, dim, value and the allowed gears: never a silent recompile, never a wrong gear.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

import torch

from torchair.base.gears import GearTable
from torchair.base.log import logger
from torchair.plan.report import GraphReport


class GearUnit:
    """Dispatch to the unit of the gear the input sizes select; build units on first use."""

    def __init__(self, table: GearTable, build: Callable[[int, Any], Callable[[list], Any]],
                 report: GraphReport) -> None:
        self.table = table
        self.index = {gear: k for k, gear in enumerate(table.gears)}
        self.units: dict[int, Callable[[list], Any]] = {}
        self.build = build  # build(gear index, shared CUDA pool) -> unit
        self.report = report
        self.pool: Any = None
        self._lock = threading.Lock()

    def __call__(self, args: list) -> Sequence[Any]:
        key = self.table.key(args)
        k = self.index.get(key)
        if k is None:
            raise self.table.no_gear_error(key)
        unit = self.units.get(k)
        if unit is not None:
            return unit(args)
        return self._first_call(k, args)

    def _first_call(self, k: int, args: list) -> Sequence[Any]:
        with self._lock:
            start = time.perf_counter()
            if self.pool is None and torch.cuda.is_available() and any(
                    isinstance(a, torch.Tensor) and a.is_cuda for a in args):
                self.pool = torch.cuda.graph_pool_handle()
            unit = self.build(k, self.pool)
            outputs = unit(args)  # a static unit builds (and captures) on its first call
            self.units[k] = unit
            seconds = time.perf_counter() - start
        entry = self.report.gears[k]
        entry["built"], entry["build_seconds"] = True, round(seconds, 4)
        logger.info("graph %d: gear %d/%d (%s) built in %.2f s", self.report.graph_id, k + 1,
                    len(self.table.gears), self.table.describe(self.table.gears[k]), seconds)
        return outputs
