"""What one served call costs around its kernel: a step whose body is one tiny fused kernel.

The module has 48 small parameters and 2 tensor inputs; its body, ``x + y + sum(params)``, is
one kernel after Inductor fuses it, so whatever a call costs beyond a kernel launch is host work:
argument checks, guards, the launch unit's call. Variants, timed side by side in interleaved
rounds (``_harness``), all under ``torch.no_grad()`` (how a server calls a step):

* ``eager``: the module's forward (49 ATen adds);
* ``torch.compile``: ``torch.compile(forward, backend=torchair, dynamic=False)`` (Dynamo's
  guards on every call, then the launch unit);
* ``cache_compile``: ``torchair.inference.cache_compile(forward, dynamic=False)`` after its
  first call in this (cold) process;
* ``cache_check``: that cached function's own check alone (the guards and input checks it runs
  before the launch unit);
* ``unit``: its launch unit alone, called with the inputs that check returned (the unit's own
  input check, then Inductor's compiled entry);
* ``floor``: one ATen add of two 4-element tensors (a dispatcher call: the least any kernel
  launch costs from Python).

A second interpreter (the warm process) then loads the cache entry the first one wrote and times
the cached call again beside ``eager`` and ``floor``. Prints the medians per call and saves them
(JSON, ``results/call_cost_<machine>.json`` or ``--out``); it asserts nothing.

    python -m bench.bench_call_cost [--rounds 15] [--steps 200] [--engine inductor|fx] [--quick]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import torch

import torchair
from bench import _harness

PARAMS = 48
SIZE = 4


class CallCost(torch.nn.Module):
    """48 parameters of 4 floats; ``forward(x, y) = x + y + sum(params)``."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.params = torch.nn.ParameterList(
            torch.nn.Parameter(torch.randn(SIZE, generator=g), requires_grad=False)
            for _ in range(PARAMS))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = x + y
        for p in self.params:
            out = out + p
        return out


def _config(engine: str) -> torchair.CompilerConfig:
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = engine == "fx"
    return config


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(SIZE, generator=g), torch.randn(SIZE, generator=g)


def _cached(model: CallCost, engine: str, cache_dir: str) -> Callable:
    return torchair.inference.cache_compile(model.forward, config=_config(engine), dynamic=False,
                                            cache_dir=cache_dir)


def _parts(cached: Any, args: tuple) -> dict[str, Callable[[int], Any]]:
    """The cached function's check alone and its launch unit alone, when the function exposes
    its runtime (it does once a call was served from the entry)."""
    runtime, frame = getattr(cached, "runtime", None), getattr(cached, "frame", None)
    if runtime is None or frame is None:
        return {}
    why, flat = runtime.check(frame(args, {}), frame.globals)
    if why:
        return {}
    unit = runtime.unit
    return {"cache_check": lambda _: runtime.check(frame(args, {}), frame.globals),
            "unit": lambda _: unit(list(flat))}


def _time(variants: dict, rounds: int, steps: int) -> dict[str, dict]:
    for fn in variants.values():  # warm up outside the timing
        for i in range(3):
            fn(i)
    res = _harness.interleaved_rounds(variants, lambda r: range(steps), rounds, lambda: None)
    return {name: _harness.summarize(t) for name, t in res.items()}


def _variants(model: CallCost, cached: Callable, args: tuple) -> dict[str, Callable[[int], Any]]:
    x, y = args
    out = {"eager": lambda _: model(x, y), "cache_compile": lambda _: cached(x, y),
           "floor": lambda _: torch.add(x, y)}
    out.update(_parts(cached, args))
    return out


def _child(args: argparse.Namespace) -> None:
    """The warm process: load the entry, time, print one JSON line."""
    torch.set_grad_enabled(False)
    model, inputs = CallCost(), _inputs()
    cached = _cached(model, args.engine, args.cache_dir)
    start = time.perf_counter()
    cached(*inputs)
    first = time.perf_counter() - start
    served = getattr(cached, "runtime", None) is not None  # False: Dynamo traced it again
    stats = _time(_variants(model, cached, inputs), args.rounds, args.steps)
    print(json.dumps({"first_call_s": first, "served_from_entry": served, "stats": stats}))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--engine", choices=["inductor", "fx"], default="inductor",
                   help="the launch units' engine (fx: debug.run_eagerly, no fused kernel)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--quick", action="store_true", help="3 rounds x 50 steps")
    p.add_argument("--out", default=None, help="JSON path (default results/call_cost_<machine>"
                                               ".json)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.steps = 3, 50
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        _child(args)
        return
    started = time.perf_counter()
    info = _harness.machine_info("cpu")
    _harness.print_machine(info)
    model, inputs = CallCost(), _inputs()
    with torch.no_grad(), tempfile.TemporaryDirectory(prefix="torchair-call-cost-") as cache_dir:
        cached = _cached(model, args.engine, cache_dir)
        compiled = torch.compile(model.forward, dynamic=False,
                                 backend=torchair.get_npu_backend(compiler_config=_config(args.engine)))
        first = {}
        for name, fn in (("cache_compile", cached), ("torch.compile", compiled)):
            start = time.perf_counter()
            fn(*inputs)
            first[name] = time.perf_counter() - start
        variants = _variants(model, cached, inputs)
        variants["torch.compile"] = lambda _: compiled(*inputs)
        cold = _time(variants, args.rounds, args.steps)
        child = [sys.executable, "-m", "bench.bench_call_cost", "--child", "--cache-dir", cache_dir,
                 "--engine", args.engine, "--rounds", str(args.rounds), "--steps", str(args.steps)]
        if args.threads:
            child += ["--threads", str(args.threads)]
        done = subprocess.run(child, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise SystemExit(f"the warm process failed:\n{done.stderr[-4000:]}")
        warm = json.loads(done.stdout.strip().splitlines()[-1])
        if not warm["served_from_entry"]:
            print(f"WARNING: the warm process did not load the cache entry:\n"
                  f"{done.stderr[-2000:]}")
    names = ["eager", "torch.compile", "cache_compile", "cache_check", "unit", "floor"]
    rows = [[name, *(round(s[name]["median"], 1) if name in s else None
                     for s in (cold, warm["stats"]))] for name in names]
    headers = ["variant", "cold process us/call", "warm process us/call"]
    print(f"{PARAMS} parameters of {SIZE} floats, 2 inputs, engine {args.engine}; first calls: "
          f"cache_compile {first['cache_compile']:.2f} s, torch.compile "
          f"{first['torch.compile']:.2f} s, warm cache_compile {warm['first_call_s']:.2f} s")
    print(_harness.format_table(headers, rows))
    _harness.save_results("call_cost", _harness.machine_tag(info),
                          {"machine": info, "command": _harness.command_line(),
                           "engine": args.engine, "threads": torch.get_num_threads(),
                           "first_call_s": dict(first, warm_cache_compile=warm["first_call_s"]),
                           "warm_served_from_entry": warm["served_from_entry"],
                           "cold": cold, "warm": warm["stats"],
                           "rows": [dict(zip(headers, r)) for r in rows],
                           "total_runtime_s": time.perf_counter() - started},
                          quick=args.quick, out=args.out)


if __name__ == "__main__":
    main()
