"""Input staging for launch units that run on fixed buffers (a CUDA graph replays on addresses).

Device-independent on purpose: the same code stages inputs for a CUDA graph and for the CPU
emulation of one (``capture="emulate"``), so CPU tests cover it.

Policy per tensor input:
- *borrowed* (parameters, inputs mutated in place such as a KV cache): the first call's tensor
  itself is the static buffer, so the usual case (the same cache every step) copies nothing. A call
  with another tensor has it copied in (the borrowed contents saved), copied back out after the
  launch when it was mutated, and the borrowed tensor restored: the other caller's tensor is never
  changed. Launch units avoid that slow path by capturing once per set of borrowed addresses.
- *owned* (everything else): a static buffer of the same shape and strides, copied into on every
  call unless the caller already passes that very buffer.
- *adopted* (``adopt``: owned inputs the unit names, those on its device): the first call's
  tensor itself is the static buffer, read and never written, so a caller that passes its
  inputs in the same device buffers every step (a serving loop's persistent input buffers) has
  nothing copied. An input that views a tensor written in place is never adopted. A call whose
  tensor is elsewhere cannot be served by this stager (:meth:`InputStager.adopted_match` is
  False): the unit then uses a stager with owned buffers for those inputs.
"""
from __future__ import annotations

import array
import ctypes
import math
import operator
import struct
from typing import Any, Callable, Sequence

import torch


class SunkScalars:
    """The int64 buffer the sunk value-dependent scalars are copied into before each launch."""

    def __init__(self, program, device: torch.device) -> None:
        self.program = program
        with torch.inference_mode(False):  # written in place later, in any mode
            self.buffer = torch.zeros(len(program), dtype=torch.int64, device=device)
        self._cuda = self.buffer.device.type == "cuda"
        self._host_view = _host_view(self.buffer)
        # a device buffer's values go through one host tensor of the program's length, written
        # in place and copied with one cudaMemcpyAsync per launch. It is pageable on purpose:
        # the driver stages a pageable source before the call returns, so the next call may
        # rewrite it at once, while a pinned one is read when the copy runs on the device (a
        # persistent pinned buffer would need an event per call; a new one per call, as
        # before, cost a pinned allocation and an event). Measured on an H200 (bench README,
        # issue 36's tenth session): a ring of 8 pinned buffers with an event each made the
        # served step's host time 20 us longer than this
        self._staging: torch.Tensor | None = None
        self._staging_view: memoryview | None = None
        if self._cuda and len(program):
            self._staging = torch.zeros(len(program), dtype=torch.int64)
            self._staging_view = _host_view(self._staging)
        # eager's checks of lengths that were host lists, on the host values, for the calls
        # that do not check them themselves (torchair.ops.attention.sunk_checks)
        self.checks: list = []
        # a CPU buffer of a program that only copies arguments (the lengths themselves): one
        # C-level gather and one pack into the buffer's bytes per call, no list of values
        self._pack: Any = None
        copied = program.copied_inputs()
        if self._host_view is not None and copied:
            self._pack = struct.Struct(f"={len(copied)}q").pack_into
            self._bytes = self._host_view.cast("B")
            self._gather = (operator.itemgetter(*copied) if len(copied) > 1 else
                            (lambda args, p=copied[0]: (args[p],)))

    def stage(self, args: Sequence[Any]) -> torch.Tensor:
        if self._pack is not None and not self.checks:
            try:
                self._pack(self._bytes, 0, *self._gather(args))
                return self.buffer
            except (struct.error, TypeError):  # not an int, or out of int64's range: the
                pass  # general path converts it as before, or says why
        values = self.program(args)
        for check in self.checks:
            check(values)
        if self._staging is not None:
            self._staging_view[:] = array.array("q", values)  # type: ignore[index]
            # non_blocking from pageable memory: staged by the driver before this returns, no
            # wait for the device (see __init__)
            self.buffer.copy_(self._staging, non_blocking=True)
        elif self._cuda:  # an empty program: nothing to copy
            return self.buffer
        elif self._host_view is not None:
            # in place through the buffer's memory: no tensor op on the hot path
            self._host_view[:] = array.array("q", values)
        else:
            self.buffer.copy_(torch.tensor(values, dtype=torch.int64))
        return self.buffer


class DeviceScalars:
    """The 0-d CPU tensors of a unit whose launch runs on a device (the numbers Dynamo passes to
    a graph as tensors: a norm's ``eps``). Each position gets a 0-d tensor on the device, which
    the unit reads instead; it is written (one small copy, in stream order) only when the call
    passes another CPU tensor than the last one copied, or the same one written since. A cached
    module's numbers are the same tensors call after call, so a step copies nothing."""

    def __init__(self, args: Sequence[Any], positions: Sequence[int],
                 device: torch.device) -> None:
        self.positions = tuple(positions)
        with torch.inference_mode(False):  # written in place later, in any mode
            self.tensors = [torch.empty((), dtype=args[i].dtype, device=device)
                            for i in positions]
        # per position: (the CPU tensor last copied, its version), or for an inference tensor
        # (no version counter) (None, its value)
        self.last: list[tuple[Any, Any] | None] = [None] * len(self.positions)
        self.copies = 0  # (diagnostics and tests)

    def stage(self, args: list) -> None:
        """Put each position's device tensor in ``args``, written first when it must be."""
        for k, i in enumerate(self.positions):
            arg, last = args[i], self.last[k]
            if last is None or last[0] is not arg or last[1] != arg._version:
                if not isinstance(arg, torch.Tensor) or arg.dim() != 0:
                    raise RuntimeError(f"static launch unit: input {i} was a 0-d tensor when "
                                       f"the unit was built, got {type(arg).__name__} "
                                       f"{list(getattr(arg, 'shape', []))}")
                if arg.is_inference():  # compared by value (a CPU read, no device sync)
                    value = arg.item()
                    if (last is None or last[0] is not None or type(last[1]) is not type(value)
                            or last[1] != value or _sign(last[1]) != _sign(value)):
                        self.tensors[k].copy_(arg, non_blocking=True)
                        self.last[k] = (None, value)
                        self.copies += 1
                else:
                    # from pageable memory: staged by the driver before copy_ returns
                    self.tensors[k].copy_(arg, non_blocking=True)
                    self.last[k] = (arg, arg._version)
                    self.copies += 1
            args[i] = self.tensors[k]

    @staticmethod
    def positions_of(args: Sequence[Any], device: torch.device,
                     mutated: set[int] = frozenset()) -> list[int]:
        """The 0-d CPU tensors of ``args`` when the unit runs on another device, but those the
        unit writes in place (their write must reach the caller's tensor)."""
        if device.type == "cpu":
            return []
        return [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)
                and a.device.type == "cpu" and a.dim() == 0 and i not in mutated]


def _sign(value: Any) -> float:
    """The sign of a float, -0.0 included (0.0 == -0.0, but they divide differently)."""
    return math.copysign(1.0, value) if isinstance(value, float) else 1.0


def picker(positions: Sequence[int]) -> Callable[[Sequence[Any]], tuple]:
    """``args -> tuple(args[i] for i in positions)`` in one C call (itemgetter)."""
    if len(positions) > 1:
        return operator.itemgetter(*positions)
    if positions:
        only = positions[0]
        return lambda args: (args[only],)
    return lambda args: ()


def _host_view(buffer: torch.Tensor) -> memoryview | None:
    """An int64 memoryview of a contiguous CPU buffer's memory (the buffer, kept by its owner,
    outlives it), or None (another device or layout)."""
    if buffer.device.type != "cpu" or not buffer.is_contiguous() or buffer.numel() == 0:
        return None
    words = (ctypes.c_int64 * buffer.numel()).from_address(buffer.data_ptr())
    view = memoryview(words).cast("B").cast("q")
    return view if array.array("q").itemsize == 8 else None


class InputStager:
    """Keeps one static buffer per graph input and copies each call's inputs into it."""

    def __init__(self, example: Sequence[Any], *, borrowed: set[int], mutated: set[int],
                 names: Sequence[str], adopt: set[int] = frozenset()) -> None:
        self.names = list(names)
        self.mutated = set(mutated)
        self.borrowed = set(borrowed) | self.mutated
        self.static: list[Any] = []
        self.compact: dict[int, tuple[torch.Tensor, list[int]]] = {}  # broadcast (stride 0) inputs
        self.adopted: list[int] = []  # owned inputs whose caller's tensor is the buffer
        written = {example[i].untyped_storage().data_ptr() for i in self.mutated
                   if isinstance(example[i], torch.Tensor)}
        for i, value in enumerate(example):
            if not isinstance(value, torch.Tensor) or i in borrowed or i in self.mutated:
                self.static.append(value)
                continue
            if i in adopt and value.untyped_storage().data_ptr() not in written:
                self.adopted.append(i)  # (a view of an input written in place keeps a copy)
                self.static.append(value)
                continue
            size = [1 if st == 0 else sz for sz, st in zip(value.size(), value.stride())]
            with torch.inference_mode(False):  # copied into in any mode later
                base = torch.empty_strided(size, value.stride(), dtype=value.dtype,
                                           device=value.device)
            if size != list(value.size()):  # copy only the distinct elements of an expand
                self.compact[i] = (base, size)
            self.static.append(base.as_strided(value.size(), value.stride()))
            self._copy_in(i, value)
        self.copies = 0  # tensors copied in since creation (diagnostics and tests)
        # where each adopted input was when the capture read it
        self.adopted_at = [(i, self.static[i].data_ptr(), self.static[i].stride())
                            for i in self.adopted]
        # the usual call passes every static buffer itself (parameters, caches, adopted inputs):
        # one C-level identity test over them (stage)
        tensors = [i for i, buf in enumerate(self.static) if isinstance(buf, torch.Tensor)]
        self._statics = tuple(self.static[i] for i in tensors)
        self._pick = picker(tensors)

    def adopted_match(self, args: Sequence[Any]) -> bool:
        """Whether every adopted input of ``args`` is at the adopted memory, with its strides.
        Compared with the address the capture read, also for the very tensor adopted: its
        storage may have been swapped since (``set_``, ``.data =``)."""
        for i, ptr, stride in self.adopted_at:  # (a loop, not all(): served once a call)
            arg = args[i]
            if arg.data_ptr() != ptr or arg.stride() != stride:
                return False
        return True

    def still_adopted(self, args: Sequence[Any]) -> list[int]:
        """The adopted inputs of ``args`` that are where the capture read them (as
        :meth:`adopted_match` tests each)."""
        return [i for i, ptr, stride in self.adopted_at
                if args[i].data_ptr() == ptr and args[i].stride() == stride]

    def stage(self, args: Sequence[Any]) -> list[tuple[int, torch.Tensor | None]]:
        """Copy ``args`` into the static buffers. Returns what :meth:`finish` must undo: for a
        borrowed buffer (another caller's tensor) its saved contents."""
        if all(map(operator.is_, self._pick(args), self._statics)):
            return []
        pending = []
        for i, (arg, buf) in enumerate(zip(args, self.static)):
            if not isinstance(buf, torch.Tensor) or arg is buf:
                continue
            if arg.data_ptr() == buf.data_ptr() and arg.stride() == buf.stride():
                continue
            self._check(i, arg, buf)
            if i in self.adopted:  # the caller's first tensor is never written
                raise RuntimeError(f"static launch unit: input {i} (`{self.names[i]}`) is not "
                                   f"at its adopted buffer's address; stage it with owned "
                                   f"buffers (adopted_match)")
            saved = buf.clone() if i in self.borrowed else None
            self._copy_in(i, arg)
            self.copies += 1
            if saved is not None or i in self.mutated:
                pending.append((i, saved))
        return pending

    def finish(self, args: Sequence[Any], pending: list[tuple[int, torch.Tensor | None]]) -> None:
        """After the launch: hand in-place updates back to the caller's tensors and give borrowed
        buffers their own contents back."""
        for i, saved in pending:
            if i in self.mutated:
                args[i].copy_(self.static[i])
            if saved is not None:
                self.static[i].copy_(saved)

    def _copy_in(self, i: int, arg: torch.Tensor) -> None:
        if i in self.compact:
            base, size = self.compact[i]
            base.copy_(arg.as_strided(size, arg.stride(), arg.storage_offset()))
        else:
            self.static[i].copy_(arg)

    def _check(self, i: int, arg: torch.Tensor, buf: torch.Tensor) -> None:
        if arg.shape != buf.shape or arg.dtype != buf.dtype or arg.device != buf.device:
            raise RuntimeError(
                f"static launch unit: input {i} (`{self.names[i]}`) is {arg.dtype}"
                f"{list(arg.shape)} on {arg.device}, but the unit was built for {buf.dtype}"
                f"{list(buf.shape)} on {buf.device}; a static graph never runs other shapes")
        if i in self.compact and arg.stride() != buf.stride():
            raise RuntimeError(
                f"static launch unit: input {i} (`{self.names[i]}`) has strides "
                f"{list(arg.stride())}, but the unit was built for the broadcast strides "
                f"{list(buf.stride())}; pass it expanded the same way")
