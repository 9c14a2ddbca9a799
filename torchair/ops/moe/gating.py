"""``npu_moe_gating_top_k``: MoE router scores -> top-k experts per token, as in torch_npu.

Per token (a row of ``x [N, E]``, E experts), in float32::

    norm   = softmax(x)  (norm_type=0)   or   sigmoid(x)  (norm_type=1)
    select = norm + bias                    (bias [E] is used to *choose* experts only)
    group_count > 1:                        (DeepSeek-V3 grouped routing)
        groups of E / group_count consecutive experts; a group's score is its max
        (group_select_mode=0) or the sum of its two largest values (group_select_mode=1);
        the k_group best groups stay, every expert of the others is set to -inf in select
    expert_idx = top-k of select            (int32 [N, k], best first; ties: lower index)
    y          = norm[expert_idx]           (the *unbiased* scores of the chosen experts)
    y          = y / (sum(y) + eps) * routed_scaling_factor     (cast to x.dtype)
    out        = norm                        (float32 [N, E])

This is the formula of the torch_npu / aclnnMoeGatingTopK documentation (the bias of
DeepSeek-V3's ``e_score_correction_bias`` steers the choice, the weights come from the plain
scores, as in vllm-ascend). The documentation shows ``norm_type=1`` in the prototype but says
"默认值为0" (default 0) in the parameter text, and TorchAir's own schema defaults to 0: the default
here is 0 (softmax).
``out`` is returned whatever ``out_flag`` is (the documentation allows only
``out_flag=False``, for which the third output holds no documented values).

Not implemented (``NotImplementedError`` naming the argument): ``renorm=1`` (the documentation
allows only 0). Device limits of Ascend (E = 256, k_group = 4, ...) are not imposed.
"""
from __future__ import annotations

import torch

from torchair.base.registry import define_op

__all__ = ["check_gating_args", "moe_gating_top_k_reference", "npu_moe_gating_top_k"]

_OP = "npu_moe_gating_top_k"
_SCHEMA = ("npu_moe_gating_top_k(Tensor x, int k, *, Tensor? bias=None, int k_group=1, "
           "int group_count=1, int group_select_mode=0, int renorm=0, int norm_type=0, "
           "bool out_flag=False, float routed_scaling_factor=1.0, float eps=1e-20) "
           "-> (Tensor, Tensor, Tensor)")
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_gating_args(x, k, bias, k_group, group_count, group_select_mode, renorm,
                      norm_type) -> None:
    """Every check of a call (dtypes, shapes and integer arguments; never tensor values)."""
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{_OP}: x has dtype {x.dtype}; expected float16, bfloat16 or float32; "
                        f"cast the router logits to one of them")
    if x.dim() != 2:
        raise ValueError(f"{_OP}: x must be 2-D [num_tokens, num_experts]; got shape "
                         f"{list(x.shape)}; flatten the leading dims (x.view(-1, E))")
    e = x.shape[1]
    if renorm != 0:
        raise NotImplementedError(f"{_OP}: renorm={renorm} is not implemented (the torch_npu "
                                  f"documentation allows only renorm=0: norm, then top-k); "
                                  f"pass renorm=0")
    if norm_type not in (0, 1):
        raise ValueError(f"{_OP}: norm_type={norm_type} is not supported; expected 0 (softmax) "
                         f"or 1 (sigmoid)")
    if group_select_mode not in (0, 1):
        raise ValueError(f"{_OP}: group_select_mode={group_select_mode} is not supported; "
                         f"expected 0 (group max) or 1 (sum of the group's top 2)")
    if group_count < 1 or e % group_count:
        raise ValueError(f"{_OP}: group_count={group_count} must be >= 1 and divide the number "
                         f"of experts x.shape[1] = {e}")
    if not 1 <= k_group <= group_count:
        raise ValueError(f"{_OP}: k_group={k_group} must be in [1, group_count={group_count}]")
    if group_count > 1 and group_select_mode == 1 and e // group_count < 2:
        raise ValueError(f"{_OP}: group_select_mode=1 sums the top 2 experts of each group, but "
                         f"a group holds {e // group_count} expert(s) (E={e}, group_count="
                         f"{group_count}); use group_select_mode=0 or fewer groups")
    limit = e // group_count * k_group
    if not 1 <= k <= limit:
        raise ValueError(f"{_OP}: k={k} must be in [1, x.shape[1] / group_count * k_group = "
                         f"{limit}] (the experts of the kept groups)")
    if bias is not None:
        if bias.dtype != x.dtype:
            raise TypeError(f"{_OP}: bias has dtype {bias.dtype} but x has {x.dtype}; cast bias "
                            f"to {x.dtype}")
        if bias.dim() != 1 or bias.shape[0] != e:
            raise ValueError(f"{_OP}: bias must have shape [num_experts] = [{e}]; got "
                             f"{list(bias.shape)}")


def _top_k_stable(values: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest values per row, best first; ties go to the lower index."""
    return torch.sort(values, dim=-1, descending=True, stable=True).indices[:, :k]


def moe_gating_top_k_reference(x, k, *, bias=None, k_group=1, group_count=1,
                               group_select_mode=0, renorm=0, norm_type=0, out_flag=False,
                               routed_scaling_factor=1.0, eps=1e-20):
    """Plain-PyTorch ``npu_moe_gating_top_k`` (the module doc's formula): ``(y, expert_idx,
    out)``: ``y [N, k]`` in x.dtype, ``expert_idx [N, k]`` int32, ``out [N, E]`` float32."""
    check_gating_args(x, k, bias, k_group, group_count, group_select_mode, renorm, norm_type)
    xf = x.float()
    norm = torch.softmax(xf, dim=-1) if norm_type == 0 else torch.sigmoid(xf)
    select = norm if bias is None else norm + bias.float()
    n, e = x.shape
    if group_count > 1:
        grouped = select.view(n, group_count, e // group_count)
        if group_select_mode == 0:
            score = grouped.amax(dim=-1)
        else:
            score = grouped.topk(2, dim=-1).values.sum(dim=-1)
        keep_groups = _top_k_stable(score, k_group)
        keep = torch.zeros(n, group_count, dtype=torch.bool, device=x.device)
        keep.scatter_(1, keep_groups, True)
        keep = keep[:, :, None].expand(n, group_count, e // group_count).reshape(n, e)
        select = select.masked_fill(~keep, float("-inf"))
    idx = _top_k_stable(select, k)
    y = norm.gather(1, idx)
    y = y / (y.sum(dim=-1, keepdim=True) + eps) * routed_scaling_factor
    return y.to(x.dtype), idx.to(torch.int32), norm


def _eager(x, k, *, bias=None, k_group=1, group_count=1, group_select_mode=0, renorm=0,
           norm_type=0, out_flag=False, routed_scaling_factor=1.0, eps=1e-20):
    # the reference is already vectorized (sort per row); it serves every device
    return moe_gating_top_k_reference(
        x, k, bias=bias, k_group=k_group, group_count=group_count,
        group_select_mode=group_select_mode, renorm=renorm, norm_type=norm_type,
        out_flag=out_flag, routed_scaling_factor=routed_scaling_factor, eps=eps)


def _fake(x, k, *, bias=None, k_group=1, group_count=1, group_select_mode=0, renorm=0,
          norm_type=0, out_flag=False, routed_scaling_factor=1.0, eps=1e-20):
    check_gating_args(x, k, bias, k_group, group_count, group_select_mode, renorm, norm_type)
    n = x.shape[0]
    return (x.new_empty((n, k)), x.new_empty((n, k), dtype=torch.int32),
            x.new_empty(x.shape, dtype=torch.float32))


npu_moe_gating_top_k = define_op(_SCHEMA, fake=_fake, kernel=_eager)
