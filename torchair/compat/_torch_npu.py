"""The emulated ``torch_npu`` module object.

Its ``npu_*`` functions (:data:`TORCH_NPU_OPS`: the ones ``torch_npu`` itself has) are the
torchair op library's ops, reached through ``torch.ops.npu`` so Dynamo traces them as the same
graph nodes as on Ascend. TorchAir's own ops (``npu_print``, the tagged events) live in
``torchair.ops`` only, as on Ascend. Any other name raises :class:`NotEmulatedError` naming it.
"""
from __future__ import annotations

import importlib.machinery
import types

import torch

import torchair
from torchair.compat._errors import module_getattr
from torchair.ops import TORCH_NPU_OPS  # torch_npu.<name> is torch.ops.npu.<name> for each

__all__ = ["TORCH_NPU_OPS", "get_npu_format", "make_torch_npu", "npu_format_cast",
           "npu_format_cast_"]

_FORMAT_ND = 2  # ACL_FORMAT_ND: the only layout that exists off Ascend


def npu_format_cast(tensor: torch.Tensor, acl_format: int) -> torch.Tensor:
    """Return ``tensor`` unchanged.

    Ascend stores some tensors in internal layouts (e.g. FRACTAL_NZ = 29) that its kernels
    prefer; CPU and CUDA kernels read the plain (ND) layout, so the cast is the identity here.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"torch_npu.npu_format_cast: expected a Tensor as first argument; got "
                        f"{type(tensor).__name__}")
    if isinstance(acl_format, bool) or not isinstance(acl_format, int):
        raise TypeError(f"torch_npu.npu_format_cast: acl_format must be an int (an ACL format "
                        f"id such as 2 for ND or 29 for FRACTAL_NZ); got {acl_format!r}")
    return tensor


def npu_format_cast_(tensor: torch.Tensor, acl_format: int | torch.Tensor) -> torch.Tensor:
    """The in-place form (``npu_format_cast_(weight, 29)``, or a tensor whose format to take):
    ``tensor`` unchanged and returned, as :func:`npu_format_cast`."""
    if isinstance(acl_format, torch.Tensor):
        acl_format = _FORMAT_ND  # another tensor's format: always ND here
    return npu_format_cast(tensor, acl_format)


def get_npu_format(tensor: torch.Tensor) -> int:
    """The ACL format id of ``tensor``: always ND (2), see :func:`npu_format_cast`."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"torch_npu.get_npu_format: expected a Tensor; got "
                        f"{type(tensor).__name__}")
    return _FORMAT_ND


def make_torch_npu(npu_namespace: types.ModuleType) -> types.ModuleType:
    """A fresh ``torch_npu`` module whose ``npu`` attribute is ``npu_namespace``."""
    mod = types.ModuleType("torch_npu", "torch_npu emulated by torchair (see torchair.compat)")
    mod.__spec__ = importlib.machinery.ModuleSpec("torch_npu", None)
    mod.__version__ = f"{torchair.__version__}+torchair.emulated"
    mod.npu = npu_namespace
    for name in TORCH_NPU_OPS:
        setattr(mod, name, getattr(torch.ops.npu, name))
    mod.npu_format_cast = npu_format_cast
    mod.npu_format_cast_ = npu_format_cast_
    mod.get_npu_format = get_npu_format
    mod.__getattr__ = module_getattr("torch_npu")
    return mod
