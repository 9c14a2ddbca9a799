"""``npu_rms_norm``, ``npu_add_rms_norm``, ``npu_add_rms_norm_cast``: RMS norm, as in torch_npu.

The normalized dims are the last ``k = gamma.dim()`` dims of the input (usually ``k = 1``, the
hidden size ``H``); ``n`` is the number of elements they hold. Per row ``x`` (one index of the
leading dims)::

    rstd  = 1 / sqrt(sum(x_f32 ** 2) / n + epsilon)            float32, shape lead + (1,) * k
    y     = round_to_dtype(x_f32 * rstd * gamma_f32)           the input's dtype

    npu_add_rms_norm(x1, x2, gamma):
        x_out = round_to_dtype(x1_f32 + x2_f32)                the sum, rounded once to x1.dtype
        (y, rstd) = npu_rms_norm(x_out, gamma)                 the norm reads the *rounded* x_out
        returns (y, rstd, x_out)
    npu_add_rms_norm_cast(x1, x2, gamma):
        returns (y.to(float32), y, rstd, x_out)                y as in npu_add_rms_norm

``round_to_dtype`` is PyTorch's float32 -> float16/bfloat16 conversion (round to nearest, ties to
even); nothing is clamped (a float16 overflow gives inf, as on Ascend). Because the norm reads the
rounded sum, ``npu_add_rms_norm(x1, x2, g) == npu_rms_norm(x1 + x2, g)`` bit for bit, and
``y_fp32`` of ``npu_add_rms_norm_cast`` equals the unfused ``npu_add_rms_norm`` -> ``.float()``
bit for bit (Ascend: ``y1 = cast(y2)``).

Inputs are float16, bfloat16 or float32 (``x2`` with ``x1``'s shape and dtype); ``gamma`` is any of
these dtypes with ``gamma.shape == x.shape[-k:]``. Kernels: :func:`rms_norm_reference` (and the
``add`` variants) are the oracle in plain PyTorch; the eager kernels run the chunked CPU kernel
(:mod:`torchair.ops.norm.cpu`) on CPU, the Triton kernel (:mod:`torchair.ops.norm.triton`) on
CUDA when Triton is importable, and the reference elsewhere.
"""
from __future__ import annotations

import torch

from torchair.base.registry import define_op
from torchair.ops.norm import cpu as _norm_cpu, triton as _norm_triton
from torchair.ops.norm.cpu import rstd_shape  # the one definition, shared with the kernels

__all__ = ["add_rms_norm_cast_reference", "add_rms_norm_reference", "check_norm_args",
           "device_kernel", "npu_add_rms_norm", "npu_add_rms_norm_cast", "npu_rms_norm",
           "rms_norm_reference", "rstd_shape"]

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

_RMS_NORM_SCHEMA = ("npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06)"
                    " -> (Tensor, Tensor)")
_ADD_RMS_NORM_SCHEMA = ("npu_add_rms_norm(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06)"
                        " -> (Tensor, Tensor, Tensor)")
_ADD_RMS_NORM_CAST_SCHEMA = ("npu_add_rms_norm_cast(Tensor x1, Tensor x2, Tensor gamma, "
                             "float epsilon=1e-06) -> (Tensor, Tensor, Tensor, Tensor)")


# ---------------------------------------------------------------- validation ---------------------

def check_norm_args(op: str, x: torch.Tensor, gamma: torch.Tensor, *, x_name: str = "self",
                    x2: torch.Tensor | None = None) -> None:
    """Check dtypes and shapes of an RMS-norm family call (shapes only, never values).

    ``x2`` (the second addend) must match ``x`` in shape and dtype; ``gamma`` must be the trailing
    dims of ``x`` and hold at least one element (leading dims may be empty).
    """
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {x_name} has dtype {x.dtype}; expected float16, bfloat16 or "
                        f"float32; cast {x_name} to one of them")
    if x2 is not None:
        if x2.dtype != x.dtype:
            raise TypeError(f"{op}: x2 has dtype {x2.dtype} but {x_name} has {x.dtype}; the "
                            f"addends must have one dtype; cast x2 to {x.dtype}")
        if tuple(x2.shape) != tuple(x.shape):
            raise ValueError(f"{op}: x2 has shape {list(x2.shape)} but {x_name} has "
                             f"{list(x.shape)}; the addends must have one shape (no "
                             f"broadcasting); expand x2 explicitly")
    if gamma.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: gamma has dtype {gamma.dtype}; expected float16, bfloat16 or "
                        f"float32; cast gamma to {x.dtype}")
    k = gamma.dim()
    if k < 1 or k > x.dim() or tuple(x.shape[x.dim() - k:]) != tuple(gamma.shape):
        raise ValueError(f"{op}: gamma has shape {list(gamma.shape)} but {x_name} has shape "
                         f"{list(x.shape)}; expected gamma.shape == {x_name}.shape[-gamma.dim():] "
                         f"(e.g. [H] for {x_name} [..., H]); pass a gamma of the normalized "
                         f"trailing dims")
    if gamma.numel() == 0:
        raise ValueError(f"{op}: gamma has shape {list(gamma.shape)}, so the normalized dims "
                         f"{x_name}.shape[-{k}:] = {list(x.shape[x.dim() - k:])} hold zero "
                         f"elements and the RMS of a row is undefined; the normalized (trailing) "
                         f"dims of {x_name} and gamma must be non-empty")


# ---------------------------------------------------------------- reference ----------------------

def rms_norm_reference(x: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-PyTorch RMS norm over the last ``gamma.dim()`` dims: the oracle of ``npu_rms_norm``.

    Returns ``(y, rstd)``: ``y`` in ``x.dtype``, ``rstd`` float32 shaped ``rstd_shape(x, gamma)``
    (see the module doc for the formula).
    """
    check_norm_args("npu_rms_norm", x, gamma)
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    xf = x.float()
    rstd = torch.rsqrt(xf.square().mean(dim=dims, keepdim=True) + epsilon)
    y = (xf * rstd) * gamma.float()
    return y.to(x.dtype), rstd


def add_rms_norm_reference(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor,
                           epsilon: float = 1e-6
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Oracle of ``npu_add_rms_norm``: ``(y, rstd, x_out)`` with the norm of the rounded sum."""
    check_norm_args("npu_add_rms_norm", x1, gamma, x_name="x1", x2=x2)
    x_out = (x1.float() + x2.float()).to(x1.dtype)
    y, rstd = rms_norm_reference(x_out, gamma, epsilon)
    return y, rstd, x_out


def add_rms_norm_cast_reference(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor,
                                epsilon: float = 1e-6
                                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Oracle of ``npu_add_rms_norm_cast``: ``(y.float(), y, rstd, x_out)``."""
    check_norm_args("npu_add_rms_norm_cast", x1, gamma, x_name="x1", x2=x2)
    y, rstd, x_out = add_rms_norm_reference(x1, x2, gamma, epsilon)
    return y.float(), y, rstd, x_out


# ---------------------------------------------------------------- eager kernels ------------------

def device_kernel(x: torch.Tensor, width: int) -> str:
    """Which implementation serves ``x`` with rows of ``width`` elements: "cpu", "triton" (CUDA,
    Triton importable, the row fits one program) or "reference"."""
    if x.device.type == "cpu":
        return "cpu"
    if x.device.type == "cuda" and _norm_triton.HAS_TRITON and width <= _norm_triton.MAX_WIDTH:
        return "triton"
    return "reference"


def _rms_norm_eager(self, gamma, epsilon=1e-6):
    check_norm_args("npu_rms_norm", self, gamma)
    kind = device_kernel(self, gamma.numel())
    if kind == "cpu":
        return _norm_cpu.rms_norm_cpu(self, gamma, epsilon)
    if kind == "triton":
        return _norm_triton.rms_norm_triton(self, gamma, epsilon)
    return rms_norm_reference(self, gamma, epsilon)


def _add_rms_norm_any(op, x1, x2, gamma, epsilon, want_f32: bool):
    check_norm_args(op, x1, gamma, x_name="x1", x2=x2)
    kind = device_kernel(x1, gamma.numel())
    if kind == "cpu":
        return _norm_cpu.add_rms_norm_cpu(x1, x2, gamma, epsilon, want_f32=want_f32)
    if kind == "triton":
        return _norm_triton.add_rms_norm_triton(x1, x2, gamma, epsilon, want_f32=want_f32)
    y, rstd, x_out = add_rms_norm_reference(x1, x2, gamma, epsilon)
    return (y, rstd, x_out, y.float()) if want_f32 else (y, rstd, x_out)


def _add_rms_norm_eager(x1, x2, gamma, epsilon=1e-6):
    return _add_rms_norm_any("npu_add_rms_norm", x1, x2, gamma, epsilon, want_f32=False)


def _add_rms_norm_cast_eager(x1, x2, gamma, epsilon=1e-6):
    y, rstd, x_out, y_f32 = _add_rms_norm_any("npu_add_rms_norm_cast", x1, x2, gamma, epsilon,
                                              want_f32=True)
    return y_f32, y, rstd, x_out


# ---------------------------------------------------------------- fake kernels -------------------

def _rms_norm_fake(self, gamma, epsilon=1e-6):
    check_norm_args("npu_rms_norm", self, gamma)
    return (self.new_empty(self.shape),
            self.new_empty(rstd_shape(self, gamma), dtype=torch.float32))


def _add_rms_norm_fake(x1, x2, gamma, epsilon=1e-6):
    check_norm_args("npu_add_rms_norm", x1, gamma, x_name="x1", x2=x2)
    return (x1.new_empty(x1.shape), x1.new_empty(rstd_shape(x1, gamma), dtype=torch.float32),
            x1.new_empty(x1.shape))


def _add_rms_norm_cast_fake(x1, x2, gamma, epsilon=1e-6):
    check_norm_args("npu_add_rms_norm_cast", x1, gamma, x_name="x1", x2=x2)
    return (x1.new_empty(x1.shape, dtype=torch.float32), x1.new_empty(x1.shape),
            x1.new_empty(rstd_shape(x1, gamma), dtype=torch.float32), x1.new_empty(x1.shape))


npu_rms_norm = define_op(_RMS_NORM_SCHEMA, fake=_rms_norm_fake, kernel=_rms_norm_eager)
npu_add_rms_norm = define_op(_ADD_RMS_NORM_SCHEMA, fake=_add_rms_norm_fake,
                             kernel=_add_rms_norm_eager)
npu_add_rms_norm_cast = define_op(_ADD_RMS_NORM_CAST_SCHEMA, fake=_add_rms_norm_cast_fake,
                                  kernel=_add_rms_norm_cast_eager)
