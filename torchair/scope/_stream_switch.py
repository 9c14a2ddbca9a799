"""``torchair.scope.npu_stream_switch`` and ``torchair.scope.npu_wait_tensor``: multi-stream
regions inside compiled code (TorchAir's "图内多流表达").

In a graph compiled by the torchair backend, the ops of a ``npu_stream_switch(tag)`` region run on
the stream named ``tag`` (one stream per tag and device), and ``npu_wait_tensor(t, dep)`` makes the
ops that read ``t`` afterwards wait until ``dep`` is computed. Data edges between streams are
synchronized automatically (an event per crossing edge), so results never depend on the streams.

On a CUDA GPU the regions run on ``torch.cuda.Stream``s (see :mod:`torchair.scope._stream_runtime`
for which launch units honour them); on CPU, and in eager mode, both are no-ops with the same
results. Inside a ``super_kernel`` scope, ``stream-fusion=0`` (the default) allows at most two
streams per segment (the main stream counts) and ``stream-fusion=1`` any number.
"""
from __future__ import annotations

from types import TracebackType

import torch

from torchair.scope._markers import STREAM_BEGIN, STREAM_END, WAIT

_MAX_TAG_LEN = 255


def _check_tag(stream_tag: str, stream_priority: int, enable_inner_parallel: bool = True
               ) -> None:
    if not isinstance(stream_tag, str):
        raise TypeError(f"npu_stream_switch stream_tag must be a str (the stream's name), got "
                        f"{type(stream_tag).__name__} {stream_tag!r}")
    if not stream_tag or len(stream_tag) > _MAX_TAG_LEN:
        raise ValueError(f"npu_stream_switch stream_tag {stream_tag!r} must have 1 to "
                         f"{_MAX_TAG_LEN} characters")
    if isinstance(stream_priority, bool) or not isinstance(stream_priority, int):
        raise TypeError(f"npu_stream_switch stream_priority must be an int, got "
                        f"{type(stream_priority).__name__} {stream_priority!r}")
    if not isinstance(enable_inner_parallel, bool):
        raise TypeError(f"npu_stream_switch enable_inner_parallel must be a bool, got "
                        f"{type(enable_inner_parallel).__name__} {enable_inner_parallel!r}")


class npu_stream_switch:  # lower case: TorchAir's public name
    """Context manager: the ops run inside go to the stream ``stream_tag``.

    ``with torchair.scope.npu_stream_switch("s1", 0): ...`` inside a function compiled with the
    torchair backend. The same tag is the same stream; regions nest (the innermost wins).
    ``stream_priority`` is the stream's priority (CUDA: lower numbers run first; the value is
    clamped to the device's range), fixed by the tag's first use: a tag used with two priorities
    in one graph is a ``ValueError``. Outside ``torch.compile`` the region does nothing.
    ``enable_inner_parallel`` (Ascend: let the ops of the region split across the chip's core
    groups; True by default, as in TorchAir) is accepted and checked; it has no effect on
    CPU/CUDA.
    """

    def __init__(self, stream_tag: str, stream_priority: int = 0,
                 enable_inner_parallel: bool = True) -> None:
        _check_tag(stream_tag, stream_priority, enable_inner_parallel)
        self.stream_tag = stream_tag
        self.stream_priority = stream_priority
        self.enable_inner_parallel = enable_inner_parallel

    def __enter__(self) -> None:
        STREAM_BEGIN(self.stream_tag, self.stream_priority)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        STREAM_END(self.stream_tag)
        return False


def npu_wait_tensor(self: torch.Tensor, dependency: torch.Tensor) -> torch.Tensor:
    """Return ``self``; in compiled code the ops that read ``self`` after this call wait until
    ``dependency`` has been computed (a control edge, e.g. to order work across streams).

    On CPU and in eager mode it only returns ``self``.
    """
    if not isinstance(self, torch.Tensor) or not isinstance(dependency, torch.Tensor):
        raise TypeError(f"npu_wait_tensor expects two tensors (self, dependency), got "
                        f"{type(self).__name__} and {type(dependency).__name__}")
    WAIT(self, dependency)
    return self
