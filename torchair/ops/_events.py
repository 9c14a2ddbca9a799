"""Tagged events and streams (TorchAir's ``npu_create_tagged_event`` family), and ``record`` /
``wait``.

A *tagged event* is an event registered under a unique string tag, so a compiled graph can name
it: ``npu_tagged_event_record(event)`` / ``npu_tagged_event_wait(event)`` look the tag up while
Dynamo traces and put the side-effecting op ``npu::npu_tagged_event_record(str tag)`` /
``npu::npu_tagged_event_wait(str tag)`` into the graph; the op finds the event by its tag when it
runs. ``npu_record_tagged_stream(input, tag)`` marks ``input`` as used by the stream named
``tag`` (``Tensor.record_stream``), the same stream ``torchair.scope.npu_stream_switch(tag)``
runs on; the tag ``"default"`` is the current (main) stream.

Devices: on CUDA (once CUDA is initialized) a tagged event wraps a ``torch.cuda.Event`` recorded
on / waited for by the current stream, and tagged streams are ``torch.cuda.Stream``s. On the CPU
all work runs in order on one host stream, so record and wait are ordering no-ops with faithful
bookkeeping: an event knows whether it was recorded (``query()``) and ``synchronize()`` returns
at once.

``record()`` returns an empty tensor marking a point of the current stream's work, and
``wait(tensors)`` makes the current stream wait for the work that produced ``tensors``; in a
compiled graph the data edge from ``record`` to ``wait`` is that dependency (a stream crossing
gets an event, see :mod:`torchair.scope._stream_runtime`). On the CPU both order nothing.
"""
from __future__ import annotations

import threading
from typing import Any

import torch

from torchair.base.log import logger
from torchair.base.registry import define_op
from torchair.scope._stream_runtime import CudaStreams

__all__ = ["TaggedEvent", "npu_create_tagged_event", "npu_record_tagged_stream",
           "npu_tagged_event_record", "npu_tagged_event_wait", "record", "wait"]

DEFAULT_STREAM_TAG = "default"


def _cuda_active() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


class TaggedEvent:
    """An event registered under ``tag`` (create it with ``npu_create_tagged_event``).

    Methods mirror ``torch.cuda.Event``: ``record(stream=None)``, ``wait(stream=None)``,
    ``query()``, ``synchronize()``; ``stream=None`` means the current stream.
    """

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.recorded = 0  # how many times the event was recorded
        self.cuda_event: Any = None  # the torch.cuda.Event, once recorded on CUDA

    def __repr__(self) -> str:
        return f"TaggedEvent(tag={self.tag!r})"

    def _cuda(self) -> Any:
        if self.cuda_event is None:
            try:  # external: a record inside a CUDA graph capture records again on replay
                self.cuda_event = torch.cuda.Event(external=True)
            except TypeError:
                self.cuda_event = torch.cuda.Event()
        return self.cuda_event

    def record(self, stream: Any = None) -> None:
        self.recorded += 1
        if isinstance(stream, torch.cuda.Stream) or (stream is None and _cuda_active()):
            self._cuda().record(stream)

    def wait(self, stream: Any = None) -> None:
        # an event never recorded is complete, as for CUDA events: nothing to wait for
        if self.cuda_event is not None and (isinstance(stream, torch.cuda.Stream) or
                                            (stream is None and _cuda_active())):
            self.cuda_event.wait(stream)

    def query(self) -> bool:
        return self.cuda_event.query() if self.cuda_event is not None else True

    def synchronize(self) -> None:
        if self.cuda_event is not None:
            self.cuda_event.synchronize()


_lock = threading.Lock()
_events: dict[str, TaggedEvent] = {}


def _check_tag(name: str, tag: Any) -> None:
    if not isinstance(tag, str):
        raise TypeError(f"{name}: the tag must be a str naming the event or stream, got "
                        f"{type(tag).__name__} {tag!r}")
    if not tag:
        raise ValueError(f"{name}: the tag must be a non-empty str")


def _event_for(tag: str, what: str) -> TaggedEvent:
    event = _events.get(tag)
    if event is None:
        raise AssertionError(f"tagged event is None while tag is {tag}, tagged event {what} "
                             f"failed; create the event with "
                             f"torchair.ops.npu_create_tagged_event({tag!r}) first")
    return event


# ------------------------------------------------------------------------------ ops

def _create_kernel(tag: str) -> None:
    with _lock:
        if tag in _events:
            raise ValueError(f"tagged event tag {tag} is already in use")
        _events[tag] = TaggedEvent(tag)
    logger.debug("created tagged event with tag %r", tag)


def _record_kernel(tag: str) -> None:
    _event_for(tag, "record").record()
    logger.debug("tagged event record, tag %r", tag)


def _wait_kernel(tag: str) -> None:
    _event_for(tag, "wait").wait()
    logger.debug("tagged event wait, tag %r", tag)


def _tagged_stream(tag: str, device: torch.device) -> Any:
    """The CUDA stream named ``tag`` on ``device`` (``"default"``: the current stream)."""
    if tag == DEFAULT_STREAM_TAG:
        return torch.cuda.current_stream(device)
    return CudaStreams(device).stream(tag, 0)


def _record_stream_kernel(input: torch.Tensor, tagged_stream: str) -> None:
    if input.is_cuda:
        input.record_stream(_tagged_stream(tagged_stream, input.device))
    # host memory is not stream-ordered: on the CPU there is nothing to keep alive


def _nothing(*args: Any) -> None:
    return None


def _record_op_kernel(*, device: torch.device | None = None) -> torch.Tensor:
    return torch.empty(0, device=device)


_create = define_op("npu_create_tagged_event(str tag) -> ()", fake=_nothing,
                    kernel=_create_kernel)
_record_event = define_op("npu_tagged_event_record(str tag) -> ()", fake=_nothing,
                          kernel=_record_kernel)
_wait_event = define_op("npu_tagged_event_wait(str tag) -> ()", fake=_nothing,
                        kernel=_wait_kernel)
_record_stream = define_op("npu_record_tagged_stream(Tensor input, str tagged_stream) -> ()",
                           fake=_nothing, kernel=_record_stream_kernel)
_record = define_op("record(*, Device? device=None) -> Tensor", fake=_record_op_kernel,
                    kernel=_record_op_kernel)
_wait = define_op("wait(Tensor[] tensors) -> ()", fake=_nothing, kernel=_nothing)

for _op in (_create, _record_event, _wait_event, _record_stream, _wait):
    torch.fx.node.has_side_effect(_op)
    torch.fx.node.has_side_effect(_op.default)


# ------------------------------------------------------------------------------ public API

def npu_create_tagged_event(tag: str) -> TaggedEvent:
    """Create the event named ``tag`` and return it. Tags are unique: a tag in use is a
    ``ValueError``. Create events outside compiled code (e.g. at module level)."""
    _check_tag("npu_create_tagged_event", tag)
    if torch.compiler.is_compiling():
        raise RuntimeError("npu_create_tagged_event cannot run inside a compiled function (the "
                           "graph would create the event again on every call); create the event "
                           "once outside it, e.g. at module level, and use it inside")
    _create(tag)
    return _events[tag]


def _tag_of(event: Any) -> str:
    tag = getattr(event, "tag", None) if isinstance(event, TaggedEvent) else None
    if tag is None or _events.get(tag) is not event:
        raise ValueError(f"tagged event {event} is not in use; create events with "
                         f"torchair.ops.npu_create_tagged_event(tag)")
    return tag


def npu_tagged_event_record(event: TaggedEvent) -> None:
    """Record ``event`` on the current stream (in a compiled graph: where this call is)."""
    _record_event(_tag_of(event))


def npu_tagged_event_wait(event: TaggedEvent) -> None:
    """Make the current stream wait until ``event``'s last record completed."""
    _wait_event(_tag_of(event))


def npu_record_tagged_stream(input: torch.Tensor, tagged_stream: str) -> None:
    """Mark ``input`` as used by the stream named ``tagged_stream`` (``"default"``: the main
    stream), so its memory is not reused before that stream's work on it is done."""
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"npu_record_tagged_stream: input must be a torch.Tensor, got "
                        f"{type(input).__name__}")
    _check_tag("npu_record_tagged_stream", tagged_stream)
    _record_stream(input, tagged_stream)


def record() -> torch.Tensor:
    """An empty tensor marking this point of the current stream's work; pass it to
    :func:`wait` (e.g. record inside ``npu_stream_switch("1")``, wait after the block)."""
    return _record()


def wait(tensors: list[torch.Tensor]) -> None:
    """Make the current stream wait for the work that produced ``tensors``."""
    if tensors is None or (isinstance(tensors, (list, tuple)) and len(tensors) == 0):
        raise ValueError("torchair.ops.wait() requires at least one tensor input")
    if not isinstance(tensors, (list, tuple)) or \
            not all(isinstance(t, torch.Tensor) for t in tensors):
        raise ValueError("arguments of torchair.ops.wait() must be torch.Tensor")
    _wait(list(tensors))
