"""What an object *is*, in terms that mean the same in another process.

Two Dynamo checks compare object identities (``___check_type_id``, ``___check_obj_id``); ids mean
nothing in another process, so the cold start records what the object is (a class by module and
qualified name, a module by name, a function or code object by name and place, an op by its
qualified name, a process group by name, backend and ranks; see :func:`describe_object`) and the
warm check compares that (:class:`TypeIs`, :class:`ObjIs`).
"""
from __future__ import annotations

import enum
import types
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["ObjIs", "TypeIs", "describe_object"]

_MISSING = object()


def _qualname(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", "")


def describe_object(obj: Any) -> dict | None:
    """What ``obj`` is, in terms that mean the same in another process (None: no such terms)."""
    if obj is None or obj is Ellipsis or isinstance(obj, bool):
        return {"const": repr(obj)}
    if isinstance(obj, types.ModuleType):
        return {"module": obj.__name__}
    if isinstance(obj, type):
        return {"class": [obj.__module__, obj.__qualname__]}
    if isinstance(obj, types.CodeType):
        return {"code": [obj.co_filename, obj.co_name, obj.co_firstlineno]}
    if isinstance(obj, types.FunctionType):
        code = obj.__code__
        return {"function": [obj.__module__, obj.__qualname__, code.co_filename,
                             code.co_firstlineno]}
    if isinstance(obj, types.BuiltinFunctionType):
        owner = getattr(obj, "__self__", None)
        owner = owner.__name__ if isinstance(owner, types.ModuleType) else type(owner).__qualname__
        return {"builtin": [str(getattr(obj, "__module__", None)), owner, _qualname(obj)]}
    if isinstance(obj, torch._ops.OpOverloadPacket):
        return {"op": obj._qualified_op_name}
    if isinstance(obj, torch._ops.OpOverload):
        return {"op": f"{obj._schema.name}.{obj._overloadname}"}
    if isinstance(obj, torch._ops._OpNamespace):
        return {"op_namespace": obj.name}
    if type(obj) is torch._ops._Ops:
        return {"torch_ops": True}
    if isinstance(obj, (torch.dtype, torch.device)):
        return {"value": [type(obj).__name__, str(obj)]}
    if isinstance(obj, enum.Enum):  # a member is unique in its class: class and name say which
        cls = type(obj)
        return {"enum": [cls.__module__, cls.__qualname__, obj.name]}
    return _describe_process_group(obj)


def _describe_process_group(obj: Any) -> dict | None:
    """A process group (Dynamo ID_MATCHes ``dist.group.WORLD`` under an in-place collective) is
    the same group in another process when its name, backend and member ranks are (the cache
    directory already separates world sizes and ranks)."""
    if not dist.is_available() or not isinstance(obj, dist.ProcessGroup):
        return None
    try:
        return {"process_group": [obj.group_name, str(dist.get_backend(obj)),
                                  list(dist.get_process_group_ranks(obj))]}
    except (RuntimeError, ValueError):  # not registered with c10d (destroyed, or not a group)
        return None


class TypeIs:
    """``___check_type_id`` of one value: its type by module and qualified name (ids mean
    nothing in another process); the type that passed last time is one identity test."""

    __slots__ = ("want", "last")

    def __init__(self, want: tuple) -> None:
        self.want, self.last = want, None

    def __call__(self, obj: Any) -> bool:
        tp = type(obj)
        if tp is self.last:
            return True
        if (tp.__module__, tp.__qualname__) == self.want:
            self.last = tp
            return True
        return False


class ObjIs:
    """``___check_obj_id`` of one value: what the object is (:func:`describe_object`); the
    object that passed last time (a module, a function...) is one identity test."""

    __slots__ = ("want", "last")

    def __init__(self, want: Any) -> None:
        self.want, self.last = want, _MISSING

    def __call__(self, obj: Any) -> bool:
        if obj is self.last:
            return True
        if describe_object(obj) == self.want:
            self.last = obj
            return True
        return False
