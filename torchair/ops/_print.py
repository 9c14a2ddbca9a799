"""``torchair.ops.npu_print``: print tensors while a graph runs, without a graph break.

``npu_print("step", x, "scale", s, summarize_size=3, tensor_detail=False)`` becomes one node of
the op ``npu::npu_print(Tensor[] tensors, str msg_format, str placeholder, int summarize_size,
bool tensor_detail) -> ()``: the message is the arguments joined by one space, each tensor
replaced by ``placeholder`` (``{}``, or ``{0}``, ``{1}``, ... when the text already contains it);
the op replaces the placeholders one by one with the tensors' summaries and prints the line
(Python ``print``, so ``capsys`` / ``capfd`` see it) each time the graph runs. The op is
side-effecting, so neither Dynamo, AOT nor our passes drop it; the function returns its tensors
unchanged (the same objects).

Summaries follow TorchAir (numpy style): ``[0 1 2 ... 7 8 9]``; rows of a matrix joined by a
newline and one space; integral floats without a fraction (``1``), others in the shortest form
that reads back as the same value of the tensor's dtype; bfloat16 is shown as float32. With
``summarize_size=n`` each dim longer than ``2 * n`` shows its first and last ``n`` entries around
``...``; ``-1`` shows everything. ``tensor_detail=True`` wraps each summary as
``tensor([...], shape=[10], dtype=torch.int64)``.

Printing reads tensor data on the host, so a graph that prints is host-scheduled (the op is
registered with the host-sync ops of :mod:`torchair.plan.analysis`; the report says so): on
CUDA a captured graph could not print on replay. TorchAir prints asynchronously from the device;
here the line is printed when the op runs, in graph order.
"""
from __future__ import annotations

import math
import struct
from typing import Any

import torch

from torchair.base.registry import define_op, register_host_sync

__all__ = ["npu_print", "summarize_tensor"]

_PRINTABLE = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
              torch.float16, torch.bfloat16, torch.float32, torch.float64)
_UNSIGNED = tuple(getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n))
_PACK = {torch.float16: "e", torch.float32: "f"}  # struct codes for the round-trip check


def _check_summarize_size(summarize_size: Any) -> None:
    if isinstance(summarize_size, bool) or not isinstance(summarize_size, int):
        raise TypeError(f"npu_print: summarize_size must be an int (entries shown at each end "
                        f"of a dim, -1 for all), got {type(summarize_size).__name__} "
                        f"{summarize_size!r}")
    if summarize_size < -1 or summarize_size == 0:
        raise ValueError(f"summarize_size must be positive or -1 for all elements, got "
                         f"{summarize_size}")


# ------------------------------------------------------------------------------ formatting

def _float_text(x: float, dtype: torch.dtype) -> str:
    """The shortest decimal that reads back as ``x`` in ``dtype``; integral values bare."""
    if math.isfinite(x) and x.is_integer():
        return f"{x:.0f}"
    if not math.isfinite(x) or dtype not in _PACK:
        return repr(x) if math.isfinite(x) else str(x)
    code = _PACK[dtype]
    want = struct.pack(code, x)
    for digits in range(1, 18):
        text = f"{x:.{digits}g}"
        if struct.pack(code, float(text)) == want:
            return text
    return repr(x)


def _scalar_text(v: Any, dtype: torch.dtype) -> str:
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return str(v)
    return _float_text(float(v), dtype)


def _shown(t: torch.Tensor, n: int) -> torch.Tensor:
    """Only the entries the summary shows (a large tensor is not copied to the host whole)."""
    if n < 0:
        return t
    for dim, size in enumerate(t.shape):
        if size > 2 * n:
            t = torch.cat([t.narrow(dim, 0, n), t.narrow(dim, size - n, n)], dim)
    return t


def summarize_tensor(tensor: torch.Tensor, summarize_size: int = 3,
                     tensor_detail: bool = False) -> str:
    """The text ``npu_print`` shows for ``tensor`` (see the module docstring)."""
    _check_summarize_size(summarize_size)
    t = tensor.detach()
    dtype = torch.float32 if t.dtype == torch.bfloat16 else t.dtype
    shown = _shown(t, summarize_size).to("cpu", dtype)
    if shown.dtype in _UNSIGNED:
        shown = shown.to(torch.int64) if shown.dtype != torch.uint64 else shown
    text = _summary(shown.tolist(), list(t.shape), summarize_size, dtype)
    if tensor_detail:
        text = f"tensor({text}, shape={list(t.shape)}, dtype={tensor.dtype})"
    return text


def _summary(values: Any, shape: list[int], n: int, dtype: torch.dtype) -> str:
    """``values``: the nested list of the entries kept by :func:`_shown` of a tensor of
    ``shape`` (a dim longer than ``2 * n`` holds its first ``n`` then its last ``n``)."""
    if not shape:
        return _scalar_text(values, dtype)
    if n < 0 or shape[0] <= 2 * n:
        parts = [_summary(v, shape[1:], n, dtype) for v in values]
    else:
        parts = [_summary(v, shape[1:], n, dtype) for v in values[:n]] + ["..."] + \
            [_summary(v, shape[1:], n, dtype) for v in values[n:]]
    sep = " " if len(shape) == 1 else "\n "
    return "[" + sep.join(parts) + "]"


# ------------------------------------------------------------------------------ the op

def _kernel(tensors: list[torch.Tensor], msg_format: str, placeholder: str,
            summarize_size: int = 3, tensor_detail: bool = False) -> None:
    message = msg_format
    for t in tensors:
        message = message.replace(placeholder, summarize_tensor(t, summarize_size,
                                                                tensor_detail), 1)
    print(message, flush=True)


def _fake(tensors: list[torch.Tensor], msg_format: str, placeholder: str,
          summarize_size: int = 3, tensor_detail: bool = False) -> None:
    if not tensors:
        raise RuntimeError("print op requires at least one tensor")
    _check_summarize_size(summarize_size)
    return None


_print = define_op("npu_print(Tensor[] tensors, str msg_format, str placeholder, "
                   "int summarize_size=3, bool tensor_detail=False) -> ()",
                   fake=_fake, kernel=_kernel)
PRINT: torch._ops.OpOverload = _print.default
for _op in (_print, PRINT):
    torch.fx.node.has_side_effect(_op)


# a graph that prints reads tensors on the host: it cannot be one captured launch
register_host_sync(PRINT)


def _placeholder(texts: list[str]) -> str:
    joined = " ".join(texts)
    placeholder, i = "{}", 0
    while placeholder in joined:
        placeholder = f"{{{i}}}"
        i += 1
    return placeholder


def npu_print(*args: Any, summarize_size: int = 3, tensor_detail: bool = False
              ) -> list[torch.Tensor]:
    """Print ``args`` (tensors, strings, numbers) joined by spaces each time the code runs,
    eagerly or inside a compiled graph (no graph break). Returns the tensors, unchanged.

    Parameters
    ----------
    *args
        At least one ``torch.Tensor``; ``str``, ``bool``, ``int`` and ``float`` arguments are
        printed as text. Complex tensors cannot be printed.
    summarize_size : int
        Entries shown at each end of every dim longer than ``2 * summarize_size``; ``-1`` shows
        every entry.
    tensor_detail : bool
        Add each tensor's shape and dtype: ``tensor([0 1 2 ... 7 8 9], shape=[10],
        dtype=torch.int64)``.
    """
    _check_summarize_size(summarize_size)
    if not isinstance(tensor_detail, bool):
        raise TypeError(f"npu_print: tensor_detail must be a bool, got "
                        f"{type(tensor_detail).__name__} {tensor_detail!r}")
    tensors: list[torch.Tensor] = []
    texts: list[str | None] = []  # None: a tensor's slot
    for i, arg in enumerate(args):
        if isinstance(arg, torch.Tensor):
            if arg.dtype not in _PRINTABLE + _UNSIGNED:
                raise TypeError(f"npu_print: argument {i} is a {arg.dtype} tensor, which cannot "
                                f"be printed; printable dtypes: bool, integers, float16, "
                                f"bfloat16, float32, float64 (print .real / .imag of a complex "
                                f"tensor)")
            tensors.append(arg)
            texts.append(None)
        elif isinstance(arg, (str, bool, int, float)):
            texts.append(str(arg))
        else:
            raise TypeError(f"npu_print: argument {i} is a {type(arg).__name__}; pass tensors, "
                            f"str, bool, int or float")
    if not tensors:
        raise RuntimeError("print op requires at least one tensor; npu_print needs a "
                           "torch.Tensor among its arguments")
    placeholder = _placeholder([t if t is not None else "[]" for t in texts])
    msg_format = " ".join(t if t is not None else placeholder for t in texts)
    PRINT(tensors, msg_format, placeholder, summarize_size, tensor_detail)
    return tensors
