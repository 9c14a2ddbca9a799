"""``npu_dynamic_quant``, ``npu_add_rms_norm_dynamic_quant``: per-token symmetric int8 (torch_npu).

Per row ``x`` (the last dim, ``H`` elements; every leading index is one token)::

    npu_dynamic_quant(input, smooth_scales=s, group_index=gi):
        x      = input_f32 * s_f32                    (s absent: x = input_f32)
        scale  = max(|x|) / 127                       float32, shape input.shape[:-1]
        y      = clamp(round(x / scale), -128, 127)   int8; y = 0 on a row whose scale is 0

    npu_add_rms_norm_dynamic_quant(x1, x2, gamma, smooth_scale1=s1, smooth_scale2=s2, beta=b):
        x_out  = round_to_dtype(x1_f32 + x2_f32)                      as npu_add_rms_norm
        y      = x_out_f32 * rstd * gamma_f32 (+ b_f32)               float32, NOT rounded
        (y1, scale1) = quantize(y * s1_f32)   (s1 absent: quantize(y))
        (y2, scale2) = quantize(y * s2_f32)   (s2 absent: quantize(y))
        returns (y1, y2, x_out, scale1, scale2)

Rounding and edge cases (the same in every kernel):

* ``round`` is round half to even (``torch.round``), applied to the float32 quotient ``x / scale``
  (a true division, not a multiplication by ``1 / scale``). ``|x / scale| <= 127`` up to one
  rounding, so the clamp only documents the int8 range.
* A row of zeros has ``scale = 0``; its ``y`` is defined as 0 (no NaN). Non-finite inputs give
  unspecified int8 values.
* ``smooth_scales``: ``[H]``; with ``group_index`` (MoE) it is ``[E, H]`` and ``group_index``
  (int32/int64 ``[E]``, non-decreasing) holds cumulative row ends: row ``r`` (of the flattened
  leading dims) uses expert ``e = #{j : group_index[j] <= r}``, i.e. rows
  ``[group_index[e-1], group_index[e])`` use ``smooth_scales[e]``; rows at or past
  ``group_index[-1]`` use the last expert. A decreasing ``group_index`` is not checked (that
  would read it on the host, also inside a static unit) and gives unspecified experts.
* ``dst_type``: None or ``torch.int8``; the int4 / float8 outputs of Ascend are not supported.

``npu_add_rms_norm_dynamic_quant`` quantizes the float32 ``y`` (Ascend's kernel keeps ``y`` in
float32 between its norm and quantization stages as well). The unfused chain ``npu_add_rms_norm``
-> ``npu_dynamic_quant(y, smooth_scales=s1)`` quantizes ``y`` rounded to ``x1.dtype`` first, so for
float16 / bfloat16 the two can differ by one int8 step (never more), in about 0.4% of the values
for float16 and 3-4% for bfloat16 (measured on random rows of 7168; ``scale1`` differs by the
rounding of ``max|y|``); for float32 they are equal. The fused result is the closer one to exact
arithmetic.

``output_mask`` (``[]`` or two bools) selects the quantizations. ``[]``: ``y1`` always, ``y2`` only
when ``smooth_scale2`` is given (then ``smooth_scale1`` must be given too). ``[m1, m2]``: ``y1`` iff
``m1``, ``y2`` iff ``m2`` (a given ``smooth_scale1`` / ``smooth_scale2`` needs ``m1`` / ``m2``
True). A quantization not produced returns *empty* outputs: ``y`` int8 of shape ``[0]`` and
``scale`` float32 of shape ``[0]`` (torch_npu returns full-size buffers of unspecified content).

Inputs are float16, bfloat16 or float32; ``gamma``, ``beta``, ``smooth_scale1/2`` are ``[H]`` in any
of these dtypes. The references (:func:`dynamic_quant_reference`,
:func:`add_rms_norm_dynamic_quant_reference`) are the oracle; the eager kernels run
:mod:`torchair.ops.norm.cpu` on CPU, :mod:`torchair.ops.norm.triton` on CUDA when Triton is
importable, and the reference elsewhere.
"""
from __future__ import annotations

from typing import Sequence

import torch

from torchair.base.registry import define_op
from torchair.ops.norm import cpu as _norm_cpu, triton as _norm_triton
from torchair.ops.norm.rms_norm import FLOAT_DTYPES, check_norm_args, device_kernel

__all__ = ["add_rms_norm_dynamic_quant_reference", "dynamic_quant_reference",
           "npu_add_rms_norm_dynamic_quant", "npu_dynamic_quant", "quantize_rows_reference",
           "wanted_outputs"]

_DQ = "npu_dynamic_quant"
_ARNDQ = "npu_add_rms_norm_dynamic_quant"
_DYNAMIC_QUANT_SCHEMA = (
    "npu_dynamic_quant(Tensor input, *, Tensor? smooth_scales=None, Tensor? group_index=None, "
    "ScalarType? dst_type=None) -> (Tensor, Tensor)")
_ADD_RMS_NORM_DYNAMIC_QUANT_SCHEMA = (
    "npu_add_rms_norm_dynamic_quant(Tensor x1, Tensor x2, Tensor gamma, *, "
    "Tensor? smooth_scale1=None, Tensor? smooth_scale2=None, Tensor? beta=None, "
    "float epsilon=1e-06, bool[2] output_mask=[]) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")
_INDEX_DTYPES = (torch.int32, torch.int64)


# ---------------------------------------------------------------- validation ---------------------

def _check_vector(op: str, name: str, t: torch.Tensor | None, hidden, x_name: str) -> None:
    """``t`` (optional) must be a float ``[H]`` vector, ``H = x.shape[-1]``."""
    if t is None:
        return
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {name} has dtype {t.dtype}; expected float16, bfloat16 or "
                        f"float32; cast {name}")
    if t.dim() != 1 or t.shape[0] != hidden:
        raise ValueError(f"{op}: {name} has shape {list(t.shape)}; expected [{hidden}] (the last "
                         f"dim of {x_name}); pass one value per channel of {x_name}")


def _check_dynamic_quant(input, smooth_scales, group_index, dst_type) -> None:
    if input.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{_DQ}: input has dtype {input.dtype}; expected float16, bfloat16 or "
                        f"float32; cast input to one of them")
    if input.dim() < 1 or input.shape[-1] == 0:
        raise ValueError(f"{_DQ}: input has shape {list(input.shape)}; expected at least one dim "
                         f"and a non-empty last dim (the quantized row); reshape input")
    if dst_type is not None and dst_type != torch.int8:
        raise TypeError(f"{_DQ}: dst_type is {dst_type}; only torch.int8 (or None) is supported "
                        f"(int4 / float8 outputs are not); pass dst_type=torch.int8")
    hidden = input.shape[-1]
    if group_index is None:
        _check_vector(_DQ, "smooth_scales", smooth_scales, hidden, "input")
        return
    if smooth_scales is None:
        raise ValueError(f"{_DQ}: group_index is given but smooth_scales is None; group_index "
                         f"selects per-expert rows of smooth_scales [E, H]; pass smooth_scales")
    if group_index.dtype not in _INDEX_DTYPES or group_index.dim() != 1:
        raise TypeError(f"{_DQ}: group_index has dtype {group_index.dtype} and shape "
                        f"{list(group_index.shape)}; expected a 1-D int32/int64 tensor [E] of "
                        f"cumulative row ends; pass group_index as int32 [E]")
    if smooth_scales.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{_DQ}: smooth_scales has dtype {smooth_scales.dtype}; expected "
                        f"float16, bfloat16 or float32; cast smooth_scales")
    experts = group_index.shape[0]
    if smooth_scales.dim() != 2 or tuple(smooth_scales.shape) != (experts, hidden) \
            or experts == 0:
        raise ValueError(f"{_DQ}: smooth_scales has shape {list(smooth_scales.shape)} with "
                         f"group_index of shape {list(group_index.shape)}; expected "
                         f"[{experts}, {hidden}] (one row of scales per expert, E >= 1); pass "
                         f"smooth_scales [E, H]")


def wanted_outputs(output_mask: Sequence[bool] | None, smooth_scale1, smooth_scale2
                   ) -> tuple[bool, bool]:
    """Which quantizations ``npu_add_rms_norm_dynamic_quant`` produces: ``(y1?, y2?)``.

    Raises ``ValueError`` for an ``output_mask`` that is neither empty nor two bools, or that
    contradicts a given smooth scale.
    """
    mask = list(output_mask) if output_mask is not None else []
    if not mask:
        if smooth_scale2 is not None and smooth_scale1 is None:
            raise ValueError(f"{_ARNDQ}: smooth_scale2 is given but smooth_scale1 is None (with "
                             f"output_mask=[]); pass smooth_scale1 too, or "
                             f"output_mask=[False, True]")
        return True, smooth_scale2 is not None
    if len(mask) != 2:
        raise ValueError(f"{_ARNDQ}: output_mask is {mask}; expected [] or two bools "
                         f"[y1?, y2?]; pass e.g. output_mask=[True, True]")
    want1, want2 = bool(mask[0]), bool(mask[1])
    for i, (want, s) in enumerate(((want1, smooth_scale1), (want2, smooth_scale2)), start=1):
        if s is not None and not want:
            raise ValueError(f"{_ARNDQ}: smooth_scale{i} is given but output_mask[{i - 1}] is "
                             f"False; set output_mask[{i - 1}]=True or drop smooth_scale{i}")
    return want1, want2


def _check_add_rms_norm_dynamic_quant(x1, x2, gamma, smooth_scale1, smooth_scale2, beta,
                                      output_mask) -> tuple[bool, bool]:
    check_norm_args(_ARNDQ, x1, gamma, x_name="x1", x2=x2)
    hidden = x1.shape[-1]
    if gamma.dim() != 1:
        raise ValueError(f"{_ARNDQ}: gamma has shape {list(gamma.shape)}; expected [{hidden}] "
                         f"(the last dim of x1: norm and quantization run per row); pass a 1-D "
                         f"gamma")
    for name, t in (("smooth_scale1", smooth_scale1), ("smooth_scale2", smooth_scale2),
                    ("beta", beta)):
        _check_vector(_ARNDQ, name, t, hidden, "x1")
    return wanted_outputs(output_mask, smooth_scale1, smooth_scale2)


# ---------------------------------------------------------------- reference ----------------------

def quantize_rows_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8 of a float32 ``x [..., H]``: ``(y int8 [..., H], scale [...])``."""
    scale = x.abs().amax(dim=-1) / 127.0
    s = scale.unsqueeze(-1)
    q = torch.where(s > 0, x / s, torch.zeros_like(x))  # a zero row: y = 0 (0 / 0 not used)
    return torch.round(q).clamp(-128, 127).to(torch.int8), scale


def _expert_rows(smooth_scales: torch.Tensor, group_index: torch.Tensor, rows: int
                 ) -> torch.Tensor:
    """``smooth_scales[e(r)]`` for every row ``r``: float32 ``[rows, H]``."""
    experts = _norm_cpu.expert_of_rows(group_index, rows, smooth_scales.shape[0])
    return smooth_scales.float()[experts.to(smooth_scales.device)]


def dynamic_quant_reference(input: torch.Tensor, *, smooth_scales: torch.Tensor | None = None,
                            group_index: torch.Tensor | None = None,
                            dst_type: torch.dtype | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-PyTorch per-token int8 quantization: the oracle of ``npu_dynamic_quant``.

    Returns ``(y int8 shaped like input, scale float32 input.shape[:-1])`` (module doc).
    """
    _check_dynamic_quant(input, smooth_scales, group_index, dst_type)
    x = input.float()
    if smooth_scales is not None and group_index is None:
        x = x * smooth_scales.float()
    elif smooth_scales is not None:
        rows = x.reshape(-1, x.shape[-1])
        x = (rows * _expert_rows(smooth_scales, group_index, rows.shape[0])).view(x.shape)
    return quantize_rows_reference(x)


def add_rms_norm_dynamic_quant_reference(
        x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, *,
        smooth_scale1: torch.Tensor | None = None, smooth_scale2: torch.Tensor | None = None,
        beta: torch.Tensor | None = None, epsilon: float = 1e-6,
        output_mask: Sequence[bool] = ()) -> tuple[torch.Tensor, ...]:
    """Oracle of ``npu_add_rms_norm_dynamic_quant``: ``(y1, y2, x_out, scale1, scale2)``."""
    want1, want2 = _check_add_rms_norm_dynamic_quant(x1, x2, gamma, smooth_scale1, smooth_scale2,
                                                     beta, output_mask)
    x_out = (x1.float() + x2.float()).to(x1.dtype)
    xf = x_out.float()
    rstd = torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + epsilon)
    y = (xf * rstd) * gamma.float()  # float32, not rounded to x1.dtype
    if beta is not None:
        y = y + beta.float()
    outs = []
    for want, smooth in ((want1, smooth_scale1), (want2, smooth_scale2)):
        if not want:
            outs.append(_empty_quant(x1))
        else:
            outs.append(quantize_rows_reference(y * smooth.float() if smooth is not None else y))
    (y1, scale1), (y2, scale2) = outs
    return y1, y2, x_out, scale1, scale2


def _empty_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The outputs of a quantization not produced: int8 ``[0]`` and float32 ``[0]``."""
    return x.new_empty(0, dtype=torch.int8), x.new_empty(0, dtype=torch.float32)


# ---------------------------------------------------------------- eager kernels ------------------

def _dynamic_quant_eager(input, *, smooth_scales=None, group_index=None, dst_type=None):
    kind = device_kernel(input, input.shape[-1] if input.dim() else 0)
    if kind == "reference":
        return dynamic_quant_reference(input, smooth_scales=smooth_scales,
                                       group_index=group_index, dst_type=dst_type)
    _check_dynamic_quant(input, smooth_scales, group_index, dst_type)
    fn = _norm_cpu.dynamic_quant_cpu if kind == "cpu" else _norm_triton.dynamic_quant_triton
    return fn(input, smooth_scales, group_index)


def _add_rms_norm_dynamic_quant_eager(x1, x2, gamma, *, smooth_scale1=None, smooth_scale2=None,
                                      beta=None, epsilon=1e-6, output_mask=()):
    kind = device_kernel(x1, x1.shape[-1] if x1.dim() else 0)
    if kind == "reference":
        return add_rms_norm_dynamic_quant_reference(
            x1, x2, gamma, smooth_scale1=smooth_scale1, smooth_scale2=smooth_scale2, beta=beta,
            epsilon=epsilon, output_mask=output_mask)
    want1, want2 = _check_add_rms_norm_dynamic_quant(x1, x2, gamma, smooth_scale1,
                                                     smooth_scale2, beta, output_mask)
    fn = (_norm_cpu.add_rms_norm_dynamic_quant_cpu if kind == "cpu"
          else _norm_triton.add_rms_norm_dynamic_quant_triton)
    return fn(x1, x2, gamma, smooth_scale1=smooth_scale1, smooth_scale2=smooth_scale2, beta=beta,
              epsilon=epsilon, want1=want1, want2=want2)


# ---------------------------------------------------------------- fake kernels -------------------

def _dynamic_quant_fake(input, *, smooth_scales=None, group_index=None, dst_type=None):
    _check_dynamic_quant(input, smooth_scales, group_index, dst_type)
    return (input.new_empty(input.shape, dtype=torch.int8),
            input.new_empty(input.shape[:-1], dtype=torch.float32))


def _add_rms_norm_dynamic_quant_fake(x1, x2, gamma, *, smooth_scale1=None, smooth_scale2=None,
                                     beta=None, epsilon=1e-6, output_mask=()):
    wants = _check_add_rms_norm_dynamic_quant(x1, x2, gamma, smooth_scale1, smooth_scale2, beta,
                                              output_mask)
    (y1, s1), (y2, s2) = [
        (x1.new_empty(x1.shape, dtype=torch.int8),
         x1.new_empty(x1.shape[:-1], dtype=torch.float32)) if want else _empty_quant(x1)
        for want in wants]
    return y1, y2, x1.new_empty(x1.shape), s1, s2


npu_dynamic_quant = define_op(_DYNAMIC_QUANT_SCHEMA, fake=_dynamic_quant_fake,
                              kernel=_dynamic_quant_eager)
npu_add_rms_norm_dynamic_quant = define_op(_ADD_RMS_NORM_DYNAMIC_QUANT_SCHEMA,
                                           fake=_add_rms_norm_dynamic_quant_fake,
                                           kernel=_add_rms_norm_dynamic_quant_eager)
