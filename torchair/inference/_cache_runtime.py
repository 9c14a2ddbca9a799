"""A warm ``cache_compile`` entry as a callable: Dynamo's recorded guards, then the launch unit.

Loading rebuilds the launch unit from the entry (graph JSON, unit arguments, the ahead-of-time
library when there is one) and compiles the recorded guards
(:class:`~torchair.inference.guards.GuardSet`). A call evaluates the guards on the call's
frame; when they hold, the same evaluation yields the graph inputs, the unit runs and AOT's
output handling (aliases of inputs, of intermediates and of other outputs) is replayed to build
the return value. Imports neither Dynamo nor Inductor.
"""
from __future__ import annotations

import json
import math
from typing import Any, Callable, Sequence

import torch

from torchair.base.gears import DIM_GEARS_ATTR, GearDim, GearTable
from torchair.inference import _cache_store as store
from torchair.inference._cache_io import NotCacheable, build_output, graph_outputs, info_from_json, program_from_graph
from torchair.inference._graph_io import graph_from_json
from torchair.inference.guards import GuardSet, TensorMemo
from torchair.plan.collectives import drain_gloo_at_exit
from torchair.plan.report import GraphReport, add_report, next_graph_id
from torchair.runtime import engines, units
from torchair.runtime.engines import fx_engine
from torchair.runtime.input_layout import InputLayoutError
from torchair.runtime.unit_call import state_watch


class _InputCheck:
    """What the launch unit itself requires of a graph input (static units take fixed shapes).
    A recorded TENSOR_MATCH guard already implies it; the inputs Dynamo does not guard (the
    parameters of inlined modules) are checked here, the unit's own last line of defence."""

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

    def fast(self) -> tuple | None:
        """(dtype, size, "is_cpu" / "is_cuda") for a check without Python calls per input, or
        None when the shape has a dynamic dim or the device has no such flag."""
        flag = {"cpu": "is_cpu", "cuda": "is_cuda"}.get(self.device_type)
        if self.kind == "symint" or -1 in self.shape or flag is None or self.torch_dtype is None:
            return None
        return self.torch_dtype, torch.Size(self.shape), flag


class _InputChecks:
    """The per-call input checks of :class:`_InputCheck`, for the inputs no tensor guard covers.
    The common case (every input as the cold call had it) costs an identity, a size and a flag
    test per input; any failure goes through :meth:`_InputCheck.mismatch` for the message."""

    def __init__(self, checks: list, covered: set) -> None:
        self.fast: list[tuple] = []
        self.slow: list[tuple[int, _InputCheck]] = []
        for k, check in enumerate(checks):
            if k in covered or check.kind == "symint":
                continue
            spec = check.fast()
            if spec is None:
                self.slow.append((k, check))
            else:
                self.fast.append((k, check, *spec))
        # the inputs checked here, remembered after they passed (see TensorMemo)
        self.memo = TensorMemo([k for k, *_ in self.fast] + [k for k, _ in self.slow])

    def mismatch(self, flat: list) -> str:
        memo = self.memo
        if memo.holds(flat):
            return ""
        why = self._mismatch(flat)
        if not why:
            memo.remember(flat)
        return why

    def explain(self, flat: list) -> str:
        """Why ``flat`` does not fit (the first input that does not), without the memo; ""
        when every checked input fits."""
        return self._mismatch(flat)

    def _mismatch(self, flat: list) -> str:
        try:
            for k, check, dtype, size, flag in self.fast:
                value = flat[k]
                if value.dtype is not dtype or value.shape != size or not getattr(value, flag):
                    return check.mismatch(value) or f"graph input `{check.name}` changed"
        except AttributeError:  # not a tensor
            return check.mismatch(value)
        for k, check in self.slow:
            why = check.mismatch(flat[k])
            if why:
                return why
        return ""


class _NumberInput:
    """A Python number Dynamo passes to the graph as a 0-d tensor (an unspecialized float such
    as a norm's ``eps``): the tensor is made again only when the number changes (same type,
    equal, same sign for zeros) or someone wrote into the last one."""

    __slots__ = ("dtype", "reuse", "last")

    def __init__(self, dtype: str, reuse: bool) -> None:
        self.dtype = getattr(torch, dtype)
        self.reuse = reuse  # False when the return value hands this input back to the caller
        self.last: tuple | None = None  # (number, tensor, tensor version): one store, thread-safe

    def __call__(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value
        last = self.last
        if last is not None:
            number, tensor, version = last
            if (type(value) is type(number) and value == number and tensor._version == version
                    and (not isinstance(value, float) or
                         math.copysign(1.0, value) == math.copysign(1.0, number))):
                return tensor
        # a normal tensor also under inference_mode (an inference tensor has no version
        # counter to tell a write into it)
        with torch.inference_mode(False):
            tensor = torch.tensor(value, dtype=self.dtype)
        if self.reuse:
            self.last = (value, tensor, tensor._version)
        return tensor


class _NumberInputs:
    """Every :class:`_NumberInput` of an entry, applied to the graph inputs at once. When each
    number is the very object the last call had (a module attribute such as a norm's ``eps``
    is the same float object call after call, so the same value and sign) and no one wrote into
    the tensors made for them, those tensors serve again: one identity test per number instead of
    a call each, which in a decode loop run with the caches the step's weights evicted. Only the
    unit could write into a tensor made here (it is never handed out): its version is compared
    only for the inputs the unit writes (``written``; None: not known, all of them). Anything
    else goes through each :class:`_NumberInput`."""

    __slots__ = ("items", "keys", "last", "replace", "written")

    def __init__(self, wraps: dict[int, _NumberInput], written: set | None = None) -> None:
        self.items = tuple(wraps.items())
        self.keys = tuple(wraps)
        self.written = written
        # the identity test and the swap in one C call where the helper is built
        self.replace = (getattr(state_watch(), "replace_same", None) if wraps else None
                        ) or _replace_same_py
        # (numbers, tensors, (tensor, version) of those the unit may write) of the last call when
        # every tensor may be reused (none is handed back to the caller); one tuple store, so
        # threads see a whole one
        self.last: tuple | None = None

    def __call__(self, flat: list) -> bool:
        """Put the tensors in ``flat``; True when they are the last call's (every number the
        very object it was, so none of them is a tensor the caller passed)."""
        last = self.last
        if last is not None:
            numbers, tensors, versions = last
            for tensor, version in versions:
                if tensor._version != version:
                    break
            else:
                if self.replace(flat, self.keys, numbers, tensors):
                    return True
        numbers = tuple(flat[k] for k in self.keys)
        for k, wrap in self.items:
            flat[k] = wrap(flat[k])
        if all(wrap.reuse for _, wrap in self.items) and not any(
                isinstance(n, torch.Tensor) for n in numbers):
            tensors = tuple(flat[k] for k in self.keys)
            written = self.written
            self.last = (numbers, tensors, tuple(
                (t, t._version) for k, t in zip(self.keys, tensors)
                if written is None or k in written))
        return False


def _replace_same_py(values: list, indices: tuple, old: tuple, new: tuple) -> bool:
    """``csrc/state_watch.c``'s ``replace_same`` where it is not built: when every
    ``values[indices[i]]`` is ``old[i]``, put ``new[i]`` there and return True; else False."""
    for i, value in zip(indices, old):
        if values[i] is not value:
            return False
    for i, value in zip(indices, new):
        values[i] = value
    return True


def _written_inputs(unit: dict) -> set | None:
    """Graph inputs the launch unit writes in place (None: not known, for a host-scheduled unit)."""
    if unit["kind"] == "static":
        return set(unit["mutated"])
    if unit["kind"] == "gears":
        return set().union(*(set(g["mutated"]) for g in unit["gears"]))
    return None


def _returned_inputs(aot: dict) -> set:
    """Graph inputs the unit's outputs hand back (themselves or views of them)."""
    return {base for kind, base in aot["outputs"] if kind in ("input", "alias_input")}


# graph output kinds that graph_outputs rebuilds from an input or another output
_ALIAS_KINDS = ("input", "alias_input", "alias_intermediate", "alias_user")


# what Runtime.serve returns for a call it leaves to the general path
MISS = object()


class InputsRefused(Exception):
    """A call the launch unit refused before running (its message says why): the caller falls
    back to compiling the call, as for a failed check."""


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
        returned = _returned_inputs(meta["aot"])
        self.wrap = _NumberInputs({k: _NumberInput(info["dtype"], k not in returned)
                                   for k, (wrap, info) in
                                   enumerate(zip(meta["as_tensor"], meta["inputs"])) if wrap},
                                  _written_inputs(meta["unit"]))
        self._input_checks = [_InputCheck(info) for info in inputs]
        self.checks = _InputChecks(self._input_checks, self.guards.tensor_inputs(self.n_inputs))
        # the set_dim_gears marks the entry was built with, per tensor input; the first call
        # served must carry them, later ones them or none (see check)
        self.gears = _gear_marks(meta["unit"], inputs)
        self.gear_args = list(self.gears.items())  # the inputs checked after the first call
        self._set_tensor_gear_args()
        self.served = False
        self._check = self.guards.check
        self.aot = meta["aot"]
        self.output = meta["output"]
        self.first_call_context: Callable | None = None
        # whether the unit checks every input these checks would, itself (known once built)
        self.unit_checks: bool | None = None
        # k when the call returns the unit's output k itself (no alias to rebuild, no attribute
        # to set after the graph): the common serving step, without the general output replay
        out = self.output
        self.plain_output: int | None = (
            out["out"] if type(out) is dict and list(out) == ["out"] and not self.writes
            and all(kind not in _ALIAS_KINDS for kind, _ in self.aot["outputs"]) else None)
        # the served call as one generated function of the positional arguments (see
        # _make_fast): None until made, after the first call serve() served
        self.fast: Callable[..., Any] | None = None
        self._fast_frame: tuple | None = None  # (names, self name, module, globals)
        self._fast_pending = False

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
            drain_gloo_at_exit(gm)
            unit = units.HostUnit(fx_engine(gm))
        add_report(report)
        return cls(meta, unit, inputs)

    def watch_arguments(self, arguments: Sequence[str], module: str | None = None) -> None:
        """Check per call only what depends on the call's ``arguments`` (see
        :meth:`GuardSet.check_arguments`); the default is every guard on every call. ``module``:
        the frame's name of the method's module (its state may be hoisted)."""
        self.guards.watch_arguments(arguments, module)
        self._check = self.guards.check_arguments
        self.rebuild_fast()
        # a parameter's or buffer's marks are module state, not a call argument: checked on the
        # first call only
        state = {k for k, _, _ in self.guards.dict_inputs()}
        self.gear_args = [(k, mark) for k, mark in self.gears.items() if k not in state]
        self._set_tensor_gear_args()
        # inputs whose tensor guard now runs on full checks only get the unit's own checks
        self.checks = _InputChecks(self._input_checks,
                                   self.guards.tensor_inputs(self.n_inputs, per_call=True))

    def serve_positional(self, names: Sequence[str], self_name: str, module: Any,
                         globals_: Any) -> None:
        """Let the serving loop's call, positional arguments ``names`` of a method of
        ``module`` (``self_name``) with ``globals_``, become one generated function
        (:attr:`fast`, see :meth:`_make_fast`) once :meth:`serve` served one."""
        self._fast_frame = (tuple(names), self_name, module, globals_)
        self.rebuild_fast()

    def rebuild_fast(self) -> None:
        """Make :attr:`fast` again at the next call :meth:`serve` serves (it binds what it
        calls when made: after a bench put a timer around the unit's fused call, say)."""
        self.fast, self._fast_pending = None, self._fast_frame is not None

    def disable_fast(self) -> None:
        """Serve every call through :meth:`serve`'s layers (a bench that times or replaces
        :attr:`unit` or the check's layers)."""
        self.fast, self._fast_pending = None, False

    def _make_fast(self) -> None:
        """After the first call :meth:`serve` served: :attr:`fast`, the same call as one
        generated function (:meth:`GuardSet.served_program
        <torchair.inference.guards.GuardSet.served_program>`) whose tail runs what
        :meth:`_inputs_differ` and :meth:`serve` run after the check: the number inputs'
        tensors, the runtime's input checks where the unit does not check its inputs itself, the
        gear-marks test, then the unit (a CPU static unit's fused call under its lock, any other
        unit's own call), returning :data:`MISS` for any call they refuse. Made only for an entry
        built without gears (the marks test is then "none at all", one C loop) whose call returns
        one of the unit's outputs as it is. Tried once per :meth:`rebuild_fast`."""
        self._fast_pending = False
        unit, frame = self.unit, self._fast_frame
        if (frame is None or self.plain_output is None or self._first_marked is None
                or any(expected is not None for _, (_, expected) in self.gear_args)):
            return
        fused = getattr(unit, "_fast", None) if isinstance(unit, units.StaticUnit) else None
        first_marked, plain, checks = self._first_marked, self.plain_output, self.checks
        every = tuple(k for k, _ in self.gear_args)  # the marks a call checks when not reused
        checked = bool(self.unit_checks)  # decided by now: serve() ran _inputs_differ

        def tail(bind: Callable[..., str]) -> list[str]:
            keys, lines = bind(self._unmarked), []
            if self.wrap.keys:  # the number inputs' tensors: marked only when made anew
                lines.append(f"reused = {bind(self.wrap, 'w')}(flat)")
                keys = f"{keys} if reused else {bind(every)}"
            if not checked:  # the unit does not check each input itself
                lines += [f"if {bind(checks.mismatch, 'f')}(flat):", "    return None"]
            lines += [f"if {bind(first_marked, 'f')}(flat, {keys}, {bind(DIM_GEARS_ATTR)}) >= 0:",
                      "    return None"]
            call = f"outputs = {bind(fused if fused is not None else unit, 'u')}(flat)"
            run = ["try:", f"    {call}",  # refused before running: the general path says why
                   f"except {bind(InputLayoutError, 'e')}:", "    return None"]
            if fused is not None:  # under the unit's lock, as StaticUnit.__call__ runs it
                run = [f"with {bind(unit._lock, 'u')}:"] + ["    " + line for line in run]
            return lines + run + [f"return outputs[{bind(plain)}]"]

        self.fast = self.guards.served_program(*frame, MISS, tail)

    def _set_tensor_gear_args(self) -> None:
        # gear_args less the numbers Dynamo passes as tensors: when the number wraps reuse the
        # last call's tensors (made here, never handed out), those inputs carry no marks
        self.tensor_gear_args = [(k, mark) for k, mark in self.gear_args
                                 if k not in self.wrap.keys]
        # an entry built without gears: a served call is refused when an argument carries marks,
        # which the C helper tells in one loop (the loop in check then says which)
        helper = state_watch() if all(
            expected is None for _, (_, expected) in self.tensor_gear_args) else None
        self._first_marked = helper.first_with if helper is not None else None
        self._unmarked = tuple(k for k, _ in self.tensor_gear_args)

    def check(self, frame: dict, globals_: Any) -> tuple[str, list]:
        """("", graph inputs) when the call fits the cached graph, else (why, [])."""
        why, flat = self._check(frame, globals_)
        if why:
            return why, []
        why = self._inputs_differ(flat)
        return (why, []) if why else ("", flat)

    def _inputs_differ(self, flat: list) -> str:
        """After the guards held: put the number inputs' tensors in ``flat``, then why an input
        does not fit ("" when every one does): its layout (where the unit does not check it
        itself) or its gear marks."""
        reused = self.wrap(flat) if self.wrap.keys else True
        # a static unit with its own input check (torchair.runtime.input_layout) checks the
        # inputs' layout itself, once; when that check fails, __call__ asks these checks why
        if not (self.unit_checks or self.unit_checks is None and self._unit_checks_inputs()):
            why = self.checks.mismatch(flat)
            if why:
                return why
        served = self.served  # read once: another thread may finish the first call meanwhile
        first_marked = self._first_marked
        if served and reused and first_marked is not None and first_marked(
                flat, self._unmarked, DIM_GEARS_ATTR) < 0:
            return ""
        for k, (name, expected) in (self.gears.items() if not served else
                                    self.tensor_gear_args if reused else self.gear_args):
            found = getattr(flat[k], DIM_GEARS_ATTR, None)  # (get_dim_gears, inline)
            # as Dynamo's guard on the marks: the first call (this process's "trace") carries
            # the entry's marks; later calls may carry none (a decode step's fresh tensors, as
            # under torch.compile) but not other marks (torch.compile would trace them again)
            if found != expected and not (served and found is None):
                return (f"graph input `{name}` has gears {found}, the entry was built for "
                        f"gears {expected}")
        return ""

    def serve(self, frame: dict, globals_: Any) -> Any:
        """The serving loop's call in one frame: :meth:`check` and :meth:`__call__` for a call
        after the first whose unit returns one of its outputs as it is. :data:`MISS` without
        running the unit for any other call, and for a call the checks refuse (the caller then
        takes the general path, which checks it again and says why)."""
        plain = self.plain_output
        if plain is None or self.first_call_context is not None or not self.served:
            return MISS
        why, flat = self._check(frame, globals_)
        if why or self._inputs_differ(flat):
            return MISS
        try:
            outputs = self.unit(flat)
        except InputLayoutError:  # refused before running: the general path says why
            return MISS
        if self._fast_pending:
            self._make_fast()
        return outputs[plain]

    def _unit_checks_inputs(self) -> bool:
        """Whether the launch unit, now built, checks each input :attr:`checks` covers (a
        static unit with its own :class:`~torchair.runtime.input_layout.InputLayout` that takes
        all of them): then those checks run only to say why the unit refused a call. Decided
        once the unit has a layout (until then: False, asked again next call)."""
        if getattr(self.unit, "layout", None) is None:
            return False
        self.unit_checks = set(self.checks.memo.slots) <= set(self.unit.kept)
        return self.unit_checks

    def _run_unit(self, flat: list, inputs: list) -> Any:
        """The unit on ``flat``; a unit that refused the inputs' layout before running raises
        :class:`InputsRefused` with the runtime's own reason when it has one (``inputs``: the
        graph inputs as passed, the unit may clear ``flat``)."""
        try:
            return self.unit(flat)
        except InputLayoutError as error:
            raise InputsRefused(self.checks.explain(inputs) or str(error)) from None

    def __call__(self, flat: list) -> Any:
        if self.plain_output is not None and self.first_call_context is None:
            # the serving step's call (no attribute writes: flat is the graph inputs)
            outputs = self._run_unit(flat, flat)
            self.served = True
            return outputs[self.plain_output]
        targets = flat[self.n_inputs:]
        del flat[self.n_inputs:]
        inputs = list(flat)  # the unit may clear its argument list
        if self.first_call_context is not None:
            with self.first_call_context():
                outputs = self._run_unit(flat, inputs)
            self.first_call_context = None
        else:
            outputs = self._run_unit(flat, inputs)
        self.served = True  # a call ran from the entry: later ones need no gear marks
        outputs = graph_outputs(self.aot, outputs, inputs)
        for target, (attr, value) in zip(targets, self.writes):  # after the graph, as Dynamo
            # a tensor stored on a module is a graph output or input ({"out": k} / {"in": j})
            setattr(target, attr, build_output(value, outputs, inputs)
                    if type(value) is dict else value)
        return build_output(self.output, outputs, inputs)


def _gear_marks(unit: dict, inputs: list) -> dict[int, tuple[str, dict | None]]:
    """Per user tensor input, the ``set_dim_gears`` marks the cold call had (None: no gears).
    A process's first call from the entry must carry the same marks: other gears would trace
    (and fail) differently."""
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
    drain_gloo_at_exit(gm)
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
