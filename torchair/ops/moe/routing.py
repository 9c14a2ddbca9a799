"""MoE token routing, as in torch_npu: ``npu_moe_init_routing`` (permute tokens by expert),
``npu_moe_compute_expert_tokens`` (where each expert's rows end) and
``npu_moe_finalize_routing`` (weighted un-permute).

Shapes: N tokens (``num_rows``), K experts per token (top-k), H hidden, E experts. An
*expanded row* is one (token, choice) pair; its *source index* is ``s = k * N + n`` (choice
major), the layout of ``row_idx`` that vllm-ascend builds with
``arange(N * K).view(K, N).T`` and the torch_npu example uses
(``row_idx = [[0, 3], [1, 4], [2, 5]]`` for N = 3, K = 2).

``npu_moe_init_routing(x [N, H], row_idx [N, K] int32, expert_idx [N, K] int32, active_num)``::

    order              = stable argsort of expert_idx.flatten()   (token-major flattening:
                                                                   ties keep token order)
    expanded_expert_idx = expert_idx.flatten()[order]              int32 [N * K], sorted
    sorted_row          = row_idx.flatten()[order]                 source index of each position
    expanded_row_idx[sorted_row[i]] = i                            int32 [N * K]: source -> position
    expanded_x[i]       = x[sorted_row[i] % N]   for i < min(N, active_num) * K

(aclnnMoeInitRouting's formula, with the stable flattened sort of torch_npu's own op test.)

``npu_moe_compute_expert_tokens(sorted_experts [M] int32, num_expert)``: ``out[e]`` = the number
of entries ``<= e``, i.e. the end of expert e's rows (the cumulative token counts; documented as
a binary search for each expert's last row), in the input's dtype, shape ``[num_expert]``.

``npu_moe_finalize_routing(expanded_permuted_rows [N*K, H], skip1, skip2, bias [E, H],
scales [N, K], expanded_src_to_dst_row [N*K], export_for_source_row [N, K], drop_pad_mode=0)``::

    out[n] = skip1[n] + skip2[n]
             + sum_k scales[n, k] * (rows[expanded_src_to_dst_row[k * N + n]]
                                     + bias[export_for_source_row[n, k]])

in float32, cast to the rows' dtype. Optional: ``skip1``, ``skip2`` (documented: when skip2 is
None skip1 must be None too), ``bias`` (needs ``export_for_source_row``), ``scales`` (None: weight
1). A position past the last row of ``expanded_permuted_rows`` (rows dropped by
``active_num < N``) adds nothing. ``drop_pad_mode`` other than 0 raises NotImplementedError.

Every output is sized by N, K, H and ``active_num`` only, never by tensor values, so the ops keep
a graph static. The eager kernels are the references: they are vectorized (one sort, gathers and
an index_put) and never read tensor values on the host.
"""
from __future__ import annotations

import torch

from torchair.base.registry import define_op

__all__ = ["compute_expert_tokens_reference", "finalize_routing_reference",
           "init_routing_reference", "npu_moe_compute_expert_tokens",
           "npu_moe_finalize_routing", "npu_moe_init_routing"]

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_INIT = "npu_moe_init_routing"
_TOKENS = "npu_moe_compute_expert_tokens"
_FINAL = "npu_moe_finalize_routing"


# ---------------------------------------------------------------- init routing -------------------

def check_init_routing(x, row_idx, expert_idx, active_num) -> None:
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{_INIT}: x has dtype {x.dtype}; expected float16, bfloat16 or float32")
    if x.dim() != 2:
        raise ValueError(f"{_INIT}: x must be 2-D [num_rows, H]; got shape {list(x.shape)}")
    if expert_idx.dim() != 2 or expert_idx.shape[0] != x.shape[0]:
        raise ValueError(f"{_INIT}: expert_idx must be 2-D [num_rows, K] with num_rows = "
                         f"x.shape[0] = {x.shape[0]}; got shape {list(expert_idx.shape)}")
    if tuple(row_idx.shape) != tuple(expert_idx.shape):
        raise ValueError(f"{_INIT}: row_idx must have expert_idx's shape "
                         f"{list(expert_idx.shape)}; got {list(row_idx.shape)}; build it as "
                         f"torch.arange(N * K, dtype=torch.int32).view(K, N).T.contiguous()")
    for name, t in (("row_idx", row_idx), ("expert_idx", expert_idx)):
        if t.dtype != torch.int32:
            raise TypeError(f"{_INIT}: {name} must be int32; got {t.dtype}; cast it with "
                            f".to(torch.int32)")
    if active_num < 0:
        raise ValueError(f"{_INIT}: active_num={active_num} must be >= 0 (the number of rows "
                         f"of x to expand; pass x.shape[0] for all)")


def init_routing_reference(x, row_idx, expert_idx, active_num):
    """Oracle of ``npu_moe_init_routing`` (module doc): ``(expanded_x, expanded_row_idx,
    expanded_expert_idx)``."""
    check_init_routing(x, row_idx, expert_idx, active_num)
    n, k = expert_idx.shape
    flat = expert_idx.reshape(-1)
    sorted_expert, order = torch.sort(flat, stable=True)
    sorted_row = row_idx.reshape(-1)[order].long()
    expanded_row_idx = torch.empty(n * k, dtype=torch.int32, device=x.device)
    expanded_row_idx[sorted_row] = torch.arange(n * k, dtype=torch.int32, device=x.device)
    rows = min(n, active_num) * k
    expanded_x = x[sorted_row[:rows] % max(n, 1)]
    return expanded_x, expanded_row_idx, sorted_expert


def _init_fake(x, row_idx, expert_idx, active_num):
    check_init_routing(x, row_idx, expert_idx, active_num)
    n, k = expert_idx.shape
    rows = torch.sym_min(n, active_num) * k
    return (x.new_empty((rows, x.shape[1])), x.new_empty((n * k,), dtype=torch.int32),
            x.new_empty((n * k,), dtype=torch.int32))


# ---------------------------------------------------------------- compute expert tokens ----------

def check_expert_tokens(sorted_experts, num_expert) -> None:
    if sorted_experts.dtype != torch.int32:
        raise TypeError(f"{_TOKENS}: sorted_expert_for_source_row must be int32; got "
                        f"{sorted_experts.dtype}")
    if sorted_experts.dim() != 1:
        raise ValueError(f"{_TOKENS}: sorted_expert_for_source_row must be 1-D; got shape "
                         f"{list(sorted_experts.shape)}; pass expanded_expert_idx of "
                         f"npu_moe_init_routing")
    if num_expert <= 0:
        raise ValueError(f"{_TOKENS}: num_expert={num_expert} must be > 0 (the number of "
                         f"experts)")


def compute_expert_tokens_reference(sorted_experts, num_expert):
    """Oracle of ``npu_moe_compute_expert_tokens``: ``out[e]`` = #entries <= e (a binary search
    per expert, as documented), dtype of the input."""
    check_expert_tokens(sorted_experts, num_expert)
    experts = torch.arange(num_expert, dtype=sorted_experts.dtype, device=sorted_experts.device)
    return torch.searchsorted(sorted_experts, experts, right=True).to(sorted_experts.dtype)


def _tokens_fake(sorted_experts, num_expert):
    check_expert_tokens(sorted_experts, num_expert)
    return sorted_experts.new_empty((num_expert,))


# ---------------------------------------------------------------- finalize routing ---------------

def check_finalize_routing(rows, skip1, skip2, bias, scales, src_to_dst, experts,
                           drop_pad_mode) -> tuple:
    """Checks of a finalize call; returns ``(N, K)``."""
    if drop_pad_mode not in (0, None):
        raise NotImplementedError(f"{_FINAL}: drop_pad_mode={drop_pad_mode} is not implemented "
                                  f"(only 0, no dropping, as documented); pass 0")
    if rows.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{_FINAL}: expanded_permuted_rows has dtype {rows.dtype}; expected "
                        f"float16, bfloat16 or float32")
    if rows.dim() != 2:
        raise ValueError(f"{_FINAL}: expanded_permuted_rows must be 2-D [N * K, H]; got shape "
                         f"{list(rows.shape)}")
    if src_to_dst.dim() != 1 or src_to_dst.dtype != torch.int32:
        raise ValueError(f"{_FINAL}: expanded_src_to_dst_row must be a 1-D int32 tensor [N * K] "
                         f"(expanded_row_idx of npu_moe_init_routing); got {src_to_dst.dtype} "
                         f"shape {list(src_to_dst.shape)}")
    if skip2 is None and skip1 is not None:
        raise ValueError(f"{_FINAL}: skip1 was given without skip2; torch_npu requires skip1 to "
                         f"be None when skip2 is None; pass the single addend as skip2 instead"
                         )
    nk = src_to_dst.shape[0]
    if scales is not None:
        if scales.dim() != 2:
            raise ValueError(f"{_FINAL}: scales must be 2-D [N, K]; got {list(scales.shape)}")
        n, k = scales.shape
    elif experts is not None:
        n, k = experts.shape
    elif skip1 is not None or skip2 is not None:
        n = (skip1 if skip1 is not None else skip2).shape[0]
        k = nk // max(n, 1)
    else:
        raise ValueError(f"{_FINAL}: scales, export_for_source_row, skip1 and skip2 are all "
                         f"None, so the number of tokens N is unknown; pass scales [N, K]")
    if n * k != nk:
        raise ValueError(f"{_FINAL}: expanded_src_to_dst_row has {nk} entries; expected N * K = "
                         f"{n} * {k} = {n * k} (N, K from scales / export_for_source_row)")
    h = rows.shape[1]
    for name, t in (("skip1", skip1), ("skip2", skip2)):
        if t is not None and (tuple(t.shape) != (n, h) or t.dtype != rows.dtype):
            raise ValueError(f"{_FINAL}: {name} must be [N, H] = [{n}, {h}] of "
                             f"{rows.dtype} (expanded_permuted_rows' dtype); got {t.dtype} "
                             f"shape {list(t.shape)}")
    if scales is not None and scales.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{_FINAL}: scales has dtype {scales.dtype}; expected a float dtype")
    if experts is not None:
        if tuple(experts.shape) != (n, k) or experts.dtype != torch.int32:
            raise ValueError(f"{_FINAL}: export_for_source_row must be int32 [N, K] = [{n}, {k}]; "
                             f"got {experts.dtype} shape {list(experts.shape)}")
    if bias is not None:
        if experts is None:
            raise ValueError(f"{_FINAL}: bias [E, H] needs export_for_source_row (the expert of "
                             f"each (token, k)) to pick its rows; pass the top-k expert ids")
        if bias.dim() != 2 or bias.shape[1] != h:
            raise ValueError(f"{_FINAL}: bias must be 2-D [E, H] with H = {h}; got shape "
                             f"{list(bias.shape)}")
    return n, k


def finalize_routing_reference(expanded_permuted_rows, skip1, skip2, bias, scales,
                               expanded_src_to_dst_row, export_for_source_row, drop_pad_mode=0):
    """Oracle of ``npu_moe_finalize_routing`` (module doc), float32 math."""
    rows = expanded_permuted_rows
    n, k = check_finalize_routing(rows, skip1, skip2, bias, scales, expanded_src_to_dst_row,
                                  export_for_source_row, drop_pad_mode)
    h = rows.shape[1]
    dst = expanded_src_to_dst_row.long().view(k, n).t()  # [N, K]: position of (n, k)
    present = dst < rows.shape[0]
    picked = rows.float()[dst.clamp(max=max(rows.shape[0] - 1, 0))]  # [N, K, H]
    if bias is not None:
        picked = picked + bias.float()[export_for_source_row.long()]
    picked = picked * present[:, :, None]
    if scales is not None:
        picked = picked * scales.float()[:, :, None]
    out = picked.sum(dim=1) if k else rows.new_zeros((n, h), dtype=torch.float32)
    for skip in (skip1, skip2):
        if skip is not None:
            out = out + skip.float()
    return out.to(rows.dtype)


def _finalize_fake(expanded_permuted_rows, skip1, skip2, bias, scales, expanded_src_to_dst_row,
                   export_for_source_row, drop_pad_mode=0):
    n, _ = check_finalize_routing(expanded_permuted_rows, skip1, skip2, bias, scales,
                                  expanded_src_to_dst_row, export_for_source_row, drop_pad_mode)
    return expanded_permuted_rows.new_empty((n, expanded_permuted_rows.shape[1]))


npu_moe_init_routing = define_op(
    "npu_moe_init_routing(Tensor x, Tensor row_idx, Tensor expert_idx, SymInt active_num) "
    "-> (Tensor, Tensor, Tensor)", fake=_init_fake, kernel=init_routing_reference)
npu_moe_compute_expert_tokens = define_op(
    "npu_moe_compute_expert_tokens(Tensor sorted_expert_for_source_row, int num_expert) -> Tensor",
    fake=_tokens_fake, kernel=compute_expert_tokens_reference)
npu_moe_finalize_routing = define_op(
    "npu_moe_finalize_routing(Tensor expanded_permuted_rows, Tensor? skip1, Tensor? skip2, "
    "Tensor? bias, Tensor? scales, Tensor expanded_src_to_dst_row, "
    "Tensor? export_for_source_row, int? drop_pad_mode=0) -> Tensor",
    fake=_finalize_fake, kernel=finalize_routing_reference)
