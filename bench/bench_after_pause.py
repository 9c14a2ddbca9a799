"""How a decode step's first steps slow down after other work: why the benches balance their order.

The side-by-side benches run variants in rounds, one after another, so what runs just before a
variant's first steps is another variant. This bench measures what that costs, on the bench
decoder (:mod:`bench.model`): before each round of ``--steps`` steps of a target (the weight GEMVs
alone, ``floor-gemv``; the launch unit called directly, ``torchair-nodynamo``; the same step
through ``cache_compile``, ``torchair-cache``), one *predecessor* runs, untimed:

- ``none``: nothing more (the round before was another target's: a step after a step);
- ``eager``: one step of the module called eagerly (~1-2 ms of ATen calls and allocations);
- ``busy``: ``--pause-ms`` of a Python busy-wait on the calling thread (no memory traffic);
- ``sleep``: ``time.sleep`` for ``--pause-ms`` (the process idle).

Reported per predecessor and target: the median step time at each position of the round, and the
first step's time over the last positions' (the steady state). Targets run in balanced orders
(``balanced_orders``) after one untimed round of every predecessor and target; the heap is
frozen once and the garbage collector off while timing.

    python -m bench.bench_after_pause                  # batch 1, 40 rounds of 12 steps
    python -m bench.bench_after_pause --quick --engine fx
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
from torchair.demo.roofline import GemvFloor, balanced_orders

PREDECESSORS = ("none", "eager", "busy", "sleep")
TARGETS = ("floor-gemv", "torchair-nodynamo", "torchair-cache")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=12, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=40, help="rounds per predecessor")
    p.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS),
                   help="the steps timed (default: all three)")
    p.add_argument("--pause-ms", type=float, default=1.8,
                   help="length of the busy and sleep predecessors (default: about eager's step)")
    H.add_unit_bench_options(p, "after_pause")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.steps = min(args.rounds, 3), min(args.steps, 3)
    if args.batch < 1 or args.steps < 1 or args.rounds < 1 or args.pause_ms < 0:
        p.error("--batch, --steps and --rounds must be >= 1 and --pause-ms >= 0")
    return args


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start, info, (cfg, model, init) = H.open_unit_bench(args)
    warm = 3
    windows = (max_calls(cfg, args.batch) - warm) // args.steps
    if windows < 1:
        raise SystemExit(f"--steps {args.steps} at --batch {args.batch} does not fit the model's "
                         f"{cfg.capacity} KV positions: lower --steps or --batch")
    schedule = make_schedule(cfg, args.batch, warm + args.steps * windows, "cpu", torch.float32, 0)
    pause = args.pause_ms / 1e3
    with torch.no_grad():
        built = ["eager"] + [t for t in args.targets if t != "floor-gemv"]
        steps = {n: make_variant(n, model, init, init, run_eagerly=args.engine == "fx")
                 for n in built}
        for v in steps.values():
            for s in schedule[:warm]:
                v(s)
        gemv = GemvFloor.of_module(model, args.batch)
        gemv()
        targets: dict[str, Callable[[int], Any]] = {
            t: (lambda i: gemv()) if t == "floor-gemv" else (lambda i, v=steps[t]: v(schedule[i]))
            for t in TARGETS if t in args.targets}
        names = list(targets)
        before: dict[str, Callable[[], Any]] = {
            "none": lambda: None, "eager": lambda: steps["eager"](schedule[warm]),
            "busy": lambda: _busy(pause), "sleep": lambda: time.sleep(pause)}
        orders = balanced_orders(len(names))
        times = {p: {t: [[] for _ in range(args.steps)] for t in names} for p in PREDECESSORS}
        with H.frozen_heap(collector_off=True):
            for r in range(-1, args.rounds):  # round -1: untimed, as the first round's predecessor
                window = range(warm + (r % windows) * args.steps,
                               warm + (r % windows + 1) * args.steps)
                for p in PREDECESSORS:
                    for k in orders[r % len(orders)]:
                        name = names[k]
                        before[p]()
                        timed = H.time_calls(targets[name], window, lambda: None)
                        for pos, t in enumerate(timed if r >= 0 else ()):
                            times[p][name][pos].append(t * 1e6)
    table = {p: {t: [statistics.median(x) for x in rows] for t, rows in by.items()}
             for p, by in times.items()}
    tail = max(1, args.steps // 3)  # the steady state: the last third of the round
    first_over_steady = {p: {t: v[0] / statistics.median(v[-tail:]) for t, v in by.items()}
                         for p, by in table.items()}
    head = ["predecessor / target, us by position"] + [str(k) for k in range(args.steps)]
    rows = [[f"{p} / {t}"] + [round(x) for x in v] for p, by in table.items() for t, v in by.items()]
    print(f"batch {args.batch}, {cfg.layers} layers, hidden {cfg.hidden}; {args.rounds} rounds of "
          f"{args.steps} steps per predecessor and target; medians over rounds")
    print(H.format_table(head, rows))
    print("\nfirst step / steady state (median of the last third of the round):")
    for p, by in first_over_steady.items():
        print(f"  after {p:6s}: " + ", ".join(f"{t} {x:.2f}x" for t, x in by.items()))
    H.save_unit_bench("after_pause", args, info, cfg, start,
                      {"steps": args.steps, "rounds": args.rounds, "targets": names,
                       "pause_ms": args.pause_ms},
                      {"by_position_us": table, "first_over_steady": first_over_steady})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
