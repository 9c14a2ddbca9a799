"""The per-call work around Inductor's C++-wrapper entry in one C++ call (``csrc/unit_call.cpp``).

A static CPU unit compiled without Inductor's input asserts (:mod:`.input_layout`) checks its
inputs and hands Inductor's compiled entry a list of tensor handles on every call. In Python
that is PyTorch's ``TensorGuards`` comparison and PyTorch's handle conversion, about 0.17 us
per input, some 9 us per call for 50 weights and inputs; the entry's own C++ then runs. The
extension module built here does the check, makes the handles and calls the entry's C++
function (``inductor_entry_impl``, found with ``dlsym`` in the module Inductor already loaded)
in one loop, returning the output handles for PyTorch's own conversion to tensors. A second,
smaller extension (:func:`state_watch`, ``csrc/state_watch.c``) tells whether module state a
served call reads has changed, from CPython's dict and type version tags.

It reads a Python tensor object as PyTorch lays it out (header, then the tensor);
:func:`module` loads it only after that reading matched handles PyTorch itself made and the
data pointers, sizes and strides Python reports, for a few probe tensors. Without a C++
compiler, with ``TORCHAIR_NATIVE_KERNELS=0``, or when any of that does not hold, units keep the
Python path (same results, a few microseconds more per call), with a log line saying why.
"""
from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
from types import ModuleType
from typing import Any, Callable, Sequence

import torch

from torchair.base.log import logger
from torchair.ops.toolchain import native

__all__ = ["ENTRY_SYMBOL", "NativeEntry", "module", "state_watch"]

_NAME = "torchair_unit_call"
# Inductor's C++ entry, ``void inductor_entry_impl(AtenTensorHandle*, AtenTensorHandle*)``, as the
# C++ compiler names it (another signature is another name: then dlsym finds nothing)
ENTRY_SYMBOL = "_Z19inductor_entry_implPP16AtenTensorOpaqueS1_"


@functools.lru_cache(maxsize=None)
def module() -> ModuleType | None:
    """The extension module, built on first use (cached on disk like the native kernels), or None
    (see the module doc)."""
    mod = _extension("unit_call", _NAME, "units call their entry from Python")
    if mod is None:
        return None
    why = _unrecognized(mod)
    if why:
        logger.warning("launch units: the C++ call helper does not read this PyTorch's tensor "
                       "objects (%s); units call their entry from Python", why)
        return None
    return mod


@functools.lru_cache(maxsize=None)
def state_watch() -> ModuleType | None:
    """``csrc/state_watch.c``'s module, built on first use: ``watch(dicts, objects, owners)`` and
    ``unchanged(watch)`` (whether dicts, objects and their ``__dict__`` are as recorded, from
    CPython's dict and type version tags), ``first_with(values, indices, name)`` (the first value
    with a non-None attribute). None without a compiler, with ``TORCHAIR_NATIVE_KERNELS=0``, or
    when this Python's tags do not change as the probe changes dicts and objects (then module
    state is read on every call)."""
    mod = _extension("state_watch", "torchair_state_watch", "module state is read on every call")
    if mod is None:
        return None
    why = _tags_unrecognized(mod)
    if why:
        logger.info("cache_compile: module state is read on every call (%s)", why)
        return None
    return mod


def _extension(source: str, name: str, otherwise: str) -> ModuleType | None:
    """The Python extension module ``name`` built from ``csrc/<source>``, or None (logged, with
    what happens ``otherwise``)."""
    if not native.enabled():
        return None
    lib = native.load(source, symbols=(f"PyInit_{name}",))
    if lib is None:
        return None
    try:
        loader = importlib.machinery.ExtensionFileLoader(name, lib._name)
        spec = importlib.util.spec_from_file_location(name, lib._name, loader=loader)
        mod = importlib.util.module_from_spec(spec)
        loader.exec_module(mod)
    except (ImportError, OSError) as exc:
        logger.info("%s could not be loaded (%s); %s", name, exc, otherwise)
        return None
    return mod


class _Probe:
    """A plain object for :func:`_tags_unrecognized`."""


class _OtherProbe:
    """Another type for :func:`_tags_unrecognized`'s ``__class__`` assignment."""


def _tags_unrecognized(mod: ModuleType) -> str:
    """Why ``mod``'s tags cannot be trusted to show a change to module state ("" when they can):
    each change below, made after a watch was taken, must make it report a change, and an
    untouched watch must not."""
    module = torch.nn.Module()
    module.eps = 1e-6
    module.register_parameter("w", torch.nn.Parameter(torch.zeros(1)))
    obj = _Probe()
    obj.a = 1

    kept: list = []  # the watches hold no references: what they point at is kept here

    def taken() -> Any:
        anchors = ((obj.__dict__, module.__dict__, module._parameters, module._modules),
                   (obj, module), ((obj, obj.__dict__), (module, module.__dict__)))
        kept.append(anchors)
        return mod.watch(*anchors)

    first = taken()
    if first is None:
        return "this Python keeps no dict version tags"
    if not mod.unchanged(first):
        return "an untouched dict read as changed"
    changes = {"an attribute set": lambda: setattr(obj, "a", 2),
               "an attribute deleted": lambda: delattr(obj, "a"),
               "a module attribute set": lambda: setattr(module, "eps", 1e-5),
               "object.__setattr__ on a module": lambda: object.__setattr__(module, "eps", 2e-5),
               "a key stored in __dict__": lambda: module.__dict__.__setitem__("x", 1),
               "a parameter stored in _parameters": lambda: module._parameters.__setitem__(
                   "w", torch.nn.Parameter(torch.ones(1))),
               "a submodule stored in _modules": lambda: module._modules.__setitem__(
                   "m", torch.nn.Module()),
               "a class attribute set": lambda: setattr(_Probe, "k", object()),
               "__dict__ replaced": lambda: setattr(module, "__dict__", dict(module.__dict__)),
               "__class__ assigned": lambda: setattr(obj, "__class__", _OtherProbe)}
    for what, change in changes.items():
        watch = taken()
        if watch is None:
            return "a probe type lost its version tag"
        change()
        if mod.unchanged(watch):
            return f"{what} left the tags unchanged"
    return ""


def _unrecognized(mod: ModuleType) -> str:
    """Why the module's reading of tensor objects cannot be trusted ("" when it can)."""
    handles = torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors
    first = torch.randn(3, 5)[:, 1:]
    if not mod.init(first, handles([first])[0]):
        return "the word after the object header is not the tensor PyTorch hands out"
    probes = [first, torch.nn.Parameter(torch.zeros(2, 7), requires_grad=False),
              torch.zeros(()), torch.arange(6.0).view(2, 3).t(), torch.empty(0, 4)]
    for t in probes:
        got = mod.probe(torch.Tensor, t)
        want = (t.data_ptr(), tuple(t.shape), t.stride())
        if got != want:
            return f"read {got} for a tensor of {want}"
    return ""


class NativeEntry:
    """Inductor's C++ entry ``f`` (the function its generated Python calls) run from C++ after the
    unit's layout check: ``__call__(args)`` returns the outputs, or None without running when an
    argument does not fit the layout (the caller's Python check then names it)."""

    def __init__(self, mod: ModuleType, layout: Any, impl: Any,
                 tensors: Callable[[list], list]) -> None:
        self._run, self._layout, self._impl, self._tensors = mod.run, layout, impl, tensors

    @classmethod
    def of(cls, f: Any, example: Sequence[torch.Tensor], outputs: int,
           tensors: Callable[[list], list]) -> NativeEntry | None:
        """For Inductor's entry ``f`` (a function of its loaded C++-wrapper module), inputs laid
        out as ``example`` and ``outputs`` outputs; None when the helper or the entry's C++
        function cannot be had."""
        mod = module()
        path = getattr(getattr(f, "__self__", None), "__file__", None)
        if mod is None or not isinstance(path, str):
            return None
        impl = mod.entry(path, ENTRY_SYMBOL, outputs)
        if impl is None:
            logger.debug("launch units: no %s in %s; the unit calls its entry from Python",
                         ENTRY_SYMBOL, path)
            return None
        return cls(mod, mod.layout(torch.Tensor, list(example)), impl, tensors)

    def __call__(self, args: list) -> list | None:
        raw = self._run(self._layout, self._impl, args)
        return None if raw is None else self._tensors(raw)
