"""Op registration for the ``npu`` namespace and the value-dependent-op registry.

Every op of the library is defined once with :func:`define_op`: a schema in the ``npu`` namespace,
a fake kernel (shapes only, valid under symbolic shapes, never reads values) and an eager kernel.
When the real ``torch_npu`` already defines an op, ours is not registered and the existing one is
used, so scripts keep their semantics.

A *value-dependent* op reads some arguments' values on the host to plan its work (Ascend calls this
"tiling"); e.g. ``actual_seq_lengths`` of incremental flash attention. :func:`register_value_dependent`
records which arguments those are and the op's *tensor twin*: the same op whose value-dependent
``SymInt[]`` arguments arrive as 1-D int64 tensors on the compute device. A static build rewrites
the op to its twin so the values are read on the device and the graph runs as one launch unit.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

import torch

NAMESPACE = "npu"
_lib = torch.library.Library(NAMESPACE, "FRAGMENT")
_defined: dict[str, torch._ops.OpOverloadPacket] = {}
_ours: set[str] = set()  # names this module defined (not a real torch_npu's)


def _op_name(schema: str) -> str:
    return schema.split("(", 1)[0].strip()


def define_op(schema: str, *, fake: Callable, kernel: Callable) -> torch._ops.OpOverloadPacket:
    """Define ``npu::<name>`` from ``schema`` with a fake kernel and an eager kernel.

    ``kernel`` serves every device (CompositeExplicitAutograd); it may dispatch to device-specific
    fast paths itself. Defining the same name twice is an error.
    """
    name = _op_name(schema)
    if name in _defined:
        raise RuntimeError(f"op npu::{name} is already defined by torchair; define it once")
    if hasattr(torch.ops, NAMESPACE) and _exists(name):
        packet = getattr(getattr(torch.ops, NAMESPACE), name)  # provided by a real torch_npu
    else:
        _lib.define(schema)
        _lib.impl(name, kernel, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{NAMESPACE}::{name}", lib=_lib)(fake)
        packet = getattr(getattr(torch.ops, NAMESPACE), name)
        _ours.add(name)
    _defined[name] = packet
    return packet


def defined_here(name: str) -> bool:
    """Whether torchair defined ``npu::<name>`` (False when a real torch_npu provides it)."""
    return name in _ours


def _exists(name: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(f"{NAMESPACE}::{name}", "")
        return True
    except RuntimeError:
        return False


@dataclasses.dataclass(frozen=True)
class ValueDependentOp:
    """A value-dependent op: which arguments it reads on the host, and its tensor twin."""

    op: torch._ops.OpOverload
    args: tuple[str, ...]
    twin: torch._ops.OpOverload

    @property
    def name(self) -> str:
        return self.op._schema.name.split("::", 1)[-1]


_value_dependent: dict[torch._ops.OpOverload, ValueDependentOp] = {}


def register_value_dependent(op: torch._ops.OpOverload, args: Iterable[str],
                             twin: torch._ops.OpOverload) -> ValueDependentOp:
    """Record ``op`` as value-dependent on ``args`` (keyword ``SymInt[]`` arguments).

    ``twin`` must have the same arguments as ``op`` except that each of ``args`` is a
    ``Tensor?`` (a 1-D int64 tensor on the compute device).
    """
    args = tuple(args)
    if op in _value_dependent:
        raise RuntimeError(f"{op} is already registered as value-dependent")
    op_args = {a.name: a for a in op._schema.arguments}
    twin_args = {a.name: a for a in twin._schema.arguments}
    for a in args:
        if a not in op_args:
            raise ValueError(f"register_value_dependent: {op} has no argument {a!r}; "
                             f"it has {sorted(op_args)}")
        if "SymInt" not in str(op_args[a].type) and "int" not in str(op_args[a].type):
            raise ValueError(f"register_value_dependent: argument {a!r} of {op} is "
                             f"{op_args[a].type}, expected SymInt[]")
        if a not in twin_args or "Tensor" not in str(twin_args[a].type):
            raise ValueError(f"register_value_dependent: twin {twin} must take {a!r} as Tensor?")
    if set(op_args) != set(twin_args):
        raise ValueError(f"register_value_dependent: twin {twin} must have the same arguments as "
                         f"{op}; differs in {sorted(set(op_args) ^ set(twin_args))}")
    entry = ValueDependentOp(op, args, twin)
    _value_dependent[op] = entry
    return entry


def get_value_dependent(target) -> ValueDependentOp | None:
    """The registry entry of an FX node target, or None when it is not value-dependent."""
    return _value_dependent.get(target)


# Ops that read tensor data on the host (``.item()``, ``.tolist()``) or whose output shape
# depends on data: the host must wait for the device, so the graph cannot be one launch unit.
# Library ops with that property add themselves with :func:`register_host_sync`.
HOST_SYNC_OPS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
                 torch.ops.aten.masked_select.default, torch.ops.aten._unique2.default,
                 torch.ops.aten.unique_consecutive.default, torch.ops.aten.unique_dim.default,
                 torch.ops.aten.equal.default, torch.ops.aten.is_nonzero.default}


def register_host_sync(op: torch._ops.OpOverload) -> None:
    """Mark ``op`` as reading tensors on the host: a graph calling it is not one launch unit."""
    HOST_SYNC_OPS.add(op)


def value_dependent_ops() -> tuple[ValueDependentOp, ...]:
    return tuple(_value_dependent.values())
