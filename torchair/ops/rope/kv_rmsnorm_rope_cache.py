"""``npu_kv_rmsnorm_rope_cache``: DeepSeek MLA's fused KV step, as in torch_npu.

``kv [B, 1, S, D]`` (``D = Dv + Dk``, DeepSeek: 512 + 64) is split along its last dim; per token,
in float32 with one rounding to ``kv``'s dtype::

    c_kv   = x * rsqrt(mean(x ** 2) + epsilon) * gamma      x = kv[..., :Dv]     (RMS norm)
    r      = kv[..., Dv:]
    p1     = cat(r[..., 0::2], r[..., 1::2])                the interleaved pairs, de-interleaved
    p2     = cat(-r[..., 1::2], r[..., 0::2])
    k_rope = p1 * cos + p2 * sin                            cos / sin [B, 1, S, Dk] (broadcast)

(ops-transformer's KvRmsNormRopeCache formulas: an interleaved RoPE whose output is stored
de-interleaved, i.e. ``k_rope[:Dk/2] + i * k_rope[Dk/2:] = (r_even + i * r_odd) * e^(i theta)``
for ``cos = cat(cos theta, cos theta)``.) Then, *in place*, ``k_rope`` is written into
``k_cache`` and ``c_kv`` into ``ckv_cache`` at ``index`` (-1: the token is not written):

* ``cache_mode="Norm"``: caches ``[B, 1, L, Dk]`` / ``[B, 1, L, Dv]``, ``index [B, S]``: token
  ``(b, s)`` goes to ``cache[b, 0, index[b, s]]``.
* ``"PA"`` / ``"PA_BNSD"`` (paged; what vllm-ascend's TorchAir MLA uses): caches
  ``[block_num, block_size, 1, Dk]`` / ``[..., Dv]``, ``index [B * S]`` of slots: token ``t = b * S
  + s`` goes to ``cache[slot // block_size, slot % block_size, 0]``.

Returns ``(k_cache, ckv_cache, k_rope, c_kv)``: the two caches and the computed ``k_rope [B, 1,
S, Dk]`` / ``c_kv [B, 1, S, Dv]`` (torch_npu fills those for ``is_output_kv=True``; here they are
always computed). As torch_npu's, the schema's returns are plain ``Tensor`` while the caches are
written in place and returned: eager calls return the cache arguments themselves; a compiled
graph returns the written caches' values (its schema marks the caches ``Tensor(a!)`` so the
writes are kept; PyTorch cannot functionalize returns that mix aliases and new tensors).

Not implemented (``NotImplementedError`` naming the argument): the FRACTAL_NZ and per-block modes (``PA_NZ``, ``PA_BLK_BNSD``,
``PA_BLK_NZ``), int8 caches and their ``k_rope_scale`` / ``c_kv_scale`` / ``k_rope_offset`` /
``c_kv_offset``, and ``v``. Under ``torch.compile`` the op runs as
``npu_kv_rmsnorm_rope_cache_functional`` (new caches; AOT copies them back into graph inputs).

Kernels: :func:`kv_rmsnorm_rope_cache_reference` is the oracle (it finds the written tokens on
the host); the eager kernel computes the same values and scatters them without reading ``index``
on the host (tokens with index -1 repeat a written token's write, so nothing else changes).
"""
from __future__ import annotations

import torch

from torchair.base.registry import define_op
from torchair.ops._functionalize import install_functionalization
from torchair.ops.rope.common import check_float, check_rope_table, interleaved_rope_reference
from torchair.ops.rope.rotary import interleaved_rope_into

__all__ = ["CACHE_MODES", "check_kv_rmsnorm_rope_cache", "kv_rmsnorm_rope_cache_reference",
           "npu_kv_rmsnorm_rope_cache", "npu_kv_rmsnorm_rope_cache_functional"]

_OP = "npu_kv_rmsnorm_rope_cache"
_TAIL = ("Tensor cos, Tensor sin, Tensor index, {kc} k_cache, {cc} ckv_cache, *, "
         "Tensor? k_rope_scale=None, Tensor? c_kv_scale=None, Tensor? k_rope_offset=None, "
         "Tensor? c_kv_offset=None, Tensor? v=None, float epsilon=1e-05, str cache_mode='Norm', "
         "bool is_output_kv=False")
_SCHEMA = (f"{_OP}(Tensor kv, Tensor gamma, " + _TAIL.format(kc="Tensor(a!)", cc="Tensor(b!)")
           + ") -> (Tensor, Tensor, Tensor, Tensor)")
_FUNCTIONAL_SCHEMA = (f"{_OP}_functional(Tensor kv, Tensor gamma, "
                      + _TAIL.format(kc="Tensor", cc="Tensor")
                      + ") -> (Tensor, Tensor, Tensor, Tensor)")
CACHE_MODES = ("Norm", "PA", "PA_BNSD")
_NOT_IMPLEMENTED_MODES = ("PA_NZ", "PA_BLK_BNSD", "PA_BLK_NZ")


# ---------------------------------------------------------------- validation ---------------------

def check_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache, *,
                                k_rope_scale=None, c_kv_scale=None, k_rope_offset=None,
                                c_kv_offset=None, v=None, cache_mode="Norm") -> tuple[int, int]:
    """Check a call (shapes, dtypes, modes; never values); returns ``(Dv, Dk)``."""
    op = _OP
    for name, t in (("k_rope_scale", k_rope_scale), ("c_kv_scale", c_kv_scale),
                    ("k_rope_offset", k_rope_offset), ("c_kv_offset", c_kv_offset), ("v", v)):
        if t is not None:
            raise NotImplementedError(f"{op}: {name} is not supported by torchair (quantized int8 "
                                      f"caches and a separate v are not implemented); pass "
                                      f"{name}=None with float caches")
    if cache_mode in _NOT_IMPLEMENTED_MODES:
        raise NotImplementedError(f"{op}: cache_mode={cache_mode!r} is not implemented by "
                                  f"torchair (FRACTAL_NZ / per-block caches); use one of "
                                  f"{', '.join(repr(m) for m in CACHE_MODES)}")
    if cache_mode not in CACHE_MODES:
        raise ValueError(f"{op}: cache_mode={cache_mode!r} is unknown; expected one of "
                         f"{', '.join(repr(m) for m in CACHE_MODES + _NOT_IMPLEMENTED_MODES)}")
    for name, t in (("kv", kv), ("gamma", gamma), ("cos", cos), ("sin", sin)):
        check_float(op, name, t)
    if kv.dim() != 4 or kv.shape[1] != 1:
        raise ValueError(f"{op}: kv has shape {list(kv.shape)}; expected 4-D [B, 1, S, D] (one "
                         f"KV head, D = Dv + Dk); view kv as [B, 1, S, D]")
    b, _, s, d = kv.shape
    if gamma.dim() != 1 or not 0 < gamma.shape[0] < d:
        raise ValueError(f"{op}: gamma has shape {list(gamma.shape)}; expected [Dv] with "
                         f"0 < Dv < D = {d} (the RMS-normed part of kv's last dim)")
    dv = gamma.shape[0]
    dk = d - dv
    if dk % 2:
        raise ValueError(f"{op}: the rope part of kv has Dk = D - Dv = {d} - {dv} = {dk} "
                         f"elements; RoPE needs an even Dk")
    if tuple(cos.shape) != tuple(sin.shape):
        raise ValueError(f"{op}: sin has shape {list(sin.shape)} but cos has {list(cos.shape)}; "
                         f"they must have one shape")
    check_rope_table(op, "kv[..., Dv:]", _shape_only(kv, dk), "cos", cos)
    for name, t, width in (("k_cache", k_cache, dk), ("ckv_cache", ckv_cache, dv)):
        if t.dtype == torch.int8:
            raise NotImplementedError(f"{op}: {name} is int8; quantized caches are not "
                                      f"implemented by torchair; use a {kv.dtype} cache")
        if t.dtype != kv.dtype:
            raise TypeError(f"{op}: {name} has dtype {t.dtype} but kv has {kv.dtype}; the caches "
                            f"must have kv's dtype")
        paged = cache_mode != "Norm"
        want = "[block_num, block_size, 1, W]" if paged else "[B, 1, cache_length, W]"
        ok = t.dim() == 4 and t.shape[-1] == width and (
            t.shape[2] == 1 if paged else (t.shape[0] == b and t.shape[1] == 1))
        if not ok:
            raise ValueError(f"{op}: {name} has shape {list(t.shape)}; cache_mode={cache_mode!r} "
                             f"needs {want} with W = {width} and B = {b}")
    if tuple(k_cache.shape[:3]) != tuple(ckv_cache.shape[:3]):
        raise ValueError(f"{op}: k_cache {list(k_cache.shape)} and ckv_cache "
                         f"{list(ckv_cache.shape)} must agree on all dims but the last")
    if index.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{op}: index has dtype {index.dtype}; expected int64 (int32 accepted); "
                        f"cast index with .to(torch.int64)")
    norm = cache_mode == "Norm"
    want_index = [b, s] if norm else [b * s]
    if list(index.shape) != want_index:
        what = "[B, S] positions per batch" if norm else "[B * S] slots, one per token"
        raise ValueError(f"{op}: index has shape {list(index.shape)}; cache_mode={cache_mode!r} "
                         f"needs {want_index} ({what})")
    return dv, dk


def _shape_only(kv, dk):
    """A stand-in with the shape of ``kv[..., Dv:]`` (for the broadcast check of cos)."""
    return kv.narrow(-1, kv.shape[-1] - dk, dk)


# ---------------------------------------------------------------- math ---------------------------

def _rms_norm(x: torch.Tensor, gamma: torch.Tensor, epsilon: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + epsilon) * gamma.float()
            ).to(x.dtype)


def _write_reference(cache, index, values, cache_mode):
    """``cache`` with ``values [B, 1, S, W]`` written at ``index`` (host-side selection)."""
    out = cache.clone()
    if cache_mode == "Norm":
        bi, si = (index >= 0).nonzero(as_tuple=True)
        out[bi, 0, index[bi, si].long()] = values[bi, 0, si]
    else:
        tok = (index >= 0).nonzero(as_tuple=True)[0]
        slot = index[tok].long()
        bs = cache.shape[1]
        out[slot // bs, slot % bs, 0] = values.reshape(-1, values.shape[-1])[tok]
    return out


def kv_rmsnorm_rope_cache_reference(kv, gamma, cos, sin, index, k_cache, ckv_cache, *,
                                    epsilon: float = 1e-5, cache_mode: str = "Norm"):
    """Oracle of ``npu_kv_rmsnorm_rope_cache``: ``(k_cache', ckv_cache', k_rope, c_kv)`` as new
    tensors (the caches are copied, then written; the arguments are left alone)."""
    dv, dk = check_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache,
                                         cache_mode=cache_mode)
    c_kv = _rms_norm(kv[..., :dv], gamma, epsilon)
    k_rope = interleaved_rope_reference(kv[..., dv:], cos, sin)
    return (_write_reference(k_cache, index, k_rope, cache_mode),
            _write_reference(ckv_cache, index, c_kv, cache_mode), k_rope, c_kv)


# ---------------------------------------------------------------- eager kernels ------------------

def _scatter(cache, index, values, cache_mode) -> None:
    """Write ``values [B, 1, S, W]`` into ``cache`` at ``index`` in place, without host reads.

    A token whose index is -1 takes the destination and value of the first written token (a
    duplicate write of the same value); when no token is written, slot 0 gets its own value back.
    """
    w = values.shape[-1]
    vals = values.reshape(-1, w)
    t = vals.shape[0]
    idx = index.reshape(-1).long()
    if cache_mode == "Norm":
        dst = cache.select(1, 0)                                   # [B, L, W]
        i = torch.arange(t, device=idx.device) // index.shape[1]   # batch of each token
        j = idx
    else:
        dst = cache.select(2, 0)                                   # [block_num, block_size, W]
        bs = cache.shape[1]
        i, j = idx.div(bs, rounding_mode="floor"), idx.remainder(bs)
    valid = idx >= 0
    first = torch.argmax(valid.to(torch.int32))
    src = torch.where(valid, torch.arange(t, device=idx.device), first)
    i, j = i[src].clamp_min(0), j[src].clamp_min(0)
    new = torch.where(valid.any(), vals[src], dst[i, j])
    dst.index_put_((i, j), new)


def _compute(kv, gamma, cos, sin, epsilon, dv, dk):
    c_kv = _rms_norm(kv[..., :dv], gamma, epsilon)
    return interleaved_rope_into(kv[..., dv:], cos, sin), c_kv


def _eager(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, k_rope_scale=None, c_kv_scale=None,
           k_rope_offset=None, c_kv_offset=None, v=None, epsilon=1e-5, cache_mode="Norm",
           is_output_kv=False):
    dv, dk = check_kv_rmsnorm_rope_cache(
        kv, gamma, cos, sin, index, k_cache, ckv_cache, k_rope_scale=k_rope_scale,
        c_kv_scale=c_kv_scale, k_rope_offset=k_rope_offset, c_kv_offset=c_kv_offset, v=v,
        cache_mode=cache_mode)
    k_rope, c_kv = _compute(kv, gamma, cos, sin, epsilon, dv, dk)
    if index.numel():
        _scatter(k_cache, index, k_rope, cache_mode)
        _scatter(ckv_cache, index, c_kv, cache_mode)
    return k_cache, ckv_cache, k_rope, c_kv


def _functional_eager(kv, gamma, cos, sin, index, k_cache, ckv_cache, **kwargs):
    return _eager(kv, gamma, cos, sin, index, k_cache.clone(), ckv_cache.clone(), **kwargs)


# ---------------------------------------------------------------- fake kernels -------------------

def _outputs_fake(kv, gamma, cos, sin, index, k_cache, ckv_cache, kwargs):
    kwargs = {k: kwargs[k] for k in ("k_rope_scale", "c_kv_scale", "k_rope_offset",
                                     "c_kv_offset", "v", "cache_mode") if k in kwargs}
    dv, dk = check_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache, **kwargs)
    b, n, s, _ = kv.shape
    return kv.new_empty([b, n, s, dk]), kv.new_empty([b, n, s, dv])


def _fake(kv, gamma, cos, sin, index, k_cache, ckv_cache, **kwargs):
    k_rope, c_kv = _outputs_fake(kv, gamma, cos, sin, index, k_cache, ckv_cache, kwargs)
    return torch.empty_like(k_cache), torch.empty_like(ckv_cache), k_rope, c_kv


npu_kv_rmsnorm_rope_cache = define_op(_SCHEMA, fake=_fake, kernel=_eager)
npu_kv_rmsnorm_rope_cache_functional = define_op(_FUNCTIONAL_SCHEMA, fake=_fake,
                                                 kernel=_functional_eager)
install_functionalization(_OP, npu_kv_rmsnorm_rope_cache_functional, mutated=(5, 6),
                          aliased_returns=False)
