"""Record the guards Dynamo produced for a ``cache_compile`` frame (the cold start).

After the cold call, the frame's new Dynamo cache entry holds a tree of guard managers (one per
source: ``L['self']``, ``L['self'].n``, ``G['SCALE']``...) with leaf guards, plus the shape
environment's guards at the root. :func:`harvest` walks it and returns JSON records
``{"kind", "source", "code": [...], "type"?, "obj"?, "advisory"?}`` that
:class:`~torchair.inference.guards.guard_set.GuardSet` checks on warm starts. A guard that cannot
be checked in another process raises :class:`~torchair.inference.guards.grammar.UnsupportedGuard`
(the cold start then does not cache the function and warns with the guard's text). Kinds in
:data:`ADVISORY_KINDS` (and a few guards implied by others) are recorded with the reason they
are not enforced.

Each record is also compiled and evaluated against the cold call's own frame: a guard that does
not hold there means the evaluator and Dynamo disagree (or the function changed what it guards),
and the function is not cached. :func:`side_effects` reads what else Dynamo would replay after the
graph. Dynamo is imported only inside the functions that read it (a warm start never calls them).
"""
from __future__ import annotations

import re
from typing import Any, Callable

import torch
import torch.distributed as dist

from torchair.core import function_modes
from torchair.inference._cache_io import TENSOR_STORE
from torchair.inference.guards.grammar import UnsupportedGuard, source_slot
from torchair.inference.guards.guard_set import GuardSet
from torchair.inference.guards.objects import describe_object
from torchair.inference.guards.sources import Globals, Sources
from torchair.inference.guards.state import global_state

__all__ = ["ADVISORY_KINDS", "entries", "harvest", "new_entry", "side_effects"]

# Kinds recorded but not enforced, with why it is sound to skip them on a warm start.
ADVISORY_KINDS = {
    "DIMENSION_DYNAMIC_MARKING_GUARD":
        "mark_static/mark_dynamic only steer how Dynamo would retrace; the sizes the graph "
        "accepts are checked by the tensor and shape guards",
    "GRAD_MODE": "cached graphs always run under torch.no_grad()",
}
_SAVED_HOOKS = "top_saved_tensors_hooks"  # AOT's ambient guard (autograd graphs only)

_COMMENT = re.compile(r"\s+#.*$")
# An identity check as Dynamo prints it: the call, then a type hint and a comment. torch 2.13
# prints `type=<class 'module'>`; torch 2.11 the object's repr, which may hold anything
# (`<module 'torch' from '...'>`, `functools.partial(<function g at 0x1>, 2)`, several lines,
# a " #"): keep the call, up to the first `, <id>)` that ends the text or starts the hint.
_ID_CALL = re.compile(r"(___check_(?:obj|type)_id\(.*?,\s*\d+\))(?:,\s*type=.*|\s+#.*)?$",
                      re.S)
_OBJ_ID = re.compile(r"___check_obj_id\((.*),\s*(\d+)\)")


def entries(code: Any) -> list:
    """Dynamo's cache entries for ``code`` (newest first)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return list(_debug_get_cache_entry_list(code))


def new_entry(code: Any, before: set[int]) -> Any:
    """The one cache entry for ``code`` that is not in ``before`` (ids of entries' code)."""
    fresh = [e for e in entries(code) if id(e.code) not in before]
    if len(fresh) != 1:
        raise UnsupportedGuard(f"expected one new Dynamo cache entry for the frame, found "
                               f"{len(fresh)}")
    return fresh[0]


def _clean(part: str) -> str:
    """Dynamo's printed guard without its trailing comment and type hint."""
    text = part.strip()
    if text.startswith("___check_type_id(") or text.startswith("___check_obj_id("):
        call = _ID_CALL.match(text)
        if call is not None:
            return call.group(1)
    return _COMMENT.sub("", text).strip()


def _walk(manager: Any, out: list) -> None:
    source = manager.get_source()
    for leaf in manager.get_leaf_guards():
        out.append((type(leaf).__name__, source, list(leaf.verbose_code_parts()), manager))
    for child in manager.get_child_managers():
        _walk(child, out)


def harvest(entry: Any, frame: dict, globals_: dict) -> list[dict]:
    """JSON records of every guard of ``entry`` (see the module doc), checked on the cold call's
    own ``frame`` (locals) and ``globals_``."""
    root = entry.guard_manager.root
    leaves: list = []
    _walk(root, leaves)
    for leaf in root.get_epilogue_lambda_guards():
        leaves.append((type(leaf).__name__, "", list(leaf.verbose_code_parts()), None))
    records, seen = [], set()
    for kind, source, parts, manager in leaves:
        rec = _record(kind, source, parts, manager, frame, globals_)
        key = (rec["kind"], tuple(rec.get("code", ())), rec.get("advisory", ""))
        if key not in seen:
            seen.add(key)
            records.append(rec)
    _self_check(records, frame, globals_)
    return records


def _record(kind: str, source: str, parts: list[str], manager: Any, frame: dict,
            globals_: dict) -> dict:
    code = [_clean(p) for p in parts]
    rec: dict = {"kind": kind, "source": source, "code": code}
    if kind in ADVISORY_KINDS:
        rec["advisory"] = ADVISORY_KINDS[kind]
    elif any(_SAVED_HOOKS in c for c in code):
        rec["advisory"] = "saved-tensor hooks act on autograd graphs; cached graphs run " \
                          "under torch.no_grad()"
    elif _on_cacheable_mode(source, code):
        rec["advisory"] = "the torch_npu emulation's device mode (or one of its attributes): " \
                          "implied by the TorchFunctionMode stack check of its tags"
    elif kind == "GLOBAL_STATE":
        rec["state"] = global_state()
    elif kind == "TORCH_FUNCTION_MODE_STACK":
        rec["depth"], rec["modes"] = _mode_stack()
        rec["process"] = [function_modes.tag_of(m) for m in function_modes.process_modes()]
    elif code and code[0].startswith("___check_fake_script_type(") and _is_process_group(
            source, frame, globals_):
        rec["advisory"] = "the script type of a ProcessGroup: implied by its ID_MATCH"
    elif kind == "DEFAULT_DEVICE":
        if code != ["utils_device.CURRENT_DEVICE == None"]:
            raise UnsupportedGuard(f"DEFAULT_DEVICE `{code[0]}`: traced under a default-device "
                                   f"context")
        rec["advisory"] = "no default-device context: implied by the TorchFunctionMode check"
    if "code" in rec and not rec.get("advisory") and kind not in ("GLOBAL_STATE",
                                                                  "TORCH_FUNCTION_MODE_STACK"):
        if any(c.startswith("___check_type_id(") for c in code):
            rec["type"] = _type_of(manager, source)
        if any(c.startswith("___check_obj_id(") for c in code):
            rec["obj"] = _object_of(code, source, frame, globals_)
    return rec


# A guard on a mode of the stack, or on one attribute of it (`.base == 'cpu'`, read by the mode's
# __torch_function__ while tracing).
_MODE_SOURCE = re.compile(r"___get_torch_function_mode_stack_at\((\d+)\)(\.[A-Za-z_]\w*)?")


def _on_cacheable_mode(source: str, code: list[str]) -> bool:
    """Whether a guard reads only a registered (cacheable) mode of the stack or one of its
    instance attributes: the mode's tag holds its class and every instance attribute, and the
    TORCH_FUNCTION_MODE_STACK record checks the tags on warm calls."""
    match = _MODE_SOURCE.fullmatch(source)
    if match is None or any("L[" in c or "G[" in c for c in code):
        return False
    modes = function_modes.stack_modes()
    index = int(match.group(1))
    if index >= len(modes):
        return False
    try:
        function_modes.tag_of(modes[index])
    except function_modes.UnknownMode:
        return False
    attr = match.group(2)
    return attr is None or attr[1:] in vars(modes[index])


def _mode_stack() -> tuple[int, list[str]]:
    """The depth of the torch-function mode stack and the tags of its modes. Modes registered
    as cacheable (the torch_npu emulation's device mode) are described by their tags and
    checked on warm calls; any other mode makes the function uncacheable."""
    modes = function_modes.stack_modes()
    try:
        return len(modes), function_modes.stack_tags(modes)
    except function_modes.UnknownMode as unknown:
        raise UnsupportedGuard(f"the function was traced under a TorchFunctionMode ({unknown}; "
                               f"TORCH_FUNCTION_MODE_STACK) that a cached graph cannot restore; "
                               f"only torchair's torch_npu emulation mode is cacheable") from None


def _is_process_group(source: str, frame: dict, globals_: dict) -> bool:
    """Whether ``source`` is a ``torch.distributed.ProcessGroup`` in the cold call's frame."""
    if not dist.is_available():
        return False
    sources = Sources()
    try:
        slot = source_slot(source, sources)
    except UnsupportedGuard:
        return False
    values, why = sources.evaluate(frame, Globals(globals_))
    return not why and isinstance(values[slot], dist.ProcessGroup)


def _type_of(manager: Any, source: str) -> list:
    tp = manager.get_type_of_guarded_value() if manager is not None else None
    if not isinstance(tp, type):
        raise UnsupportedGuard(f"TYPE_MATCH on {source}: the guarded type is unknown")
    return [tp.__module__, tp.__qualname__]


def _object_of(code: list[str], source: str, frame: dict, globals_: dict) -> dict:
    """The guarded object of an ID_MATCH, read from the cold frame and checked to be the very
    object Dynamo saw (same id), described for other processes."""
    match = next((_OBJ_ID.search(c) for c in code if _OBJ_ID.search(c)), None)
    if match is None:
        raise UnsupportedGuard(f"ID_MATCH `{code[0]}`: no object id")
    sources = Sources()
    slot = source_slot(match.group(1), sources)
    values, why = sources.evaluate(frame, Globals(globals_))
    if why:
        raise UnsupportedGuard(f"ID_MATCH on {source}: {why}")
    obj = values[slot]
    if id(obj) != int(match.group(2)):
        raise UnsupportedGuard(f"ID_MATCH on {source}: the object changed during the call")
    described = describe_object(obj)
    if described is None:
        raise UnsupportedGuard(f"ID_MATCH on {source} (a {type(obj).__qualname__}): identity of "
                               f"such an object cannot be checked in another process")
    return described


def _self_check(records: list[dict], frame: dict, globals_: dict) -> None:
    guards = GuardSet(records)  # compiles every record: UnsupportedGuard if one cannot be
    why, _ = guards.check(frame, globals_)
    if why:
        raise UnsupportedGuard(f"a recorded guard does not hold on the call that was traced "
                               f"({why}); the function changes what Dynamo guards")


def side_effects(on_found: Callable[[str], None]) -> list[list]:
    """Python side effects Dynamo would replay after the graph on objects that existed before
    the call, as ``[source, attribute, value]`` for a warm call to replay: attribute writes of
    constants (None, bool, int, float, str) on objects reached from the frame (transformers'
    ``compiling = True`` flags), and tensors stored on an ``nn.Module``'s attributes (a rope's
    ``self.cos_cached = cos``), whose value is :data:`TENSOR_STORE` until the cold start maps the
    stored tensor onto a graph output or input. Anything else (list appends, other values or
    objects stored, tensors stored on other objects, deletions, tensor hooks) is reported to
    ``on_found``: a cached graph cannot replay it. Objects created during the call (a returned
    dict) do not count."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator
        from torch._dynamo.variables.base import AttributeMutationExisting, ValueMutationExisting
        from torch._dynamo.variables.tensor import TensorVariable

        effects = InstructionTranslator.current_tx().output.side_effects
        existing = (AttributeMutationExisting, ValueMutationExisting)
        mutated = [v for v in effects.id_to_variable.values()
                   if isinstance(v.mutation_type, existing) and effects.is_modified(v)]
        hooks = bool(effects.tensor_hooks)
        writes, others = [], []
        for v in mutated:
            found = _attribute_writes(v, effects, AttributeMutationExisting, TensorVariable)
            if found is None:
                others.append(v)
            else:
                writes += found
    except Exception:  # noqa: BLE001 - internals moved: say so rather than guess
        on_found("Dynamo's side-effect record is not readable in this torch version")
        return []
    if others or hooks:
        names = sorted({_describe_variable(v, effects) for v in others})[:3]
        on_found("the function mutates Python state that existed before the call ("
                 + (", ".join(names) if names else "tensor hooks") + "), which Dynamo "
                 "replays after the graph and a cached graph cannot; keep such updates "
                 "outside func")
    return writes


_CONSTANTS = (type(None), bool, int, float, str)


def _python_type(variable: Any) -> type | None:
    try:
        tp = variable.python_type()
    except Exception:  # noqa: BLE001 - a variable that does not know its type
        return None
    return tp if isinstance(tp, type) else None


def _attribute_writes(variable: Any, effects: Any, attribute_kind: type,
                      tensor_kind: type) -> list | None:
    """``[[source, attr, value], ...]`` when ``variable`` has a source and its only changes are
    attributes set to constants or, on an ``nn.Module``, to tensors; None otherwise."""
    if not isinstance(variable.mutation_type, attribute_kind):
        return None
    name = getattr(getattr(variable, "source", None), "name", None)
    name = name() if callable(name) else name
    attrs = effects.store_attr_mutations.get(variable, {})
    if not isinstance(name, str) or not attrs:
        return None
    owner = _python_type(variable)
    module = owner is not None and issubclass(owner, torch.nn.Module)
    out = []
    for attr, value in attrs.items():
        if not isinstance(attr, str):
            return None
        if value.is_python_constant():
            constant = value.as_python_constant()
            if type(constant) not in _CONSTANTS:
                return None
            out.append([name, attr, constant])
        elif module and isinstance(value, tensor_kind) and issubclass(
                _python_type(value) or object, torch.Tensor):
            out.append([name, attr, dict(TENSOR_STORE)])
        else:
            return None
    return out


def _describe_variable(variable: Any, effects: Any) -> str:
    """``L['cache'].layers[0]`` (``.is_initialized``, ...): where the object is and what changed."""
    name = getattr(getattr(variable, "source", None), "name", None)
    name = name() if callable(name) else name
    where = name if isinstance(name, str) else type(variable).__name__
    attrs = getattr(effects, "store_attr_mutations", {}).get(variable, {})
    return where + (f" (.{', .'.join(sorted(map(str, attrs))[:3])})" if attrs else "")
