"""The emulated ``torch.npu`` (= ``torch_npu.npu``) and ``torch_npu.npu.utils`` modules.

On a CUDA emulation every call forwards to ``torch.cuda`` with the NPU device argument mapped.
On the CPU:

- device queries answer for one device (``device_count() == 1``), except that
  ``set_device(i)`` is accepted for any ``i`` (a tensor-parallel rank sets its local rank) and
  ``current_device()`` then returns ``i``; tensors still go to the CPU;
- ``synchronize``, ``empty_cache`` and ``reset_peak_memory_stats`` do nothing (host work is
  synchronous; the CPU allocator keeps no cache or statistics);
- ``memory_allocated`` / ``max_memory_allocated`` / ``memory_reserved`` / ``max_memory_reserved``
  return 0: the CPU allocator does not count;
- seeds and RNG state are the CPU generator's (``torch.manual_seed`` ...);
- ``get_device_properties`` describes the host (:class:`HostDeviceProperties`).

Streams and events are in :mod:`torchair.compat._streams`, the Ascend-only switches in
:mod:`torchair.compat._settings`. Any other name raises ``NotEmulatedError`` naming it.
"""
from __future__ import annotations

import dataclasses
import os
import types
from typing import Any, Callable

import torch

from torchair.base.log import logger
from torchair.compat._device import device_index_of, to_emulated
from torchair.compat._errors import module_getattr
from torchair.compat._settings import settings_api
from torchair.compat._streams import stream_api

__all__ = ["HostDeviceProperties", "make_npu_namespace"]

_MEMORY = ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved")
_UTILS = ("synchronize", "device_count", "set_device", "current_device", "get_device_name",
          "get_device_properties", "device", "stream", "StreamContext", "set_stream",
          "current_stream", "default_stream", "is_bf16_supported")


@dataclasses.dataclass(frozen=True)
class HostDeviceProperties:
    """``torch.npu.get_device_properties()`` on the CPU: the host, with its cores standing in
    for the AI cube and vector cores."""

    name: str
    total_memory: int
    multi_processor_count: int
    cube_core_num: int
    vector_core_num: int


def _host_properties() -> HostDeviceProperties:
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not POSIX
        memory = 0
    cores = os.cpu_count() or 1
    return HostDeviceProperties("CPU (NPU emulated by torchair)", memory, cores, cores, cores)


class _HostDevice:
    """``torch.npu.device(i)`` on the CPU: checks ``i`` and does nothing (one device)."""

    def __init__(self, device: Any) -> None:
        to_emulated(torch._C.device("cpu"), device)
        self.idx = 0

    def __enter__(self) -> _HostDevice:
        return self

    def __exit__(self, *exc: object) -> bool:
        return False


def _cuda_api(target: torch.device) -> dict[str, Callable[..., Any] | type]:
    cuda = torch.cuda

    def on(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(device: Any = None) -> Any:
            return fn(to_emulated(target, device))
        call.__name__ = fn.__name__
        return call

    api: dict[str, Any] = {name: on(getattr(cuda, name)) for name in (
        *_MEMORY, "synchronize", "get_device_name", "get_device_properties",
        "reset_peak_memory_stats")}
    api.update(
        device_count=cuda.device_count, current_device=cuda.current_device,
        set_device=lambda device: cuda.set_device(to_emulated(target, device)),
        device=cuda.device, empty_cache=cuda.empty_cache, manual_seed=cuda.manual_seed,
        manual_seed_all=cuda.manual_seed_all, seed=cuda.seed, seed_all=cuda.seed_all,
        initial_seed=cuda.initial_seed, get_rng_state=cuda.get_rng_state,
        set_rng_state=cuda.set_rng_state, is_bf16_supported=cuda.is_bf16_supported)
    return api


def _host_api() -> dict[str, Callable[..., Any] | type]:
    cpu = torch._C.device("cpu")

    def checked(result: Callable[[], Any], name: str) -> Callable[..., Any]:
        def call(device: Any = None) -> Any:
            to_emulated(cpu, device)
            return result()
        call.__name__ = name
        return call

    current = [0]  # the index the script set (its local rank under the launcher)

    def set_device(device: Any) -> None:
        to_emulated(cpu, device)
        index = device_index_of(device)
        if index is not None:
            if index < 0:
                raise ValueError(f"torch.npu.set_device({device!r}): a device index must be "
                                 ">= 0")
            current[0] = index
        logger.debug("torch.npu.set_device(%r): the emulated NPU is the CPU", device)

    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    api: dict[str, Any] = {name: checked(lambda: 0, name) for name in _MEMORY}
    for name, result in (("synchronize", lambda: None), ("reset_peak_memory_stats", lambda: None),
                         ("get_device_name", lambda: _host_properties().name),
                         ("get_device_properties", _host_properties)):
        api[name] = checked(result, name)
    api.update(
        device_count=lambda: 1, current_device=lambda: current[0], set_device=set_device,
        device=_HostDevice, empty_cache=lambda: None, manual_seed=manual_seed,
        manual_seed_all=manual_seed, seed=torch.seed, seed_all=torch.seed,
        initial_seed=torch.initial_seed, get_rng_state=lambda device="npu": torch.get_rng_state(),
        set_rng_state=lambda new_state, device="npu": torch.set_rng_state(new_state),
        is_bf16_supported=lambda: True)
    return api


def _module(name: str, doc: str, api: dict[str, Any]) -> types.ModuleType:
    module = types.ModuleType(name, doc)
    for key, value in api.items():
        if isinstance(value, types.FunctionType) and value.__name__ == "<lambda>":
            value.__name__ = key
        if isinstance(value, types.FunctionType) and value.__module__.startswith("torchair"):
            value.__qualname__ = key
            value.__module__ = name
        setattr(module, key, value)
    module.__getattr__ = module_getattr(name)
    return module


def make_npu_namespace(target: torch.device) -> types.ModuleType:
    """The ``torch.npu`` / ``torch_npu.npu`` module for ``target``; ``.utils`` is
    ``torch_npu.npu.utils``."""
    api = _cuda_api(target) if target.type == "cuda" else _host_api()
    api.update(stream_api(target))
    api.update(settings_api())
    api.update(is_available=lambda: True, is_initialized=lambda: True, init=lambda: None)
    ns = _module("torch_npu.npu", f"torch.npu emulated by torchair on {target}", api)
    utils = {name: getattr(ns, name) for name in _UTILS}
    utils.update(
        # No CANN off Ascend: an empty version, and no feature gate "CANN >= v" holds.
        get_cann_version=lambda module="CANN": "",
        _is_gte_cann_version=lambda version, module="CANN": False,
        is_support_inf_nan=lambda: True)  # CPU and CUDA keep inf/nan (no overflow flag)
    ns.utils = _module("torch_npu.npu.utils", "torch_npu.npu.utils emulated by torchair", utils)
    return ns
