"""``npu_quant_matmul``: int8 x int8 matmul with an int32 accumulator and a quantization epilogue.

With ``acc = x1 @ x2`` accumulated exactly in int32 (batch dimensions broadcast), per output
element ``[..., m, n]`` and in float32::

    a  = wrap_int32(acc + bias[n])              (int32 bias; added to the int32 accumulator)
    v  = float32(a) * scale[n]                  (scale: one value or one per column n)
    v  = v * pertoken_scale[m]                  (optional; float16 / bfloat16 output only)
    v  = v + float32(bias[n])                   (float bias: float32 / float16 / bfloat16)
    int8 output (default):   out = clamp(round_half_even(v + offset[n]), -128, 127)
    float16 / bfloat16:      out = v rounded to the output dtype (round to nearest even)

This is the formula of the torch_npu / aclnnQuantMatmulV4 documentation: an int32 bias enters
before ``scale`` (``(x1 @ x2 + bias) * scale + offset``), a float bias after it
(``x1 @ x2 * scale [* pertoken_scale] + bias``), and ``offset`` exists only for int8 output. The
documents do not name the rounding of the int8 requantization; round half to even is used (the
rounding of Ascend's float -> int8 casts, ``CAST_RINT``).

The int32 bias is added to the int32 accumulator with two's-complement wrap-around
(``wrap_int32(v) = (v + 2**31) mod 2**32 - 2**31``), as an int32 hardware accumulator does:
``|x1 @ x2| <= K * 2**14 < 2**30`` never overflows by itself (``K <= 65535``), so only a bias
within ``K * 2**14`` of the int32 limits can wrap. Every kernel (reference, CPU, Triton) gives the
same wrapped result; no kernel reads tensor values to detect it.

An int64 ``scale`` is the output of ``torch_npu.npu_trans_quant_param`` and is decoded: its low
32 bits are the float32 bit pattern of the scale (truncated to its 19 high bits by that call) and
bits 37..45 hold a 9-bit signed integer offset (used for int8 output).

Accepted combinations (the Atlas A2/A3 table of the documentation, int8 inputs):

==============  ==============  ==================  =====================  ==============
output_dtype    scale           offset              bias                   pertoken_scale
==============  ==============  ==================  =====================  ==============
int8 / None     int64, float32  float32 / None      int32 / None           None
float16         int64, float32  None                int32 / None           None
float16         float32         None                int32, f16, f32 / None float32
bfloat16        float32, bf16   None                int32, bf16, f32/None  float32 / None
==============  ==============  ==================  =====================  ==============

Not implemented (``NotImplementedError`` naming the argument): int4 inputs packed in int32,
``output_dtype=torch.int32`` (the documentation does not say how ``scale`` applies to it), and
non-default ``x1_dtype`` / ``x2_dtype`` / ``pertoken_scale_dtype`` / ``scale_dtype`` /
``group_sizes`` / ``y_scale``.

The eager kernel runs the Triton kernel on CUDA (when Triton is importable), the fast CPU kernel
(``torch._int_mm`` + a chunked epilogue) on CPU, and :func:`quant_matmul_reference` elsewhere.
"""
from __future__ import annotations

import torch

from torchair.base.registry import define_op
from torchair.ops.quant import cpu as _quant_cpu, triton as _quant_triton
from torchair.ops.quant.plans import QuantMatmulPlan

__all__ = ["QuantMatmulPlan", "check_quant_matmul", "npu_quant_matmul", "prepare_quant_matmul",
           "quant_matmul_epilogue_reference", "quant_matmul_reference", "wrap_int32"]

_OP = "npu_quant_matmul"
_SCHEMA = (
    "npu_quant_matmul(Tensor x1, Tensor x2, Tensor scale, *, Tensor? offset=None, "
    "Tensor? pertoken_scale=None, Tensor? bias=None, ScalarType? output_dtype=None, "
    "int? x1_dtype=None, int? x2_dtype=None, int? pertoken_scale_dtype=None, "
    "int? scale_dtype=None, int[]? group_sizes=None, Tensor? y_scale=None) -> Tensor"
)
_MAX_K = 65535  # documented limit; keeps |x1 @ x2| < 2**30 so int32 never overflows
_OUTPUT_DTYPES = (torch.int8, torch.float16, torch.bfloat16)
# output dtype -> (scale dtypes, bias dtypes) without / with pertoken_scale (None: not allowed)
_COMBOS = {
    torch.int8: (({torch.int64, torch.float32}, {torch.int32}), None),
    torch.float16: (({torch.int64, torch.float32}, {torch.int32}),
                    ({torch.float32}, {torch.int32, torch.float16, torch.float32})),
    torch.bfloat16: (({torch.float32, torch.bfloat16}, {torch.int32, torch.bfloat16, torch.float32}),
                     ({torch.float32, torch.bfloat16},
                      {torch.int32, torch.bfloat16, torch.float32})),
}


def output_dtype_of(output_dtype: torch.dtype | None) -> torch.dtype:
    """The dtype of the result for ``output_dtype`` (None means int8); raises for the others."""
    if output_dtype is None:
        return torch.int8
    if output_dtype == torch.int32:
        raise NotImplementedError(
            f"{_OP}: output_dtype=torch.int32 is not implemented by torchair (the torch_npu "
            "documentation does not define how scale applies to an int32 output); use "
            "output_dtype=torch.bfloat16 or torch.float16, or torch._int_mm for the raw "
            "accumulator")
    if output_dtype not in _OUTPUT_DTYPES:
        raise ValueError(f"{_OP}: output_dtype={output_dtype} is not supported; expected None, "
                         "torch.int8, torch.float16 or torch.bfloat16")
    return output_dtype


def _check_unsupported(extras: dict) -> None:
    for name, value in extras.items():
        if value is not None:
            raise NotImplementedError(
                f"{_OP}: {name}={value!r} is not implemented by torchair (only the default None "
                f"is); drop the {name} argument")


def _check_inputs(x1: torch.Tensor, x2: torch.Tensor) -> None:
    if x1.dtype == torch.int32 or x2.dtype == torch.int32:
        raise NotImplementedError(
            f"{_OP}: int4 inputs packed in int32 (x1 {x1.dtype}, x2 {x2.dtype}) are not "
            "implemented by torchair; pass int8 x1 and x2")
    for name, t in (("x1", x1), ("x2", x2)):
        if t.dtype != torch.int8:
            raise TypeError(f"{_OP}: {name} must be int8; got {t.dtype}. Quantize it to int8 "
                            "first (e.g. npu_dynamic_quant for activations)")
        if not 2 <= t.dim() <= 6:
            raise ValueError(f"{_OP}: {name} must have 2 to 6 dimensions; got shape "
                             f"{tuple(t.shape)}")


def _per_column(name: str, t: torch.Tensor, n: int) -> torch.Tensor:
    """``t`` of shape (1,), (n,), (1, 1) or (1, n) as a flat float32 vector."""
    ok = (t.dim() == 1 or (t.dim() == 2 and t.shape[0] == 1)) and t.shape[-1] in (1, n)
    if not ok:
        raise ValueError(f"{_OP}: {name} must have shape (1,) or (n,) with n = x2.shape[-1] = "
                         f"{n}; got {tuple(t.shape)}")
    return t.reshape(-1)


def decode_int64_scale(scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 scale and offset packed by ``npu_trans_quant_param`` into an int64 tensor.

    Low 32 bits: the float32 bit pattern; bits 37..45: a 9-bit two's-complement offset.
    """
    bits = scale.reshape(-1).contiguous()
    words = bits.view(torch.int32).reshape(-1, 2)  # (low, high) words: little-endian hosts
    value = words[:, 0].contiguous().view(torch.float32).reshape(scale.shape)
    off = (bits >> 37) & 0x1FF
    off = torch.where(off >= 256, off - 512, off)
    return value, off.to(torch.float32).reshape(scale.shape)


def check_quant_matmul(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None,
                       output_dtype=None, **extras) -> tuple[torch.dtype, torch.Size]:
    """Every argument check of ``npu_quant_matmul`` (dtypes and shapes, never tensor values):
    the one validation shared by the fake kernel and :func:`prepare_quant_matmul`, so the two
    cannot drift. Returns ``(output dtype, broadcast batch shape)``."""
    _check_unsupported(extras)
    _check_inputs(x1, x2)
    m, k = x1.shape[-2], x1.shape[-1]
    n = x2.shape[-1]
    if x2.shape[-2] != k:
        raise ValueError(f"{_OP}: x1 [..., M, K] and x2 [..., K, N] disagree on K: x1 "
                         f"{tuple(x1.shape)}, x2 {tuple(x2.shape)}; transpose x2 if it is [N, K]")
    if k > _MAX_K:
        raise ValueError(f"{_OP}: K = {k} exceeds {_MAX_K} (the documented limit, which keeps "
                         "the int32 accumulator exact); split K and add the partial results")
    try:
        batch = torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    except RuntimeError as err:
        raise ValueError(f"{_OP}: the batch dimensions of x1 {tuple(x1.shape)} and x2 "
                         f"{tuple(x2.shape)} do not broadcast") from err
    out_dtype = output_dtype_of(output_dtype)
    with_pertoken = pertoken_scale is not None
    combo = _COMBOS[out_dtype][int(with_pertoken)]
    if combo is None:
        raise ValueError(f"{_OP}: pertoken_scale is not supported with output_dtype "
                         f"{out_dtype}; use output_dtype=torch.bfloat16 or torch.float16")
    scale_dtypes, bias_dtypes = combo
    if scale.dtype not in scale_dtypes:
        raise TypeError(f"{_OP}: scale has dtype {scale.dtype}; with output_dtype {out_dtype}"
                        f"{' and pertoken_scale' if with_pertoken else ''} it must be one of "
                        f"{sorted(map(str, scale_dtypes))}")
    _per_column("scale", scale, n)
    if scale.dtype == torch.int64 and offset is not None:
        raise ValueError(f"{_OP}: offset was given with an int64 scale; pass the offset "
                         "either packed by npu_trans_quant_param(scale, offset) or as a "
                         "float32 offset with a float32 scale, not both")
    if offset is not None:
        if out_dtype != torch.int8:
            raise ValueError(f"{_OP}: offset is only supported with int8 output; got "
                             f"output_dtype {out_dtype}. Drop offset or use int8 output")
        if offset.dtype != torch.float32:
            raise TypeError(f"{_OP}: offset must be float32; got {offset.dtype}")
        _per_column("offset", offset, n)
    if with_pertoken:
        if pertoken_scale.dtype != torch.float32:
            raise TypeError(f"{_OP}: pertoken_scale must be float32; got {pertoken_scale.dtype}")
        if tuple(pertoken_scale.shape) not in ((m,), (m, 1)):
            raise ValueError(f"{_OP}: pertoken_scale must have shape (M,) with M = "
                             f"x1.shape[-2] = {m}; got {tuple(pertoken_scale.shape)}")
    if bias is not None:
        if bias.dtype not in bias_dtypes:
            raise TypeError(f"{_OP}: bias has dtype {bias.dtype}; with output_dtype "
                            f"{out_dtype}{' and pertoken_scale' if with_pertoken else ''} it "
                            f"must be one of {sorted(map(str, bias_dtypes))}")
        out_rank = len(batch) + 2
        shape_ok = tuple(bias.shape) == (n,) or (
            out_rank == 3 and tuple(bias.shape) == (batch[0], 1, n))
        if not shape_ok:
            raise ValueError(f"{_OP}: bias must have shape (N,) = ({n},), or (batch, 1, N) = "
                             f"({batch[0] if batch else 'batch'}, 1, {n}) for a 3-D output; "
                             f"got {tuple(bias.shape)}")
    return out_dtype, batch


def prepare_quant_matmul(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None,
                         output_dtype=None, **extras) -> QuantMatmulPlan:
    """Validate the arguments of ``npu_quant_matmul`` (:func:`check_quant_matmul`) and return
    the canonical epilogue."""
    out_dtype, _ = check_quant_matmul(x1, x2, scale, offset=offset, pertoken_scale=pertoken_scale,
                                      bias=bias, output_dtype=output_dtype, **extras)
    n = x2.shape[-1]
    scale = _per_column("scale", scale, n)
    packed_offset = None
    if scale.dtype == torch.int64:
        scale, packed_offset = decode_int64_scale(scale)
    scale = scale.float()
    if offset is not None:
        offset = _per_column("offset", offset, n)
    elif packed_offset is not None and out_dtype == torch.int8:
        offset = packed_offset
    if pertoken_scale is not None:
        pertoken_scale = pertoken_scale.reshape(x1.shape[-2])
    int_bias = float_bias = None
    if bias is not None:
        if bias.dtype == torch.int32:
            int_bias = bias
        else:
            float_bias = bias.float()
    return QuantMatmulPlan(out_dtype, scale, offset, pertoken_scale, int_bias, float_bias)


def wrap_int32(v: torch.Tensor) -> torch.Tensor:
    """Integer ``v`` reduced to the int32 range with two's-complement wrap-around, as int64."""
    return torch.remainder(v.to(torch.int64) + 2 ** 31, 2 ** 32) - 2 ** 31


def quant_matmul_epilogue_reference(acc: torch.Tensor, plan: QuantMatmulPlan) -> torch.Tensor:
    """The epilogue of the module doc on an exact integer accumulator ``[..., M, N]``."""
    if plan.int_bias is not None:  # the int32 accumulator wraps around (module doc)
        acc = wrap_int32(acc.to(torch.int64) + plan.int_bias.to(torch.int64))
    v = acc.to(torch.float32) * plan.scale
    if plan.pertoken is not None:
        v = v * plan.pertoken[:, None]
    if plan.float_bias is not None:
        v = v + plan.float_bias
    if plan.out_dtype != torch.int8:
        return v.to(plan.out_dtype)
    if plan.offset is not None:
        v = v + plan.offset
    return torch.round(v).clamp(-128, 127).to(torch.int8)  # round half to even


def quant_matmul_reference(x1: torch.Tensor, x2: torch.Tensor, scale: torch.Tensor, *,
                           offset: torch.Tensor | None = None,
                           pertoken_scale: torch.Tensor | None = None,
                           bias: torch.Tensor | None = None,
                           output_dtype: torch.dtype | None = None,
                           **extras) -> torch.Tensor:
    """Plain-PyTorch ``npu_quant_matmul``: the oracle of the fast kernels.

    Parameters
    ----------
    x1, x2
        int8 ``[..., M, K]`` and ``[..., K, N]`` (2 to 6 dimensions; batch dimensions broadcast;
        ``K <= 65535``).
    scale
        float32 / bfloat16 / int64 (from ``npu_trans_quant_param``), shape ``(1,)`` or ``(N,)``.
    offset
        float32 ``(1,)`` or ``(N,)``, int8 output only.
    pertoken_scale
        float32 ``(M,)``, float16 / bfloat16 output only.
    bias
        ``(N,)`` or, for a 3-D output, ``(batch, 1, N)``; int32 (added to the accumulator) or
        float32 / float16 / bfloat16 (added after scaling).
    output_dtype
        None / torch.int8 (requantized), torch.float16 or torch.bfloat16.

    Returns
    -------
    Tensor ``[*broadcast(batch), M, N]`` of ``output_dtype``; formula in the module doc.
    The accumulator is computed in float64, exact for ``K <= 65535`` (every partial sum is an
    integer below ``2**31``) and supported on every device; an int32 bias is added with int32
    wrap-around (module doc).
    """
    plan = prepare_quant_matmul(x1, x2, scale, offset=offset, pertoken_scale=pertoken_scale,
                                bias=bias, output_dtype=output_dtype, **extras)
    return _reference_kernel(x1, x2, plan)


def _reference_kernel(x1: torch.Tensor, x2: torch.Tensor, plan: QuantMatmulPlan) -> torch.Tensor:
    """The reference computation of a validated call: exact float64 matmul, then the epilogue."""
    acc = torch.matmul(x1.double(), x2.double()).to(torch.int64)
    return quant_matmul_epilogue_reference(acc, plan)


def _eager(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None, output_dtype=None,
           x1_dtype=None, x2_dtype=None, pertoken_scale_dtype=None, scale_dtype=None,
           group_sizes=None, y_scale=None):
    extras = {"x1_dtype": x1_dtype, "x2_dtype": x2_dtype,
              "pertoken_scale_dtype": pertoken_scale_dtype, "scale_dtype": scale_dtype,
              "group_sizes": group_sizes, "y_scale": y_scale}
    plan = prepare_quant_matmul(x1, x2, scale, offset=offset, pertoken_scale=pertoken_scale,
                                bias=bias, output_dtype=output_dtype, **extras)
    if x1.device.type == "cuda" and _quant_triton.HAS_TRITON:
        return _quant_triton.quant_matmul_triton(x1, x2, plan)
    if x1.device.type == "cpu":
        return _quant_cpu.quant_matmul_cpu(x1, x2, plan)
    return _reference_kernel(x1, x2, plan)


def _fake(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None, output_dtype=None,
          x1_dtype=None, x2_dtype=None, pertoken_scale_dtype=None, scale_dtype=None,
          group_sizes=None, y_scale=None):
    """Shape ``[*broadcast(batch), M, N]``; the same checks as the eager kernel
    (:func:`check_quant_matmul`: dtypes and shapes, never values)."""
    out_dtype, batch = check_quant_matmul(
        x1, x2, scale, offset=offset, pertoken_scale=pertoken_scale, bias=bias,
        output_dtype=output_dtype, x1_dtype=x1_dtype, x2_dtype=x2_dtype,
        pertoken_scale_dtype=pertoken_scale_dtype, scale_dtype=scale_dtype,
        group_sizes=group_sizes, y_scale=y_scale)
    return x1.new_empty((*batch, x1.shape[-2], x2.shape[-1]), dtype=out_dtype)


npu_quant_matmul = define_op(_SCHEMA, fake=_fake, kernel=_eager)
