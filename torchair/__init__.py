"""torchair: TorchAir's graph-mode ``torch.compile`` backend for CPU and CUDA GPUs.

    import torchair
    config = torchair.CompilerConfig()
    config.experimental_config.tiling_schedule_optimize = True
    model = torch.compile(model, backend=torchair.get_npu_backend(compiler_config=config),
                          dynamic=True, fullgraph=True)      # or backend="torchair"
    torchair.graph_reports()[-1]   # static or not, and why

TorchAir's public names and where each stands here (works / no effect here / not supported):
``torchair.base.parity.PUBLIC_API``.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

from torchair import inference, ops, scope
from torchair.base.log import logger as _logger
from torchair.base.parity import unsupported_reason as _unsupported_reason
from torchair.base.version import VERSION as _VERSION
from torchair.configs.compiler_config import CompilerConfig
from torchair.plan.report import GraphReport, graph_reports

__version__ = _VERSION

# The compiler (backend, pipeline, passes, patterns) loads on first use, so a process that only
# runs cache_compile's warm entries never imports it (nor the sympy/decomposition machinery).
# Importing torchair patches nothing (torchair.compat patches only inside emulate_npu()).
_LAZY = {"get_compiler": "torchair.core.backend", "get_npu_backend": "torchair.core.backend",
         "register_replacement": "torchair.patterns",
         "logger": "torchair.core.utils",
         "dynamo_export": "torchair.export", "load_export": "torchair.export",
         "use_internal_format_weight": "torchair.experimental.inference",
         "npu_format_cast_via_cpu": "torchair.experimental.inference"}
_LAZY_MODULES = ("compat", "experimental", "export", "npu_export", "npu_fx_compiler", "patterns")


def __getattr__(name: str):
    import importlib

    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in _LAZY_MODULES:
        return importlib.import_module(f"torchair.{name}")  # the import binds the attribute
    reason = _unsupported_reason(f"torchair.{name}")
    if reason is not None:
        raise AttributeError(f"torchair.{name} is not supported by this torchair: {reason}")
    raise AttributeError(f"module 'torchair' has no attribute {name!r}")


def patch_for_hcom() -> None:
    """TorchAir: make the in-place ``torch.distributed`` collectives traceable in graphs.

    PyTorch >= 2.3.1 already remaps most of them (warned, as in TorchAir); this adds
    ``dist.broadcast`` and ``dist.all_to_all`` and a clear error for a collective traced without
    a process group. Idempotent; ``torchair.distributed.unpatch_for_hcom()`` undoes it. See
    :mod:`torchair.distributed.hcom` for exactly what it patches.
    """
    from torchair.distributed import hcom

    warnings.warn("For versions 2.3.1 and above of PyTorch, there is no need to call "
                  "patch_for_hcom anymore.", stacklevel=2)
    hcom.patch_for_hcom()


def register_fx_node_ge_converter(aten_op: Any) -> Callable[[Callable], Callable]:
    """TorchAir: register ``converter`` as the Ascend GE lowering of the op ``aten_op``.

    There is no GE graph here: an op in a torchair graph runs through its PyTorch kernels (give
    a custom op its eager and fake kernels with ``torch.library``). The decorator checks its
    arguments, logs that the converter is not used and returns it unchanged, so scripts that
    register converters still import and run. ``aten_op=None`` is accepted (TorchAir ignores it).
    """
    import torch

    if aten_op is not None and not isinstance(aten_op, (torch._ops.OpOverload,
                                                        torch._ops.OpOverloadPacket)):
        raise TypeError(f"register_fx_node_ge_converter: aten_op must be a torch op (e.g. "
                        f"torch.ops.npu.my_op.default) or None, got {type(aten_op).__name__} "
                        f"{aten_op!r}")

    def decorator(converter: Callable) -> Callable:
        if not callable(converter):
            raise TypeError(f"register_fx_node_ge_converter({aten_op}): the converter must be "
                            f"callable, got {type(converter).__name__}")
        _logger.info("register_fx_node_ge_converter(%s): GE converters are not used by torchair "
                    "(no GE graph); the op runs through its PyTorch kernels", aten_op)
        return converter

    return decorator


__all__ = [
    "CompilerConfig",
    "GraphReport",
    "dynamo_export",
    "get_compiler",
    "get_npu_backend",
    "graph_reports",
    "inference",
    "load_export",
    "logger",
    "npu_format_cast_via_cpu",
    "ops",
    "patch_for_hcom",
    "register_fx_node_ge_converter",
    "register_replacement",
    "scope",
    "use_internal_format_weight",
]
