"""Launch units: what a compiled graph runs on each call.

- :class:`HostUnit` (dynamic build): shape-generic code scheduled op by op from the host.
- :class:`StaticUnit` (static build): fixed shapes, built at its first call from the real inputs;
  the sunk scalars are copied into one int64 buffer before each launch. On CUDA the whole graph is
  captured once as a CUDA graph and replayed on staged inputs; on CPU it is one compiled callable.
"""
from __future__ import annotations

import contextlib
import dataclasses
import operator
import threading
import time
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.fx as fx
from torch.utils._python_dispatch import _disable_current_modes

from torchair.base.log import logger
from torchair.ops import _device_checks
from torchair.ops.attention.cpu import launch_errors as _launch_errors, launch_library as _launch_library
from torchair.plan.report import GraphReport
from torchair.plan.sink import HostScalarProgram
from torchair.runtime import capture as _capture, engines as _engines
from torchair.runtime.binders.attention import AttentionBinder, fia_errors
from torchair.runtime.binders.small_products import SmallProductBinder
from torchair.runtime.engines import Engine, fx_engine, inductor_engine
from torchair.runtime.input_layout import InputLayout, plain_tensors
from torchair.runtime.staging import DeviceScalars, InputStager, SunkScalars, picker
from torchair.runtime.unit_call import NativeEntry

# the engines that compile with Inductor (which may order independent ops differently from the
# program); every other engine is the FX engine
_INDUCTOR_ENGINES = ("inductor", _engines.CPP_ENGINE, _engines.AOT_ENGINE)

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


MAX_CAPTURES = 8


@dataclasses.dataclass
class _Capture:
    stager: InputStager
    replay: Callable[[], None]
    outputs: list
    groups: list[list[int]]  # output positions sharing one storage (views of each other)
    # the capture on owned buffers that serves calls whose adopted inputs are elsewhere
    owned: _Capture | None = None

    def copy_outputs(self, outputs: list) -> list:
        """Fresh copies (static buffers are overwritten by the next replay)."""
        return _capture.copy_outputs(outputs, self.groups)


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
                 report: GraphReport, pool: Any = None, library: str | None = None) -> None:
        self.gm = gm
        # ahead-of-time build: ``library`` (a warm cache entry's) is loaded instead of compiling;
        # a unit built inside ``engines.ahead_of_time`` keeps its files here (name -> path)
        self.library = library
        self.files: dict[str, str] = {}
        self.pool = pool  # CUDA graph memory pool shared with other units (gears); None: own
        self.kept = tuple(kept_inputs)
        self.program = program
        self.engine_name = engine
        self.capture = capture
        # positions below are in the unit's own argument list (kept inputs, then the buffer)
        where = {orig: pos for pos, orig in enumerate(self.kept)}
        self.borrowed = {where[i] for i in borrowed if i in where}
        self.mutated = {where[i] for i in mutated if i in where}
        self.names = [names[i] for i in self.kept] + (["sunk_scalars"] if program else [])
        self.report = report
        self.sunk: SunkScalars | None = None
        # 0-d CPU inputs of a captured device unit, read from device tensors (see DeviceScalars)
        self.scalars: DeviceScalars | None = None
        self.run: Callable[[list], Sequence[Any]] | None = None
        self._fast: Callable[[list], Sequence[Any]] | None = None  # see _fused
        self._host_checks: list = []  # (call node name, check) of the sunk host lists
        # the sunk buffer's slots those checks cover, in a captured unit (see _capture_one)
        self._checked_slots: frozenset[tuple[int, int]] = frozenset()
        # the unit's own input check when compiled without Inductor's input asserts (see
        # torchair.runtime.input_layout); None: Inductor's asserts, or no generated code
        self.layout: InputLayout | None = None
        # one call at a time: a call stages its sunk scalars into the unit's one buffer (and a
        # CUDA graph reads and writes its static buffers), so two threads sharing a compiled
        # model would read each other's lengths; uncontended, the lock costs ~0.1 us a call
        self._lock = threading.RLock()

    def __call__(self, args: list) -> Sequence[Any]:
        with self._lock:
            fast = self._fast
            if fast is not None:
                return fast(args)
            unit_args = [args[i] for i in self.kept]
            if self.sunk is not None:
                unit_args.append(self.sunk.stage(args))
            if self.scalars is not None:
                self.scalars.stage(unit_args)
            if self.run is None:
                return self._build(args, unit_args)
            if self.layout is not None:
                self.layout.check(unit_args)
            return self.run(unit_args)

    def _build(self, args: list, unit_args: list) -> Sequence[Any]:
        start = time.perf_counter()
        what = f"graph {self.report.graph_id}"
        if self.program is not None and self.sunk is None:
            self.sunk = SunkScalars(self.program, _device_of(unit_args))
            from torchair.ops.attention.sunk_checks import host_checked_slots, host_list_checks

            # (call node name, check); a captured unit checks on the host what its replay
            # would otherwise read back from the device (see _capture_one)
            self._host_checks = host_list_checks(self.gm, captured=self.capture is not None)
            if self.capture is not None:
                self._checked_slots = host_checked_slots(self.gm)
            self.sunk.checks = [check for _, check in self._host_checks]
            unit_args.append(self.sunk.stage(args))
        if self.capture == "cuda" and self.scalars is None:
            positions = DeviceScalars.positions_of(unit_args, _device_of(unit_args),
                                                   self.mutated)
            if positions:
                self.scalars = DeviceScalars(unit_args, positions, _device_of(unit_args))
                self.scalars.stage(unit_args)  # the engine is built for the device tensors
        engine = self._engine(unit_args, what)
        errors = _launch_library.loaded() and self.capture is None  # launch kernels defer errors
        as_fia = errors and fia_errors(self.gm)
        if self.capture is None:
            in_order = self.engine_name not in _INDUCTOR_ENGINES  # the FX engine
            self.run = (_launch_errors.checked(engine, as_fia=as_fia, in_order=in_order)
                        if errors else engine)
            cpu = _device_of(unit_args).type == "cpu"
            example, outputs = list(unit_args), None
            try:
                outputs = self.run(unit_args)
            finally:  # also after a first run that raised (a deferred error, say)
                count = len(outputs) if isinstance(outputs, (list, tuple)) else None
                self._fast = self._fused(engine, errors, as_fia, example, count) if cpu else None
        else:
            self.run = self._captured(engine, unit_args)
            outputs = self.run(unit_args)
        self.report.engine = self.engine_name
        self.report.build_seconds = time.perf_counter() - start
        logger.info("%s: built static launch unit (%s) in %.2f s", what, self.report.launch,
                    self.report.build_seconds)
        return outputs

    def _fused(self, engine: Engine, errors: bool, as_fia: bool, example: list,
               outputs: int | None) -> Callable[[list], Sequence[Any]] | None:
        """The whole call of a CPU unit whose engine calls Inductor's compiled graph directly,
        as one function: the kept arguments, the sunk scalars, Inductor's generated entry,
        the version bumps and the deferred-error check, with no layer of wrappers between
        them (each layer is Python the step runs with cold caches: the weights it streams
        evict them). Built after the first run (Inductor's own first-call bookkeeping has
        run); under the profiler the compiled graph is called as before, to keep its label.
        A unit with its own input check calls Inductor's compiled C++ from C++
        (:class:`~torchair.runtime.unit_call.NativeEntry`, with ``example``, the first call's
        arguments, and the ``outputs`` count of its result) or, without that helper, without the
        entry's Python (:func:`~torchair.runtime.engines.cpp_entry_parts`). None for any other
        engine (it keeps the layered call)."""
        found = _engines.compiled_entry(engine)
        if found is None:
            return None
        entry, bump = found
        graph = engine.graph  # type: ignore[attr-defined]
        profiler = torch.autograd.profiler
        labelled = hasattr(profiler, "_is_profiler_enabled")
        pick = operator.itemgetter(*self.kept) if len(self.kept) > 1 else None
        kept, sunk, layout = self.kept, self.sunk, self.layout
        # without the entry's Python around Inductor's compiled C++ (see cpp_entry_parts)
        parts = _engines.cpp_entry_parts(entry) if layout is not None else None
        plain = None
        if parts is not None:
            handles, compiled, tensors = parts

            def plain(call_args: list) -> Sequence[Any]:
                return tensors(compiled(handles(call_args)))

        direct = (NativeEntry.of(parts[1], example, outputs, parts[2])
                  if parts is not None and outputs is not None else None)
        if errors:
            pending, raise_pending = _launch_library.pending(), _launch_errors.raise_pending
            eager_error, take = _launch_errors.eager_error, _launch_library.take
        # what torch.autograd.graph.increment_version calls on a list, without its Python frame
        increment_version = torch._C._increment_version

        def run(args: list) -> Sequence[Any]:
            unit_args = list(pick(args)) if pick is not None else [args[i] for i in kept]
            if sunk is not None:
                unit_args.append(sunk.stage(args))
            profiling = labelled and profiler._is_profiler_enabled
            if layout is not None and (direct is None or profiling):
                layout.check(unit_args)
            call_args = list(unit_args) if bump else unit_args  # the entry clears its list
            if errors and pending.value:
                take()  # kept by a call outside any unit run (defer_errors by hand): not ours
            try:
                if profiling:
                    outputs = graph(call_args)
                elif direct is not None:
                    outputs = direct(call_args)
                    if outputs is None:  # an input the C++ check refused: the layout says which
                        layout.check(call_args)
                        outputs = plain(call_args)
                elif plain is not None:
                    outputs = plain(call_args)
                else:
                    outputs = entry(call_args)
            except BaseException as exc:
                error = eager_error(exc, as_fia) if errors else None  # Inductor's order
                if error is not None:
                    raise error from None
                raise
            if bump:
                increment_version([unit_args[i] for i in bump])
            if errors and pending.value:
                raise_pending(as_fia)
            return outputs

        run.parts, run.direct = parts, direct  # type: ignore[attr-defined]
        return run

    def _engine(self, unit_args: list, what: str) -> Engine:
        """The engine of this unit: a warm cache entry's library, else compiled here."""
        if self.library is not None:
            try:
                engine = _engines.load_library(self.library, str(_device_of(unit_args)))
                self.engine_name = _engines.AOT_ENGINE
                # what the build bound, counted
                self.report.launch_kernels, self.report.small_products = _engines.bound_calls(
                    _engines.library_calls(self.library))
                return engine
            except RuntimeError as exc:
                logger.warning("%s: the cached library could not be run (%s); compiling the "
                               "graph in this process instead", what, exc)
                self.engine_name = "inductor"
        gm = self._launch_graph(unit_args)
        if self.engine_name not in _INDUCTOR_ENGINES:
            return fx_engine(gm)
        # AOT's runtime may have a dispatch mode active on this call; compile outside it
        directory = _engines.aot_directory()
        with _disable_current_modes():
            if directory is None:
                # Inductor's C++ wrapper cannot call c10d's functional collectives (their
                # group arguments) nor Python ops returning Tensor[]; such graphs go straight
                # to its Python wrapper
                from torchair.plan.collectives import collective_nodes
                from torchair.runtime.cpp_wrapper_limits import tensor_list_custom_ops

                cpp = (self.capture is None and _device_of(unit_args).type == "cpu"
                       and _engines.cpp_wrapper_enabled() and not collective_nodes(gm)
                       and not tensor_list_custom_ops(gm))
                # the unit checks its inputs itself (see torchair.runtime.input_layout)
                if cpp and plain_tensors(unit_args):
                    self.layout = InputLayout(what, unit_args, self.names)
                engine, self.engine_name = inductor_engine(gm, unit_args, what, cpp_wrapper=cpp,
                                                           size_asserts=self.layout is None)
            else:
                engine, self.engine_name, self.files = _engines.aot_engine(
                    gm, unit_args, what, directory)
        return engine

    def _launch_graph(self, unit_args: list) -> fx.GraphModule:
        """The graph the engine builds: on CPU without a capture, ops that have launch kernels
        call them (:class:`~torchair.runtime.binders.attention.AttentionBinder`, bit for bit the
        general ops), and so do few-row products in Inductor-engine units
        (:class:`~torchair.runtime.binders.small_products.SmallProductBinder`: rounded
        differently from ATen's mm, as Inductor's fused kernels are; the FX engine,
        ``debug.run_eagerly``, keeps eager's kernels); ``self.gm`` stays as traced."""
        if self.capture is not None or _device_of(unit_args).type != "cpu":
            return self.gm
        gm, count = AttentionBinder()(self.gm)
        self.report.launch_kernels = count
        if self.engine_name in _INDUCTOR_ENGINES:  # the FX engine runs eager's kernels
            binder = SmallProductBinder()
            gm, self.report.small_products = binder(gm)
            if binder.grouped:
                logger.debug("graph %d: %d few-row products share %d gemv_cat call(s)",
                             self.report.graph_id, binder.grouped, binder.groups)
        if count and self.sunk is not None:  # bound calls check their host lists in C++
            left = {n.name for n in gm.graph.nodes}
            self.sunk.checks = [check for name, check in self._host_checks if name in left]
        if count:
            logger.debug("graph %d: %d call(s) bound to launch kernels", self.report.graph_id,
                         count)
        return gm

    def _captured(self, engine: Engine, unit_args: list) -> Callable[[list], list]:
        """Replay of captured work, one capture per set of borrowed input addresses (parameters,
        buffers and in-place inputs of another model instance or another KV cache get their
        own), up to ``MAX_CAPTURES``; beyond that one more capture, on buffers of its own,
        serves every other address, its inputs copied in and out around a replay.

        A capture reads the other inputs on the unit's device (the step's tokens, positions)
        from the tensors its first call passed (adopted, see :mod:`torchair.runtime.staging`):
        a caller that keeps its inputs in the same buffers every step has nothing copied. The
        first call with such an input elsewhere captures once more (``_Capture.owned``): the
        inputs still where the first capture read them stay adopted, the others get buffers of
        their own that such calls are copied into; a call that fits neither goes one capture
        further down, where nothing is adopted."""
        captures: dict[tuple[int, ...], _Capture] = {}
        keyed = sorted(self.borrowed | self.mutated)
        pool = None
        if self.capture == "cuda":
            pool = self.pool if self.pool is not None else torch.cuda.graph_pool_handle()

        pick = picker(keyed)
        data_ptr = torch.Tensor.data_ptr

        overflow: list[_Capture] = []  # beyond MAX_CAPTURES: one capture, copied in and out

        def run(call_args: list) -> list:
            key = tuple(map(data_ptr, pick(call_args)))
            cap = captures.get(key)
            if cap is None and len(captures) < MAX_CAPTURES:
                cap, first = self._capture_one(engine, call_args, pool, adopt=None)
                captures[key] = cap
                if len(captures) > 1:
                    logger.info("graph %d: captured again for new addresses of its parameters or "
                                "in-place inputs (%d captures)", self.report.graph_id,
                                len(captures))
                return cap.copy_outputs(first)  # the capture's real run was this call's launch
            if cap is None:
                if not overflow:
                    logger.warning("graph %d: more than %d distinct addresses for its parameters "
                                   "or in-place inputs; the others are copied in and out around "
                                   "each replay (slow)", self.report.graph_id, MAX_CAPTURES)
                    # on buffers of its own (nothing adopted): it serves every address
                    cap, first = self._capture_one(engine, call_args, pool, adopt=[])
                    overflow.append(cap)
                    return cap.copy_outputs(first)
                cap = overflow[0]
            while cap.stager.adopted and not cap.stager.adopted_match(call_args):
                if cap.owned is None:
                    # the inputs still where the capture read them stay adopted; the others (and
                    # every one, a second time down) get buffers of their own
                    keep = cap.stager.still_adopted(call_args) if cap is captures.get(key) else []
                    cap.owned, first = self._capture_one(engine, call_args, pool, adopt=keep)
                    logger.debug("graph %d: %d input(s) on the device came in other buffers "
                                 "than the first call's; captured again on buffers of its own "
                                 "for them, which such calls are copied into",
                                 self.report.graph_id, len(cap.stager.adopted) - len(keep))
                    return cap.owned.copy_outputs(first)
                cap = cap.owned
            pending = cap.stager.stage(call_args)
            try:
                cap.replay()
            finally:
                cap.stager.finish(call_args, pending)
            return cap.copy_outputs(cap.outputs)

        return run

    def _capture_one(self, engine: Engine, call_args: list, pool: Any,
                     adopt: Sequence[int] | None) -> tuple[_Capture, list]:
        """A capture on ``call_args``; ``adopt``: the inputs it reads from the caller's tensors
        (None: every input on the unit's device that InputStager may adopt)."""
        device = _device_of(call_args)
        if adopt is None:
            adopt = [i for i, a in enumerate(call_args)
                     if isinstance(a, torch.Tensor) and a.device == device]
        stager = InputStager(call_args, borrowed=self.borrowed | self._sunk_position(),
                             mutated=self.mutated, names=self.names, adopt=set(adopt))
        if self._checked_slots and self.sunk is not None:
            # the sunk lengths' checks run on the host before every launch (SunkScalars.checks):
            # the capture leaves them out, so a replay reads no device flag back for them
            engine = _host_checked_engine(engine, self.sunk.buffer, self._checked_slots)
        if self.capture == "cuda":
            replay, outputs, first = _capture.capture_cuda(engine, stager.static, pool,
                                                           _device_of(stager.static))
        else:
            replay, outputs, first = _capture.capture_emulated(engine, stager.static)
        return _Capture(stager, replay, outputs, _capture.storage_groups(first)), first

    def _sunk_position(self) -> set[int]:
        return {len(self.kept)} if self.program is not None else set()


def _host_checked_engine(engine: Engine, buffer: torch.Tensor,
                         slots: frozenset[tuple[int, int]]) -> Engine:
    """``engine`` run with ``slots`` of ``buffer`` host-checked (the capture, and each replay of
    the CPU emulation, which reruns the engine)."""
    def run(args: list) -> Sequence[Any]:
        with _device_checks.host_checked(buffer, slots):
            return engine(args)

    return run


def _device_of(args: Sequence[Any]) -> torch.device:
    """The compute device of a graph: an accelerator if any input is on one, else CPU."""
    devices = [a.device for a in args if isinstance(a, torch.Tensor)]
    return next((d for d in devices if d.type != "cpu"), torch.device("cpu"))
