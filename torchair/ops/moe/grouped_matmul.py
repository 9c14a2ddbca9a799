"""``npu_grouped_matmul``: several matmuls in one op, as in torch_npu (the MoE expert FFN).

Groups ``g = 0 .. G-1``, each with its weight ``W_g [K, N]`` (``weight`` is a list of G 2-D
tensors, or one 3-D tensor ``[G, K, N]``, as vllm-ascend passes it). Per group, in float32::

    y_g = x_g @ W_g  (+ bias_g[N])                                  float x and weight
    y_g = float(x_g @ W_g) * scale_g[N] * per_token_scale[m]        int8 x and weight (W8A8)

``group_type=-1``: ``x`` is a list of G tensors, ``x_g = x[g]`` (``[..., K]``; 2-D unless
``split_item=0``). ``group_type=0``: ``x`` is one 2-D tensor ``[M, K]`` whose rows are split by
``group_list`` (a 1-D int64 tensor of G values): with ``group_list_type=0`` the values are the
cumulative row ends (``x_g = x[end_{g-1} : end_g]``), with ``group_list_type=1`` the row counts
of the groups. ``split_item`` 0 / 1: the output is a list of G tensors (``y_g``); 2 / 3: one
tensor, the ``y_g`` stacked along the rows. For ``group_type=0`` and ``split_item`` 2 / 3 the
output is ``[M, N]``, sized by ``x`` and never by ``group_list``'s values (rows past the last
group are zero; Ascend leaves them unspecified), so a graph around the op stays static.

Output dtype: ``x``'s for float inputs (``output_dtype`` None or equal); ``output_dtype``
float16 / bfloat16 for W8A8 (``scale``: float32 or bfloat16, one ``[N]`` per group or one
``[G, N]``; ``per_token_scale``: one float32 ``[M]``). ``group_type`` must be passed (torch_npu
requires it too).

Not implemented (``NotImplementedError`` naming the argument): ``group_type`` 1 / 2 (split N / K),
``offset``, ``antiquant_scale`` / ``antiquant_offset`` (weight-only quantization),
``activation_input`` / ``activation_quant_scale`` / ``activation_quant_offset``, ``act_type`` != 0,
int8 output (W8A8 without ``output_dtype``) and a bias with int8 inputs.

Kernels: :func:`grouped_matmul_reference` (the oracle: a float32 / exact float64 loop over the
groups, reading ``group_list`` on the host); on CPU the fast path loops over the groups with one
``torch.mm`` per group written into the output in place; on other devices a sync-free path
(:func:`grouped_matmul_masked`: each group's matmul over all rows, kept where the row belongs to
the group; no host read, so it can be captured in a CUDA graph; no Triton kernel yet).
"""
from __future__ import annotations

import dataclasses

import torch

from torchair.base.registry import define_op

__all__ = ["GroupedMatmulPlan", "grouped_matmul_masked", "grouped_matmul_reference",
           "npu_grouped_matmul", "plan_grouped_matmul"]

_OP = "npu_grouped_matmul"
_SCHEMA = (
    "npu_grouped_matmul(Tensor[] x, Tensor[] weight, *, Tensor[]? bias=None, "
    "Tensor[]? scale=None, Tensor[]? offset=None, Tensor[]? antiquant_scale=None, "
    "Tensor[]? antiquant_offset=None, Tensor[]? per_token_scale=None, Tensor? group_list=None, "
    "Tensor[]? activation_input=None, Tensor[]? activation_quant_scale=None, "
    "Tensor[]? activation_quant_offset=None, int? split_item=0, int? group_type=None, "
    "int? group_list_type=0, int? act_type=0, int[]? tuning_config=None, "
    "ScalarType? output_dtype=None) -> Tensor[]")
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclasses.dataclass
class GroupedMatmulPlan:
    """A validated call: per-group weights, epilogue terms and the output layout."""

    x: list                     # group_type -1: one tensor per group; 0: [x [M, K]]
    weights: list               # G tensors [K, N]
    biases: list | None         # G tensors [N] (float) or None
    scales: list | None         # G tensors [N] (W8A8) or None
    per_token: torch.Tensor | None
    grouped_rows: bool          # group_type == 0: x's rows split by group_list
    group_list: torch.Tensor | None
    cumulative: bool            # group_list_type == 0
    single_output: bool         # split_item 2 / 3
    out_dtype: torch.dtype
    quant: bool


def _unsupported(**kwargs) -> None:
    for name, value in kwargs.items():
        if value is not None and not (isinstance(value, (list, tuple)) and len(value) == 0):
            raise NotImplementedError(f"{_OP}: {name} is not implemented by torchair (float and "
                                      f"W8A8 grouped matmuls only); drop the {name} argument")


def _per_group(name: str, values, weights: list) -> list | None:
    """``values`` (None, a list of G [N] tensors, or one [G, N] tensor in a list) as G tensors."""
    if values is None or len(values) == 0:
        return None
    groups = len(weights)
    if len(values) == 1 and values[0].dim() == 2:
        values = list(values[0].unbind(0))
    if len(values) != groups:
        raise ValueError(f"{_OP}: {name} has {len(values)} tensor(s); expected one [N] per group "
                         f"({groups}) or one [{groups}, N]")
    for g, (t, w) in enumerate(zip(values, weights)):
        if t.dim() != 1 or t.shape[0] != w.shape[1]:
            raise ValueError(f"{_OP}: {name}[{g}] must have shape [N] = [{w.shape[1]}] "
                             f"(weight[{g}].shape[1]); got {list(t.shape)}")
    return list(values)


def plan_grouped_matmul(x, weight, *, bias=None, scale=None, offset=None, antiquant_scale=None,
                        antiquant_offset=None, per_token_scale=None, group_list=None,
                        activation_input=None, activation_quant_scale=None,
                        activation_quant_offset=None, split_item=0, group_type=None,
                        group_list_type=0, act_type=0, tuning_config=None,
                        output_dtype=None) -> GroupedMatmulPlan:
    """Every check of a call (dtypes, shapes, options; never tensor values), shared by the fake
    kernel and the eager kernels."""
    _unsupported(offset=offset, antiquant_scale=antiquant_scale,
                 antiquant_offset=antiquant_offset, activation_input=activation_input,
                 activation_quant_scale=activation_quant_scale,
                 activation_quant_offset=activation_quant_offset)
    if act_type not in (0, None):
        raise NotImplementedError(f"{_OP}: act_type={act_type} is not implemented (no fused "
                                  f"activation); apply the activation after the op")
    if group_type is None:
        raise ValueError(f"{_OP}: group_type is None; torch_npu requires it: pass group_type=0 "
                         f"to split the rows of x by group_list, or -1 for one x per weight")
    if group_type in (1, 2):
        raise NotImplementedError(f"{_OP}: group_type={group_type} (split along N / K) is not "
                                  f"implemented; use group_type=0 or -1")
    if group_type not in (-1, 0):
        raise ValueError(f"{_OP}: group_type={group_type} is not supported; expected -1 or 0")
    split_item = 0 if split_item is None else split_item
    if split_item not in (0, 1, 2, 3):
        raise ValueError(f"{_OP}: split_item={split_item} must be 0, 1 (a list of outputs, one "
                         f"per group) or 2, 3 (one output)")
    if len(x) == 0 or len(weight) == 0:
        raise ValueError(f"{_OP}: x and weight must be non-empty lists of tensors")
    if len(weight) == 1 and weight[0].dim() == 3:
        weights = list(weight[0].unbind(0))
    else:
        weights = list(weight)
    for w in weights:
        if w.dim() != 2:
            raise ValueError(f"{_OP}: each weight must be 2-D [K, N] (or one 3-D [G, K, N]); got "
                             f"shape {list(w.shape)}")
    groups = len(weights)
    k, n = weights[0].shape
    one_n = group_type == 0 or split_item in (2, 3)  # the groups' outputs share one tensor
    for w in weights:
        if w.dtype != weights[0].dtype:
            raise TypeError(f"{_OP}: the weights must share one dtype; got {w.dtype} and "
                            f"{weights[0].dtype}")
        if (one_n and w.shape[1] != n) or (group_type == 0 and w.shape[0] != k):
            raise ValueError(f"{_OP}: the weights must share K and N with group_type=0, and N "
                             f"with split_item 2 / 3 (one output); got {list(w.shape)} and "
                             f"{list(weights[0].shape)}")
    quant = x[0].dtype == torch.int8
    for t in x:
        if t.dtype != x[0].dtype:
            raise TypeError(f"{_OP}: the tensors of x must share one dtype; got {t.dtype} and "
                            f"{x[0].dtype}")
    if quant:
        if weights[0].dtype != torch.int8:
            raise TypeError(f"{_OP}: x is int8 but weight is {weights[0].dtype}; W8A8 needs int8 "
                            f"weights (weight-only quantization is not implemented)")
        if output_dtype not in (torch.float16, torch.bfloat16):
            raise NotImplementedError(f"{_OP}: int8 x with output_dtype={output_dtype} is not "
                                      f"implemented; pass output_dtype=torch.bfloat16 or "
                                      f"torch.float16 with scale (and per_token_scale)")
        if scale is None or len(scale) == 0:
            raise ValueError(f"{_OP}: int8 x and weight need scale (one [N] per group or one "
                             f"[G, N]) to dequantize the int32 accumulator")
        if bias is not None and len(bias):
            raise NotImplementedError(f"{_OP}: bias with int8 inputs is not implemented; add the "
                                      f"bias to the output")
        out_dtype = output_dtype
    else:
        if x[0].dtype not in FLOAT_DTYPES:
            raise TypeError(f"{_OP}: x has dtype {x[0].dtype}; expected float16, bfloat16, "
                            f"float32 or int8")
        if weights[0].dtype != x[0].dtype:
            raise TypeError(f"{_OP}: weight has dtype {weights[0].dtype} but x has {x[0].dtype}; "
                            f"cast the weights to {x[0].dtype}")
        if output_dtype not in (None, x[0].dtype):
            raise ValueError(f"{_OP}: output_dtype={output_dtype} differs from x's dtype "
                             f"{x[0].dtype}; float grouped matmuls return x's dtype; drop it")
        for name, value in (("scale", scale), ("per_token_scale", per_token_scale)):
            if value is not None and len(value):
                raise ValueError(f"{_OP}: {name} applies to int8 x and weight only; x is "
                                 f"{x[0].dtype}; drop {name}")
        out_dtype = x[0].dtype
    biases = _per_group("bias", bias, weights)
    if biases is not None and not quant:
        for b in biases:
            if b.dtype not in FLOAT_DTYPES:
                raise TypeError(f"{_OP}: bias has dtype {b.dtype}; expected a float dtype")
    scales = _per_group("scale", scale, weights) if quant else None
    if scales is not None:
        for s in scales:
            if s.dtype not in (torch.float32, torch.bfloat16):
                raise TypeError(f"{_OP}: scale has dtype {s.dtype}; expected float32 or bfloat16")
    if group_type == -1:
        if group_list is not None:
            raise ValueError(f"{_OP}: group_list is given with group_type=-1 (one x per weight); "
                             f"pass group_type=0 to split x's rows by group_list")
        if len(x) != groups:
            raise ValueError(f"{_OP}: group_type=-1 pairs x[g] with weight[g]; got {len(x)} x "
                             f"and {groups} weights")
        for g, (t, w) in enumerate(zip(x, weights)):
            if t.dim() < 2 or t.shape[-1] != w.shape[0] or (split_item != 0 and t.dim() != 2):
                raise ValueError(f"{_OP}: x[{g}] has shape {list(t.shape)} and weight[{g}] "
                                 f"{list(w.shape)}; expected x[{g}] [..., K] (2-D unless "
                                 f"split_item=0) with K = weight[{g}].shape[0]")
        rows = None
    else:
        if len(x) != 1 or x[0].dim() != 2:
            raise ValueError(f"{_OP}: group_type=0 splits the rows of one 2-D x [M, K]; got "
                             f"{len(x)} tensor(s) of shapes {[list(t.shape) for t in x]}")
        if x[0].shape[1] != k:
            raise ValueError(f"{_OP}: x [M, K] = {list(x[0].shape)} and weight [K, N] = "
                             f"{[k, n]} disagree on K; transpose the weights to [G, K, N]")
        if group_list is None:
            raise ValueError(f"{_OP}: group_type=0 needs group_list (a 1-D int64 tensor of "
                             f"{groups} row ends or counts)")
        if (group_list.dim() != 1 or group_list.shape[0] != groups
                or group_list.dtype != torch.int64):
            raise ValueError(f"{_OP}: group_list must be a 1-D int64 tensor of {groups} values "
                             f"(one per weight); got {group_list.dtype} shape "
                             f"{list(group_list.shape)}; cast with .to(torch.int64)")
        if group_list_type not in (0, 1, None):
            raise ValueError(f"{_OP}: group_list_type={group_list_type} must be 0 (cumulative "
                             f"row ends) or 1 (row counts)")
        rows = x[0].shape[0]
    per_token = None
    if per_token_scale is not None and len(per_token_scale):
        if len(per_token_scale) != 1 or rows is None:
            raise ValueError(f"{_OP}: per_token_scale must be one float32 [M] tensor with "
                             f"group_type=0; got {len(per_token_scale)} tensor(s)")
        per_token = per_token_scale[0]
        if per_token.dtype != torch.float32 or tuple(per_token.shape) != (rows,):
            raise ValueError(f"{_OP}: per_token_scale must be float32 [M] = [{rows}]; got "
                             f"{per_token.dtype} shape {list(per_token.shape)}")
    return GroupedMatmulPlan(list(x), weights, biases, scales, per_token, group_type == 0,
                             group_list, group_list_type in (0, None), split_item in (2, 3),
                             out_dtype, quant)


# ---------------------------------------------------------------- kernels ------------------------

def _row_bounds(plan: GroupedMatmulPlan, device) -> torch.Tensor:
    """Row ends of the groups (cumulative, int64) on ``device``."""
    ends = plan.group_list.to(device=device, dtype=torch.int64)
    return ends if plan.cumulative else torch.cumsum(ends, 0)


def _host_bounds(plan: GroupedMatmulPlan) -> list[tuple[int, int]]:
    """(start, end) rows of every group, read on the host, checked against M."""
    ends = _row_bounds(plan, "cpu").tolist()
    m = plan.x[0].shape[0]
    bounds, start = [], 0
    for g, end in enumerate(ends):
        if end < start or end > m:
            kind = "cumulative row ends" if plan.cumulative else "row counts"
            raise ValueError(f"{_OP}: group_list {plan.group_list.tolist()} ({kind}) gives group "
                             f"{g} the rows [{start}, {end}), outside x's {m} rows or "
                             f"decreasing; the groups must partition a prefix of x's rows")
        bounds.append((start, end))
        start = end
    return bounds


def _epilogue(plan: GroupedMatmulPlan, acc: torch.Tensor, g: int, rows: slice | None):
    """float32 ``acc`` of group ``g`` -> its output (bias or dequant scales), output dtype."""
    if plan.quant:
        acc = acc * plan.scales[g].float()
        if plan.per_token is not None:
            acc = acc * plan.per_token[rows].float()[:, None]
    elif plan.biases is not None:
        acc = acc + plan.biases[g].float()
    return acc.to(plan.out_dtype)


def _matmul_f32(plan: GroupedMatmulPlan, a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if plan.quant:  # exact: every partial sum is an integer below 2**53
        return torch.matmul(a.double(), w.double()).float()
    return torch.matmul(a.float(), w.float())


def _run_loop(plan: GroupedMatmulPlan, mm) -> list:
    """The per-group loop (host-read bounds) with ``mm(a, w) -> float32``."""
    if not plan.grouped_rows:
        outs = [_epilogue(plan, mm(a, w), g, None) for g, (a, w) in
                enumerate(zip(plan.x, plan.weights))]
        return [torch.cat(outs)] if plan.single_output else outs
    x = plan.x[0]
    bounds = _host_bounds(plan)
    n = plan.weights[0].shape[1]
    if plan.single_output:
        out = x.new_zeros((x.shape[0], n), dtype=plan.out_dtype)
        for g, (start, end) in enumerate(bounds):
            if end > start:
                out[start:end] = _epilogue(plan, mm(x[start:end], plan.weights[g]), g,
                                           slice(start, end))
        return [out]
    return [_epilogue(plan, mm(x[s:e], plan.weights[g]), g, slice(s, e))
            for g, (s, e) in enumerate(bounds)]


def grouped_matmul_reference(x, weight, **kwargs) -> list:
    """Oracle of ``npu_grouped_matmul`` (module doc): float32 (int8: exact) per group."""
    plan = plan_grouped_matmul(x, weight, **kwargs)
    return _run_loop(plan, lambda a, w: _matmul_f32(plan, a, w))


def _cpu_mm(plan: GroupedMatmulPlan):
    """One ``torch.mm`` per group in the input dtype (float32 accumulation inside ATen)."""
    if plan.quant:
        return lambda a, w: _matmul_f32(plan, a, w)
    return lambda a, w: torch.matmul(a, w).float()


def grouped_matmul_masked(plan: GroupedMatmulPlan) -> list:
    """Sync-free kernel of ``group_type=0`` with one output: each group's matmul over all M rows,
    kept on the rows of the group (row ends compared on the device, never read on the host)."""
    x = plan.x[0]
    m = x.shape[0]
    ends = _row_bounds(plan, x.device)
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    row = torch.arange(m, device=x.device)
    out = x.new_zeros((m, plan.weights[0].shape[1]), dtype=plan.out_dtype)
    for g, w in enumerate(plan.weights):
        mine = ((row >= starts[g]) & (row < ends[g]))[:, None]
        y = _epilogue(plan, _matmul_f32(plan, x, w), g, slice(None))
        out = torch.where(mine, y, out)
    return [out]


def _eager(x, weight, **kwargs):
    plan = plan_grouped_matmul(x, weight, **kwargs)
    if plan.grouped_rows and plan.single_output and x[0].device.type != "cpu":
        return grouped_matmul_masked(plan)
    return _run_loop(plan, _cpu_mm(plan))


def _fake(x, weight, **kwargs):
    plan = plan_grouped_matmul(x, weight, **kwargs)
    n = plan.weights[0].shape[1]
    if plan.grouped_rows:
        if plan.single_output:
            return [x[0].new_empty((x[0].shape[0], n), dtype=plan.out_dtype)]
        ctx = torch.library.get_ctx()  # one output per group: its rows depend on group_list
        return [x[0].new_empty((ctx.new_dynamic_size(), n), dtype=plan.out_dtype)
                for _ in plan.weights]
    if plan.single_output:  # 2-D x, one N
        return [x[0].new_empty((sum(t.shape[0] for t in plan.x), n), dtype=plan.out_dtype)]
    return [t.new_empty((*t.shape[:-1], w.shape[1]), dtype=plan.out_dtype)
            for t, w in zip(plan.x, plan.weights)]


npu_grouped_matmul = define_op(_SCHEMA, fake=_fake, kernel=_eager)
