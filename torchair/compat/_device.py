"""The emulated NPU device: which real device stands in for it, and the ``torch.npu`` namespace.

An Ascend script's "npu" is CUDA when a GPU is present, else the CPU. Device arguments written
for Ascend (``"npu"``, ``"npu:1"``, ``1``) are mapped onto that device.
"""
from __future__ import annotations

import types
from typing import Any

import torch

from torchair.compat._errors import module_getattr
from torchair.core.utils import logger

__all__ = ["make_npu_namespace", "resolve_device", "to_emulated"]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The real device that plays the NPU: ``device`` ("cpu" or "cuda[:i]") or the best present."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"emulate_npu: device={device!r} is not a device; expected 'cpu' or "
                         "'cuda' (or None to pick CUDA when available)") from err
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"emulate_npu: device={device!r} is not supported; expected 'cpu' or "
                         "'cuda' (or None to pick CUDA when available)")
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"emulate_npu: device={device!r} was asked for but CUDA is not "
                           "available here; use device='cpu'")
    return resolved


def _index_of(device: Any) -> int | None:
    """The device index an Ascend device argument names, or None for "the current one"."""
    if device is None:
        return None
    if isinstance(device, bool):
        raise TypeError(f"npu device must be an int, 'npu[:i]' or a torch.device; got {device!r}")
    if isinstance(device, int):
        return device
    if isinstance(device, torch.device):
        return device.index
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind in ("npu", "cuda", "cpu") and (not index or index.isdigit()):
            return int(index) if index else None
    raise ValueError(f"npu device {device!r} is not understood; expected an int, 'npu', "
                     "'npu:<i>' or a torch.device")


def to_emulated(target: torch.device, device: Any = None) -> torch.device:
    """The real device for an Ascend device argument (``None``, an index, ``"npu:i"``)."""
    if target.type == "cpu":
        _index_of(device)  # still reject nonsense
        return target
    index = _index_of(device)
    if index is None:
        index = target.index if target.index is not None else torch.cuda.current_device()
    return torch.device("cuda", index)


def make_npu_namespace(target: torch.device) -> types.ModuleType:
    """The ``torch.npu`` / ``torch_npu.npu`` module: device queries answered by ``target``."""
    ns = types.ModuleType("torch_npu.npu", "torch.npu emulated by torchair on " + str(target))
    cuda = target.type == "cuda"

    def is_available() -> bool:
        return True

    def device_count() -> int:
        return torch.cuda.device_count() if cuda else 1

    def current_device() -> int:
        return torch.cuda.current_device() if cuda else 0

    def set_device(device: Any) -> None:
        real = to_emulated(target, device)
        if cuda:
            torch.cuda.set_device(real)
        else:
            logger.debug("torch.npu.set_device(%r): the emulated NPU is the CPU", device)

    def synchronize(device: Any = None) -> None:
        if cuda:
            torch.cuda.synchronize(to_emulated(target, device))

    def get_device_name(device: Any = None) -> str:
        if cuda:
            return torch.cuda.get_device_name(to_emulated(target, device))
        return "CPU (NPU emulated by torchair)"

    def empty_cache() -> None:
        if cuda:
            torch.cuda.empty_cache()

    def manual_seed(seed: int) -> None:
        if cuda:
            torch.cuda.manual_seed(seed)
        else:
            torch.manual_seed(seed)

    def manual_seed_all(seed: int) -> None:
        if cuda:
            torch.cuda.manual_seed_all(seed)
        else:
            torch.manual_seed(seed)

    def set_compile_mode(jit_compile: bool = False) -> None:
        logger.debug("torch.npu.set_compile_mode(jit_compile=%r): nothing to do off Ascend",
                     jit_compile)

    for fn in (is_available, device_count, current_device, set_device, synchronize,
               get_device_name, empty_cache, manual_seed, manual_seed_all, set_compile_mode):
        fn.__module__ = ns.__name__
        fn.__qualname__ = fn.__name__
        setattr(ns, fn.__name__, fn)
    # ``torch.npu.config.allow_internal_format``: internal (FRACTAL_*) formats do not exist here.
    ns.config = types.SimpleNamespace(allow_internal_format=False)
    ns.__getattr__ = module_getattr("torch_npu.npu")
    return ns

