"""``npu_moe_gating_top_k_softmax``: softmax over the router logits, then top-k, as in torch_npu.

``npu_moe_gating_top_k_softmax(x, finished=None, k=1) -> (y, expert_idx, row_idx)`` with ``x``
``[N, E]`` (or ``[B, S, E]``, the leading dims taken as ``N = B * S`` rows), in float32::

    p          = softmax(x, dim=-1)
    expert_idx = top-k of p                   int32 [..., k], best first; ties: lower index
    y          = p[expert_idx]                in x.dtype
    row_idx    = j * N + n  at [n, j]         int32 [..., k] (arange(N * k).view(k, N).T)
    finished   [...] bool (x.shape[:-1]):     a True row gets expert_idx = E (num_experts);
                                              its y and row_idx are as for any row

(the torch_npu / aclnnMoeGatingTopKSoftmax documentation's formula and its finished rule: "the
expert index is filled with num_expert"; the probabilities are *not* renormalized over the k.)
``k`` must be in ``[1, E]`` (Ascend also caps it at 1024; not imposed here).

Kernels: :func:`moe_gating_top_k_softmax_reference` is the oracle and, being vectorized (a stable
sort per row, no host reads, so it captures in a CUDA graph), also the eager kernel of every
device.
"""
from __future__ import annotations

import torch

from torchair.base.registry import define_op

__all__ = ["check_gating_softmax", "moe_gating_top_k_softmax_reference",
           "npu_moe_gating_top_k_softmax"]

_OP = "npu_moe_gating_top_k_softmax"
_SCHEMA = f"{_OP}(Tensor x, Tensor? finished=None, int k=1) -> (Tensor, Tensor, Tensor)"
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_gating_softmax(x, finished, k) -> None:
    """Every check of a call (dtypes, shapes, k; never tensor values)."""
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{_OP}: x has dtype {x.dtype}; expected float16, bfloat16 or float32; "
                        f"cast the router logits to one of them")
    if x.dim() not in (2, 3):
        raise ValueError(f"{_OP}: x has shape {list(x.shape)} ({x.dim()}-D); expected 2-D "
                         f"[num_tokens, num_experts] or 3-D [B, S, num_experts]; reshape x")
    e = x.shape[-1]
    if not 1 <= k <= e:
        raise ValueError(f"{_OP}: k={k} must be in [1, num_experts = x.shape[-1] = {e}]")
    if finished is not None:
        if finished.dtype != torch.bool:
            raise TypeError(f"{_OP}: finished has dtype {finished.dtype}; expected bool (True: "
                            f"the row is finished); cast finished with .to(torch.bool)")
        if tuple(finished.shape) != tuple(x.shape[:-1]):
            raise ValueError(f"{_OP}: finished has shape {list(finished.shape)}; expected "
                             f"x.shape[:-1] = {list(x.shape[:-1])} (one flag per row of x)")


def moe_gating_top_k_softmax_reference(x, finished=None, k=1):
    """Plain-PyTorch ``npu_moe_gating_top_k_softmax`` (the module doc's formula): ``(y,
    expert_idx, row_idx)``, ``[..., k]`` each, in x.dtype / int32 / int32. No host reads."""
    check_gating_softmax(x, finished, k)
    e = x.shape[-1]
    p = torch.softmax(x.float(), dim=-1)
    idx = torch.sort(p, dim=-1, descending=True, stable=True).indices[..., :k]
    y = p.gather(-1, idx).to(x.dtype)
    if finished is not None:
        idx = idx.masked_fill(finished.unsqueeze(-1), e)
    lead = x.shape[:-1]
    n = x.numel() // e                                   # rows (e >= k >= 1)
    rows = torch.arange(n, device=x.device, dtype=torch.int32).view(*lead, 1)
    cols = torch.arange(k, device=x.device, dtype=torch.int32) * n
    return y, idx.to(torch.int32), rows + cols


def _eager(x, finished=None, k=1):
    return moe_gating_top_k_softmax_reference(x, finished, k)


def _fake(x, finished=None, k=1):
    check_gating_softmax(x, finished, k)
    shape = (*x.shape[:-1], k)
    return (x.new_empty(shape), x.new_empty(shape, dtype=torch.int32),
            x.new_empty(shape, dtype=torch.int32))


npu_moe_gating_top_k_softmax = define_op(_SCHEMA, fake=_fake, kernel=_eager)
