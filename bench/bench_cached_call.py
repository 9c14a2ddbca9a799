"""Where a ``cache_compile`` decode step's host time goes inside a decode loop.

``bench_call_cost.py`` times a served call whose kernel touches a few bytes: every cache holds
the check's Python objects and code. In a decode step the weights stream through the caches
between two calls, so the check runs with them cold. This bench times the bench decoder
(:mod:`bench.model`) through ``cache_compile``: ``torchair-cache``, the served call as it ships
(one generated function of the call's arguments, ``Runtime.fast``), and ``layered``, a second
instance kept on the layered call (``Runtime.disable_fast``), split in three (the entry's guard
check, ``Runtime._check``: the generated per-call check; its launch unit, ``Runtime.unit``; the
rest: the frame, the number inputs' tensors, the gear-marks test and ``CachedFunction`` /
``Runtime.serve`` themselves), beside the same launch unit called with Dynamo's flat arguments
and nothing checked (``torchair-nodynamo``) and, optionally, ``eager``. The served call is
split too, where its unit has a fused call (Inductor): that call, timed inside the generated
function (made again around a timer), and the host work, the step less that call (the layered
call's host work is its check and rest; its unit part includes the unit's ``__call__``). The variants
run in interleaved rounds of ``--steps`` steps (``_harness.interleaved_rounds``, as
``bench_decode_step.py``); each number is a median over rounds at one position in the round:
position 0 runs right after another variant, the later ones after their own previous step,
which is the serving loop's state.

    python -m bench.bench_cached_call                  # batch 1, 60 rounds of 10 steps
    python -m bench.bench_cached_call --batch 8 --eager
    python -m bench.bench_cached_call --quick          # tiny model, a smoke test
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import torch

from bench import _harness as H
from bench._decode_variants import make_variant
from bench.model import make_schedule, max_calls
from torchair.inference import _cache_runtime

PARTS = ("check", "unit", "rest")
FAST_PARTS = ("unit", "host")  # the served call's parts: its unit's fused call, the rest


class _FusedTimer:
    """Times the static unit's fused call inside ``runtime``'s one generated function (made
    again around a timer, ``Runtime.rebuild_fast``), so the served call splits into that call and
    the host work around it; put back on exit. Nothing is timed where the unit has no fused call
    (the FX engine): then the runtime keeps its layered call."""

    def __init__(self, runtime: _cache_runtime.Runtime) -> None:
        self.runtime = runtime
        self.unit = runtime.unit
        self.real = getattr(self.unit, "_fast", None)
        self.last: dict[str, int] = {}

    def __enter__(self) -> _FusedTimer:
        real, last = self.real, self.last
        if real is not None:
            def timed(flat: list) -> Any:
                start = time.perf_counter_ns()
                try:
                    return real(flat)
                finally:
                    last["unit"] = time.perf_counter_ns() - start

            self.unit._fast = timed
            self.runtime.rebuild_fast()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.real is not None:
            self.unit._fast = self.real
            self.runtime.rebuild_fast()


class _Split:
    """Times the guard check (``Runtime._check``: the generated per-call check or the general
    one) and the launch unit (``Runtime.unit``) of every call of ``runtime`` while installed
    (instance attributes: ``Runtime.serve`` and the general path both call them)."""

    def __init__(self, runtime: _cache_runtime.Runtime) -> None:
        self.runtime = runtime
        self.last: dict[str, int] = {}
        self._saved = (runtime._check, runtime.unit)

    def __enter__(self) -> _Split:
        runtime, last = self.runtime, self.last

        def timed(name: str, fn: Callable) -> Callable:
            def wrapper(*args: Any) -> Any:
                start = time.perf_counter_ns()
                try:
                    return fn(*args)
                finally:
                    last[name] = time.perf_counter_ns() - start
            return wrapper

        runtime.disable_fast()  # the layered call, whose layers these wrappers time
        runtime._check, runtime.unit = timed("check", runtime._check), timed("unit", runtime.unit)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.runtime._check, self.runtime.unit = self._saved


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=10, help="steps per variant per round")
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--eager", action="store_true", help="run eager as a third variant")
    H.add_unit_bench_options(p, "cached_call")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.steps = min(args.rounds, 3), min(args.steps, 3)
    if args.batch < 1 or args.steps < 1 or args.rounds < 1:
        p.error("--batch, --steps and --rounds must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start, info, (cfg, model, init) = H.open_unit_bench(args)
    warm = 3  # compiling and first calls
    # as many windows of fresh lengths as the rounds need and the KV cache holds (max_calls)
    windows = max(1, min(args.rounds, (max_calls(cfg, args.batch) - warm) // args.steps))
    n_calls = warm + args.steps * windows
    schedule = make_schedule(cfg, args.batch, n_calls, "cpu", torch.float32, 0)
    names = (["eager"] if args.eager else []) + ["torchair-cache", "layered", "torchair-nodynamo"]
    with torch.no_grad():
        variants = {n: make_variant("torchair-cache" if n == "layered" else n, model, init, init,
                                    run_eagerly=args.engine == "fx") for n in names}
        for v in variants.values():
            for s in schedule[:warm]:
                v(s)
        served = variants["torchair-cache"]
        with _Split(variants["layered"].compiled.runtime) as split, \
                _FusedTimer(served.compiled.runtime) as fused:
            timed = split.last
            cache, recorded = variants["layered"], []  # (check, unit) ns per layered call
            fused_ns: list[int] = []  # the served call's fused unit call, ns per call
            served(schedule[warm - 1])  # one served call makes the function around the timer

            def cached(i: int) -> None:
                cache(schedule[i])
                recorded.append((timed["check"], timed["unit"]))

            def served_call(i: int) -> None:
                served(schedule[i])
                if "unit" in fused.last:
                    fused_ns.append(fused.last.pop("unit"))

            calls = {n: (cached if n == "layered" else served_call if n == "torchair-cache" else
                         lambda i, v=v: v(schedule[i])) for n, v in variants.items()}
            rounds = H.interleaved_rounds(
                calls, lambda r: range(warm + (r % windows) * args.steps,
                                       warm + (r % windows + 1) * args.steps),
                args.rounds, H.synchronizer("cpu"))
    # by position k in the round: each variant's step, and the cached step's parts
    positions = {n: [[rnd[k] * 1e6 for rnd in rows] for k in range(args.steps)]
                 for n, rows in rounds.items()}
    splits = iter(recorded)  # in the order the cached calls ran: round by round
    parts = {p: [[] for _ in range(args.steps)] for p in PARTS}
    for rnd in rounds["layered"]:
        for k, total in enumerate(rnd):
            check, unit = (t / 1e3 for t in next(splits))
            parts["check"][k].append(check)
            parts["unit"][k].append(unit)
            parts["rest"][k].append(total * 1e6 - check - unit)
    fast_parts: dict[str, list[list[float]]] = {}
    if fused_ns and len(fused_ns) == sum(len(rnd) for rnd in rounds["torchair-cache"]):
        units = iter(fused_ns)
        fast_parts = {p: [[] for _ in range(args.steps)] for p in FAST_PARTS}
        for rnd in rounds["torchair-cache"]:
            for k, total in enumerate(rnd):
                unit = next(units) / 1e3
                fast_parts["unit"][k].append(unit)
                fast_parts["host"][k].append(total * 1e6 - unit)

    def medians(rows: list[list[float]]) -> list[float]:
        return [statistics.median(row) for row in rows]

    table = {n: medians(rows) for n, rows in positions.items()}
    split_table = {p: medians(rows) for p, rows in parts.items()}
    fast_table = {p: medians(rows) for p, rows in fast_parts.items()}
    later = slice(1, None) if args.steps > 1 else slice(0, None)
    summary = {n: statistics.median(v[later]) for n, v in {**table, **split_table}.items()}
    summary.update({f"served {p}": statistics.median(v[later]) for p, v in fast_table.items()})
    head = ["us per step, by position in the round"] + [str(k) for k in range(args.steps)]
    rows = [[n] + [round(x) for x in v] for n, v in table.items()]
    rows += [[f"  torchair-cache: {p}"] + [round(x, 1) for x in v] for p, v in fast_table.items()]
    rows += [[f"  layered: {p}"] + [round(x, 1) for x in v] for p, v in split_table.items()]
    print(f"batch {args.batch}, {cfg.layers} layers, hidden {cfg.hidden}; {args.rounds} rounds x "
          f"{args.steps} steps per variant, balanced orders; medians over rounds")
    print(H.format_table(head, rows))
    print(f"\npositions 1+ (a step after its own): torchair-cache (one generated function) "
          f"{summary['torchair-cache']:.0f} us; layered {summary['layered']:.0f} us = check "
          f"{summary['check']:.1f} + unit {summary['unit']:.1f} + rest {summary['rest']:.1f}; "
          f"the unit alone (torchair-nodynamo) {summary['torchair-nodynamo']:.0f} us")
    if fast_table:
        print(f"host work per call (positions 1+): torchair-cache {summary['served host']:.1f} us "
              f"(the step less its unit's fused call), layered "
              f"{summary['check'] + summary['rest']:.1f} us (check + rest)")
    H.save_unit_bench("cached_call", args, info, cfg, start,
                      {"steps": args.steps, "rounds": args.rounds},
                      {"by_position_us": table, "cache_split_by_position_us": split_table,
                       "served_split_by_position_us": fast_table,
                       "later_positions_median_us": summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
