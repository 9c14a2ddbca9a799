"""``npu_swiglu``: the SwiGLU activation, as in torch_npu.

``npu_swiglu(self, dim=-1)`` splits ``self`` into halves ``A`` (first) and ``B`` (second) along
``dim`` (its size must be even) and returns, in float32 rounded once to ``self``'s dtype::

    out = silu(A) * B          silu(z) = z * sigmoid(z) = z / (1 + exp(-z))

of ``self``'s shape with ``dim`` halved (torch_npu's documentation: ``swish(A) * B``, A the
first half; vllm-ascend feeds it the ``[gate | up]`` output of the merged MLP projection).
Inputs are float16, bfloat16 or float32.

Kernels: :func:`swiglu_reference` is the oracle; the eager kernel runs the Triton kernel
(:mod:`torchair.ops.activation.triton`) on CUDA when Triton is importable, else the fused kernel
of :mod:`torchair.ops.activation.cpu` (plain PyTorch ops, any device).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from torchair.base.registry import define_op
from torchair.ops.activation import cpu as _act_cpu, triton as _act_triton

__all__ = ["check_swiglu", "device_kernel", "npu_swiglu", "swiglu_out_shape", "swiglu_reference"]

_OP = "npu_swiglu"
_SCHEMA = f"{_OP}(Tensor self, int dim=-1) -> Tensor"
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_swiglu(x: torch.Tensor, dim: int) -> int:
    """Check an ``npu_swiglu`` call; returns ``dim`` made non-negative."""
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{_OP}: self has dtype {x.dtype}; expected float16, bfloat16 or "
                        f"float32; cast self to one of them")
    nd = x.dim()
    if nd == 0 or not -nd <= dim < nd:
        raise ValueError(f"{_OP}: dim={dim} is out of range for self of shape {list(x.shape)}; "
                         f"expected dim in [{-nd}, {nd - 1}] (a tensor of at least one dim)")
    d = dim % nd
    if x.shape[d] % 2 != 0:
        raise ValueError(f"{_OP}: self has size {x.shape[d]} along dim={dim}; SwiGLU splits that "
                         f"dim into two equal halves, so it must be even")
    return d


def swiglu_out_shape(x: torch.Tensor, d: int) -> list:
    shape = list(x.shape)
    shape[d] = shape[d] // 2
    return shape


def swiglu_reference(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Oracle of ``npu_swiglu``: ``silu(A) * B`` in float32, ``A`` the first half along ``dim``."""
    d = check_swiglu(x, dim)
    h = x.shape[d] // 2
    xf = x.float()
    a, b = xf.narrow(d, 0, h), xf.narrow(d, h, h)
    return (F.silu(a) * b).to(x.dtype)


def device_kernel(x: torch.Tensor) -> str:
    """"triton" (CUDA, Triton importable) or "fused" (the PyTorch-op kernel, any device)."""
    if x.device.type == "cuda" and _act_triton.HAS_TRITON:
        return "triton"
    return "fused"


def _swiglu_eager(self, dim=-1):
    d = check_swiglu(self, dim)
    if device_kernel(self) == "triton":
        return _act_triton.swiglu_triton(self, d)
    return _act_cpu.swiglu_cpu(self, d)


def _swiglu_fake(self, dim=-1):
    d = check_swiglu(self, dim)
    return self.new_empty(swiglu_out_shape(self, d))


npu_swiglu = define_op(_SCHEMA, fake=_swiglu_fake, kernel=_swiglu_eager)
