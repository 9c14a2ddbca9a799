"""Fast CPU kernels of ``npu_quant_matmul`` and ``npu_dequant_swiglu_quant``.

Both take the canonical plans built (and validated) by their op modules
(:class:`torchair.ops.quant.plans.QuantMatmulPlan`,
:class:`torchair.ops.quant.plans.SwigluQuantPlan`) and compute the same float32
operations, in the same order, as the reference kernels, so results match them exactly up to the
last-ulp differences of vectorized ``exp`` (an int8 output may then differ by 1 at a rounding
tie; the tests bound how often).

* quant matmul: the exact int32 ``x1 @ x2`` (``|acc| <= K * 2**14 < 2**31`` for ``K <= 65535``);
  for at most 16 rows ``torch._int_mm`` where it measured faster (see ``_use_int_mm``), else
  computed with float32 GEMMs over slices of at most 1024 columns of K (each slice's partial sums
  are integers of magnitude <= 2**24, so exact in float32), converted and summed in int32. CPU
  ``torch._int_mm`` measured 40-110x slower than this on a 2-core EPYC (864x7168x4096: 56 s vs
  0.5 s). When float32 matmuls may run at reduced precision (``torch.backends.mkldnn.matmul.
  fp32_precision`` / ``set_float32_matmul_precision`` other than the IEEE default) one float64
  GEMM is used instead (exact for any K here); then the epilogue (an int32
  bias added in int32, wrapping around like the reference's ``wrap_int32``) in row chunks of
  ~``_EPILOGUE_BYTES`` float32 (cache-resident), in place into one reused buffer.
* dequant swiglu quant: row chunks of ~``_SWIGLU_BYTES`` float32 ``[rows, 2H]`` (4 MiB: the
  chunk's ~8 MiB working set stays in L3 across its ~10 elementwise passes; 512 KiB chunks
  measured 1.5-2x slower on a 2-core EPYC, the per-chunk op overhead dominating) converted into
  a reused buffer; every step works in place on two preallocated
  buffers; outputs are preallocated and written per chunk. A Python loop over chunks only, never
  over rows.

``CHUNK_ROWS`` (None: automatic) fixes the rows per chunk of both kernels; tests set it small.
"""
from __future__ import annotations

import math
import threading
import time

import torch

from torchair.base.log import logger
from torchair.ops.quant.plans import QuantMatmulPlan, SwigluQuantPlan

CHUNK_ROWS: int | None = None
# The int8 GEMM of a decode-sized quant matmul: None picks per shape by measuring (below);
# "int_mm" / "float" force one (tests)
GEMM: str | None = None
_EPILOGUE_BYTES = 256 * 2**10
_SWIGLU_BYTES = 4 * 2**20
_INV_127 = 1.0 / 127.0


def _rows_per_chunk(row_bytes: int, target: int) -> int:
    if CHUNK_ROWS is not None:
        return max(1, int(CHUNK_ROWS))
    return max(1, target // max(1, row_bytes))


# ------------------------------------------------------------------ npu_quant_matmul -----------

# A float32 GEMM over at most this many columns of K is exact for int8 operands: every partial
# sum is an integer of magnitude <= 1024 * 128 * 128 = 2**24, which float32 holds exactly.
_EXACT_FP32_K = 1024


def _fp32_matmul_is_ieee() -> bool:
    """Whether CPU float32 matmuls run in full IEEE float32 (not bf16/tf32 reduced precision)."""
    matmul = getattr(getattr(torch.backends, "mkldnn", None), "matmul", None)
    precision = getattr(matmul, "fp32_precision", None)
    if precision is not None:
        return precision in ("none", "ieee")
    try:
        return torch.get_float32_matmul_precision() == "highest"
    except RuntimeError:  # legacy and new precision APIs were mixed: do not guess
        return False


def int8_matmul_cpu(x1: torch.Tensor, x2: torch.Tensor, timed: bool = True) -> torch.Tensor:
    """Exact int32 ``x1 @ x2`` of int8 ``[..., M, K]`` and ``[..., K, N]`` as ``[B * M, N]``
    (``B`` the product of the broadcast batch dimensions); see the module doc for the method.
    ``timed=False`` (a traced formula): read the GEMM choice made earlier, never time it."""
    batch = torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    m, k = x1.shape[-2:]
    n = x2.shape[-1]
    b = math.prod(batch)
    if k == 0 or b * m == 0 or n == 0:
        return torch.zeros(b * m, n, dtype=torch.int32)
    if all(d == 1 for d in x2.shape[:-2]):  # one weight: fold the batch into the rows
        a = x1.expand(*batch, m, k).reshape(b * m, k)
        w = x2.reshape(k, n)
        if _use_int_mm(a, w) if timed else int_mm_chosen(b * m, k, n):
            return torch._int_mm(a, w)
    else:
        a = x1.expand(*batch, m, k).reshape(b, m, k)
        w = x2.expand(*batch, k, n).reshape(b, k, n)
    return float_product(a, w).reshape(b * m, n)


def float_product(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The exact int32 product of int8 ``a [..., M, K]`` and ``w [..., K, N]``: float32 GEMMs over
    slices of K summed in int32, or one float64 GEMM (module doc)."""
    k = a.shape[-1]
    if not _fp32_matmul_is_ieee():
        return torch.matmul(a.double(), w.double()).to(torch.int32)
    af = a.float()
    acc = None
    for start in range(0, k, _EXACT_FP32_K):
        part = torch.matmul(af[..., start:start + _EXACT_FP32_K],
                            w[..., start:start + _EXACT_FP32_K, :].float()).to(torch.int32)
        if acc is None:
            acc = part
        else:
            acc += part
    return acc


# ``torch._int_mm`` (PyTorch's int8 GEMM, int32 accumulation, exact while no sum can overflow:
# K * 2**14 < 2**31) against the float32 slices above: which is faster depends on the CPU and its
# oneDNN kernels (on a 2-core Xeon VM it was 4-5x faster at 1-8 rows; an earlier 2-core EPYC
# measured it 40-110x slower on a prefill shape). So for decode-sized products (at most
# ``_INT_MM_MAX_ROWS`` rows) the first call of each (rows, K, N) times both once (best of 3,
# a few ms) and keeps the faster; larger products always take the float32 slices. Both paths
# give the same exact int32 result.
_INT_MM_MAX_K = (2**31 - 1) // 2**14
_INT_MM_MAX_ROWS = 16
_gemm_choice: dict[tuple[int, int, int], bool] = {}  # (rows, K, N) -> use torch._int_mm
_gemm_lock = threading.Lock()


def _fixed_choice(rows: int, k: int) -> bool | None:
    """The GEMM choice when no timing decides it (None: timing decides)."""
    if k > _INT_MM_MAX_K or not hasattr(torch, "_int_mm"):
        return False
    if GEMM is not None:
        return GEMM == "int_mm"
    if rows > _INT_MM_MAX_ROWS:
        return False
    return None


def int_mm_chosen(rows: int, k: int, n: int) -> bool:
    """Whether the int8 product of this shape uses ``torch._int_mm`` as chosen (forced by
    ``GEMM`` or timed by :func:`_use_int_mm`); False when never decided."""
    fixed = _fixed_choice(rows, k)
    return fixed if fixed is not None else _gemm_choice.get((rows, k, n), False)


def _use_int_mm(a: torch.Tensor, w: torch.Tensor) -> bool:
    rows, k = a.shape
    n = w.shape[1]
    fixed = _fixed_choice(rows, k)
    if fixed is not None:
        return fixed
    key = (rows, k, n)
    choice = _gemm_choice.get(key)
    if choice is None:
        with _gemm_lock:
            choice = _gemm_choice.get(key)
            if choice is None:
                choice = _gemm_choice[key] = _int_mm_is_faster(a, w)
    return choice


def _best_of(fn, runs: int = 3) -> float:
    best = math.inf
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _int_mm_is_faster(a: torch.Tensor, w: torch.Tensor) -> bool:
    """Time torch._int_mm and the float32 slices once on these operands (module comment)."""
    try:
        if not torch.equal(torch._int_mm(a, w), float_product(a, w)):  # also a warm-up
            logger.warning("torch._int_mm disagrees with the exact float32 int8 product for "
                           "shape %s x %s; not using it", list(a.shape), list(w.shape))
            return False
    except (RuntimeError, NotImplementedError) as exc:
        logger.debug("torch._int_mm is not available for %s x %s (%s)", list(a.shape),
                     list(w.shape), exc)
        return False
    t_int = _best_of(lambda: torch._int_mm(a, w))
    t_float = _best_of(lambda: float_product(a, w))
    logger.debug("int8 GEMM %s x %s: torch._int_mm %.1f us, float32 slices %.1f us", list(a.shape),
                 list(w.shape), t_int * 1e6, t_float * 1e6)
    return t_int < t_float


def quant_matmul_cpu(x1: torch.Tensor, x2: torch.Tensor, plan: QuantMatmulPlan) -> torch.Tensor:
    """``npu_quant_matmul`` on CPU (see the module doc of ``quant_matmul``)."""
    batch = torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    m = x1.shape[-2]
    n = x2.shape[-1]
    acc = int8_matmul_cpu(x1, x2)  # [R, N], R = B * M
    rows_total = acc.shape[0]
    out = torch.empty(rows_total, n, dtype=plan.out_dtype)
    step = _rows_per_chunk(n * 4, _EPILOGUE_BYTES)
    buf = torch.empty(min(step, rows_total) * n, dtype=torch.float32)
    pertoken = plan.pertoken.float() if plan.pertoken is not None else None
    int_bias = plan.int_bias
    batched_bias = int_bias is not None and int_bias.dim() == 3
    if int_bias is not None:
        int_bias = int_bias.reshape(-1, n)
    float_bias = plan.float_bias
    batched_fbias = float_bias is not None and float_bias.dim() == 3
    if float_bias is not None:
        float_bias = float_bias.reshape(-1, n)
    for r0 in range(0, rows_total, step):
        r1 = min(r0 + step, rows_total)
        a = acc[r0:r1]
        rows = torch.arange(r0, r1) if (pertoken is not None or batched_bias
                                        or batched_fbias) else None
        if int_bias is not None:  # int32 + int32 in place: two's-complement wrap-around
            a.add_(int_bias[rows // m] if batched_bias else int_bias)
        v = buf[:(r1 - r0) * n].view(r1 - r0, n)
        torch.mul(a, plan.scale, out=v)  # float32(acc) * scale in one pass
        if pertoken is not None:
            v.mul_(pertoken[rows % m][:, None])
        if float_bias is not None:
            v.add_(float_bias[rows // m] if batched_fbias else float_bias)
        if plan.out_dtype == torch.int8:
            if plan.offset is not None:
                v.add_(plan.offset)
            v.round_().clamp_(-128, 127)
        out[r0:r1].copy_(v)
    return out.view(*batch, m, n)


# ------------------------------------------------------------------ npu_dequant_swiglu_quant ---

def dequant_swiglu_quant_cpu(plan: SwigluQuantPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """``npu_dequant_swiglu_quant`` on CPU: ``(y int8 [T, H], scale float32 [T])``."""
    x = plan.x
    tokens, width = x.shape
    h = width // 2
    y = torch.empty(tokens, h, dtype=torch.int8)
    scale = torch.zeros(tokens, dtype=torch.float32)
    if tokens == 0:
        return y, scale
    step = min(tokens, _rows_per_chunk(width * 4, _SWIGLU_BYTES))
    xf_buf = torch.empty(step * width, dtype=torch.float32)
    t_buf = torch.empty(step * h, dtype=torch.float32)
    a_buf = torch.empty(step * h, dtype=torch.float32) if plan.dynamic else None
    i_buf = torch.empty(step * width, dtype=torch.int32) if plan.int_bias is not None else None
    w_buf = torch.empty(step * width, dtype=torch.float32) \
        if plan.row_group is not None and plan.weight_scale is not None else None
    groups = plan.num_groups
    for r0 in range(0, tokens, step):
        r1 = min(r0 + step, tokens)
        n = r1 - r0
        xf = xf_buf[:n * width].view(n, width)
        gid = plan.row_group[r0:r1] if plan.row_group is not None else None
        xc = x[r0:r1]
        if i_buf is not None:
            xc = torch.add(xc, plan.int_bias, out=i_buf[:n * width].view(n, width))
        xf.copy_(xc)  # convert (a mixed-dtype torch.mul(out=) is ~1.5x slower than copy + mul_)
        if plan.weight_scale is not None:
            if gid is None:
                xf.mul_(plan.weight_scale[0])
            else:
                ws = w_buf[:n * width].view(n, width)
                torch.index_select(plan.weight_scale, 0, gid.clamp(max=groups - 1), out=ws)
                xf.mul_(ws)
        if plan.act_scale is not None:
            xf.mul_(plan.act_scale[r0:r1, None])
        if plan.float_bias is not None:
            xf.add_(plan.float_bias)
        left, right = xf[:, :h], xf[:, h:]
        act, gate = (left, right) if plan.activate_left else (right, left)
        t = t_buf[:n * h].view(n, h)
        torch.neg(act, out=t)
        t.exp_().add_(1.0)
        torch.div(act, t, out=t)
        t.mul_(gate)  # silu(act) * gate
        qs = plan.quant_scale  # [G, H] or [G, 1]: per row of the chunk, or G == 1
        if qs is not None:
            qs = qs[gid.clamp(max=groups - 1)] if gid is not None else qs[0]
        if plan.dynamic:
            if qs is not None:
                t.mul_(qs)
            s = scale[r0:r1]
            torch.amax(torch.abs(t, out=a_buf[:n * h].view(n, h)), dim=1, out=s)
            s.mul_(_INV_127)
            t.div_(torch.where(s == 0, 1.0, s)[:, None])
        else:
            if qs is not None:
                t.div_(qs)
            if plan.quant_offset is not None:
                t.add_(plan.quant_offset[0])
            t.nan_to_num_(0.0)
        t.round_().clamp_(-128, 127)
        if gid is not None:
            outside = (gid >= groups)[:, None]
            t.masked_fill_(outside, 0.0)
            scale[r0:r1].masked_fill_(outside[:, 0], 0.0)
        y[r0:r1].copy_(t)
    return y, scale
