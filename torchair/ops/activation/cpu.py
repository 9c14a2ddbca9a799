"""Fast kernel of ``npu_swiglu`` on CPU (and the generic fallback on other devices).

Same contract as :func:`torchair.ops.activation.swiglu.swiglu_reference`; arguments arrive
checked. The reference converts ``x [..., 2H]`` to float32, then allocates the silu of ``A`` and
the product; this kernel applies silu *in place* on ``A`` inside the float32 copy (float16 /
bfloat16 inputs; a float32 input is not copied, its silu is the one new buffer), multiplies
``B`` in, and rounds once: one float32 buffer fewer, the same float32 math as the reference
(PyTorch's silu, then the product), so results are within an ulp of the reference's (PyTorch's
contiguous and strided silu may round differently depending on the version: equal on torch 2.13,
an ulp apart on 2.11). At decode sizes the cost is
the exponential of silu and the dispatcher calls, so the gain over the reference is small
(``bench/bench_rope_swiglu.py``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["swiglu_cpu"]


def swiglu_cpu(x: torch.Tensor, d: int) -> torch.Tensor:
    """``silu(A) * B`` along the (non-negative) dim ``d``, in ``x.dtype``."""
    h = x.shape[d] // 2
    if x.dtype == torch.float32:
        y = F.silu(x.narrow(d, 0, h))
        return y.mul_(x.narrow(d, h, h))
    xf = x.float()
    y = F.silu(xf.narrow(d, 0, h), inplace=True)
    y.mul_(xf.narrow(d, h, h))
    return y.to(x.dtype)
