"""Install and undo the ``torch_npu`` emulation.

:func:`emulate_npu` patches, and records so that :func:`restore` can undo exactly:

- ``sys.modules["torch_npu"]`` and ``sys.modules["torch_npu.npu"]`` (the emulated modules);
- ``torch.npu`` (the same namespace as ``torch_npu.npu``);
- ``torch.Tensor.npu``, ``torch.Tensor.is_npu`` and ``torch.nn.Module.npu``.

Nothing is patched until :func:`emulate_npu` is called; importing torchair patches nothing.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

import torch

from torchair.compat._device import make_npu_namespace, resolve_device, to_emulated
from torchair.compat._torch_npu import make_torch_npu
from torchair.core.utils import logger

__all__ = ["Emulation", "emulate_npu", "is_emulated", "restore"]

_MISSING = object()
_active: Emulation | None = None


class Emulation:
    """A handle on the emulation; also a context manager that restores on exit.

    ``device`` is the real device playing the NPU, or None when the real ``torch_npu`` is
    installed and nothing was emulated (``emulated`` is then False).
    """

    def __init__(self, device: torch.device | None, owner: bool) -> None:
        self.device = device
        self._owner = owner  # only the call that installed the patches undoes them on exit
        self._undo: list[tuple[Any, str, Any]] = []

    @property
    def emulated(self) -> bool:
        return self.device is not None

    def __enter__(self) -> Emulation:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._owner:
            self.restore()

    def __repr__(self) -> str:
        state = f"on {self.device}" if self.emulated else "not installed (real torch_npu)"
        return f"<torchair.compat.Emulation {state}>"

    def _set(self, owner: Any, name: str, value: Any) -> None:
        old = owner.get(name, _MISSING) if isinstance(owner, dict) else vars(owner).get(
            name, _MISSING)
        self._undo.append((owner, name, old))
        if isinstance(owner, dict):
            owner[name] = value
        else:
            setattr(owner, name, value)

    def restore(self) -> None:
        """Undo every patch of this emulation, newest first; a second call does nothing."""
        global _active
        while self._undo:
            owner, name, old = self._undo.pop()
            if isinstance(owner, dict):
                if old is _MISSING:
                    owner.pop(name, None)
                else:
                    owner[name] = old
            elif old is _MISSING:
                if name in vars(owner):
                    delattr(owner, name)
            else:
                setattr(owner, name, old)
        if _active is self:
            _active = None
            logger.info("torch_npu emulation removed")


def _real_torch_npu() -> bool:
    """Whether the real ``torch_npu`` is importable (it is then imported, as a script would)."""
    if "torch_npu" in sys.modules:
        return True
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:
        importlib.import_module("torch_npu")
    except Exception as err:  # noqa: BLE001 (a broken install: emulate, do not fail the script)
        logger.warning("torch_npu is installed but cannot be imported (%s: %s); emulating it",
                       type(err).__name__, err)
        sys.modules.pop("torch_npu", None)
        return False
    return True


def emulate_npu(device: str | torch.device | None = None) -> Emulation:
    """Make scripts written for Ascend (``torch_npu`` + TorchAir) run unchanged on CPU or CUDA.

    When the real ``torch_npu`` cannot be imported, install a ``torch_npu`` module whose
    ``npu_*`` ops are torchair's, ``Tensor.npu`` / ``Module.npu`` that move to ``device``
    ("cpu" or "cuda"; default CUDA when available, else CPU) and a ``torch.npu`` namespace.
    Returns a handle; use it as a context manager or call :func:`restore` to undo. Calling it
    again while installed returns a handle that does not own the patches (same device only).
    """
    global _active
    target = resolve_device(device)
    if _active is not None:
        if device is not None and target != _active.device:
            raise RuntimeError(f"emulate_npu(device={device!r}): the emulation is already "
                               f"installed on {_active.device}; call torchair.compat.restore() "
                               "first")
        return Emulation(_active.device, owner=False)
    if _real_torch_npu():
        logger.info("the real torch_npu is installed: nothing emulated")
        return Emulation(None, owner=False)

    emulation = Emulation(target, owner=True)
    npu_ns = make_npu_namespace(target)
    torch_npu = make_torch_npu(npu_ns)

    def tensor_npu(self: torch.Tensor, device: Any = None, non_blocking: bool = False,
                   memory_format: torch.memory_format = torch.preserve_format) -> torch.Tensor:
        return self.to(to_emulated(target, device), non_blocking=non_blocking,
                       memory_format=memory_format)

    def module_npu(self: torch.nn.Module, device: Any = None) -> torch.nn.Module:
        return self.to(to_emulated(target, device))

    tensor_npu.__name__ = tensor_npu.__qualname__ = "npu"
    module_npu.__name__ = module_npu.__qualname__ = "npu"
    emulation._set(sys.modules, "torch_npu", torch_npu)
    emulation._set(sys.modules, "torch_npu.npu", npu_ns)
    emulation._set(torch, "npu", npu_ns)
    emulation._set(torch.Tensor, "npu", tensor_npu)
    emulation._set(torch.Tensor, "is_npu", property(lambda self: self.device.type == target.type))
    emulation._set(torch.nn.Module, "npu", module_npu)
    _active = emulation
    logger.info("torch_npu emulated by torchair: the NPU is %s", target)
    return emulation


def is_emulated() -> bool:
    """Whether the emulation is installed now."""
    return _active is not None


def restore() -> None:
    """Undo the installed emulation, if any."""
    if _active is not None:
        _active.restore()
