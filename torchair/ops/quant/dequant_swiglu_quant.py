"""``npu_dequant_swiglu_quant``: dequantize, SwiGLU, quantize to int8, in one op (as torch_npu).

For every token row ``t`` of ``x [..., 2H]`` (``T`` rows), in float32::

    d      = float32(x[t] + bias)                      int32 bias: added to the int32 x first
    d      = d * weight_scale[g]                       [2H] per column (or [T, 2H]: row t)
    d      = d * activation_scale[t]                   per token (optional)
    d      = d + bias                                  float32 / float16 / bfloat16 bias
    a, b   = d[:H], d[H:]
    out    = silu(a) * b   if activate_left            silu(z) = z / (1 + exp(-z))
             silu(b) * a   otherwise (the default: the right half is activated)
    quant_mode 0 (static):
        y  = clamp(round_half_even(out / quant_scale + quant_offset), -128, 127)
             quant_scale one value or [H] (absent: 1; a one-value scale of 0 counts as 1),
             quant_offset likewise (absent: 0); NaN -> 0. scale output: zeros (not computed)
    quant_mode 1 (dynamic, per token):
        out   = out * quant_scale[g]                   optional smoothing, [H] or one value
        scale = max(|out|) * float32(1 / 127)
        y     = round_half_even(out / scale)           (0 where scale == 0)

``g`` is the row's group: 0 without ``group_index``; with ``group_index`` (count mode: entry
``i`` is the number of consecutive rows of group ``i``, negative counts count as 0) the rows of
group ``i`` use ``weight_scale[i]`` and ``quant_scale[i]``, and rows past the sum of the counts
are outputs of zeros (the NPU leaves them unwritten). Returns ``(y int8 [..., H], scale float32
[...])``.

Facts this rests on: torch_npu's ``npu_dequant_swiglu_quant`` documentation (activate_left=False
activates ``split(x, 2)[1]`` and multiplies ``split(x, 2)[0]``; group_index is count mode, needs
quant_mode=1 and no bias / quant_offset; x int32 needs weight_scale), the aclnnDequantSwigluQuant
documentation of hicann/ops-nn (x int32 / float16 / bfloat16; bias int32 / float32 / float16 /
bfloat16; scale output not computed in static mode) and its Ascend C kernel (int32 bias added
before the float conversion, float bias after both scales; static quantization divides by
quant_scale and adds quant_offset; dynamic multiplies by quant_scale, takes amax * (1/127) and
divides; float -> int8 by ``CAST_RINT``, i.e. round half to even).

Float x (float16 / bfloat16): bias must be None; weight_scale and activation_scale are optional
and, when given, multiply as above (the Atlas A2 formula ``Dequant(x, weight_scale,
activation_scale)``; newer Ascend chips refuse them for float x). For float x without group_index,
weight_scale may also have x's full shape ``[..., 2H]`` (one scale row per token, as seed 004's
SuperKernel example passes it): each row then acts as its own group. The eager kernel runs Triton on CUDA (when importable), the fast CPU kernel on CPU, and
:func:`dequant_swiglu_quant_reference` elsewhere; none reads tensor values on the host.
"""
from __future__ import annotations

import torch

from torchair.base.registry import define_op
from torchair.ops.quant import cpu as _quant_cpu, triton as _quant_triton
from torchair.ops.quant.plans import SwigluQuantPlan

__all__ = ["SwigluQuantPlan", "check_dequant_swiglu_quant", "dequant_swiglu_quant_reference",
           "npu_dequant_swiglu_quant", "prepare_dequant_swiglu_quant"]

_OP = "npu_dequant_swiglu_quant"
_SCHEMA = (
    "npu_dequant_swiglu_quant(Tensor x, *, Tensor? weight_scale=None, "
    "Tensor? activation_scale=None, Tensor? bias=None, Tensor? quant_scale=None, "
    "Tensor? quant_offset=None, Tensor? group_index=None, bool activate_left=False, "
    "int quant_mode=0) -> (Tensor, Tensor)"
)
_X_DTYPES = (torch.int32, torch.float16, torch.bfloat16)
_BIAS_DTYPES = (torch.int32, torch.float32, torch.float16, torch.bfloat16)
_QUANT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_x(x: torch.Tensor) -> None:
    if x.dtype not in _X_DTYPES:
        raise TypeError(f"{_OP}: x must be int32 (a matmul accumulator), float16 or bfloat16; "
                        f"got {x.dtype}")
    if x.dim() < 2 or x.shape[-1] % 2 != 0 or x.shape[-1] == 0:
        raise ValueError(f"{_OP}: x must be [..., 2H] with at least 2 dimensions and an even, "
                         f"non-zero last dimension; got shape {tuple(x.shape)}")


def _check_dtype(name: str, t: torch.Tensor, dtypes) -> None:
    if t.dtype not in dtypes:
        raise TypeError(f"{_OP}: {name} has dtype {t.dtype}; expected one of "
                        f"{[str(d) for d in dtypes]}")


def _rows_of(name: str, t: torch.Tensor, groups: int, width: int, allow_one: bool
             ) -> torch.Tensor:
    """``t`` as ``[groups, width]`` (or ``[groups, 1]`` when ``allow_one``): accepted shapes are
    (groups, width), (groups, 1), (groups,) [allow_one], and (width,) / (1,) when groups == 1."""
    shape = tuple(t.shape)
    widths = (width, 1) if allow_one else (width,)
    if len(shape) == 2 and shape[0] == groups and shape[1] in widths:
        return t
    if len(shape) == 1 and groups == 1 and shape[0] in widths:
        return t.reshape(1, -1)
    if len(shape) == 1 and allow_one and shape[0] == groups:
        return t.reshape(groups, 1)
    expected = f"({groups}, {width})" + (f", ({groups}, 1) or ({groups},)" if allow_one else "")
    if groups == 1:
        expected += f" or ({width},)"
    raise ValueError(f"{_OP}: {name} must have shape {expected}; got {shape}")


def check_dequant_swiglu_quant(x, *, weight_scale=None, activation_scale=None, bias=None,
                               quant_scale=None, quant_offset=None, group_index=None,
                               activate_left=False, quant_mode=0) -> None:
    """Every argument check of ``npu_dequant_swiglu_quant`` (dtypes and shapes, never tensor
    values): the one validation shared by the fake kernel and
    :func:`prepare_dequant_swiglu_quant`, so the two cannot drift."""
    _check_x(x)
    if quant_mode not in (0, 1):
        raise ValueError(f"{_OP}: quant_mode={quant_mode!r}; expected 0 (static) or 1 (dynamic)")
    dynamic = quant_mode == 1
    width = x.shape[-1]
    h = width // 2
    lead = tuple(x.shape[:-1])
    groups = 1
    if group_index is not None:
        if group_index.dtype not in (torch.int64, torch.int32) or group_index.dim() != 1 \
                or group_index.numel() == 0:
            raise ValueError(f"{_OP}: group_index must be a non-empty 1-D int32 or int64 tensor "
                             f"of token counts; got {group_index.dtype} "
                             f"{tuple(group_index.shape)}")
        if x.dim() != 2:
            raise ValueError(f"{_OP}: with group_index, x must be 2-D [T, 2H]; got "
                             f"{tuple(x.shape)}")
        for name, value in (("bias", bias), ("quant_offset", quant_offset)):
            if value is not None:
                raise ValueError(f"{_OP}: {name} is not supported with group_index (torch_npu "
                                 f"ignores it there); drop {name} or group_index")
        if not dynamic:
            raise ValueError(f"{_OP}: group_index needs quant_mode=1 (dynamic); got "
                             f"quant_mode={quant_mode}")
        groups = group_index.numel()
    if x.dtype != torch.int32:
        if bias is not None:
            raise ValueError(f"{_OP}: bias applies to int32 x only (the matmul accumulator); x "
                             f"is {x.dtype}. Drop bias or pass the int32 accumulator")
    elif weight_scale is None:
        raise ValueError(f"{_OP}: x is int32, so weight_scale (float32 [2H] = [{width}], or "
                         f"[G, 2H] with group_index) is required to dequantize it")
    if weight_scale is not None:
        _check_dtype("weight_scale", weight_scale, (torch.float32,))
        if not _per_token_scale(x, weight_scale, group_index):
            _rows_of("weight_scale", weight_scale, groups, width, False)
    if activation_scale is not None:
        _check_dtype("activation_scale", activation_scale, (torch.float32,))
        if tuple(activation_scale.shape) not in (lead, lead + (1,)):
            raise ValueError(f"{_OP}: activation_scale must have shape {lead} or {lead + (1,)} "
                             f"(one value per token); got {tuple(activation_scale.shape)}")
    if bias is not None:
        if bias.dtype not in _BIAS_DTYPES:
            raise TypeError(f"{_OP}: bias has dtype {bias.dtype}; expected one of "
                            f"{[str(d) for d in _BIAS_DTYPES]}")
        _rows_of("bias", bias, 1, width, False)
    if quant_scale is not None:
        _check_dtype("quant_scale", quant_scale, _QUANT_DTYPES)
        _rows_of("quant_scale", quant_scale, groups, h, True)
    if quant_offset is not None:
        if dynamic:
            raise ValueError(f"{_OP}: quant_offset is only used by static quantization "
                             "(quant_mode=0); drop it with quant_mode=1")
        _check_dtype("quant_offset", quant_offset, _QUANT_DTYPES)
        _rows_of("quant_offset", quant_offset, 1, h, True)


def _per_token_scale(x, weight_scale, group_index) -> bool:
    """Float x's weight_scale of x's own (multi-row) shape: one scale row per token."""
    return (x.dtype != torch.int32 and group_index is None and x.dim() >= 2
            and x.numel() // x.shape[-1] > 1 and tuple(weight_scale.shape) == tuple(x.shape))


def prepare_dequant_swiglu_quant(x, *, weight_scale=None, activation_scale=None, bias=None,
                                 quant_scale=None, quant_offset=None, group_index=None,
                                 activate_left=False, quant_mode=0) -> SwigluQuantPlan:
    """Validate the arguments of ``npu_dequant_swiglu_quant`` (:func:`check_dequant_swiglu_quant`)
    and return the canonical plan."""
    check_dequant_swiglu_quant(
        x, weight_scale=weight_scale, activation_scale=activation_scale, bias=bias,
        quant_scale=quant_scale, quant_offset=quant_offset, group_index=group_index,
        activate_left=activate_left, quant_mode=quant_mode)
    dynamic = quant_mode == 1
    width = x.shape[-1]
    h = width // 2
    lead = tuple(x.shape[:-1])
    x2d = x.reshape(-1, width)
    tokens = x2d.shape[0]
    groups, row_group = 1, None
    if group_index is not None:
        groups = group_index.numel()
        ends = torch.cumsum(group_index.long().clamp_min(0), 0)
        positions = torch.arange(tokens, device=x.device)
        row_group = torch.searchsorted(ends, positions, right=True)  # == groups: past the end
    ws = None
    if weight_scale is not None and _per_token_scale(x, weight_scale, group_index):
        # one row per token: every row is its own group (kernels index scales by row_group)
        groups, row_group = tokens, torch.arange(tokens, device=x.device)
        ws = weight_scale.float().reshape(tokens, width)
    elif weight_scale is not None:
        ws = _rows_of("weight_scale", weight_scale.float(), groups, width, False)
    act = None
    if activation_scale is not None:
        act = activation_scale.float().reshape(tokens)
    int_bias = float_bias = None
    if bias is not None:
        bias = _rows_of("bias", bias, 1, width, False)[0]
        if bias.dtype == torch.int32:
            int_bias = bias
        else:
            float_bias = bias.float()
    qs = qo = None
    if quant_scale is not None:
        qs = _rows_of("quant_scale", quant_scale.float(), 1 if group_index is None else groups,
                      h, True)
        if group_index is None and groups > 1:  # per-token weight_scale: the same row each
            qs = qs.expand(groups, qs.shape[1])
        if not dynamic and qs.shape[1] == 1:  # one static scale: 0 counts as 1 (as on Ascend)
            qs = torch.where(qs == 0, 1.0, qs)
    if quant_offset is not None:
        qo = _rows_of("quant_offset", quant_offset.float(), 1, h, True)
    return SwigluQuantPlan(x2d, lead, dynamic, bool(activate_left), groups, ws, act, int_bias,
                           float_bias, qs, qo, row_group)


def swiglu_quant_reference(plan: SwigluQuantPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """The formula of the module doc on a canonical plan: ``(y [T, H], scale [T])``."""
    x = plan.x
    h = x.shape[1] // 2
    last = plan.num_groups - 1
    gid = plan.row_group.clamp(max=last) if plan.row_group is not None else None
    if plan.int_bias is not None:
        x = x + plan.int_bias
    d = x.to(torch.float32)
    if plan.weight_scale is not None:
        d = d * (plan.weight_scale[gid] if gid is not None else plan.weight_scale[0])
    if plan.act_scale is not None:
        d = d * plan.act_scale[:, None]
    if plan.float_bias is not None:
        d = d + plan.float_bias
    left, right = d[:, :h], d[:, h:]
    act, gate = (left, right) if plan.activate_left else (right, left)
    out = act / (torch.exp(-act) + 1.0) * gate
    qs = plan.quant_scale
    if qs is not None:
        qs = qs[gid] if gid is not None else qs[0]
    if plan.dynamic:
        if qs is not None:
            out = out * qs
        scale = out.abs().amax(dim=1) * (1.0 / 127.0)
        out = out / torch.where(scale == 0, 1.0, scale)[:, None]
    else:
        if qs is not None:
            out = out / qs
        if plan.quant_offset is not None:
            out = out + plan.quant_offset[0]
        out = torch.nan_to_num(out, nan=0.0)
        scale = torch.zeros(x.shape[0], dtype=torch.float32, device=x.device)
    y = torch.round(out).clamp(-128, 127)
    if plan.row_group is not None:
        outside = plan.row_group >= plan.num_groups
        y = y.masked_fill(outside[:, None], 0.0)
        scale = scale.masked_fill(outside, 0.0)
    return y.to(torch.int8), scale


def _shaped(plan: SwigluQuantPlan, y: torch.Tensor, scale: torch.Tensor):
    return y.view(*plan.lead_shape, y.shape[-1]), scale.view(plan.lead_shape)


def dequant_swiglu_quant_reference(
        x: torch.Tensor, *, weight_scale: torch.Tensor | None = None,
        activation_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None,
        quant_scale: torch.Tensor | None = None, quant_offset: torch.Tensor | None = None,
        group_index: torch.Tensor | None = None, activate_left: bool = False,
        quant_mode: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-PyTorch ``npu_dequant_swiglu_quant``: the oracle of the fast kernels.

    Parameters
    ----------
    x
        int32 ``[..., 2H]`` (a quantized matmul's accumulator) or float16 / bfloat16.
    weight_scale
        float32 ``[2H]`` / ``[1, 2H]``, or ``[G, 2H]`` with group_index; required for int32 x.
        For float x also x's own shape ``[..., 2H]`` (one row per token).
    activation_scale
        float32 ``[...]`` or ``[..., 1]``: one value per token; optional.
    bias
        ``[2H]``: int32 (added to x before dequantization) or float32 / float16 / bfloat16
        (added after it); not with group_index.
    quant_scale
        float32 / float16 / bfloat16. Static: one value or ``[H]`` (divisor). Dynamic: ``[H]``,
        one value, or ``[G, H]`` / ``[G]`` with group_index (multiplier, "smooth" scale).
    quant_offset
        static only: one value or ``[H]``, added after the division.
    group_index
        int32 / int64 ``[G]``: token counts of consecutive groups (count mode); needs quant_mode=1.
    activate_left
        True: silu of the left half times the right half; False: silu of the right half.
    quant_mode
        0 static, 1 dynamic per-token.

    Returns
    -------
    ``(y, scale)``: int8 ``[..., H]`` and float32 ``[...]`` (zeros in static mode). Formula and
    rounding in the module doc.
    """
    plan = prepare_dequant_swiglu_quant(
        x, weight_scale=weight_scale, activation_scale=activation_scale, bias=bias,
        quant_scale=quant_scale, quant_offset=quant_offset, group_index=group_index,
        activate_left=activate_left, quant_mode=quant_mode)
    return _shaped(plan, *swiglu_quant_reference(plan))


def _eager(x, *, weight_scale=None, activation_scale=None, bias=None, quant_scale=None,
           quant_offset=None, group_index=None, activate_left=False, quant_mode=0):
    plan = prepare_dequant_swiglu_quant(
        x, weight_scale=weight_scale, activation_scale=activation_scale, bias=bias,
        quant_scale=quant_scale, quant_offset=quant_offset, group_index=group_index,
        activate_left=activate_left, quant_mode=quant_mode)
    if x.device.type == "cuda" and _quant_triton.HAS_TRITON:
        return _shaped(plan, *_quant_triton.dequant_swiglu_quant_triton(plan))
    if x.device.type == "cpu":
        return _shaped(plan, *_quant_cpu.dequant_swiglu_quant_cpu(plan))
    return _shaped(plan, *swiglu_quant_reference(plan))


def _fake(x, *, weight_scale=None, activation_scale=None, bias=None, quant_scale=None,
          quant_offset=None, group_index=None, activate_left=False, quant_mode=0):
    """``(int8 [..., H], float32 [...])``; the same checks as the eager kernel
    (:func:`check_dequant_swiglu_quant`: dtypes and shapes, never values)."""
    check_dequant_swiglu_quant(
        x, weight_scale=weight_scale, activation_scale=activation_scale, bias=bias,
        quant_scale=quant_scale, quant_offset=quant_offset, group_index=group_index,
        activate_left=activate_left, quant_mode=quant_mode)
    lead = x.shape[:-1]
    y = x.new_empty((*lead, x.shape[-1] // 2), dtype=torch.int8)
    return y, x.new_empty(lead, dtype=torch.float32)


npu_dequant_swiglu_quant = define_op(_SCHEMA, fake=_fake, kernel=_eager)
