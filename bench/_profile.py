"""Per-op overhead table from ``torch.profiler``: calls per step, self CPU time per call and per
step, for a callable run a known number of steps under the profiler.

    prof = profile_steps(lambda i: step(inputs[i]), range(20), sync)
    rows = op_table(prof, n_steps=20)
    print(format_op_table(rows, top=15))

``self CPU`` is the profiler's self time: the time spent in an event minus the time of the events
it encloses. For ATen ops it is the op's own CPU work (dispatch, checks, the kernel on CPU); for
``record_function`` ranges (Dynamo's ``Torch-Compiled Region``, Inductor's
``## Call CompiledFxGraph ##``, torchair's launch ranges) it is the Python / C++ glue inside the
range that is not an op. On CUDA the kernels' GPU time is not in these numbers (``device_us``
per step is recorded separately when the profiler saw CUDA activity).
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import torch
from torch.profiler import ProfilerActivity, profile

__all__ = ["profile_steps", "op_table", "format_op_table", "op_table_markdown"]


def profile_steps(fn: Callable[[int], Any], steps: Iterable[int],
                  sync: Callable[[], None] = lambda: None) -> profile:
    """Run ``fn(step)`` for each step under ``torch.profiler`` (CPU, plus CUDA when available);
    returns the finished profiler."""
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        for step in steps:
            fn(step)
            sync()
    return prof


def op_table(prof: profile, n_steps: int, *, min_self_us_per_step: float = 0.0
             ) -> list[dict[str, Any]]:
    """One row per event name, sorted by self CPU time per step (largest first): ``name``,
    ``calls_per_step``, ``self_cpu_us_per_call``, ``self_cpu_us_per_step``,
    ``self_cpu_share`` (of the sum over all rows) and ``device_us_per_step`` (CUDA self time,
    0 on CPU). Rows below ``min_self_us_per_step`` are left out (the share still counts them)."""
    if n_steps <= 0:
        raise ValueError("n_steps must be positive")
    rows = []
    for evt in prof.key_averages():
        self_us = float(evt.self_cpu_time_total)
        device_us = float(getattr(evt, "self_device_time_total",
                                  getattr(evt, "self_cuda_time_total", 0.0)) or 0.0)
        rows.append({"name": evt.key, "calls_per_step": evt.count / n_steps,
                     "self_cpu_us_per_call": self_us / evt.count if evt.count else 0.0,
                     "self_cpu_us_per_step": self_us / n_steps,
                     "device_us_per_step": device_us / n_steps})
    total = sum(r["self_cpu_us_per_step"] for r in rows) or 1.0
    for r in rows:
        r["self_cpu_share"] = r["self_cpu_us_per_step"] / total
    rows.sort(key=lambda r: r["self_cpu_us_per_step"], reverse=True)
    return [r for r in rows if r["self_cpu_us_per_step"] >= min_self_us_per_step]


def _rows(rows: Sequence[dict[str, Any]], top: int | None) -> tuple[list[list[str]], str | None]:
    shown = list(rows[:top] if top else rows)
    cells = [[r["name"], f"{r['calls_per_step']:g}", f"{r['self_cpu_us_per_call']:.1f}",
              f"{r['self_cpu_us_per_step']:.1f}", f"{100 * r['self_cpu_share']:.1f}"]
             for r in shown]
    rest = rows[len(shown):]
    note = None
    if rest:
        note = (f"{len(rest)} more ops, {sum(r['self_cpu_us_per_step'] for r in rest):.1f} us "
                f"per step together")
    return cells, note


HEADERS = ["op", "calls/step", "self CPU us/call", "self CPU us/step", "% self CPU"]


def format_op_table(rows: Sequence[dict[str, Any]], top: int | None = 15) -> str:
    """A plain-text table of the ``top`` rows (all with None) and a line for the rest."""
    cells, note = _rows(rows, top)
    table = [HEADERS] + cells
    widths = [max(len(r[i]) for r in table) for i in range(len(HEADERS))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if note:
        lines.append(f"({note})")
    return "\n".join(lines)


def op_table_markdown(rows: Sequence[dict[str, Any]], top: int | None = 15) -> str:
    """The same table as markdown (op names in backticks)."""
    cells, note = _rows(rows, top)
    lines = ["| " + " | ".join(HEADERS) + " |", "| --- |" + " ---: |" * (len(HEADERS) - 1)]
    lines += [f"| `{c[0]}` | " + " | ".join(c[1:]) + " |" for c in cells]
    if note:
        lines.append(f"\n({note}.)")
    return "\n".join(lines)
