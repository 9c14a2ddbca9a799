"""Fast CPU kernels of the RMS-norm and dynamic-quant ops: cache-sized row chunks, float32 buffers.

Same contracts as the references in :mod:`torchair.ops.norm.rms_norm` and
:mod:`torchair.ops.quant.dynamic_quant` (see their module docs); arguments arrive already checked.

How a call runs: the rows (all leading dims flattened; the normalized / quantized dims are one
row of ``n`` elements) are walked in chunks of ``R`` rows, a Python loop over chunks only. Each
chunk is read from memory once, converted into a reused float32 buffer of ``R * n`` elements (about
``_CHUNK_BYTES``, so it stays in cache while every pass of the chunk runs over it), worked on
in place with ``out=`` / in-place PyTorch ops (vectorized, float32 accumulation for float16 /
bfloat16 inputs, both cores on each op) and written to preallocated outputs. Memory traffic is the
inputs read once and the outputs written once; the fused ``add_rms_norm_dynamic_quant`` never
writes or re-reads the normalized ``y``.

The float32 math is the references' expression for expression (``sum(x ** 2) / n``, ``x * rstd *
gamma``, ``x / scale``, ``round``), so results equal the references' up to the summation order of
``sum(x ** 2)`` (PyTorch's per-row reduction, the same for the references in practice).

``CHUNK_ROWS`` (None: automatic) fixes the rows per chunk; tests set it small to cross chunk
boundaries.
"""
from __future__ import annotations

import itertools
import threading

import torch

__all__ = ["CHUNK_ROWS", "add_rms_norm_cpu", "add_rms_norm_dynamic_quant_cpu", "chunk_rows",
           "dynamic_quant_cpu", "expert_of_rows", "rms_norm_cpu", "rstd_shape"]

CHUNK_ROWS: int | None = None
# float32 bytes of one chunk buffer. Each op of a chunk is split over the cores, so a core holds
# half a buffer; fewer, larger chunks amortize the per-op overhead (~2-3 us) and the thread
# fork/join. Measured for the fused add_rms_norm_dynamic_quant on a 2-core EPYC (2 MiB L2 per
# core, 32 MiB L3), H = 7168 bf16, 4096 tokens: 512 KiB 56 ms, 1 MiB 48 ms, 2 MiB 44 ms,
# 4 MiB 48 ms.
_CHUNK_BYTES = 2 * 2**20
_INT8_MAX = 127.0
_workspace = threading.local()  # .buf: float32 scratch of this thread, reused across calls


def chunk_rows(width: int) -> int:
    """Rows per chunk for rows of ``width`` elements (``CHUNK_ROWS`` when set)."""
    if CHUNK_ROWS is not None:
        return max(1, int(CHUNK_ROWS))
    return max(1, _CHUNK_BYTES // max(1, 4 * width))


def rstd_shape(x: torch.Tensor, gamma: torch.Tensor) -> list:
    """``x.shape[:-k] + (1,) * k`` with ``k = gamma.dim()`` (symbolic sizes stay symbolic): the
    shape of ``rstd`` of the RMS-norm family (re-exported by :mod:`torchair.ops.norm.rms_norm`)."""
    k = gamma.dim()
    return list(x.shape[:x.dim() - k]) + [1] * k


def _as_rows(t: torch.Tensor, width: int) -> torch.Tensor:
    return t.contiguous().view(-1, width)


def _buffers(count: int, rows: int, width: int) -> torch.Tensor:
    """``count`` float32 chunk buffers ``[count, min(rows, chunk_rows(width)), width]``.

    They are views of one per-thread workspace kept between calls: allocating megabytes of scratch
    per call costs more than the work (glibc serves such blocks with fresh ``mmap`` pages, about
    0.8 ms of page faults per MiB on the 2-core test machine).
    """
    shape = (count, max(1, min(rows, chunk_rows(width))), width)
    numel = shape[0] * shape[1] * shape[2]
    ws = getattr(_workspace, "buf", None)
    if ws is None or ws.numel() < numel:
        ws = _workspace.buf = torch.empty(numel, dtype=torch.float32)
    return ws[:numel].view(shape)


def _split(t: torch.Tensor | None, step: int):
    """Row chunks of ``t`` (views, made in one call), or an endless run of None."""
    return t.split(step) if t is not None else itertools.repeat(None)


def _fit(buf: torch.Tensor, rows: int) -> torch.Tensor:
    """The first ``rows`` rows of a chunk buffer (the last chunk may be short)."""
    return buf if buf.shape[0] == rows else buf[:rows]


# ---------------------------------------------------------------- chunk passes -------------------

def _normalize(src: torch.Tensor, dst: torch.Tensor, gamma: torch.Tensor, epsilon: float,
               rstd: torch.Tensor, tmp: torch.Tensor) -> None:
    """``dst = src * rstd * gamma`` (float32 [R, n]); ``rstd`` [R] = 1/sqrt(sum(src**2)/n + eps).

    ``src`` must be float32 (a float16 ``square`` would round); ``dst`` may be ``src``; ``tmp`` is
    an [R, n] float32 scratch buffer.
    """
    torch.sum(torch.square(src, out=tmp), -1, out=rstd)
    rstd.div_(src.shape[-1]).add_(epsilon).rsqrt_()
    torch.mul(src, rstd[:, None], out=dst).mul_(gamma)


def _quantize(buf: torch.Tensor, scale: torch.Tensor, y: torch.Tensor, tmp: torch.Tensor) -> None:
    """Per-row symmetric int8: ``scale = amax|buf| / 127``; ``y = round(buf / scale)`` (0 where
    the scale is 0). ``buf`` (float32 [R, n]) is overwritten; ``tmp`` is [R, n] scratch."""
    torch.amax(torch.abs(buf, out=tmp), -1, out=scale).div_(_INT8_MAX)
    # |buf / scale| <= 127 (1 + 2 eps) < 127.5: the clamp to [-128, 127] of the contract never acts
    buf.div_(torch.where(scale == 0, 1.0, scale)[:, None]).round_()
    y.copy_(buf)


# ---------------------------------------------------------------- RMS norm family ----------------

def rms_norm_cpu(x: torch.Tensor, gamma: torch.Tensor, epsilon: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``npu_rms_norm`` on CPU: ``(y, rstd)``."""
    n = gamma.numel()
    xr = _as_rows(x, n)
    y = torch.empty_like(xr)
    rstd = torch.empty(xr.shape[0], dtype=torch.float32)
    g = gamma.reshape(n).float()
    buf, tmp = _buffers(2, xr.shape[0], n)
    step = buf.shape[0]
    for xc, yc, rc in zip(_split(xr, step), _split(y, step), _split(rstd, step)):
        b, t = _fit(buf, xc.shape[0]), _fit(tmp, xc.shape[0])
        if x.dtype == torch.float32:
            _normalize(xc, yc, g, epsilon, rc, t)
        else:
            _normalize(b.copy_(xc), b, g, epsilon, rc, t)
            yc.copy_(b)
    return y.view(x.shape), rstd.view(rstd_shape(x, gamma))


def add_rms_norm_cpu(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, epsilon: float, *,
                     want_f32: bool = False) -> tuple[torch.Tensor, ...]:
    """``npu_add_rms_norm`` on CPU: ``(y, rstd, x_out)``, and ``y.float()`` last if ``want_f32``."""
    n = gamma.numel()
    x1r, x2r = _as_rows(x1, n), _as_rows(x2, n)
    x_out = torch.empty_like(x1r)
    y = torch.empty_like(x1r)
    y_f32 = torch.empty(x1r.shape, dtype=torch.float32) if want_f32 else None
    rstd = torch.empty(x1r.shape[0], dtype=torch.float32)
    g = gamma.reshape(n).float()
    buf, tmp = _buffers(2, x1r.shape[0], n)
    step = buf.shape[0]
    for x1c, x2c, xo, yc, rc, yfc in zip(_split(x1r, step), _split(x2r, step),
                                         _split(x_out, step), _split(y, step),
                                         _split(rstd, step), _split(y_f32, step)):
        b, t = _fit(buf, xo.shape[0]), _fit(tmp, xo.shape[0])
        torch.add(x1c, x2c, out=xo)  # float32 math, rounded once to x1.dtype
        if x1.dtype == torch.float32:
            _normalize(xo, yc, g, epsilon, rc, t)
        else:
            _normalize(b.copy_(xo), b, g, epsilon, rc, t)  # the norm reads the rounded sum
            yc.copy_(b)
        if yfc is not None:
            yfc.copy_(yc)
    out = (y.view(x1.shape), rstd.view(rstd_shape(x1, gamma)), x_out.view(x1.shape))
    return out + (y_f32.view(x1.shape),) if want_f32 else out


# ---------------------------------------------------------------- dynamic quant ------------------

def expert_of_rows(group_index: torch.Tensor, rows: int, experts: int) -> torch.Tensor:
    """Expert of each row from cumulative row ends: row r -> #{e : group_index[e] <= r}, clamped
    to ``experts - 1`` (int64 [rows], on group_index's device)."""
    ends = group_index.to(torch.int64)
    r = torch.arange(rows, device=ends.device)
    return torch.searchsorted(ends, r, right=True).clamp_(max=experts - 1)


def dynamic_quant_cpu(x: torch.Tensor, smooth_scales: torch.Tensor | None,
                      group_index: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``npu_dynamic_quant`` (int8) on CPU: ``(y, scale)``."""
    n = x.shape[-1]
    xr = _as_rows(x, n)
    rows = xr.shape[0]
    y = torch.empty(xr.shape, dtype=torch.int8)
    scale = torch.empty(rows, dtype=torch.float32)
    smooth = smooth_scales.float() if smooth_scales is not None else None
    experts = (expert_of_rows(group_index.cpu(), rows, smooth.shape[0])
               if group_index is not None else None)
    buf, tmp = _buffers(2, rows, n)
    step = buf.shape[0]
    for xc, yc, sc, ec in zip(_split(xr, step), _split(y, step), _split(scale, step),
                              _split(experts, step)):
        b = _fit(buf, xc.shape[0])
        if smooth is None:
            b.copy_(xc)
        elif ec is None:
            torch.mul(xc, smooth, out=b)
        else:
            torch.mul(xc, smooth[ec], out=b)
        _quantize(b, sc, yc, _fit(tmp, xc.shape[0]))
    return y.view(x.shape), scale.view(x.shape[:-1])


def add_rms_norm_dynamic_quant_cpu(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, *,
                                   smooth_scale1: torch.Tensor | None,
                                   smooth_scale2: torch.Tensor | None,
                                   beta: torch.Tensor | None, epsilon: float, want1: bool,
                                   want2: bool) -> tuple[torch.Tensor, ...]:
    """``npu_add_rms_norm_dynamic_quant`` on CPU: ``(y1, y2, x_out, scale1, scale2)``; a
    quantization not wanted gives empty ``[0]`` outputs."""
    n = x1.shape[-1]
    x1r, x2r = _as_rows(x1, n), _as_rows(x2, n)
    rows = x1r.shape[0]
    x_out = torch.empty_like(x1r)
    y1, sc1 = _quant_outputs(x1r.shape, want1)
    y2, sc2 = _quant_outputs(x1r.shape, want2)
    g = gamma.reshape(n).float()
    bt, s1, s2 = (t.reshape(n).float() if t is not None else None
                  for t in (beta, smooth_scale1, smooth_scale2))
    # buf: y (then y * s1); tmp: x ** 2, then |y| scratch; buf2: y * s2 (second quantization)
    bufs = _buffers(3 if want2 else 2, rows, n)
    buf, tmp = bufs[0], bufs[1]
    buf2 = bufs[2] if want2 else None
    rstd = torch.empty(buf.shape[0], dtype=torch.float32)
    step = buf.shape[0]
    for x1c, x2c, xo, y1c, s1c, y2c, s2c in zip(
            _split(x1r, step), _split(x2r, step), _split(x_out, step),
            _split(y1 if want1 else None, step), _split(sc1 if want1 else None, step),
            _split(y2 if want2 else None, step), _split(sc2 if want2 else None, step)):
        r = xo.shape[0]
        b, t = _fit(buf, r), _fit(tmp, r)
        torch.add(x1c, x2c, out=xo)  # float32 math, rounded once to x1.dtype
        src = xo if x1.dtype == torch.float32 else b.copy_(xo)  # the norm reads the rounded sum
        _normalize(src, b, g, epsilon, _fit(rstd, r), t)  # y: float32, never rounded to x1.dtype
        if bt is not None:
            b.add_(bt)
        if want2:
            b2 = _fit(buf2, r)
            if s2 is not None:
                torch.mul(b, s2, out=b2)
            else:
                b2.copy_(b)
        if want1:
            if s1 is not None:
                b.mul_(s1)
            _quantize(b, s1c, y1c, t)
        if want2:
            _quantize(b2, s2c, y2c, t)
    lead = x1.shape[:-1]
    return (y1.view(x1.shape) if want1 else y1, y2.view(x1.shape) if want2 else y2,
            x_out.view(x1.shape), sc1.view(lead) if want1 else sc1,
            sc2.view(lead) if want2 else sc2)


def _quant_outputs(shape, want: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 ``y`` [rows, n] and float32 ``scale`` [rows], or empty ``[0]`` ones if not wanted."""
    if not want:
        return torch.empty(0, dtype=torch.int8), torch.empty(0, dtype=torch.float32)
    return torch.empty(shape, dtype=torch.int8), torch.empty(shape[0], dtype=torch.float32)
