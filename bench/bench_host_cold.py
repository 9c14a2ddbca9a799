"""The host work of a ``cache_compile`` decode step, with the caches the step's weights evicted.

``bench_call_cost`` times a cached call warm: every cache holds the check's objects and code.
``bench_cached_call`` times the check inside a decode loop, next to the launch unit's ~300 us,
whose own spread (tens of us) hides changes of a few. This bench isolates the host work: the
bench decoder (:mod:`bench.model`) through ``cache_compile`` (``torchair-cache``), its launch unit
replaced by a stub that returns the last real output, each part timed right after the weight
GEMVs (the floor's ``GemvFloor``: 23 MiB streamed through the caches, as the step does) -- *cold*
-- and back to back -- *warm*. The parts:

- ``empty``: a call that does nothing (the timer's own cost);
- ``frame``: building the frame the guards read (``Frame``);
- ``program``: the generated per-call check alone, on a built frame;
- ``check``: ``Runtime.check`` on a built frame (the program, the number inputs' tensors, the
  gear marks);
- ``call``: the whole cached call (``CachedFunction.__call__``) with the stub unit, on its
  layered path (``Runtime.disable_fast``: the served call's one generated function binds the
  real unit or its fused call, which the stub cannot replace; ``bench_cached_call`` times that one).

Cold parts run in balanced orders (``balanced_orders``): the first part after the sweep pays
more than the later ones in a round, whatever it is. Medians over rounds; the heap frozen and the
garbage collector off while timing. The unit is put back afterwards.

    python -m bench.bench_host_cold                    # batch 1, 400 rounds
    python -m bench.bench_host_cold --batch 8
    python -m bench.bench_host_cold --quick --engine fx
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import torch

from bench import _harness as H
from bench._decode_variants import make_variant
from bench.model import make_schedule
from torchair.demo.roofline import GemvFloor, balanced_orders

PARTS = ("empty", "frame", "program", "check", "call")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rounds", type=int, default=400, help="cold rounds (each part once each)")
    p.add_argument("--warm-calls", type=int, default=2000, help="back-to-back calls per part")
    H.add_unit_bench_options(p, "host_cold")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.warm_calls = min(args.rounds, 10), min(args.warm_calls, 50)
    if args.batch < 1 or args.rounds < 1 or args.warm_calls < 1:
        p.error("--batch, --rounds and --warm-calls must be >= 1")
    return args


class _StubUnit:
    """Stands in for a runtime's launch unit: the last real output, nothing run."""

    def __init__(self, real: Any, outputs: Any) -> None:
        self.layout = getattr(real, "layout", None)  # what Runtime reads of a unit
        self.kept = getattr(real, "kept", ())
        self.outputs = outputs

    def __call__(self, flat: list) -> Any:
        return self.outputs


def _parts(cached: Any, args: tuple) -> dict[str, Callable[[], Any]]:
    runtime, frame = cached.runtime, cached.frame
    program, built = runtime.guards.program, frame(args, {})
    if program is None:
        raise SystemExit("the per-call check is not generated here "
                         "($TORCHAIR_GUARD_CODEGEN=0?); nothing to time")
    return {"empty": lambda: None,
            "frame": lambda: frame(args, {}),
            "program": lambda: program(built, frame.globals),
            "check": lambda: runtime.check(built, frame.globals),
            "call": lambda: cached(*args)}


def time_parts(parts: dict[str, Callable[[], Any]], sweep: Callable[[], Any], rounds: int,
               warm_calls: int) -> tuple[dict[str, float], dict[str, float]]:
    """(cold, warm) median us per part: cold right after ``sweep``, in balanced orders; warm
    back to back."""
    names = list(parts)
    orders = balanced_orders(len(names))
    cold: dict[str, list[int]] = {n: [] for n in names}
    clock = time.perf_counter_ns
    with H.frozen_heap(collector_off=True):
        for r in range(rounds):
            for i in orders[r % len(orders)]:
                fn = parts[names[i]]
                sweep()
                start = clock()
                fn()
                cold[names[i]].append(clock() - start)
        warm: dict[str, list[int]] = {n: [] for n in names}
        for n in names:
            fn = parts[n]
            for _ in range(warm_calls):
                start = clock()
                fn()
                warm[n].append(clock() - start)
    return ({n: statistics.median(v) / 1e3 for n, v in cold.items()},
            {n: statistics.median(v) / 1e3 for n, v in warm.items()})


def measure(cached: Any, call_args: tuple, sweep: Callable[[], Any], rounds: int,
            warm_calls: int) -> tuple[dict[str, float], dict[str, float]]:
    """:func:`time_parts` of the warm ``cache_compile`` function ``cached`` on ``call_args``,
    its runtime's launch unit stubbed out meanwhile (put back afterwards)."""
    runtime = cached.runtime
    if runtime is None:
        raise SystemExit("cache_compile did not serve the step from its entry; see the log")
    real = runtime.unit
    outputs = real(runtime.check(cached.frame(call_args, {}), cached.frame.globals)[1])
    runtime.disable_fast()  # the layered call: the stub below replaces its unit
    runtime.unit = _StubUnit(real, outputs)
    try:
        return time_parts(_parts(cached, call_args), sweep, rounds, warm_calls)
    finally:
        runtime.unit = real


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start, info, (cfg, model, init) = H.open_unit_bench(args)
    schedule = make_schedule(cfg, args.batch, 6, "cpu", torch.float32, 0)
    with torch.no_grad():
        variant = make_variant("torchair-cache", model, init, init,
                               run_eagerly=args.engine == "fx")
        for step in schedule[:5]:  # compile, the first served calls, the per-call check
            variant(step)
        cached, step = variant.compiled, schedule[5]
        call_args = (step.x, step.pos, step.lens, variant.k_caches, variant.v_caches)
        cold, warm = measure(cached, call_args, GemvFloor.of_module(model, args.batch),
                             args.rounds, args.warm_calls)
    rows = [[n, round(cold[n], 2), round(warm[n], 2), round(cold[n] / warm[n], 1)]
            for n in PARTS]
    print(f"batch {args.batch}, {cfg.layers} layers, hidden {cfg.hidden}; cold: right after "
          f"the weight GEMVs, {args.rounds} rounds in balanced orders; warm: "
          f"{args.warm_calls} calls back to back; medians")
    print(H.format_table(["part", "cold us", "warm us", "cold / warm"], rows))
    H.save_unit_bench("host_cold", args, info, cfg, start,
                      {"rounds": args.rounds, "warm_calls": args.warm_calls},
                      {"cold_us": cold, "warm_us": warm})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
