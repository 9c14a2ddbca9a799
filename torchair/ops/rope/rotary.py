"""``npu_apply_rotary_pos_emb`` (in place) and ``npu_rotary_mul``: rotary position embedding, as
in torch_npu.

Both compute, in float32 with one rounding to the input's dtype (``rotate`` and the modes
``"half"`` / ``"quarter"`` / ``"interleave"`` as in :mod:`torchair.ops.rope.common`)::

    y = x * cos + rotate(x) * sin          cos / sin broadcast to x (each dim 1 or equal)

``npu_apply_rotary_pos_emb(query, key, cos, sin, layout='BSH', rotary_mode='half')`` rotates
``query`` and ``key`` *in place* and returns them (torch_npu's kernel writes its inputs, and its
TorchAir converter warns of it). ``layout`` names the dims of the 4-D ``query`` / ``key``:
``"BSND"`` (``"BSH"``, the default, is the same code on Ascend and takes 4-D tensors too),
``"SBND"``, ``"BNSD"``, or ``"TND"`` for 3-D ones; ``query`` and ``key`` agree on every dim but
``N`` (grouped KV heads); ``cos`` and ``sin`` have one shape, the tensors' rank, ``D`` last and
broadcast to both (typically ``[B, S, 1, D]`` for BSND; vllm-ascend's decode passes
``[T, 1, 1, D]`` with ``query`` ``[T, 1, N, D]``). All four share one float dtype (torch_npu
requires it). Under ``torch.compile`` the op runs as ``npu_apply_rotary_pos_emb_functional``
(same arguments, new tensors) and the writes into graph inputs become AOT's copies back, so a
static build stays one launch unit.

``npu_rotary_mul(self, r1, r2, rotary_mode='half')`` is the functional form: ``y`` with ``cos =
r1``, ``sin = r2`` (any float dtypes), a new tensor of ``self``'s shape and dtype.

Kernels: :func:`torchair.ops.rope.common.rope_reference` is the oracle; the eager kernels run the
Triton kernel (:mod:`torchair.ops.rope.triton`) for contiguous CUDA tensors when Triton is
importable, else the fused kernel of :mod:`torchair.ops.rope.cpu` (plain PyTorch ops, any
device). None reads tensor values on the host.
"""
from __future__ import annotations

import torch

from torchair.base.registry import define_op
from torchair.ops._functionalize import install_functionalization
from torchair.ops.rope import cpu as _rope_cpu, triton as _rope_triton
from torchair.ops.rope.common import check_float, check_mode, check_rope_table, deinterleave, rope_reference

__all__ = ["LAYOUTS", "apply_rotary_pos_emb_reference", "check_apply_rotary_pos_emb",
           "device_kernel", "npu_apply_rotary_pos_emb", "npu_apply_rotary_pos_emb_functional",
           "interleaved_rope_into", "npu_rotary_mul", "rotary_mul_reference", "rotate_into"]

_APPLY = "npu_apply_rotary_pos_emb"
_ARGS = ("Tensor cos, Tensor sin, str layout='BSH', str rotary_mode='half'")
_APPLY_SCHEMA = (f"{_APPLY}(Tensor(a!) query, Tensor(b!) key, {_ARGS}) -> (Tensor(a!), Tensor(b!))")
_FUNCTIONAL_SCHEMA = (f"{_APPLY}_functional(Tensor query, Tensor key, {_ARGS}) -> (Tensor, Tensor)")
_MUL = "npu_rotary_mul"
_MUL_SCHEMA = f"{_MUL}(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half') -> Tensor"

# layout -> (rank of query / key, index of the head dim N)
LAYOUTS = {"BSH": (4, 2), "BSND": (4, 2), "SBND": (4, 2), "BNSD": (4, 1), "TND": (3, 1)}


# ---------------------------------------------------------------- validation ---------------------

def check_apply_rotary_pos_emb(query, key, cos, sin, layout, rotary_mode) -> None:
    """Check an ``npu_apply_rotary_pos_emb`` call (shapes and dtypes only, never values)."""
    op = _APPLY
    if layout not in LAYOUTS:
        raise ValueError(f"{op}: layout={layout!r} is not supported; expected one of "
                         f"{', '.join(repr(k) for k in LAYOUTS)}")
    rank, n_dim = LAYOUTS[layout]
    for name, t in (("query", query), ("key", key), ("cos", cos), ("sin", sin)):
        check_float(op, name, t)
    for name, t in (("key", key), ("cos", cos), ("sin", sin)):
        if t.dtype != query.dtype:
            raise TypeError(f"{op}: {name} has dtype {t.dtype} but query has {query.dtype}; "
                            f"torch_npu needs one dtype for query, key, cos and sin; cast {name} "
                            f"to {query.dtype}")
    for name, t in (("query", query), ("key", key)):
        if t.dim() != rank:
            hint = (" (a [B, S, H] tensor: view it as [B, S, N, D])" if layout == "BSH" and
                    t.dim() == 3 else "")
            raise ValueError(f"{op}: {name} has shape {list(t.shape)} ({t.dim()}-D); layout="
                             f"{layout!r} needs {rank}-D tensors{hint}")
    for i in range(rank):
        if i != n_dim and query.shape[i] != key.shape[i]:
            raise ValueError(f"{op}: key has shape {list(key.shape)} but query has "
                             f"{list(query.shape)}; with layout={layout!r} they may differ only "
                             f"in dim {n_dim} (N, the heads); pass matching tensors")
    check_mode(op, rotary_mode, query.shape[-1])
    if tuple(cos.shape) != tuple(sin.shape):
        raise ValueError(f"{op}: sin has shape {list(sin.shape)} but cos has {list(cos.shape)}; "
                         f"they must have one shape")
    for x_name, x in (("query", query), ("key", key)):
        check_rope_table(op, x_name, x, "cos", cos)


def _check_rotary_mul(x, r1, r2, rotary_mode) -> None:
    for name, t in (("self", x), ("r1", r1), ("r2", r2)):
        check_float(_MUL, name, t)
    check_mode(_MUL, rotary_mode, x.shape[-1] if x.dim() else 0)
    check_rope_table(_MUL, "self", x, "r1", r1)
    check_rope_table(_MUL, "self", x, "r2", r2)


# ---------------------------------------------------------------- references ---------------------

def apply_rotary_pos_emb_reference(query, key, cos, sin, layout: str = "BSH",
                                   rotary_mode: str = "half"
                                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Oracle of ``npu_apply_rotary_pos_emb``: the rotated ``(query, key)`` as new tensors
    (``x * cos + rotate(x) * sin`` in float32, rounded to the dtype); inputs are not written."""
    check_apply_rotary_pos_emb(query, key, cos, sin, layout, rotary_mode)
    return (rope_reference(query, cos, sin, rotary_mode),
            rope_reference(key, cos, sin, rotary_mode))


def rotary_mul_reference(x, r1, r2, rotary_mode: str = "half") -> torch.Tensor:
    """Oracle of ``npu_rotary_mul``: ``x * r1 + rotate(x) * r2`` in float32, in ``x.dtype``."""
    _check_rotary_mul(x, r1, r2, rotary_mode)
    return rope_reference(x, r1, r2, rotary_mode)


# ---------------------------------------------------------------- eager kernels ------------------

def device_kernel(x: torch.Tensor, out: torch.Tensor) -> str:
    """Which kernel rotates ``x`` into ``out``: "triton" (CUDA, Triton importable, contiguous) or
    "fused" (the PyTorch-op kernel of ``cpu.py``, any device)."""
    if x.device.type == "cuda" and _rope_triton.supports(x, out):
        return "triton"
    return "fused"


def rotate_into(x, cos, sin, mode: str, out) -> torch.Tensor:
    """``x * cos + rotate(x) * sin`` written into ``out`` (may be ``x``); returns ``out``."""
    if device_kernel(x, out) == "triton":
        return _rope_triton.rope_triton(x, cos, sin, mode, out)
    return _rope_cpu.rope_cpu(x, cos, sin, mode, out)


def interleaved_rope_into(r, cos, sin) -> torch.Tensor:
    """The fast form of :func:`torchair.ops.rope.common.interleaved_rope_reference` (same
    contract): de-interleave ``r`` into a new tensor, then rotate-half it in place (Triton on
    CUDA, the fused kernel elsewhere); no host reads. Returns the new tensor."""
    p1 = deinterleave(r)
    return rotate_into(p1, cos, sin, "half", p1)


def _apply_eager(query, key, cos, sin, layout="BSH", rotary_mode="half"):
    check_apply_rotary_pos_emb(query, key, cos, sin, layout, rotary_mode)
    rotate_into(query, cos, sin, rotary_mode, query)
    rotate_into(key, cos, sin, rotary_mode, key)
    return query, key


def _functional_eager(query, key, cos, sin, layout="BSH", rotary_mode="half"):
    check_apply_rotary_pos_emb(query, key, cos, sin, layout, rotary_mode)
    return (rotate_into(query, cos, sin, rotary_mode, torch.empty_like(query)),
            rotate_into(key, cos, sin, rotary_mode, torch.empty_like(key)))


def _rotary_mul_eager(self, r1, r2, rotary_mode="half"):
    _check_rotary_mul(self, r1, r2, rotary_mode)
    return rotate_into(self, r1, r2, rotary_mode, torch.empty_like(self))


# ---------------------------------------------------------------- fake kernels -------------------

def _apply_fake(query, key, cos, sin, layout="BSH", rotary_mode="half"):
    check_apply_rotary_pos_emb(query, key, cos, sin, layout, rotary_mode)
    return query, key


def _functional_fake(query, key, cos, sin, layout="BSH", rotary_mode="half"):
    check_apply_rotary_pos_emb(query, key, cos, sin, layout, rotary_mode)
    return torch.empty_like(query), torch.empty_like(key)


def _rotary_mul_fake(self, r1, r2, rotary_mode="half"):
    _check_rotary_mul(self, r1, r2, rotary_mode)
    return torch.empty_like(self)


npu_apply_rotary_pos_emb = define_op(_APPLY_SCHEMA, fake=_apply_fake, kernel=_apply_eager)
npu_apply_rotary_pos_emb_functional = define_op(_FUNCTIONAL_SCHEMA, fake=_functional_fake,
                                                kernel=_functional_eager)
install_functionalization(_APPLY, npu_apply_rotary_pos_emb_functional, mutated=(0, 1))
npu_rotary_mul = define_op(_MUL_SCHEMA, fake=_rotary_mul_fake, kernel=_rotary_mul_eager)
