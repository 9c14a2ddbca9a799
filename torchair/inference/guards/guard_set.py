"""The guards of one cached frame, checked before every call a warm ``cache_compile`` serves.

A :class:`GuardSet` compiles the records the cold start made
(:mod:`~torchair.inference.guards.record`) through the grammar
(:mod:`~torchair.inference.guards.grammar`) and checks them on a call's frame; when they hold,
the same evaluation yields the graph inputs. So a call is served by the cached graph exactly
when Dynamo would have served it by the traced one.

A call goes through one of these check tiers (named so in the DEBUG trace of calls, see
:meth:`GuardSet.check_arguments`):

- the *full check*: the process state, then every guard. The only tier before
  :meth:`GuardSet.watch_arguments`; after it, the first call, the first call after any
  parameter, buffer or submodule assignment (:mod:`~torchair.inference.guards.epoch`), and the
  fallback of the per-call tiers;
- the *process-state check* of per-call checks: a call whose process state (grad, autocast,
  function modes...) differs is refused before any guard runs;
- the *generated program* (:mod:`~torchair.inference.guards.codegen`): the process state's
  common case and the per-call guards as one generated function, serving the common case where
  the state is unchanged, every guard holds and the tensor memo holds;
- the *memo hit*: the general per-call form where the per-call tensor guards' memo
  (:class:`~torchair.inference.guards.tensors.TensorMemo`) held, so only the other per-call
  guards ran;
- the *per-call guards*: the general per-call form running every per-call guard.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import torch

from torchair.base.log import env_switch, logger
from torchair.inference.guards.codegen import ENV_CODEGEN, NotGenerated, ServedCall, per_call_program
from torchair.inference.guards.epoch import EPOCH, module_epoch, watch_modules
from torchair.inference.guards.grammar import compile_expression, source_slot
from torchair.inference.guards.sources import Fn, Globals, Sources
from torchair.inference.guards.state import ProcessState
from torchair.inference.guards.tensors import DISPATCH_TLS, TensorMemo

__all__ = ["Guard", "GuardSet", "TIER_FULL", "TIER_GUARDS", "TIER_MEMO", "TIER_PROGRAM",
           "TIER_STATE"]

# the check tiers (see the module doc), as the DEBUG trace of calls names them
TIER_FULL = "full check"
TIER_STATE = "process-state check"
TIER_PROGRAM = "generated program"
TIER_MEMO = "memo hit"
TIER_GUARDS = "per-call guards"

# the DEBUG trace of calls: each of the first calls, then every _TRACE_EVERY-th, and every call
# whose tier differs from the last traced call's
_TRACE_FIRST = 8
_TRACE_EVERY = 1000

_TENSOR_DICTS = ("._parameters", "._buffers")


class Guard:
    """One compiled guard: its record's ``kind``, one line of its ``code``, the ``source`` it
    guards, the compiled ``fn(values)``, the slots it ``read`` s, and the recorded identities
    ``type_of`` / ``obj`` its identity checks compare."""

    __slots__ = ("kind", "code", "source", "fn", "read", "type_of", "obj")

    def __init__(self, kind: str, code: str, source: str, fn: Fn, read: set,
                 type_of: list | None = None, obj: dict | None = None) -> None:
        self.kind, self.code, self.source, self.fn, self.read = kind, code, source, fn, read
        self.type_of, self.obj = type_of, obj  # what identity checks compare (recorded)


class GuardSet:
    """The checks of one cached frame (records from :mod:`~torchair.inference.guards.record`)
    and the sources they and the graph inputs read.

    After :meth:`watch_arguments`, its public per-call attributes (read by the generated
    program, :mod:`~torchair.inference.guards.codegen`) are: ``per_call``, the tuple
    ``(guards, steps, dict_inputs)`` of the guards checked on every call, the source steps they
    and the graph inputs need, and ``(graph input, dict slot, key)`` of the inputs read from a
    module's parameter or buffer dict; ``memo``, the :class:`TensorMemo` of the per-call
    TENSOR_MATCH guards; ``untensored``, the per-call guards the memo does not imply;
    ``tensor_dicts``, graph input -> its module dict as of the last full check; ``module_root``,
    the source of the module whose state the per-call check may hoist (``L['self']``; None:
    none); and ``program``, the generated per-call check (None: the general form runs)."""

    def __init__(self, records: Sequence[dict], input_sources: Sequence[str] = ()) -> None:
        self.sources = Sources()
        self.guards: list[Guard] = []
        state, modes, mode_tags = None, None, []
        for rec in records:
            kind = rec["kind"]
            if rec.get("advisory"):
                continue
            if kind == "GLOBAL_STATE":
                state = rec["state"]
            elif kind == "TORCH_FUNCTION_MODE_STACK":
                modes = int(rec["depth"])
                # the stack's modes, then the process-wide ones (function_modes.process_modes)
                mode_tags = list(rec.get("modes", ())) + list(rec.get("process", ()))
            else:
                for code in rec["code"]:
                    read: set[int] = set()
                    fn = compile_expression(code, self.sources, type_of=rec.get("type"),
                                            obj=rec.get("obj"), read=read)
                    self.guards.append(Guard(kind, code, rec.get("source", ""), fn, read,
                                             rec.get("type"), rec.get("obj")))
        self.process = ProcessState(state, modes, mode_tags)
        self.inputs = [source_slot(s, self.sources) for s in input_sources]
        self._tensor_slots = {source_slot(g.source, self.sources) for g in self.guards
                              if g.kind == "TENSOR_MATCH" and g.source}
        # the per-call checks (see the class doc), set by watch_arguments
        self.per_call: tuple | None = None
        self.memo: TensorMemo | None = None
        self.untensored: list[Guard] = []
        self.tensor_dicts: dict[int, Any] = {}
        self.module_root: str | None = None
        self.program: Callable[[dict, Any], list | None] | None = None
        self._checked_epoch = -1  # the module epoch of the last full check that held
        # the DEBUG trace of calls (see _trace)
        self._calls = 0
        self._next_trace = 1
        self._tier = ""

    def tensor_inputs(self, count: int, per_call: bool = False) -> set[int]:
        """Which of the first ``count`` input sources a TENSOR_MATCH guard checks (dtype,
        device, static sizes and strides); ``per_call``: one that :meth:`check_arguments` runs
        on every call."""
        slots = self._tensor_slots
        if per_call and self.per_call is not None:
            slots = {source_slot(g.source, self.sources) for g in self.per_call[0]
                     if g.kind == "TENSOR_MATCH" and g.source}
        return {k for k, slot in enumerate(self.inputs[:count]) if slot in slots}

    def __len__(self) -> int:
        return len(self.guards)

    def _run(self, guards: Sequence[Guard], values: list) -> str:
        for guard in guards:
            try:
                ok = guard.fn(values)
            except Exception as error:  # noqa: BLE001 - an unreadable value fails the guard
                return f"{guard.kind} `{guard.code}`: {type(error).__name__}: {error}"
            if not ok:
                return f"{guard.kind} `{guard.code}` does not hold{self._now(guard, values)}"
        return ""

    def check(self, frame: dict, globals_: dict | Globals) -> tuple[str, list]:
        """("", graph inputs) when every guard holds, else (a sentence naming the first guard
        that does not, [])."""
        why, flat = self._check_all(frame, globals_)
        self._note(TIER_FULL, why)
        return why, flat

    def _check_all(self, frame: dict, globals_: dict | Globals) -> tuple[str, list]:
        """:meth:`check`, untraced."""
        epoch = module_epoch()  # before reading: an assignment during the check is seen next
        why = self.process.differs()
        if why:
            return why, []
        if not isinstance(globals_, Globals):
            globals_ = Globals(globals_)
        values, why = self.sources.evaluate(frame, globals_)
        if not why:
            why = self._run(self.guards, values)
        if why:
            return why, []
        if self.per_call is not None:
            self.tensor_dicts = {k: values[parent] for k, parent, _ in self.per_call[2]}
            self._checked_epoch = epoch
        return "", [values[i] for i in self.inputs]

    # ------------------------------------------------------------- per-call argument checks
    def watch_arguments(self, arguments: Sequence[str], module: str | None = None) -> None:
        """Prepare :meth:`check_arguments`: the guards that read a call argument (a name in
        ``arguments``) or no source at all, the sources they and the graph inputs read, and
        the inputs that are a module's parameters or buffers (read from the module's
        ``_parameters`` / ``_buffers`` dict, kept from the last full check). ``module``: the
        frame's name of the module whose state the generated check may read once and serve
        again while unchanged (:mod:`~torchair.inference.guards.hoist`)."""
        self.module_root = f"L[{module!r}]" if module is not None else None
        roots = {f"L[{name!r}]" for name in arguments}
        sources = self.sources

        def per_call(guard: Guard) -> bool:
            read = [r for r in guard.read if sources.roots[r] != DISPATCH_TLS]
            return not read or any(sources.roots[r] in roots for r in read)

        guards = [g for g in self.guards if per_call(g)]
        dict_inputs, read = [], set()
        for k, slot in enumerate(self.inputs):
            parent = sources.steps[slot - 2][0] if slot >= 2 else -1
            if (sources.roots[slot] not in roots and slot in sources.items and parent >= 2
                    and sources.steps[parent - 2][2].endswith(_TENSOR_DICTS)):
                dict_inputs.append((k, parent, sources.items[slot]))
            else:
                read.add(slot)
        for guard in guards:
            read |= guard.read
        self.per_call = (guards, sources.ancestors(read), dict_inputs)
        # the tensors the per-call TENSOR_MATCH guards check, remembered after they held: a call
        # with the same tensor metadata runs only the other guards
        memoed = [g for g in guards if g.kind == "TENSOR_MATCH" and g.source]
        self.memo = TensorMemo(sorted({source_slot(g.source, sources) for g in memoed}))
        self.untensored = [g for g in guards if not any(g is m for m in memoed)]
        self.tensor_dicts = {}
        self._checked_epoch = -1
        self.program = self._generate()
        watch_modules()

    def _generate(self) -> Callable[[dict, Any], list | None] | None:
        """The per-call check as one generated function (:mod:`.codegen`), or None
        (``$TORCHAIR_GUARD_CODEGEN=0``, or a check it does not cover)."""
        if not env_switch(ENV_CODEGEN):
            return None
        return _generated(lambda: per_call_program(self),
                          "the per-call check runs in its general form")

    def served_program(self, names: Sequence[str], self_name: str, module: Any, globals_: Any,
                       miss: Any, tail: Callable[[Callable[..., str]], list[str]]
                       ) -> Callable | None:
        """The whole served call as one generated function of the call's positional arguments
        (:class:`~torchair.inference.guards.codegen.ServedCall`): what :meth:`check_arguments`
        does on a call its generated program serves (the module epoch compared, the program's
        check, the call counted and traced), then ``tail``'s lines, which read the graph inputs
        as ``flat`` and return the result. Any other call returns ``miss`` before ``tail`` runs
        (the caller then takes the general path, which checks again and says why). None when
        the per-call check has no generated program, or this form does not cover the frame."""
        if self.per_call is None or self.program is None:
            return None

        def head(bind: Callable[..., str]) -> list[str]:
            # a parameter, buffer or submodule assigned since the last full check: the general
            # path runs the full check (check_arguments' first test)
            return [f"if {bind(self, 'g')}._checked_epoch != {bind(EPOCH)}[0]:", "    return None"]

        def counted_tail(bind: Callable[..., str]) -> list[str]:
            g, tier = bind(self, "g"), bind(TIER_PROGRAM)
            return [f"{g}._calls += 1",  # as check_arguments on a call its program served
                    f"if {g}._tier is not {tier} or {g}._calls >= {g}._next_trace:",
                    f"    {g}._trace({tier}, {bind('')})"] + tail(bind)

        served = ServedCall(tuple(names), self_name, module, globals_, miss, head, counted_tail,
                            getattr(self.program, "hoist", None))
        return _generated(lambda: per_call_program(self, served),
                          "the served call keeps its layers")

    def dict_inputs(self) -> list:
        """(graph input index, its module dict's slot, key) of the inputs read from a module's
        ``_parameters`` / ``_buffers`` dict on per-call checks ([] before watch_arguments)."""
        return list(self.per_call[2]) if self.per_call is not None else []

    def check_arguments(self, frame: dict, globals_: dict | Globals) -> tuple[str, list]:
        """:meth:`check` of what can change from call to call without touching a module: the
        process state (grad, autocast, function modes...), every guard that reads a call
        argument, and the graph inputs read again (parameters and buffers from their module's
        dict). Guards on module attributes and globals are checked by the full :meth:`check`,
        which runs instead on the first call and after any parameter, buffer or submodule
        assignment (:func:`module_epoch`). Each call is traced at DEBUG with the tier that
        decided it (see the module doc; rate-limited, see :meth:`_trace`)."""
        if self.per_call is None or self._checked_epoch != EPOCH[0]:  # (module_epoch())
            return self.check(frame, globals_)
        program = self.program
        if program is not None:  # it checks the process state's common case itself, first
            flat = program(frame, globals_)
            if flat is not None:
                self._calls += 1  # (the gate of _note, inline on the hot path)
                if self._tier is not TIER_PROGRAM or self._calls >= self._next_trace:
                    self._trace(TIER_PROGRAM, "")
                return "", flat
        guards, steps, dict_inputs = self.per_call
        why = self.process.differs_per_call()
        if why:
            self._note(TIER_STATE, why)
            return why, []
        if not isinstance(globals_, Globals):
            globals_ = Globals(globals_)
        values, why = self.sources.evaluate_some(frame, globals_, steps)
        tier = TIER_GUARDS
        if not why:
            memo = self.memo
            if memo.holds(values):
                tier = TIER_MEMO
                why = self._run(self.untensored, values)
            else:
                why = self._run(guards, values)
                if not why:
                    memo.remember(values)
        if why:
            self._note(tier, why)
            return why, []
        dicts = self.tensor_dicts
        for k, _, key in dict_inputs:
            try:
                values[self.inputs[k]] = dicts[k][key]
            except KeyError:  # removed from its module: the full check says which source
                return self.check(frame, globals_)
        self._note(tier, "")
        return "", [values[i] for i in self.inputs]

    # ------------------------------------------------------------------ the trace of calls
    def _note(self, tier: str, why: str) -> None:
        """Count a call decided by ``tier`` (``why``: the refusal, "" when served) and trace it
        when due: a counter and a comparison per call, the log call only on traced calls."""
        self._calls += 1
        if tier is not self._tier or self._calls >= self._next_trace:
            self._trace(tier, why)

    def _trace(self, tier: str, why: str) -> None:
        """The DEBUG line of call ``self._calls``: each of the first ``_TRACE_FIRST`` calls,
        then every ``_TRACE_EVERY``-th, and any call whose tier differs from the last traced."""
        calls = self._calls
        if calls >= self._next_trace:
            self._next_trace = calls + 1 if calls < _TRACE_FIRST else calls + _TRACE_EVERY
        self._tier = tier
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("cache_compile: guard check of call %d %s by the %s%s", calls,
                         "refused" if why else "served", tier, f" ({why})" if why else "")

    def _now(self, guard: Guard, values: list) -> str:
        """The guarded value now, when it is short to show (for the warning)."""
        slot = self.sources.index.get(guard.source) if guard.source else None
        if slot is None or slot >= len(values):
            return ""
        value = values[slot]
        if guard.kind == "TYPE_MATCH":
            return f" ({guard.source} is a {type(value).__qualname__})"
        if guard.kind == "TENSOR_MATCH" and isinstance(value, torch.Tensor):
            return (f" ({guard.source} is {str(value.dtype).removeprefix('torch.')}"
                    f"{list(value.shape)} with strides {list(value.stride())})")
        if guard.kind in ("LENGTH_CHECK", "DICT_LENGTH"):
            try:
                return f" (len({guard.source}) is {len(value)})"
            except TypeError:
                return ""
        if guard.kind in ("EQUALS_MATCH", "TRUE_MATCH", "FALSE_MATCH", "NONE_MATCH"):
            text = repr(value)
            return f" ({guard.source} is {text if len(text) <= 60 else text[:57] + '...'})"
        return ""


def _generated(make: Callable[[], Callable], otherwise: str) -> Callable | None:
    """``make()``, or None (logged at DEBUG with what happens ``otherwise``) when the generator
    does not cover the checks or fails: the general form is always there."""
    try:
        return make()
    except NotGenerated as why:
        logger.debug("cache_compile: %s (%s)", otherwise, why)
    except Exception as why:  # noqa: BLE001 - the general form is always there
        logger.debug("cache_compile: %s (%s: %s)", otherwise, type(why).__name__, why)
    return None
