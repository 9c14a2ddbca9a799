"""``cache_compile``'s guards: Dynamo's guards for a cached frame, recorded on the cold start and
checked in a later process without Dynamo.

One concern per module, bottom to top (a module imports only those above it in this list):

- :mod:`.sources`: the values guards read (``L``, ``G`` and the sources reached from them) as one
  flat program of getter steps;
- :mod:`.objects`: what an object *is* across processes (identity checks);
- :mod:`.state`: the process-wide state (GLOBAL_STATE, the torch-function mode stack);
- :mod:`.tensors`: tensor checks (TENSOR_MATCH, dispatch keys, the C++ tensor memo);
- :mod:`.epoch`: the module epoch (parameter, buffer, submodule registrations);
- :mod:`.grammar`: the accepted guard grammar, compiled into closures (never ``eval``-ed);
- :mod:`.codegen`: the per-call check as one generated function;
- :mod:`.guard_set`: :class:`GuardSet`, one frame's guards checked per call, by tiers;
- :mod:`.record`: the cold start's harvest of Dynamo's guards and side effects.
"""
from __future__ import annotations

from torchair.inference.guards.epoch import module_epoch
from torchair.inference.guards.grammar import UnsupportedGuard, compile_expression, source_slot
from torchair.inference.guards.guard_set import GuardSet
from torchair.inference.guards.objects import describe_object
from torchair.inference.guards.record import ADVISORY_KINDS, entries, harvest, new_entry, side_effects
from torchair.inference.guards.sources import Globals, Sources
from torchair.inference.guards.state import global_state
from torchair.inference.guards.tensors import TensorMemo

__all__ = ["ADVISORY_KINDS", "Globals", "GuardSet", "Sources", "TensorMemo", "UnsupportedGuard",
           "compile_expression", "describe_object", "entries", "global_state", "harvest",
           "module_epoch", "new_entry", "side_effects", "source_slot"]
