"""The three default fusion patterns of seed 003, all starting at ``npu_add_rms_norm``.

============================================================  =====================================
found                                                         replaced by
============================================================  =====================================
``add_rms_norm`` y -> ``dynamic_quant(y, smooth_scales=s)``   ``add_rms_norm_dynamic_quant`` (s)
``add_rms_norm`` y -> ``flatten(0, 1)`` -> ``dynamic_quant``  ``add_rms_norm_dynamic_quant``, then
(no smooth scales), its scale -> ``view(-1, 1)``              the same flatten and view
``add_rms_norm`` y (last dim h) -> ``view(-1, h)``            ``add_rms_norm_cast``'s float32 y,
-> ``.to(torch.float32)``                                     viewed ``(-1, h)``
============================================================  =====================================

Each comes in four variants: the sum ``x_out`` used after the chain or not, and ``epsilon``
given or left at its default (``1e-6``; a default argument does not appear in the graph). A
chain whose intermediate (the norm's ``y``, its ``rstd``, the unflattened quant scale) has users
outside the chain is left unfused: the fused op does not produce that intermediate.

Numerics: ``add_rms_norm_dynamic_quant`` quantizes the normalized row in float32 while the
unfused chain quantizes it after rounding to the input dtype, so fused int8 values may differ by
one step where a value lies within rounding of a .5 boundary (as on Ascend, where the fusion is
the same). ``add_rms_norm_cast``'s float32 output is ``float(y)`` and equals the chain exactly.
"""
from __future__ import annotations

import torch

from torchair.base.log import logger
from torchair.patterns import replacement
from torchair.patterns.replacement import register_replacement, registered_patterns

_EPS = 1.2345e-5  # example epsilon for tracing: a value no other constant of the pattern has
_ONLY_Y1 = [True, False]  # compute y1/scale1 only (no second smooth scale in these chains)

SMOOTH = "add_rms_norm+dynamic_quant(smooth_scales) -> add_rms_norm_dynamic_quant"
FLATTEN = "add_rms_norm+flatten+dynamic_quant -> add_rms_norm_dynamic_quant"
CAST = "add_rms_norm+view+to(float32) -> add_rms_norm_cast"
NAMES = (SMOOTH, FLATTEN, CAST)


def _norm(x1, x2, gamma, eps):
    if eps is None:
        return torch.ops.npu.npu_add_rms_norm(x1, x2, gamma)
    return torch.ops.npu.npu_add_rms_norm(x1, x2, gamma, eps)


def _norm_quant(x1, x2, gamma, eps, smooth=None):
    kwargs = {} if eps is None else {"epsilon": eps}
    y1, _, x_out, scale1, _ = torch.ops.npu.npu_add_rms_norm_dynamic_quant(
        x1, x2, gamma, smooth_scale1=smooth, output_mask=_ONLY_Y1, **kwargs)
    return y1, x_out, scale1


def _smooth(keep_x_out: bool):
    def search(x1, x2, gamma, smooth, eps):
        y, _, x_out = _norm(x1, x2, gamma, eps)
        yq, scale = torch.ops.npu.npu_dynamic_quant(y, smooth_scales=smooth)
        return (yq, scale, x_out) if keep_x_out else (yq, scale)

    def replace(x1, x2, gamma, smooth, eps):
        yq, x_out, scale = _norm_quant(x1, x2, gamma, eps, smooth)
        return (yq, scale, x_out) if keep_x_out else (yq, scale)

    return search, replace


def _flatten(keep_x_out: bool):
    def search(x1, x2, gamma, eps):
        y, _, x_out = _norm(x1, x2, gamma, eps)
        yq, scale = torch.ops.npu.npu_dynamic_quant(y.flatten(0, 1))
        scale = scale.view(-1, 1)
        return (yq, scale, x_out) if keep_x_out else (yq, scale)

    def replace(x1, x2, gamma, eps):
        yq, x_out, scale = _norm_quant(x1, x2, gamma, eps)
        yq, scale = yq.flatten(0, 1), scale.view(-1, 1)
        return (yq, scale, x_out) if keep_x_out else (yq, scale)

    return search, replace


def _cast(keep_x_out: bool):
    def search(x1, x2, gamma, eps):
        y, _, x_out = _norm(x1, x2, gamma, eps)
        y32 = y.view(-1, y.size(-1)).to(torch.float32)
        return (y32, x_out) if keep_x_out else y32

    def replace(x1, x2, gamma, eps):
        args = (x1, x2, gamma) if eps is None else (x1, x2, gamma, eps)
        y32, _, _, x_out = torch.ops.npu.npu_add_rms_norm_cast(*args)
        y32 = y32.view(-1, y32.size(-1))
        return (y32, x_out) if keep_x_out else y32

    return search, replace


def _default_eps(fn, smooth: bool):
    """``fn`` without its trailing ``eps`` argument: the op's default epsilon (not in the graph)."""
    if smooth:
        def without_eps(x1, x2, gamma, smooth):
            return fn(x1, x2, gamma, smooth, None)
    else:
        def without_eps(x1, x2, gamma):
            return fn(x1, x2, gamma, None)
    return without_eps


def _examples(smooth: bool) -> list:
    x = torch.randn(2, 3, 16, dtype=torch.float16)
    args = [x, torch.randn_like(x), torch.rand(16, dtype=torch.float16) + 0.5]
    if smooth:
        args.append(torch.rand(16, dtype=torch.float16) + 0.5)
    return args


_OPS = ("npu_add_rms_norm", "npu_dynamic_quant", "npu_add_rms_norm_dynamic_quant",
        "npu_add_rms_norm_cast")


def has_anchor(gm) -> bool:
    """Whether ``gm`` has an ``npu_add_rms_norm`` node, where every default pattern starts."""
    op = getattr(torch.ops.npu, "npu_add_rms_norm", None) if hasattr(torch.ops, "npu") else None
    return op is not None and bool(gm.graph.find_nodes(op="call_function", target=op.default))


def register_defaults() -> tuple[str, ...]:
    """Register the default patterns unless they are; returns the names of those registered."""
    with replacement.REGISTRY_LOCK:  # another thread must not see some variants registered only
        if all(name in registered_patterns() for name in NAMES):
            return NAMES
        missing = [op for op in _OPS if not hasattr(torch.ops.npu, op)]
        if missing:
            logger.debug("default fusion patterns skipped: ops %s are not defined", missing)
            return ()
        return _register_all()


def _register_all() -> tuple[str, ...]:
    makers = ((SMOOTH, _smooth, True), (FLATTEN, _flatten, False), (CAST, _cast, False))
    for name, make, smooth in makers:
        for keep_x_out in (True, False):
            search, replace = make(keep_x_out)
            register_replacement(search, replace, _examples(smooth) + [_EPS],
                                 scalar_workaround={"eps": _EPS}, skip_duplicates=True, name=name)
            register_replacement(_default_eps(search, smooth), _default_eps(replace, smooth),
                                 _examples(smooth), skip_duplicates=True, name=name)
    return NAMES
