"""``torch.npu`` streams and events.

On a CUDA emulation they are ``torch.cuda``'s own (``Stream``, ``Event``, ``stream``,
``current_stream``, ...): NPU device arguments reach them through the ``torch.device`` stand-in.

On the CPU, work runs in order on the host, so streams and events are faithful no-ops:
:class:`HostStream` has the stream methods (``query`` is always True), and :class:`HostEvent`
records a host timestamp, so ``elapsed_time`` returns the real milliseconds between two
``record`` calls and raises the ``ValueError`` CUDA raises when an event was not created with
``enable_timing=True`` or not recorded.

Inside code Dynamo traces they stay no-ops and add nothing to the graph: ``with
torch.npu.stream(s)`` is an empty context, ``Event.record`` / ``wait`` and the ``Stream``
methods do nothing (a compiled graph's ops already run in order on the host). The argument
checks run eagerly only, and an event recorded inside a compiled graph keeps no timestamp
(``elapsed_time`` on it raises the "must be recorded" error). Dynamo sees a ``torch.Stream``
subclass as its own stream object, so a check such as ``isinstance(s, HostStream)`` cannot be
traced; hence the eager-only checks.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import time
from typing import Any, Callable

import torch

from torchair.compat._device import to_emulated

__all__ = ["HostEvent", "HostStream", "host_record_stream", "stream_api"]

_CPU = torch._C.device("cpu")  # the real class: torch.device is replaced while emulating
_tracing = torch.compiler.is_dynamo_compiling  # True while Dynamo traces (see the module doc)


class HostStream:
    """A ``torch.npu.Stream`` on the CPU: ``Stream(device=None, priority=0)``.

    Its methods do nothing: host work is already ordered. ``stream_id`` is 0 for the default
    stream, then 1, 2, ... Not a ``torch.Stream``: Dynamo would trace one as a device stream
    and put stream ops into the graph, which refuse this module's events; as a plain object
    Dynamo traces its (empty) methods. ``Tensor.record_stream`` with one is a no-op (the
    emulation's function mode answers it: the torch op refuses CPU tensors).
    """

    _ids = itertools.count(1)

    def __init__(self, device: Any = None, priority: int = 0, *,
                 stream_id: int | None = None) -> None:
        to_emulated(_CPU, device)  # rejects what is not an NPU device
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"torch.npu.Stream: priority must be an int; got {priority!r}")
        self._stream_id = next(type(self)._ids) if stream_id is None else stream_id
        self._priority = priority

    @property
    def stream_id(self) -> int:
        return self._stream_id

    @property
    def priority(self) -> int:
        return self._priority

    @property
    def device(self) -> torch.device:
        return _CPU

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def wait_event(self, event: HostEvent) -> None:
        if not _tracing():
            _check(event, HostEvent, "Stream.wait_event", "event")

    def wait_stream(self, stream: HostStream) -> None:
        if not _tracing():
            _check(stream, HostStream, "Stream.wait_stream", "stream")

    def record_event(self, event: HostEvent | None = None) -> HostEvent:
        event = HostEvent() if event is None else event
        if not _tracing():
            event.record(self)
        return event

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HostStream) and other._stream_id == self._stream_id

    def __hash__(self) -> int:
        return hash(("npu-host-stream", self._stream_id))

    def __repr__(self) -> str:
        return f"<torch.npu.Stream device=cpu stream_id={self._stream_id} (emulated on CPU)>"


class HostEvent:
    """A ``torch.npu.Event`` on the CPU: ``Event(enable_timing=False, blocking=False,
    interprocess=False)``; ``record`` takes a host timestamp (see the module doc)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False) -> None:
        self.enable_timing = bool(enable_timing)
        self.blocking = bool(blocking)
        self.interprocess = bool(interprocess)
        self._time: float | None = None

    def record(self, stream: HostStream | None = None) -> None:
        if _tracing():
            return
        if stream is not None:
            _check(stream, HostStream, "Event.record", "stream")
        self._time = time.perf_counter()

    def wait(self, stream: HostStream | None = None) -> None:
        if stream is not None and not _tracing():
            _check(stream, HostStream, "Event.wait", "stream")

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end_event: HostEvent) -> float:
        """Milliseconds from this event's ``record`` to ``end_event``'s."""
        _check(end_event, HostEvent, "Event.elapsed_time", "end_event")
        if not (self.enable_timing and end_event.enable_timing):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        if self._time is None or end_event._time is None:
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        return (end_event._time - self._time) * 1000.0

    def __repr__(self) -> str:
        state = "recorded" if self._time is not None else "not recorded"
        return f"<torch.npu.Event {state} (emulated on CPU)>"


_TENSOR_RECORD_STREAM = torch.Tensor.record_stream


def host_record_stream(self: torch.Tensor, stream: Any) -> None:
    """``Tensor.record_stream`` on a CPU emulation: a no-op for a ``torch.npu.Stream`` (a CPU
    tensor has no stream to record), torch's own method for anything else."""
    if isinstance(stream, HostStream):
        return None
    return _TENSOR_RECORD_STREAM(self, stream)


_PUBLIC = {HostStream: "Stream", HostEvent: "Event"}


def _check(value: Any, kind: type, where: str, name: str) -> None:
    if not isinstance(value, kind):
        raise TypeError(f"torch.npu.{where}: {name} must be a torch.npu.{_PUBLIC[kind]} "
                        f"(emulated on CPU); got {type(value).__name__}")


class _StreamContext:
    """``torch.npu.stream(s)`` / ``StreamContext(s)``: ``s`` is current inside the block
    (None: no-op). Each CPU emulation makes a subclass bound to its stream state ``_api``."""

    _api: _HostStreams

    def __init__(self, stream: HostStream | None) -> None:
        if stream is not None and not _tracing():
            _check(stream, HostStream, "stream", "stream")
        self.stream, self._prev = stream, None

    def __enter__(self) -> HostStream | None:
        if self.stream is not None and not _tracing():
            self._prev = self._api.current_stream()
            self._api.set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc: object) -> None:
        if self.stream is not None and not _tracing():
            self._api.set_stream(self._prev)


class _HostStreams:
    """The current-stream state of one CPU emulation (per thread, like CUDA's)."""

    def __init__(self) -> None:
        self.default = HostStream(stream_id=0)
        self._local = threading.local()
        self.context = type("StreamContext", (_StreamContext,), {"_api": self})

    def current_stream(self, device: Any = None) -> HostStream:
        to_emulated(_CPU, device)
        return getattr(self._local, "stream", self.default)

    def default_stream(self, device: Any = None) -> HostStream:
        to_emulated(_CPU, device)
        return self.default

    def set_stream(self, stream: HostStream | None) -> None:
        if stream is None or _tracing():
            return
        _check(stream, HostStream, "set_stream", "stream")
        self._local.stream = stream

    def stream(self, stream: HostStream | None) -> Any:
        if _tracing():
            return contextlib.nullcontext(stream)
        return self.context(stream)


def stream_api(target: torch.device) -> dict[str, Callable[..., Any] | type]:
    """The stream and event names of ``torch.npu`` for the device playing the NPU."""
    if target.type == "cuda":
        cuda = torch.cuda
        return {"Stream": cuda.Stream, "Event": cuda.Event, "stream": cuda.stream,
                "StreamContext": cuda.StreamContext, "current_stream": cuda.current_stream,
                "default_stream": cuda.default_stream, "set_stream": cuda.set_stream}
    host = _HostStreams()
    api: dict[str, Any] = {"Stream": HostStream, "Event": HostEvent,
                           "StreamContext": host.context}
    for name in ("stream", "current_stream", "default_stream", "set_stream"):
        api[name] = getattr(host, name)
    return api
