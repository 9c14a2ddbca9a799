"""GraphReport: what the backend decided about one compiled graph, and why.

``torchair.graph_reports()`` returns them oldest first. Each report says whether the graph is
static at the FX, IR and build levels (seed 000's three levels), lists its inputs as the IR sees
them, its value-dependent ops and constants, and, when something is not static, one sentence per
cause naming the input or op and the fix.
"""
from __future__ import annotations

import dataclasses
import itertools
import threading
from typing import Any

from torchair.plan.inputs import InputInfo


@dataclasses.dataclass
class GraphReport:
    graph_id: int
    fx_static: bool
    ir_static: bool
    build_static: bool
    inputs: list[InputInfo]
    value_dependent_ops: list[str]
    reasons: list[str]
    consts: dict[str, Any] = dataclasses.field(default_factory=dict)  # "node.arg" -> value
    sunk_inputs: list[str] = dataclasses.field(default_factory=list)
    gears: list[Any] = dataclasses.field(default_factory=list)
    launch: str = ""  # how the graph runs, e.g. "one launch unit: CUDA graph replay"
    engine: str = ""  # "inductor" | "fx"
    passes: dict[str, int] = dataclasses.field(default_factory=dict)  # pass -> rewrites
    patterns: dict[str, int] = dataclasses.field(default_factory=dict)  # fusion pattern -> rewrites
    scopes: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # super_kernel -> ops
    # op -> attributes of its Ascend-only scopes (limit_core_num, op_never_timeout, data_dump,
    # profiler_trace): recorded, no effect on CPU/CUDA (see torchair.scope._ascend_only)
    scope_attributes: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    # super_kernel scope -> {"segments": [[op, ...], ...], "skipped": [[op, reason], ...],
    #                        "launch": [how each segment runs, ...]}
    segments: dict[str, Any] = dataclasses.field(default_factory=dict)
    # launch units the host issues per step: 1 for one static launch unit; a launch unit per
    # super_kernel segment plus one per op run op by op (FX engine); None when unknown
    # (shape-generic Inductor code launches its own kernels)
    launches_per_step: int | None = None
    dumps: list[str] = dataclasses.field(default_factory=list)
    build_seconds: float | None = None  # filled in when the launch unit is built
    # calls a CPU static unit makes to C++ launch kernels instead of the general op (filled in
    # when it is built; see torchair.runtime.binders.attention)
    launch_kernels: int = 0
    # calls a CPU static unit makes to torchair_native::gemv / gemv_cat for its few-row products
    # (mm/addmm; products of one input share a gemv_cat call; filled in when it is built; see
    # torchair.ops.matmul.cpu)
    small_products: int = 0
    # collectives (``_c10d_functional`` ops) and where they run, e.g. "all_reduce x2 inside the
    # launch unit (gloo, host)"; "" for a graph without collectives
    collectives: str = ""

    @property
    def path(self) -> int:
        """Which of the four compile paths of seed 000 this graph took (0 if none fits)."""
        has_symint = any(i.kind == "symint" for i in self.inputs)
        if self.fx_static and self.ir_static and self.build_static:
            return 1
        if not self.ir_static:
            return 2
        if has_symint and not self.build_static:
            return 3
        if has_symint and self.build_static:
            return 4
        return 0

    def __str__(self) -> str:
        yes = {True: "static", False: "dynamic"}
        lines = [f"graph {self.graph_id}: FX {yes[self.fx_static]}, IR {yes[self.ir_static]}, "
                 f"build {yes[self.build_static]} (path {self.path or '-'})"]
        lines += [f"  {i}" for i in self.inputs]
        if self.value_dependent_ops:
            lines.append(f"  value-dependent ops: {', '.join(self.value_dependent_ops)}")
        for key, value in self.consts.items():
            lines.append(f"  Const {key} = {value}")
        if self.sunk_inputs:
            lines.append(f"  sunk into the device scalar buffer: {', '.join(self.sunk_inputs)}")
        if self.gears:
            built = sum(1 for g in self.gears if g.get("built"))
            lines.append(f"  gears: {len(self.gears)} ({built} built)")
            lines += [f"    gear {k + 1}: {g['gear']}" + (
                f" - built in {g['build_seconds']:.2f} s" if g.get("built") else " - not built")
                for k, g in enumerate(self.gears)]
        if self.passes:
            lines.append("  passes: " + ", ".join(f"{k} x{v}" for k, v in self.passes.items()))
        if self.patterns:
            lines.append("  fusion patterns fired: " + ", ".join(
                f"{k} x{v}" for k, v in self.patterns.items()))
        lines += [f"  super_kernel scope {k!r}: {', '.join(v) or '(no ops)'}"
                  for k, v in self.scopes.items()]
        lines += _scope_attribute_lines(self.scope_attributes)
        for plan in self.segments.values():
            launch = plan.get("launch") or [""] * len(plan["segments"])
            lines += [f"    segment {i + 1}: {', '.join(seg)}" + (f" -> {how}" if how else "")
                      for i, (seg, how) in enumerate(zip(plan["segments"], launch))]
            lines += [f"    skipped {name}: {why}" for name, why in plan["skipped"]]
        lines.append(f"  launch: {self.launch} [{self.engine} engine]")
        if self.collectives:
            lines.append(f"  collectives: {self.collectives}")
        if self.launches_per_step is not None:
            lines.append(f"  launches per step: {self.launches_per_step}")
        if self.build_seconds is not None:
            lines.append(f"  built in {self.build_seconds:.2f} s")
        if self.launch_kernels:
            lines.append(f"  launch kernels: {self.launch_kernels} call(s) go to C++ dispatcher "
                         f"kernels, no Python per call")
        if self.small_products:
            lines.append(f"  small products: {self.small_products} call(s) of "
                         f"torchair_native::gemv / gemv_cat (few-row mm; products of one input "
                         f"share a gemv_cat call)")
        lines += [f"  why not static: {r}" for r in self.reasons]
        lines += [f"  dump: {d}" for d in self.dumps]
        return "\n".join(lines)


def _scope_attribute_lines(attributes: dict[str, dict[str, str]]) -> list[str]:
    """One line per distinct attribute set: its attributes, then the ops that carry it."""
    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for op, attrs in attributes.items():
        groups.setdefault(tuple(sorted(attrs.items())), []).append(op)
    return [f"  Ascend-only scope ({', '.join(f'{k}={v}' for k, v in attrs)}; no effect here): "
            f"{', '.join(ops)}" for attrs, ops in groups.items()]


_lock = threading.Lock()
_reports: list[GraphReport] = []
_ids = itertools.count()


def next_graph_id() -> int:
    """A process-wide graph id (ids of graphs that failed to compile are not reused)."""
    with _lock:
        return next(_ids)


def add_report(report: GraphReport) -> None:
    with _lock:
        _reports.append(report)


def graph_reports() -> list[GraphReport]:
    """Reports of the graphs compiled in this process, oldest first."""
    with _lock:
        return list(_reports)
