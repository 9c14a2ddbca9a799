"""The emulated NPU device: which real device stands in for it.

An Ascend script's "npu" is CUDA when a GPU is present, else the CPU. Device arguments written
for Ascend (``"npu"``, ``"npu:1"``, ``1``) are mapped onto that device; on the CPU the index is
dropped (there is one CPU device).
"""
from __future__ import annotations

from typing import Any

import torch

__all__ = ["emulated_string", "resolve_device", "to_emulated"]

_REAL_DEVICE = torch._C.device  # torch.device itself: it is replaced while emulating


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The real device that plays the NPU: ``device`` ("cpu" or "cuda[:i]") or the best present."""
    if device is None:
        return _REAL_DEVICE("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = _REAL_DEVICE(device)
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


def device_index_of(device: Any) -> int | None:
    """The device index an Ascend device argument names, or None for "the current one"."""
    if device is None:
        return None
    if isinstance(device, bool):
        raise TypeError(f"npu device must be an int, 'npu[:i]' or a torch.device; got {device!r}")
    if isinstance(device, int):
        return device
    if isinstance(device, _REAL_DEVICE):
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
        device_index_of(device)  # still reject nonsense
        return _REAL_DEVICE("cpu")
    index = device_index_of(device)
    if index is None:
        index = target.index if target.index is not None else torch.cuda.current_device()
    return _REAL_DEVICE("cuda", index)


def emulated_string(target: torch.device, device: Any = None) -> str:
    """:func:`to_emulated` as a string ("cpu", "cuda", "cuda:1"), for code Dynamo traces."""
    index = device_index_of(device)
    if target.type == "cpu":
        return "cpu"
    if index is None:
        return str(target)
    return f"cuda:{index}"
