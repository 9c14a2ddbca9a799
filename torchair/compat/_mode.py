"""Ascend device arguments wherever torch takes a device: ``"npu"``, ``"npu:0"``,
``torch.device("npu", 0)``.

Two pieces, both installed by :func:`~torchair.compat.emulate_npu` and removed by ``restore()``:

- :class:`NpuDeviceMode`, a ``TorchFunctionMode`` that rewrites ``device="npu[:i]"`` keyword
  arguments of every torch call (factories, ``Tensor.to``, ``Module.to`` through
  ``torch._C._nn._parse_to``) and positional device strings of the calls in ``_POSITIONAL``.
  It hands torch the target as a plain string ("cpu", "cuda", "cuda:1"), so Dynamo traces it
  (``torch.compile(..., fullgraph=True)`` works) without building ``torch.device`` objects.
  Cost: one Python call per torch call made from Python (eager code, and compiled graphs run
  op by op, e.g. with ``debug.run_eagerly``), about 3 us: 2.9-3.2 us measured for
  ``Tensor.add``, ``torch.zeros(device=...)`` and ``Tensor.to`` on a 2-core CPU (min of 7 x
  20000 calls).
- :func:`make_device_class`, the stand-in for ``torch.device``: ``torch.device("npu", 0)``
  returns the real ``torch.device`` of the emulated device; every other argument form is passed
  to the real constructor unchanged, and ``isinstance``/``issubclass`` see the real class.

An integer in a device position (``device=0``, ``Tensor.to(0)``, ``Module.to(0)``,
``torch.device(0)``) is the NPU of that index, as on torch_npu where the accelerator is the NPU.

Not covered (they read the device in C++ without a torch-function hook): ``torch.Generator``,
storage constructors, ``torch.load(map_location="npu")`` and ``torch.autocast("npu")``; pass a
``torch.device("npu")`` or the emulated device there. The mode is thread-local, like every
``TorchFunctionMode``: the emulation pushes it in the threads the script starts (see
:mod:`torchair.compat._children`).
"""
from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from torchair.core.function_modes import register_cacheable_mode

__all__ = ["NpuDeviceMode", "make_device_class", "npu_string", "pop_mode", "route_factories",
           "routes_factories_after_compile", "unroute_factories"]

_REAL_DEVICE = torch._C.device  # torch.device itself; never replaced


def npu_string(base: str, spec: Any, ints: bool = False, cuda: bool = False) -> str | None:
    """The real device string for an Ascend device argument, or None when ``spec`` is not one.

    ``base`` is the emulated device ("cpu", "cuda", "cuda:1"): "npu" -> base, "npu:i" -> "cpu"
    on the CPU (one device), else "cuda:i". With ``ints`` (``spec`` is in a device position), an
    index ``i >= 0`` is the NPU ``i`` as on torch_npu, where the accelerator is the NPU: "cpu" on
    the CPU, else "cuda:i". With ``cuda`` (a CPU emulation after ``transfer_to_npu``), "cuda",
    "cuda:i" and CUDA ``torch.device`` objects are the NPU as well.
    """
    kind = type(spec)
    if kind is str:
        if spec.startswith("npu"):
            if spec == "npu":
                return base
            if spec.startswith("npu:") and spec[4:].isdigit():
                return "cpu" if base == "cpu" else "cuda" + spec[3:]
            return None
        if cuda and spec.startswith("cuda") and (spec == "cuda" or spec[5:].isdigit()):
            return base
        return None
    if ints and kind is int and spec >= 0:
        return "cpu" if base == "cpu" else f"cuda:{spec}"
    if cuda and kind is _REAL_DEVICE and spec.type == "cuda":
        return base
    return None


# Calls whose device may come positionally: Tensor.to("npu"), Module.to("npu") (via _parse_to).
_POSITIONAL = (torch.Tensor.to, torch._C._nn._parse_to, torch.as_tensor)


class NpuDeviceMode(TorchFunctionMode):
    """Rewrites Ascend device arguments of torch calls to the emulated device (see module doc).

    (``Tensor.record_stream`` with a CPU emulation's stream is answered by the emulation's own
    ``Tensor.record_stream``, :func:`torchair.compat._streams.host_record_stream`: torch's
    argument parser refuses that stream before a mode sees the call.)
    """

    def __init__(self, base: str) -> None:
        super().__init__()
        self.base = base
        self.cuda = False  # True on a CPU emulation once the script imported transfer_to_npu

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        elif "device" in kwargs:
            mapped = npu_string(self.base, kwargs["device"], True, self.cuda)
            if mapped is not None:  # (not dict(kwargs, device=...): Dynamo traces that
                kwargs = kwargs.copy()  # through a polyfill it then guards on)
                kwargs["device"] = mapped
        if func is _POSITIONAL[0]:  # Tensor.to(self, device, ...): an int there is a device
            if len(args) > 1:
                args = (args[0], self._map(args[1], True), *(self._map(a) for a in args[2:]))
        elif func is _POSITIONAL[1]:  # Module.to's _parse_to(device, ...)
            if args:
                args = (self._map(args[0], True), *(self._map(a) for a in args[1:]))
        elif func is _POSITIONAL[2]:
            args = tuple(self._map(a) for a in args)
        return func(*args, **kwargs)

    def _map(self, arg: Any, ints: bool = False) -> Any:
        mapped = npu_string(self.base, arg, ints, self.cuda)
        return arg if mapped is None else mapped


# What the mode does to a traced call depends only on its attributes (the device playing the NPU,
# whether "cuda" is mapped too): cache_compile may serve graphs traced
# under an equal mode.
register_cacheable_mode(NpuDeviceMode)


# Factories that eager hands to torch-function modes but torch 2.11's Dynamo does not: it routes a
# call through the modes only for functions in its own overridable set, which there leaves out
# those torch.overrides lists as ignored (2.13 has them). Traced, `torch.arange(8, device="npu")`
# then reached fake tensors with "npu" in it. Adding them makes tracing do what eager does; with
# no mode on the stack nothing changes (Dynamo routes only while a mode is active). The set is
# Dynamo's, process-wide: the emulation takes out what it added when it is restored. Dynamo first
# imported by something else than torch.compile during the emulation (torch.export) is not
# covered.
_FACTORIES = ("arange", "tensor", "as_tensor", "randn", "rand", "randint", "randperm", "linspace",
              "logspace", "eye", "empty_strided", "full_like", "scalar_tensor", "range")


def _dynamo_overridable() -> set | None:
    try:
        from torch._dynamo.variables import torch as dynamo_torch

        overridable = dynamo_torch.get_overridable_functions()
    except (ImportError, AttributeError):
        return None
    return overridable if isinstance(overridable, set) else None


def route_factories() -> list:
    """Have Dynamo route the factories above through torch-function modes, as eager does.

    Imports Dynamo's torch variables. Returns the functions it added (none where this PyTorch
    routes them already or has no such set), for :func:`unroute_factories`."""
    overridable = _dynamo_overridable()
    if overridable is None:
        return []
    added = [fn for fn in (getattr(torch, name) for name in _FACTORIES if hasattr(torch, name))
             if fn not in overridable]
    overridable.update(added)
    return added


def unroute_factories(added: list) -> None:
    """Undo :func:`route_factories` (what it added; nothing when Dynamo was never imported)."""
    if added and "torch._dynamo" in sys.modules:
        overridable = _dynamo_overridable()
        if overridable is not None:
            overridable.difference_update(added)


def routes_factories_after_compile(compile_fn: Callable, added: list,
                                   after: Callable[[], None] | None = None) -> Callable:
    """``torch.compile`` that calls :func:`route_factories` once it has imported Dynamo,
    collecting what it added in ``added`` (the emulation does not import Dynamo itself: 1.6 s
    for scripts that never compile), then ``after()``."""

    @functools.wraps(compile_fn)
    def compile_(*args: Any, **kwargs: Any) -> Any:
        result = compile_fn(*args, **kwargs)
        added.extend(route_factories())
        if after is not None:
            after()
        return result

    return compile_


def pop_mode(mode: TorchFunctionMode) -> bool:
    """Remove ``mode`` from this thread's torch-function mode stack, keeping the modes above it.

    Returns whether it was found.
    """
    above = []
    found = False
    while torch._C._len_torch_function_stack() > 0:
        top = torch._C._pop_torch_function_stack()
        if top is mode:
            found = True
            break
        above.append(top)
    for other in reversed(above):
        torch._C._push_on_torch_function_stack(other)
    return found


class _DeviceMeta(type):
    """The metaclass of every ``torch.device`` stand-in: it is the real class to ``isinstance``,
    ``issubclass``, ``==`` and ``hash``. Stand-ins of earlier emulations compare equal too, as
    Dynamo caches a set of constant-foldable classes built from whichever ``torch.device`` it
    saw first."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, _REAL_DEVICE)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, _REAL_DEVICE)

    def __getattr__(cls, name: str) -> Any:
        return getattr(_REAL_DEVICE, name)

    def __eq__(cls, other: object) -> bool:
        return other is _REAL_DEVICE or type(other) is _DeviceMeta

    def __ne__(cls, other: object) -> bool:
        return not (other is _REAL_DEVICE or type(other) is _DeviceMeta)

    def __hash__(cls) -> int:
        return hash(_REAL_DEVICE)


def _mark_constant(fn):
    """``torch._dynamo.assume_constant_result(fn)`` without importing Dynamo (1.6 s) for scripts
    that never compile: the decorator only sets this marker, which Dynamo reads when tracing
    (a test checks that it still does)."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        return dynamo.assume_constant_result(fn)
    fn._dynamo_marked_constant = True
    return fn


def make_device_class(base: str, mode: NpuDeviceMode | None = None) -> type:
    """A ``torch.device`` stand-in whose ``"npu"`` is ``base`` ("cpu", "cuda", "cuda:1").

    ``torch.device(i)`` (an index alone: the accelerator's device ``i``) is the NPU ``i`` as on
    torch_npu: the CPU on a CPU emulation, else ``cuda:i``. While ``mode.cuda`` is set (a CPU
    emulation after ``transfer_to_npu``), ``"cuda[:i]"`` is the CPU too.

    The class compares and hashes equal to the real ``torch.device`` (see :class:`_DeviceMeta`),
    so tables that torch modules imported during the emulation build from ``torch.device``
    (Dynamo's constant types, FX's code-generation builtins) still match real devices, also
    after ``restore()``.
    Construction goes through a helper Dynamo treats as a constant (``assume_constant_result``),
    so ``torch.device("npu", 0)`` folds to a constant inside ``torch.compile``.
    """

    def new_device(*args: Any, **kwargs: Any) -> torch.device:
        spec = args[0] if args else kwargs.get("type")
        if type(spec) is int and len(args) == 1 and not kwargs and spec >= 0:
            return _REAL_DEVICE("cpu") if base == "cpu" else _REAL_DEVICE("cuda", spec)
        if mode is not None and mode.cuda and type(spec) is str and spec.startswith("cuda"):
            _REAL_DEVICE(*args, **kwargs)  # the real constructor checks the rest
            return _REAL_DEVICE(base)
        if type(spec) is not str or not spec.startswith("npu"):
            return _REAL_DEVICE(*args, **kwargs)
        as_cuda = "cuda" + spec[3:]
        try:  # the real constructor checks the rest: "npu:x", index twice, negative index
            device = _REAL_DEVICE(as_cuda, *args[1:], **kwargs) if args else \
                _REAL_DEVICE(**dict(kwargs, type=as_cuda))
        except (RuntimeError, TypeError, ValueError) as err:
            raise RuntimeError(f"torch.device({spec!r}): not an NPU device ({err}); expected "
                               "'npu', 'npu:<index>' or ('npu', <index>)") from None
        if base == "cpu":
            return _REAL_DEVICE("cpu")
        return _REAL_DEVICE(base) if device.index is None else device

    new_device = _mark_constant(new_device)

    class device(metaclass=_DeviceMeta):  # noqa: N801 (it stands in for torch.device)
        __doc__ = (f"torch.device under the torch_npu emulation: 'npu' is '{base}'; anything "
                   "else is the real torch.device.")

        def __new__(cls, *args: Any, **kwargs: Any) -> torch.device:
            return new_device(*args, **kwargs)

    device.__module__, device.__qualname__ = "torch", "device"  # pickles as torch.device
    return device
