"""``torchair.experimental.inference``: weight layouts for inference.

Ascend kernels prefer some weights in internal layouts (FRACTAL_NZ for ``nn.Linear``,
FRACTAL_Z for fp16 ``nn.Conv2d``); TorchAir converts them once before compiling. CPU and CUDA
kernels read the plain row-major layout (ACL's ND), so the conversion here is the identity: both
functions check their arguments as TorchAir does and leave the values, shapes and storage alone.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from torchair.base.log import logger

__all__ = ["npu_format_cast_via_cpu", "use_internal_format_weight"]

FORMAT_ND = 2
FORMAT_FRACTAL_Z = 4  # fp16 Conv2d weights on Ascend
FORMAT_FRACTAL_NZ = 29  # Linear weights on Ascend


def _check_format_id(name: str, value: Any, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        what = "an int or None" if optional else "an int"
        raise TypeError(f"npu_format_cast_via_cpu: {name} must be {what} (an ACL "
                        f"{'format' if name == 'acl_format' else 'dtype'} id), got "
                        f"{type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"npu_format_cast_via_cpu: {name} must be a non-negative ACL id, got "
                         f"{value}")


def npu_format_cast_via_cpu(self: torch.Tensor, acl_format: int,
                            customize_dtype: Optional[int] = None,
                            input_dtype: Optional[int] = None) -> torch.Tensor:
    """``self`` in the layout ``acl_format``, converted on the host (Ascend).

    Off Ascend every layout is ND: returns ``self`` as a contiguous tensor (``self`` itself when
    it already is). ``customize_dtype`` / ``input_dtype`` (ACL dtype ids of Ascend's packed
    formats) are checked and have no effect.
    """
    if not isinstance(self, torch.Tensor):
        raise TypeError(f"npu_format_cast_via_cpu: self must be a torch.Tensor, got "
                        f"{type(self).__name__}")
    _check_format_id("acl_format", acl_format)
    _check_format_id("customize_dtype", customize_dtype, optional=True)
    _check_format_id("input_dtype", input_dtype, optional=True)
    return self.contiguous()


def _internal_format(module: torch.nn.Module) -> Optional[int]:
    if isinstance(module, torch.nn.Linear):
        return FORMAT_FRACTAL_NZ
    if isinstance(module, torch.nn.Conv2d) and module.groups == 1 and \
            module.weight.dtype == torch.float16:
        return FORMAT_FRACTAL_Z
    return None


def use_internal_format_weight(model: torch.nn.Module) -> None:
    """Cast the weights of ``model``'s ``nn.Linear`` (FRACTAL_NZ) and fp16 ``nn.Conv2d``
    (FRACTAL_Z) layers to Ascend's internal layouts, in place; returns None.

    Off Ascend the internal layout is the plain one, so every weight keeps its values, shape
    and storage (each cast is logged at DEBUG). Call it before compiling, as with TorchAir.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"use_internal_format_weight: model must be a torch.nn.Module, got "
                        f"{type(model).__name__}")
    casts = 0
    for name, module in model.named_modules():
        acl_format = _internal_format(module)
        weight = getattr(module, "weight", None)
        if acl_format is None or not isinstance(weight, torch.Tensor):
            continue
        cast = npu_format_cast_via_cpu(weight.data, acl_format)
        if cast is not weight.data:
            weight.data = cast
        casts += 1
        logger.debug("use_internal_format_weight: %s.weight -> format %d (ND off Ascend: "
                     "values and storage unchanged)", name or type(module).__name__, acl_format)
    logger.debug("use_internal_format_weight: %d weights cast", casts)
    return None
