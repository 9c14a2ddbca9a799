"""What a compile produced, for callers that persist it (``cache_compile``).

Inside ``with recording() as records:`` every graph the pipeline compiles appends a
:class:`GraphRecord`: the final graph and the arguments of its launch unit, AOT's metadata, and the
outputs of the unit's first call. Outside a ``recording`` block nothing is recorded.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any, Iterator

import torch.fx as fx

_records: contextvars.ContextVar[list | None] = contextvars.ContextVar("torchair_records",
                                                                      default=None)


@dataclasses.dataclass
class GraphRecord:
    kind: str  # "static" | "host" | "gears"
    gm: fx.GraphModule
    report: Any
    unit: dict[str, Any]  # the launch unit's constructor arguments
    fw_metadata: Any = None
    outputs: list | None = None  # the first call's outputs (the objects returned to AOT)
    launch_unit: Any = None  # the unit built from ``unit`` (a static unit's files, once built)


@contextlib.contextmanager
def recording() -> Iterator[list[GraphRecord]]:
    records: list[GraphRecord] = []
    token = _records.set(records)
    try:
        yield records
    finally:
        _records.reset(token)


def record(kind: str, gm: fx.GraphModule, report: Any, **unit: Any) -> GraphRecord | None:
    records = _records.get()
    if records is None:
        return None
    import torch

    context = torch._guards.TracingContext.try_get()
    entry = GraphRecord(kind, gm, report, unit, getattr(context, "fw_metadata", None))
    records.append(entry)
    return entry


def last() -> GraphRecord | None:
    records = _records.get()
    return records[-1] if records else None
