"""``torch_npu`` as a package: ``import torch_npu.X`` and ``from torch_npu.X import Y``.

The emulated modules (``torch_npu``, ``torch_npu.npu``, ``.npu.utils``, ``.distributed``) carry
a ``__path__``, so Python looks their submodules up instead of answering "'torch_npu' is not a
package", and :class:`TorchNpuFinder` (first on ``sys.meta_path`` while emulated) answers every
``torch_npu.*`` name that is not in ``sys.modules``:

- ``torch_npu.contrib`` and ``torch_npu.contrib.transfer_to_npu`` are emulated. On Ascend,
  importing ``transfer_to_npu`` makes CUDA code run on the NPU (``torch.cuda.*`` become
  ``torch.npu.*``, ``"cuda"`` device arguments ``"npu"``, ``.cuda()`` ``.npu()``, ``nccl``
  ``hccl``). On a CUDA emulation the NPU is CUDA, so it changes nothing. On the CPU,
  :func:`transfer_patches` makes ``"cuda"`` / ``"cuda:i"`` / ``torch.device("cuda")`` device
  arguments mean the CPU (the device mode and the ``torch.device`` stand-in), ``Tensor.cuda`` /
  ``Module.cuda`` the emulation's ``.npu``, ``torch.cuda``'s device, stream, event and memory
  functions (:data:`CUDA_AS_NPU`) the emulated ``torch.npu``'s when the script calls them
  (torch's own modules and compiled code keep the CPU build's answers: ``is_available()`` is
  False there), and ``backend="nccl"`` gloo.
- any other ``torch_npu.*`` module raises ``ModuleNotFoundError`` naming it and saying what is
  emulated.
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, Callable

from torchair.base.log import logger
from torchair.compat._errors import module_getattr

__all__ = ["CUDA_AS_NPU", "EMULATED_MODULES", "TorchNpuFinder", "make_package",
           "not_emulated_module", "transfer_patches"]

# torch.cuda names that transfer_to_npu points at torch.npu on a CPU emulation. Not the seeds
# and RNG state: torch.manual_seed itself calls torch.cuda.manual_seed_all, which must stay
# torch's (a lazy no-op without CUDA).
CUDA_AS_NPU = ("is_available", "is_initialized", "init", "device_count", "current_device",
               "set_device", "synchronize", "get_device_name", "get_device_properties",
               "memory_allocated", "max_memory_allocated", "memory_reserved",
               "max_memory_reserved", "reset_peak_memory_stats", "empty_cache", "Stream",
               "Event", "stream", "current_stream", "default_stream", "set_stream", "device",
               "is_bf16_supported")
EMULATED_MODULES = ("torch_npu", "torch_npu.npu", "torch_npu.npu.utils", "torch_npu.distributed",
                    "torch_npu.contrib", "torch_npu.contrib.transfer_to_npu")


def make_package(module: types.ModuleType) -> types.ModuleType:
    """Give ``module`` a package's ``__path__`` and ``__spec__`` (its name is kept)."""
    module.__path__ = []
    module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None, is_package=True)
    return module


def not_emulated_module(name: str) -> ModuleNotFoundError:
    """The error for ``import <name>``, a torch_npu submodule the emulation does not have."""
    return ModuleNotFoundError(
        f"No module named {name!r}: {name} is Ascend-only and not emulated by torchair run. "
        f"The emulated torch_npu modules are {', '.join(EMULATED_MODULES)}. Remove the import "
        "or guard it for non-Ascend runs (try: ... except ImportError).", name=name)


class TorchNpuFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``torch_npu.contrib`` (and ``.transfer_to_npu``); refuses other submodules.

    ``on_transfer`` is called when a script imports ``torch_npu.contrib.transfer_to_npu``.
    ``served`` lists the modules it created (``restore()`` removes them from ``sys.modules``).
    """

    def __init__(self, on_transfer: Callable[[], None]) -> None:
        self.on_transfer = on_transfer
        self.served: list[str] = []

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if not fullname.startswith("torch_npu."):
            return None
        if fullname == "torch_npu.contrib":
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        if fullname == "torch_npu.contrib.transfer_to_npu":
            return importlib.machinery.ModuleSpec(fullname, self)
        raise not_emulated_module(fullname)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name, f"{spec.name} emulated by torchair")
        module.__getattr__ = module_getattr(spec.name)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        self.served.append(module.__name__)
        if module.__name__ == "torch_npu.contrib.transfer_to_npu":
            self.on_transfer()

    def remove_served(self) -> None:
        """Take the modules this finder created out of ``sys.modules``."""
        for name in self.served:
            sys.modules.pop(name, None)
        self.served.clear()


_SCRIPT_WRAPPERS: list = []  # what _for_scripts made, for inline_script_wrappers


def inline_script_wrappers() -> None:
    """Keep the ``torch.cuda`` stand-ins of :func:`_for_scripts` out of Dynamo's table of torch
    functions. Dynamo builds that table once, by name: built after transfer_to_npu, it took the
    stand-ins for torch ops and called them at trace time (torch's answer); out of it, Dynamo
    inlines them and they give the script's. Called after each ``torch.compile`` of an
    emulated script and when transfer_to_npu is imported; nothing before Dynamo is imported."""
    if not _SCRIPT_WRAPPERS or "torch._dynamo" not in sys.modules:
        return
    try:
        from torch._dynamo import trace_rules

        rules = trace_rules.get_torch_obj_rule_map()
    except (ImportError, AttributeError):  # another PyTorch's internals: torch's answer stays
        return
    for wrapper in _SCRIPT_WRAPPERS:
        rules.pop(wrapper, None)


def _for_scripts(original: Any, npu: Any) -> Any:
    """``npu`` for the script's calls, eager and traced; ``original`` for torch's own modules.

    torch asks ``torch.cuda`` too (Dynamo saves the CUDA RNG state when
    ``torch.cuda.is_available()``, the DataLoader pins memory ...): there the answers stay the
    CPU build's. Code Dynamo traces gets the script's answer, as eager does (the NPU's, folded
    to a constant), so a function that branches on ``torch.cuda.is_available()`` takes the same
    branch compiled; the emulation's ``cuda`` flag, in its mode's tag, keeps cache_compile
    entries traced with and without transfer_to_npu apart. Classes (``Stream``, ``Event``,
    ``device``) are replaced as they are."""
    import torch

    if isinstance(npu, type) or not callable(npu):
        return npu

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_dynamo_compiling():  # True only in code Dynamo traces: the
            return npu(*args, **kwargs)  # script's (Dynamo folds the NPU's answer)
        if torch.compiler.is_compiling():  # Dynamo's / AOTAutograd's own calls while compiling
            return original(*args, **kwargs)
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller != "torch" and not caller.startswith("torch."):
            return npu(*args, **kwargs)
        return original(*args, **kwargs)

    # torchair's own function to Dynamo, which inlines it (as torch.cuda's, it was taken for a
    # torch op and called at trace time, with torch's answer)
    call.__module__ = __name__
    del call.__wrapped__  # (Dynamo's trace rules look through it to the torch function)
    _SCRIPT_WRAPPERS.append(call)
    return call


def transfer_patches(target: Any, npu_ns: types.ModuleType, tensor_npu: Callable[..., Any],
                     module_npu: Callable[..., Any]) -> list[tuple[Any, str, Any]]:
    """``(owner, name, value)`` patches of ``transfer_to_npu`` for a CPU emulation (see module
    doc); nothing on CUDA, where the NPU already is CUDA."""
    import torch

    if target.type != "cpu":
        logger.info("torch_npu.contrib.transfer_to_npu: the emulated NPU is CUDA, nothing to "
                    "transfer")
        return []
    logger.info("torch_npu.contrib.transfer_to_npu: 'cuda' devices and torch.cuda calls are "
                "the emulated NPU (the CPU)")
    patches: list[tuple[Any, str, Any]] = [
        (torch.cuda, name, _for_scripts(getattr(torch.cuda, name), getattr(npu_ns, name)))
        for name in CUDA_AS_NPU if hasattr(torch.cuda, name)]
    patches += [(torch.Tensor, "cuda", tensor_npu), (torch.nn.Module, "cuda", module_npu)]
    return patches
