"""What a ``cache_compile`` entry holds, and what a loaded one says about a warm start.

``entry_files`` turns the cold start's record (``torchair.inference._cache_cold.ColdState``) into
the entry's files: ``meta.json`` (format ``FORMAT``, key, guards, graph inputs, how the result
maps onto graph outputs, the launch unit, the build report), each launch unit's graph and code
(one static unit per gear for a graph with gears), its constants (``constants.pt``), and with
ge_cache the libraries built ahead of time (``library_files``). Reading back: ``stale_reason``
says why an entry cannot serve, ``has_library`` / ``fx_only`` whether a warm start builds again,
and ``known_vec_isa`` skips Inductor's vector-ISA probe when the cold start recorded its pick.
"""
from __future__ import annotations

import contextlib
import json
from typing import Any, Callable, Iterator

import torch

from torchair.core import recorder
from torchair.inference import _cache_key as keys, _cache_store as store
from torchair.inference._cache_cold import ColdState
from torchair.inference._cache_io import NotCacheable, aot_outputs_spec, info_to_json, output_spec, program_to_graph
from torchair.inference._graph_io import graph_code, graph_to_json
from torchair.runtime import engines

__all__ = ["FORMAT", "entry_files", "fx_only", "has_library", "known_vec_isa", "library_files",
           "stale_reason"]

FORMAT = 2


def entry_files(state: ColdState, parts: dict, guards: list, result: Any, *, name: str,
                ge_cache: bool, vec_isa: str | None) -> dict[str, bytes]:
    """The entry's files for the cold call recorded in ``state``: ``meta.json`` (key, guards,
    inputs, output mapping, the launch unit, the build report) and the unit's graph files.
    Raises ``NotCacheable`` when the call did not produce exactly one called graph."""
    records = state.records
    if records and records[0].kind == "gears":
        records = records[:1]  # the others: gears built during the call
    if state.compiles != 1 or len(records) != 1:
        raise NotCacheable(f"Dynamo produced {len(records)} graphs; one is needed")
    rec = records[0]
    if rec.outputs is None or state.aot_outputs is None:
        raise NotCacheable("the compiled graph was not called")
    inputs = rec.report.inputs
    if len(inputs) != len(state.sources):
        raise NotCacheable(f"the graph has {len(inputs)} inputs but Dynamo passed "
                           f"{len(state.sources)} (e.g. inline_inbuilt_nn_modules=False "
                           f"lifts parameters into the graph)")
    aot = aot_outputs_spec(rec.fw_metadata, len(rec.outputs))
    output = output_spec(result, state.aot_outputs, state.flat_inputs,
                         _numbers_that_may_vary(state, guards))
    files, unit = _unit_files(rec)
    report = rec.report
    meta = {
        "format": FORMAT, "name": name, "key": parts, "key_hash": keys.key_hash(parts),
        "traced_files": keys.file_hashes(state.code_files), "guards": guards,
        "sources": state.sources, "as_tensor": state.as_tensor, "writes": state.writes,
        "inputs": [info_to_json(i) for i in inputs], "aot": aot, "output": output,
        "unit": unit, "ge_cache": ge_cache, "vec_isa": vec_isa,
        "report": {"fx_static": report.fx_static, "ir_static": report.ir_static,
                   "build_static": report.build_static, "reasons": report.reasons,
                   "value_dependent_ops": report.value_dependent_ops,
                   "launch": report.launch, "sunk_inputs": report.sunk_inputs,
                   "patterns": report.patterns, "scopes": report.scopes,
                   "gears": [dict(g, built=False, build_seconds=None)
                             for g in report.gears]},
    }
    files["meta.json"] = json.dumps(meta, indent=1, default=str).encode()
    return files


def _numbers_that_may_vary(state: ColdState, guards: list) -> Callable[[Any], bool]:
    """Which returned numbers (not graph outputs) might not be constants of the compiled code.

    Dynamo returns a number computed from symbolic values as a graph output; one it does not
    return that way is either a constant (specialized, guarded by value) or an unspecialized
    input handed back unchanged (rebuilt from its source on every call). An int is suspect when
    it equals a SymInt graph input's cold value or some int is guarded by type only; a float
    when any float reached the graph as a tensor or is guarded by type only."""
    int_values = {v for v, shape in zip(state.flat_inputs, state.shapes)
                  if shape is None and isinstance(v, int)}
    typed = {tuple(g["type"]) for g in guards if g.get("type")}
    loose_ints = ("builtins", "int") in typed
    loose_floats = ("builtins", "float") in typed or any(state.as_tensor)

    def may_vary(x: Any) -> bool:
        if isinstance(x, float):
            return loose_floats
        return loose_ints or x in int_values

    return may_vary


def library_files(rec: recorder.GraphRecord) -> dict[str, bytes]:
    """The ahead-of-time libraries the cold start built (ge_cache), as entry files."""
    out = {}
    if rec.kind == "gears":
        built = getattr(rec.launch_unit, "units", {})
        pairs = [(f"gear{k}.", getattr(u, "files", {})) for k, u in built.items()]
    else:
        pairs = [("", getattr(rec.launch_unit, "files", {}))]
    for prefix, files in pairs:
        for name, path in files.items():
            with open(path, "rb") as f:
                out[prefix + name] = f.read()
    return out


def _unit_json(gm: Any, unit: dict, kind: str, launch_unit: Any) -> tuple[dict, dict]:
    """A launch unit's graph and constructor arguments as entry files and JSON."""
    graph, tensors = graph_to_json(gm)
    files = {"graph.json": json.dumps(graph).encode(), "code.py": graph_code(gm).encode()}
    out: dict = {"kind": kind}
    if kind == "static":
        library = engines.LIBRARY in getattr(launch_unit, "files", {})
        out.update(kept=list(unit["kept"]), engine=unit["engine"], capture=unit["capture"],
                   library=library, borrowed=sorted(unit["borrowed"]),
                   mutated=sorted(unit["mutated"]), names=list(unit["names"]))
        if unit["program"] is not None:
            program, _ = graph_to_json(program_to_graph(unit["program"]))
            out["program"] = {"graph": program,
                              "input_indices": list(unit["program"].input_indices),
                              "input_names": list(unit["program"].input_names)}
    return files, out if not tensors else dict(out, _tensors=tensors)


def _unit_files(rec: recorder.GraphRecord) -> tuple[dict, dict]:
    """Entry files and the unit's JSON; a graph with gears keeps one static unit per gear."""
    tensors: dict = {}
    if rec.kind != "gears":
        files, unit = _unit_json(rec.gm, rec.unit, rec.kind, rec.launch_unit)
        tensors.update(unit.pop("_tensors", {}))
    else:
        files, unit = {}, {"kind": "gears", "gears": []}
        table = rec.unit["table"]
        unit["table"] = {"dims": [[d.input_index, d.input_name, d.dim, list(d.sizes)]
                                  for d in table.dims],
                         "gears": [list(g) for g in table.gears], "policy": table.policy}
        built = getattr(rec.launch_unit, "units", {})
        for k in range(len(table.gears)):
            with recorder.recording() as records:
                rec.unit["build"](k, None)  # plans the gear's static unit (builds nothing)
            if len(records) != 1 or records[0].kind != "static":
                raise NotCacheable(f"gear {k} did not plan one static launch unit")
            gear_files, gear = _unit_json(records[0].gm, records[0].unit, "static", built.get(k))
            for name, tensor in gear.pop("_tensors", {}).items():
                if name in tensors and tensors[name] is not tensor:
                    raise NotCacheable(f"gear graphs disagree on the constant {name}")
                tensors[name] = tensor
            files.update({f"gear{k}.{n}": data for n, data in gear_files.items()})
            unit["gears"].append(gear)
    if tensors:
        files["constants.pt"] = store.dump_tensors(tensors)
    return files, unit


def stale_reason(meta: dict, parts: dict) -> str:
    """Why the entry's ``meta`` cannot serve a call keyed ``parts`` ("" when it can): another
    format, another key, or a traced source file changed since."""
    if meta.get("format") != FORMAT:
        return f"entry format {meta.get('format')} (expected {FORMAT})"
    if meta.get("key") != json.loads(json.dumps(parts, default=str)):
        return "its key differs from this call's"
    now = keys.file_hashes(list(meta["traced_files"]))
    for name, digest in meta["traced_files"].items():
        if now.get(name) != digest:
            return f"source file {name} changed"
    return ""


def fx_only(meta: dict) -> bool:
    """Whether every launch unit of the entry runs on the FX engine (``debug.run_eagerly``, or
    static units built by it): no Inductor build, so no vector-ISA pick to restore (and no
    Inductor import) on a warm start."""
    if meta["key"]["config"].get("debug.run_eagerly") is True:
        return True
    unit = meta["unit"]
    units = unit["gears"] if unit["kind"] == "gears" else [unit]
    return bool(units) and all(u.get("engine") == "fx" for u in units)


def has_library(unit: dict) -> bool:
    """Whether every launch unit of the entry's ``unit`` has an ahead-of-time library."""
    if unit["kind"] == "gears":
        return bool(unit["gears"]) and all(g.get("library") for g in unit["gears"])
    return bool(unit.get("library"))


@contextlib.contextmanager
def known_vec_isa(recorded: str | None) -> Iterator[None]:
    """Skip Inductor's vector-ISA probe (it compiles test programs: ~1.5 s per process) when the
    cold start recorded the probed pick: trust the CPU flags, and if that picks another ISA than
    the recorded one, forget it so Inductor probes as usual."""
    if not recorded or torch.cuda.is_available():
        yield
        return
    from torch._inductor import config as inductor_config, cpu_vec_isa

    with inductor_config.patch({"cpp.vec_isa_ok": True}):
        same = str(cpu_vec_isa.pick_vec_isa()) == recorded
    if not same:
        cpu_vec_isa.valid_vec_isa_list.cache_clear()
        yield
        return
    with inductor_config.patch({"cpp.vec_isa_ok": True}):
        yield
