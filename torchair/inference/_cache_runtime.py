"""A warm ``cache_compile`` entry as a callable: Dynamo's recorded guards, then the launch unit.

Loading rebuilds the launch unit from the entry (graph JSON, unit arguments, the ahead-of-time
library when there is one) and compiles the recorded guards
(:class:`~torchair.inference._guard_eval.GuardSet`). A call evaluates the guards on the call's
frame; when they hold, the same evaluation yields the graph inputs, the unit runs and AOT's
output handling (aliases of inputs, of intermediates and of other outputs) is replayed to build
the return value. Imports neither Dynamo nor Inductor.
"""
from __future__ import annotations

import json
from typing import Any, Callable

import torch

from torchair.inference import _cache_store as store
from torchair.inference._cache_io import (NotCacheable, build_output, graph_outputs,
                                          info_from_json, program_from_graph)
from torchair.inference._graph_io import graph_from_json
from torchair.inference._guard_eval import GuardSet
from torchair.inference.gears import GearDim, GearTable, get_dim_gears
from torchair.plan.report import GraphReport, add_report, next_graph_id
from torchair.runtime import engines, units
from torchair.runtime.engines import fx_engine


class _InputCheck:
    """What the launch unit itself requires of a graph input (static units take fixed shapes);
    the guards already imply it, this is the unit's own last line of defence."""

    def __init__(self, info: Any) -> None:
        self.kind, self.name, self.shape, self.dtype = info.kind, info.name, info.shape, info.dtype
        self.torch_dtype = getattr(torch, info.dtype, None)
        self.device_type = torch.device(info.device).type

    def mismatch(self, value: Any) -> str:
        if self.kind == "symint":
            return ""
        if (isinstance(value, torch.Tensor) and value.dtype == self.torch_dtype
                and value.device.type == self.device_type and value.dim() == len(self.shape)
                and all(d in (-1, s) for d, s in zip(self.shape, value.shape))):
            return ""
        got = (f"{str(value.dtype).replace('torch.', '')}{list(value.shape)} on "
               f"{value.device.type}" if isinstance(value, torch.Tensor) else type(value).__name__)
        return (f"graph input `{self.name}` is {got}, the launch unit takes {self.dtype}"
                f"{list(self.shape)} on {self.device_type}")


def _number_as_tensor(dtype: str) -> Callable[[Any], Any]:
    """A Python number Dynamo passed to the graph as a 0-d tensor: do the same."""
    torch_dtype = getattr(torch, dtype)
    return lambda v: v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=torch_dtype)


class Runtime:
    """A loaded entry (see the module doc)."""

    def __init__(self, meta: dict, unit: Callable, inputs: list) -> None:
        self.meta = meta
        self.unit = unit
        # the objects whose attributes Dynamo would set after the graph come last in ``flat``
        self.writes = [(attr, value) for _, attr, value in meta.get("writes", [])]
        self.guards = GuardSet(meta["guards"], meta["sources"] + [w[0] for w in
                                                                  meta.get("writes", [])])
        self.n_inputs = len(meta["sources"])
        self.wrap = {k: _number_as_tensor(info["dtype"]) for k, (wrap, info) in
                     enumerate(zip(meta["as_tensor"], meta["inputs"])) if wrap}
        self.checks = [_InputCheck(info) for info in inputs]
        self.gears = _gear_marks(meta["unit"], inputs)
        self.aot = meta["aot"]
        self.output = meta["output"]
        self.first_call_context: Callable | None = None

    @classmethod
    def load(cls, meta: dict, files: dict, entry: Any) -> Runtime:
        tensors = store.load_tensors(files["constants.pt"]) if "constants.pt" in files else {}
        inputs = [info_from_json(i) for i in meta["inputs"]]
        saved = meta["report"]
        report = GraphReport(graph_id=next_graph_id(), fx_static=saved["fx_static"],
                             ir_static=saved["ir_static"], build_static=saved["build_static"],
                             inputs=inputs, value_dependent_ops=saved["value_dependent_ops"],
                             reasons=saved["reasons"], sunk_inputs=saved["sunk_inputs"],
                             patterns=saved["patterns"], scopes=saved.get("scopes", {}),
                             gears=saved.get("gears", []))
        u = meta["unit"]
        if u["kind"] == "gears":
            unit = _gear_unit(u, files, entry, tensors, report)
            report.launch = saved["launch"] + " (from cache_compile)"
        elif u["kind"] == "static":
            gm = graph_from_json(json.loads(files["graph.json"]), tensors)
            report.launch = saved["launch"] + " (from cache_compile)"
            unit = _static_unit(u, gm, files, entry, report, "")
        else:
            gm = graph_from_json(json.loads(files["graph.json"]), tensors)
            report.launch = "host-scheduled, shape-generic (from cache_compile)"
            report.engine = "fx"
            unit = units.HostUnit(fx_engine(gm))
        add_report(report)
        return cls(meta, unit, inputs)

    def check(self, frame: dict, globals_: Any) -> tuple[str, list]:
        """("", graph inputs) when the call fits the cached graph, else (why, [])."""
        why, flat = self.guards.check(frame, globals_)
        if why:
            return why, []
        for k, wrap in self.wrap.items():
            flat[k] = wrap(flat[k])
        for value, check in zip(flat, self.checks):
            why = check.mismatch(value)
            if why:
                return why, []
        for k, (name, expected) in self.gears.items():
            found = get_dim_gears(flat[k])
            if found != expected:
                return (f"graph input `{name}` has gears {found}, the entry was built for "
                        f"gears {expected}"), []
        return "", flat

    def __call__(self, flat: list) -> Any:
        targets = flat[self.n_inputs:]
        del flat[self.n_inputs:]
        inputs = list(flat)  # the unit may clear its argument list
        if self.first_call_context is not None:
            with self.first_call_context():
                outputs = self.unit(flat)
            self.first_call_context = None
        else:
            outputs = self.unit(flat)
        for target, (attr, value) in zip(targets, self.writes):  # after the graph, as Dynamo
            setattr(target, attr, value)
        return build_output(self.output, graph_outputs(self.aot, outputs, inputs), inputs)


def _gear_marks(unit: dict, inputs: list) -> dict[int, tuple[str, dict | None]]:
    """Per user tensor input, the ``set_dim_gears`` marks the cold call had (None: no gears).
    A warm call must carry the same marks: other gears would trace (and fail) differently."""
    marks: dict[int, tuple[str, dict | None]] = {
        k: (info.name, None) for k, info in enumerate(inputs) if info.kind == "tensor"}
    if unit["kind"] == "gears":
        for index, name, dim, sizes in unit["table"]["dims"]:
            gears = marks[index][1] or {}
            gears[dim] = tuple(sizes)
            marks[index] = (name, gears)
    return marks


def _static_unit(u: dict, gm: Any, files: dict, entry: Any, report: GraphReport,
                 prefix: str) -> units.StaticUnit:
    program = None
    if "program" in u:
        p = u["program"]
        program = program_from_graph(graph_from_json(p["graph"], {}), p["input_indices"],
                                     p["input_names"])
    if u["capture"] == "cuda" and not torch.cuda.is_available():
        raise NotCacheable("the entry replays a CUDA graph but CUDA is not available")
    library = None
    if u.get("library"):
        name = prefix + engines.LIBRARY
        if name not in files:
            raise NotCacheable(f"the entry's {name} is missing")
        library = str(entry / name)  # read_entry verified its sha256
    return units.StaticUnit(gm, kept_inputs=u["kept"], program=program, engine=u["engine"],
                            capture=u["capture"], borrowed=set(u["borrowed"]),
                            mutated=set(u["mutated"]), names=u["names"], report=report,
                            library=library)


def _gear_unit(u: dict, files: dict, entry: Any, tensors: dict, report: GraphReport) -> Any:
    """One static unit per gear, each from its own graph in the entry, built at first use."""
    from torchair.runtime.gears import GearUnit

    table = GearTable(tuple(GearDim(d[0], d[1], d[2], tuple(d[3])) for d in u["table"]["dims"]),
                      tuple(tuple(g) for g in u["table"]["gears"]), u["table"]["policy"])

    def build(k: int, pool: Any) -> units.StaticUnit:
        gear = u["gears"][k]
        prefix = f"gear{k}."
        gm = graph_from_json(json.loads(files[prefix + "graph.json"]), tensors)
        unit = _static_unit(gear, gm, files, entry, report, prefix)
        unit.pool = pool
        return unit

    return GearUnit(table, build, report)
