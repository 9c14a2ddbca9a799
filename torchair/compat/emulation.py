"""Install and undo the ``torch_npu`` emulation.

:func:`emulate_npu` patches, and records so that :func:`restore` can undo exactly:

- ``sys.modules["torch_npu"]``, ``["torch_npu.npu"]`` and ``["torch_npu.npu.utils"]`` (the
  emulated modules);
- ``torch.npu`` (the same namespace as ``torch_npu.npu``);
- ``torch.Tensor.npu``, ``torch.Tensor.is_npu`` and ``torch.nn.Module.npu``;
- ``torch.distributed.init_process_group`` / ``new_group`` (HCCL played by gloo or NCCL) and
  ``sys.modules["torch_npu.distributed"]`` (see :mod:`._distributed`);
- ``torch.device`` (a stand-in that maps ``"npu"``) and a ``TorchFunctionMode`` on this
  thread's mode stack that maps ``device="npu[:i]"`` arguments (see :mod:`._mode`);
- ``threading.Thread._bootstrap_inner`` (threads the script starts get the mode), ``sys.path``,
  ``$PYTHONPATH`` and ``$TORCHAIR_NPU_EMULATION`` (child processes get the emulation) (see
  :mod:`._children`);
- a finder first on ``sys.meta_path`` for ``torch_npu.*`` submodules, ``torch_npu.contrib``
  and ``transfer_to_npu`` (see :mod:`._submodules`).

Nothing is patched until :func:`emulate_npu` is called; importing torchair patches nothing.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
from typing import Any, Callable

import torch

from torchair.base.log import logger
from torchair.compat._children import DEVICE_ENV, child_env_patches, is_shim, thread_bootstrap
from torchair.compat._device import emulated_string, resolve_device
from torchair.compat._distributed import distributed_patches, make_torch_npu_distributed
from torchair.compat._mode import (
    NpuDeviceMode,
    make_device_class,
    pop_mode,
    route_factories,
    routes_factories_after_compile,
    unroute_factories,
)
from torchair.compat._npu_namespace import make_npu_namespace
from torchair.compat._streams import host_record_stream
from torchair.compat._submodules import TorchNpuFinder, inline_script_wrappers, make_package, transfer_patches
from torchair.compat._torch_npu import make_torch_npu
from torchair.core.function_modes import register_process_mode

__all__ = ["Emulation", "emulate_npu", "install_in_child", "is_emulated", "restore"]

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
        self._undo: list[Callable[[], None]] = []
        self.mode: NpuDeviceMode | None = None  # the device mode, on the installing thread

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
        """Set ``owner[name]`` (a dict) or ``owner.name``, recording how to undo it."""
        is_dict = isinstance(owner, dict)
        old = (owner if is_dict else vars(owner)).get(name, _MISSING)

        def undo() -> None:
            if is_dict and old is _MISSING:
                owner.pop(name, None)
            elif is_dict:
                owner[name] = old
            elif old is not _MISSING:
                setattr(owner, name, old)
            elif name in vars(owner):
                delattr(owner, name)

        if is_dict:
            owner[name] = value
        else:
            setattr(owner, name, value)
        self._undo.append(undo)

    def _push_mode(self, mode: NpuDeviceMode) -> None:
        mode.__enter__()

        def pop() -> None:
            if not pop_mode(mode):
                logger.warning("torch_npu emulation: its device mode was no longer on the "
                               "torch-function mode stack (popped by other code?)")
        self._undo.append(pop)

    def restore(self) -> None:
        """Undo every patch of this emulation, newest first; a second call does nothing."""
        global _active
        while self._undo:
            self._undo.pop()()
        if _active is self:
            _active = None
            logger.info("torch_npu emulation removed")


def _real_torch_npu() -> bool:
    """Whether the real ``torch_npu`` is importable (it is then imported, as a script would)."""
    if "torch_npu" in sys.modules:  # torchair's shim is importing (a child process): emulate
        return not is_shim(sys.modules["torch_npu"])
    spec = importlib.util.find_spec("torch_npu")
    if spec is None or is_shim(spec):  # the shim: a child of an emulated process
        return False
    try:
        importlib.import_module("torch_npu")
    except Exception as err:  # noqa: BLE001 (a broken install: emulate, do not fail the script)
        logger.warning("torch_npu is installed but cannot be imported (%s: %s); emulating it",
                       type(err).__name__, err)
        sys.modules.pop("torch_npu", None)
        return False
    return True


def _active_mode() -> NpuDeviceMode | None:
    return _active.mode if _active is not None else None


# the emulation's patches beside its mode (the torch.device stand-in) act in every thread
register_process_mode(_active_mode)


def emulate_npu(device: str | torch.device | None = None) -> Emulation:
    """Make scripts written for Ascend (``torch_npu`` + TorchAir) run unchanged on CPU or CUDA.

    When the real ``torch_npu`` cannot be imported, install a ``torch_npu`` module whose
    ``npu_*`` ops are torchair's, ``Tensor.npu`` / ``Module.npu`` that move to ``device``
    ("cpu" or "cuda"; default CUDA when available, else CPU), a ``torch.npu`` namespace
    (devices, streams, events, seeds, memory queries, Ascend switches), and make ``"npu"``,
    ``"npu:<i>"`` and ``torch.device("npu", i)`` mean ``device`` wherever torch takes a device.
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
        return self.to(emulated_string(target, device), non_blocking=non_blocking,
                       memory_format=memory_format)

    def module_npu(self: torch.nn.Module, device: Any = None) -> torch.nn.Module:
        return self.to(emulated_string(target, device))

    tensor_npu.__name__ = tensor_npu.__qualname__ = "npu"
    module_npu.__name__ = module_npu.__qualname__ = "npu"
    mode = NpuDeviceMode(str(target))

    def transfer_to_npu() -> None:  # `import torch_npu.contrib.transfer_to_npu`
        patches = transfer_patches(target, npu_ns, tensor_npu, module_npu)
        if patches and not mode.cuda:
            for owner, name, value in patches:
                emulation._set(owner, name, value)
            mode.cuda = True
            emulation._undo.append(lambda: setattr(mode, "cuda", False))
            inline_script_wrappers()

    finder = TorchNpuFinder(transfer_to_npu)
    emulation._set(sys.modules, "torch_npu", make_package(torch_npu))
    emulation._set(sys.modules, "torch_npu.npu", make_package(npu_ns))
    emulation._set(sys.modules, "torch_npu.npu.utils", make_package(npu_ns.utils))
    if torch.distributed.is_available():
        torch_npu.distributed = make_package(make_torch_npu_distributed())
        emulation._set(sys.modules, "torch_npu.distributed", torch_npu.distributed)
    sys.meta_path.insert(0, finder)
    emulation._undo.append(lambda: (sys.meta_path.remove(finder) if finder in sys.meta_path
                                    else None, finder.remove_served()))
    for owner, name, value in distributed_patches(target, lambda: mode.cuda):
        emulation._set(owner, name, value)
    emulation._set(torch, "npu", npu_ns)
    emulation._set(torch.Tensor, "npu", tensor_npu)
    if target.type == "cpu":  # a host stream is not a torch.Stream (see _streams.HostStream)
        emulation._set(torch.Tensor, "record_stream", host_record_stream)
    emulation._set(torch.Tensor, "is_npu", property(lambda self: self.device.type == target.type))
    emulation._set(torch.nn.Module, "npu", module_npu)
    emulation._set(torch, "device", make_device_class(str(target), mode))
    emulation._push_mode(mode)
    emulation.mode = mode
    emulation._set(threading.Thread, "_bootstrap_inner", thread_bootstrap(mode))
    emulation._undo.extend(child_env_patches(str(target)))
    routed: list = []  # factories Dynamo routes through the mode because of us (torch 2.11)
    if "torch._dynamo" in sys.modules:
        routed += route_factories()
    emulation._set(torch, "compile", routes_factories_after_compile(torch.compile, routed,
                                                                    inline_script_wrappers))
    emulation._undo.append(lambda: unroute_factories(routed))
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


def install_in_child() -> None:
    """Install the emulation in a child process on ``$TORCHAIR_NPU_EMULATION`` (the shim's
    import); ``sys.modules["torch_npu"]`` is then the emulated module."""
    emulate_npu(os.environ.get(DEVICE_ENV) or None)
