"""Matrix-product operands that ATen's CPU BLAS path takes without a copy.

Inductor views a one-row buffer (a ``[1, 1, K]`` norm output, say) as ``[1, K]`` with strides
``(0, 1)``: a size-1 dim's stride does not address anything, so Inductor derives 0. ATen's CPU
``mm`` / ``addmm`` only hands an operand to BLAS when its leading dimension is at least the
row length, so it clones such an operand before every call (an ``empty_like`` + ``copy_``,
about 10 us per product inside a decode step; four per step in the bench decoder). The same
storage viewed with strides ``(K, 1)`` addresses the same elements and passes ATen's check.

:func:`blas_strides` patches Inductor's ``mm`` and ``addmm`` lowerings, while torchair compiles
a graph, to restride such operands (a symbolic row length too: ``(s0, 1)`` addresses the same
elements for any ``s0``); every other layout is left as it is. The patch swaps entries of
Inductor's process-wide lowering table, so an Inductor compile in another thread at the same time
gets it too (its code stays correct). It also puts a marker pass into Inductor's FX-graph cache
key, so code cached by a compile without the patch is not served to one with it.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

__all__ = ["blas_strides", "blas_compatible"]


def blas_compatible(size: list, stride: list) -> list | None:
    """New strides for a 2-D operand of ``size`` whose size-1 dim has stride 0 (the other dim
    contiguous), or None when it needs none. The new strides address the same elements."""
    if len(size) != 2:
        return None
    rows, cols = size
    if rows == 1 and stride[0] == 0 and stride[1] == 1 and cols != 1:
        return [cols, 1]
    if cols == 1 and stride[1] == 0 and stride[0] == 1 and rows != 1:
        return [1, rows]
    return None


def _restride(x: Any) -> Any:
    from torch._inductor import ir

    try:
        view = ir.ExternKernel.realize_input(x)
    except Exception:  # noqa: BLE001 - anything unusual goes to the lowering unchanged
        return x
    if not isinstance(view, ir.ReinterpretView):
        return x
    try:
        layout = view.get_layout()
        stride = blas_compatible(list(layout.size), list(layout.stride))
    except (TypeError, NotImplementedError):  # symbolic comparisons that do not decide
        return x
    if stride is None:
        return x
    fixed = ir.FixedLayout(layout.device, layout.dtype, list(layout.size), stride,
                           layout.offset)
    return ir.TensorBox(ir.ReinterpretView(data=view.data, layout=fixed))


def _wrap(lowering: Callable, operands: tuple[int, ...]) -> Callable:
    def patched(*args: Any, **kwargs: Any) -> Any:
        args = tuple(_restride(a) if i in operands else a for i, a in enumerate(args))
        return lowering(*args, **kwargs)

    patched.torchair_blas_strides = True  # type: ignore[attr-defined]
    return patched


def _cache_marker() -> Any:
    """A no-op post-grad pass whose uuid enters Inductor's FX-graph cache key (None where this
    PyTorch has no such passes)."""
    try:
        from torch._inductor.custom_graph_pass import CustomGraphPass
    except ImportError:
        return None

    class BlasStrides(CustomGraphPass):
        def __call__(self, graph: Any) -> None:
            return None

        def uuid(self) -> str:
            return "torchair.blas_strides.1"

    return BlasStrides()


@contextlib.contextmanager
def _keyed() -> Iterator[None]:
    """Inductor's ``post_grad_custom_pre_pass`` set to the marker while no one else uses it
    (torchair runs its users' passes itself): a changed cache key, nothing else."""
    import torch._inductor.config as inductor_config

    marker = _cache_marker()
    if marker is None or getattr(inductor_config, "post_grad_custom_pre_pass", 0) is not None:
        yield
        return
    with inductor_config.patch(post_grad_custom_pre_pass=marker):
        yield


@contextlib.contextmanager
def blas_strides() -> Iterator[None]:
    """While active, Inductor's ``mm`` / ``addmm`` lowerings restride one-row (one-column)
    operands as :func:`blas_compatible` says. Nested uses keep one patch."""
    from torch._inductor import lowering

    aten = torch.ops.aten
    saved = {}
    for op, operands in ((aten.mm.default, (0, 1)), (aten.addmm.default, (1, 2))):
        current = lowering.lowerings.get(op)
        if current is None or getattr(current, "torchair_blas_strides", False):
            continue
        saved[op] = current
        lowering.lowerings[op] = _wrap(current, operands)
    try:
        with _keyed():
            yield
    finally:
        for op, current in saved.items():
            lowering.lowerings[op] = current
