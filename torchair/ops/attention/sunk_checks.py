"""Eager's host-list checks for attention calls whose lengths a static unit sank.

Eager validates ``actual_seq_lengths`` given as a Python list further than as a tensor: with a
paged cache the block table must be wide enough and the cache must have enough blocks for the
lengths (IFA, FIA), and FIA's query lengths must lie in ``[0, S_q]``. Path 4 sinks such lists
into the unit's int64 buffer and calls the op's tensor twin, which cannot know that its tensor
was a list. Calls bound to a C++ launch kernel check them there (``host_lengths``); for the
calls left to the twin (CUDA units, no C++ compiler, ``TORCHAIR_NATIVE_KERNELS=0``, arguments
the kernels do not take) :func:`host_list_checks` gives the same checks as functions of the
buffer's host values, run by :class:`torchair.runtime.staging.SunkScalars` before each launch,
with eager's texts (IFA's, FIA's or FIA v2's words) and in eager's order within the call. What
the twin reports itself with eager's text (a count of neither B nor 1, negative KV lengths) is
left to it, so that it is raised at the call, in the program's order; the checks here raise
before the launch, so when another call of the same unit fails too, the order between the two
may differ from eager's.

A unit that captures its launch (a CUDA graph, or its CPU emulation) asks for ``captured``
checks: those also check the sunk KV lengths for negative values with eager's text, and
:func:`host_checked_slots` names the buffer slots they cover. The unit captures with those
slots :func:`~torchair.ops._device_checks.host_checked`, so the twin captures no device flag
for them and the replay is not followed by a device-to-host read of one (a stream sync).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
import torch.fx as fx

from torchair.base.sink_meta import sunk_slots
from torchair.ops.attention import (
    fia_checks as _fia_checks,
    fused_infer_attention_score_v2 as _v2,
    ifa_checks as _ifa_checks,
)

__all__ = ["host_checked_slots", "host_list_checks"]

Check = Callable[[list], None]


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _paged(args: tuple, kw: dict) -> tuple[int, int, int] | None:
    """``(table width, cache blocks, block_size)`` of a paged call, None for a dense one."""
    table, key = _val(kw.get("block_table")), _val(args[1]) if len(args) > 1 else None
    if not isinstance(table, torch.Tensor) or not isinstance(key, torch.Tensor):
        return None
    return int(table.shape[1]), int(key.shape[0]), int(kw.get("block_size", 0))


def _call_check(kv_slots: tuple[int, int] | None, q_slots: tuple[int, int] | None, batch: int,
                q_len: int, paged: tuple[int, int, int] | None, kv_wording: Callable[[], Any],
                q_wording: Callable[[], Any], negatives: bool) -> Check:
    """One call's checks. What the twin itself reports with eager's text (a count of neither B
    nor 1, negative KV lengths) is left to it, so that it is raised where the call runs, in the
    program's order; only the checks of host lists alone run here, before the launch. With
    ``negatives`` (a captured unit) negative KV lengths are checked here too, first, as eager
    checks a host list (``host_lengths``)."""
    def check(values: list) -> None:
        if kv_slots is not None:
            lengths = values[kv_slots[0]:kv_slots[1]]
            if len(lengths) not in (batch, 1):
                return  # the twin's own error, at the call
            if min(lengths, default=0) < 0:
                if not negatives:
                    return
                with kv_wording():
                    _ifa_checks.host_lengths(lengths, batch)
            if paged is not None:
                with kv_wording():
                    _ifa_checks.check_paged_lengths(
                        lengths * batch if len(lengths) == 1 else lengths, *paged)
        if q_slots is not None:
            lengths = values[q_slots[0]:q_slots[1]]
            if len(lengths) not in (batch, 1):
                return
            with q_wording():
                _fia_checks.check_host_q_lengths(lengths, q_len)
    return check


def _dims(node: fx.Node, layout: str) -> tuple[int, int] | None:
    """``(B, S_q)`` of the call's query."""
    query = _val(node.args[0]) if node.args else None
    if not isinstance(query, torch.Tensor) or query.dim() not in (3, 4):
        return None
    s_dim = 2 if layout.startswith("BNSD") or layout == "NSD" else 1
    if layout == "NSD":
        return 1, int(query.shape[1])
    return int(query.shape[0]), int(query.shape[s_dim])


def _twin_calls(gm: fx.GraphModule) -> Iterator[tuple[fx.Node, dict, int, int]]:
    """``(node, kwargs in v1's names, B, S_q)`` of every IFA / FIA / FIA v2 tensor-twin call of
    ``gm`` whose query shape is known."""
    twins = _twins()
    fia_v2 = twins[2]
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in twins:
            continue
        kw = dict(node.kwargs)
        if node.target is fia_v2:
            kw = {_v2.TO_V1.get(k, k): v for k, v in kw.items()}
            layout = kw.get("input_layout", "BSH")
            kw["input_layout"] = _v2.LAYOUTS.get(layout, (layout,))[0]
        layout = kw.get("input_layout", "BSH")
        dims = _dims(node, layout) if isinstance(layout, str) else None
        if dims is not None:
            yield node, kw, dims[0], dims[1]


def _twins() -> tuple:
    npu = torch.ops.npu
    return (npu.npu_incre_flash_attention_tensor.default,
            npu.npu_fused_infer_attention_score_tensor.default,
            npu.npu_fused_infer_attention_score_v2_tensor.default)


def _slots(node: fx.Node, kw: dict) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """The sunk buffer slots of the call's KV lengths and (FIA) query lengths."""
    ifa = node.target is _twins()[0]
    kv_slots = sunk_slots(kw.get("actual_seq_lengths" if ifa else "actual_seq_lengths_kv"))
    q_slots = None if ifa else sunk_slots(kw.get("actual_seq_lengths"))
    return kv_slots, q_slots


def host_list_checks(gm: fx.GraphModule, captured: bool = False) -> list[tuple[str, Check]]:
    """``(node name, check)`` for every IFA / FIA / FIA v2 tensor-twin call of ``gm`` whose
    lengths were host lists (module doc); ``check(values)`` takes the sunk buffer's host values
    and raises eager's ValueError. ``captured``: the checks of a unit that captures its launch
    (module doc), which also check negative KV lengths."""
    ifa, fia, _ = _twins()
    checks: list[tuple[str, Check]] = []
    for node, kw, batch, q_len in _twin_calls(gm):
        paged = _paged(node.args, kw)
        if node.target is ifa:
            wording: Callable[[], Any] = contextlib.nullcontext
        elif node.target is fia:
            wording = lambda: _fia_checks.ifa_errors_as_fia(kv_lengths=True)  # noqa: E731
        else:
            def wording():  # v1's checks under FIA's words, then v2's
                stack = contextlib.ExitStack()
                stack.enter_context(_v2.v2_wording())
                stack.enter_context(_fia_checks.ifa_errors_as_fia(kv_lengths=True))
                return stack
        kv_slots, q_slots = _slots(node, kw)
        if (kv_slots is not None and (paged is not None or captured)) or q_slots is not None:
            q_wording = contextlib.nullcontext if node.target is fia else _v2.v2_wording
            checks.append((node.name, _call_check(kv_slots, q_slots, batch, q_len, paged,
                                                  wording, q_wording, captured)))
    return checks


def host_checked_slots(gm: fx.GraphModule) -> frozenset[tuple[int, int]]:
    """The sunk buffer slots whose values ``host_list_checks(gm, captured=True)`` checks for
    negative values (KV lengths, and FIA's query lengths, checked to lie in ``[0, S_q]``)."""
    found: set[tuple[int, int]] = set()
    for node, kw, _, _ in _twin_calls(gm):
        found.update(s for s in _slots(node, kw) if s is not None)
    return frozenset(found)
