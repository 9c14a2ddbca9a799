"""TorchAir's module path ``torchair.npu_fx_compiler``: the backend and the compiler.

The same objects as ``torchair.get_npu_backend`` / ``torchair.get_compiler`` (defined in
:mod:`torchair.core.backend`).
"""
from torchair.core.backend import get_compiler, get_npu_backend

__all__ = ["get_compiler", "get_npu_backend"]
