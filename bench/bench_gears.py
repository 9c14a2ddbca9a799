"""Dynamic gears on a decoder step: compile time and per-step latency per gear, gears cycled.

The model is the benches' decoder step (:mod:`bench.model`, as in ``bench_decode_step``): per
layer RMSNorm -> q/k/v projections (GQA) -> in-place KV-cache write at ``pos`` (``index_copy_``)
-> ``torch.ops.npu.npu_incre_flash_attention(..., actual_seq_lengths=lens)`` -> output projection
-> RMSNorm -> SwiGLU MLP, then a final RMSNorm. The batch dim of ``x`` and of the KV caches is
the gear dim (``--gears``, default 1 2 4 8 16). Each variant owns one KV cache of the largest gear
per layer and passes views ``cache[:b]`` for batch ``b`` (what serving engines do; ``--cache
per-gear`` gives one preallocated cache per gear instead). ``actual_seq_lengths`` is a Python
list of one length (``[L]``, the op accepts one length for all sequences), so the list length is
the same at every gear (Dynamo guards the length of a list); ``L`` grows by one at every call of
the process, warm-up and check calls included, and ``pos = L - 1``.

Variants (all measured side by side in one process, interleaved rounds, see ``_harness.py``):

- ``eager``: the module called directly.
- ``torchair-gears``: ``set_dim_gears(t, {0: gears})`` on ``x`` and every KV-cache view,
  ``mark_static`` on ``pos``, ``experimental_config.tiling_schedule_optimize=True``,
  ``torch.compile(..., dynamic=True, fullgraph=True)``: one Dynamo trace, one static launch unit
  per gear, built at the gear's first call. Default engine Inductor (each gear a fixed-shape
  Inductor compile); ``--engine fx`` uses ``debug.run_eagerly=True`` (FX engine) instead and
  names the variants ``...-fx``.
- ``torchair-per-shape``: the same backend without gears: every tensor ``mark_static``,
  ``dynamic=True`` (for the lengths only), so each batch size is its own Dynamo trace and build.
  (``dynamic=False`` would make the length a constant and recompile at every step.)
- ``inductor-dynamic``: stock ``torch.compile(backend="inductor", dynamic=True, fullgraph=True)``
  with the batch dims ``mark_unbacked`` (the marks ``set_dim_gears`` makes; plain ``dynamic=True``
  would specialize the first call's batch 1): one shape-generic graph for every batch size.

Measured: (1) compile: Dynamo traces (``CompileCounterWithBackend``), wall time of each gear's
first call (the first one traces and compiles), torchair's per-gear ``build_seconds`` from
``graph_reports()``, total = wall of the first pass over all gears; traces after that pass must
be 0; (2) outputs and final KV caches vs eager (``allclose``) over ``--check-passes`` passes;
(3) per-step latency per gear: ``--rounds`` interleaved rounds, in each round every variant runs
``--steps`` passes over all gears (the gear changes at every call, as in a serving loop), each call
timed on its own. Nothing is asserted about speed.

    python -m bench.bench_gears --quick            # smoke run, < 60 s on 2 CPU cores
    python -m bench.bench_gears                    # defaults, a few minutes on 2 CPU cores
    python -m bench.bench_gears --engine fx --threads 1
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import sys
import time
from typing import Any, Callable

import torch
import torch._dynamo
import torch._dynamo.testing
from torch._dynamo.decorators import mark_unbacked

import torchair
from bench import _harness as H
from bench._decode_timing import report_dict
from bench.bench_decode_step import sci
from bench.model import DecoderStep, ModelConfig
from torchair.inference import set_dim_gears

KINDS = ("eager", "torchair-gears", "torchair-per-shape", "inductor-dynamic")


# ------------------------------------------------------------------------------ inputs

@dataclasses.dataclass
class StepInput:
    batch: int
    x: torch.Tensor
    pos: torch.Tensor
    lens: list[int]


def first_length(cfg: ModelConfig, gears: list[int], n_calls: int) -> int:
    """The first call's length: room for ``n_calls`` growing lengths in the cache, >= 2 (Dynamo
    specializes 0 and 1), and no warm-up length equal to a model size or gear (an int equal to a
    size could be duck-sized into one symbol with it)."""
    room = cfg.capacity - n_calls
    if room < 2:
        raise SystemExit(f"--capacity {cfg.capacity} is too small for {n_calls} calls; raise "
                         f"--capacity or lower --rounds/--steps")
    sizes = {cfg.capacity, cfg.hidden, cfg.kv_hidden, cfg.intermediate, cfg.heads,
             cfg.kv_heads, cfg.head_dim, *gears}
    start = max(2, room // 2)
    for first in list(range(start, room + 1)) + list(range(2, start)):
        if not sizes & set(range(first, first + 2 * len(gears))):
            return first
    return start


def make_schedule(cfg: ModelConfig, gears: list[int], passes: int, device: str,
                  dtype: torch.dtype, seed: int) -> list[StepInput]:
    """``passes`` passes over the gears; call ``i`` has batch ``gears[i % G]`` and length
    ``L0 + i`` (new at every call), writing its token at column ``L0 + i - 1``."""
    n_calls = passes * len(gears)
    first = first_length(cfg, gears, n_calls)
    gen = torch.Generator().manual_seed(seed)
    steps = []
    for i in range(n_calls):
        b, length = gears[i % len(gears)], first + i
        x = torch.randn(b, 1, cfg.hidden, generator=gen).to(device=device, dtype=dtype)
        pos = torch.tensor([length - 1], dtype=torch.int64, device=device)
        torch._dynamo.mark_static(pos)
        steps.append(StepInput(b, x, pos, [length]))
    return steps


# ------------------------------------------------------------------------------ variants

@dataclasses.dataclass
class Variant:
    name: str
    kind: str
    engine: str | None
    describe: str
    compiled: Callable
    counter: Any  # CompileCounterWithBackend, None for eager
    caches: list[torch.Tensor]  # what the variant owns (big caches, or all per-gear caches)
    per_gear: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]]  # b -> (k list, v list)
    result: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __call__(self, s: StepInput, x: torch.Tensor | None = None) -> torch.Tensor:
        k, v = self.per_gear[s.batch]
        return self.compiled(s.x if x is None else x, s.pos, s.lens, k, v)

    def mark_x(self, x: torch.Tensor, gears: list[int]) -> torch.Tensor:
        """A private copy of a warm-up ``x`` carrying this variant's marks (the schedule's
        tensors are shared by all variants, and the marks of different variants conflict)."""
        x = x.clone()
        if self.kind == "torchair-gears":
            set_dim_gears(x, {0: gears})
            _static_except_batch(x)
        elif self.kind == "inductor-dynamic":
            mark_unbacked(x, 0)
            _static_except_batch(x)
        elif self.kind == "torchair-per-shape":
            torch._dynamo.mark_static(x)
        return x

    @property
    def traces(self) -> int | None:
        return None if self.counter is None else self.counter.frame_count


def _static_except_batch(t: torch.Tensor) -> None:
    """``mark_static`` on every dim but the batch dim: with ``dynamic=True`` an unmarked dim is a
    symbol unless a guard pins it (e.g. the cache capacity, which no op relates to a weight), and
    torchair then takes the shape-generic path instead of one static unit per gear."""
    for d in range(1, t.dim()):
        torch._dynamo.mark_static(t, d)


def _torchair_backend(engine: str) -> Callable:
    cfg = torchair.CompilerConfig()
    cfg.experimental_config.tiling_schedule_optimize = True
    cfg.debug.run_eagerly = engine == "fx"
    return torchair.get_npu_backend(compiler_config=cfg)


def make_caches(init_k: list[torch.Tensor], init_v: list[torch.Tensor], gears: list[int],
                layout: str):
    """(owned tensors, {b: (k list, v list)}): views ``cache[:b]`` of one cache of the largest
    gear per layer, or one cache per gear (``init[:b]`` copied)."""
    if layout == "views":
        k = [t.clone() for t in init_k]
        v = [t.clone() for t in init_v]
        return k + v, {b: ([t[:b] for t in k], [t[:b] for t in v]) for b in gears}
    per_gear = {b: ([t[:b].clone() for t in init_k], [t[:b].clone() for t in init_v])
                for b in gears}
    return [t for b in gears for t in per_gear[b][0] + per_gear[b][1]], per_gear


def reset_caches(variant: Variant, init_k: list[torch.Tensor], init_v: list[torch.Tensor]) -> None:
    """Back to the initial content, in place (launch units keep the same buffers)."""
    with torch.no_grad():
        for b, (k, v) in variant.per_gear.items():
            for dst, src in zip(k + v, init_k + init_v):
                dst.copy_(src[:b])


def make_variant(name: str, kind: str, engine: str | None, model: DecoderStep,
                 init_k: list[torch.Tensor], init_v: list[torch.Tensor], gears: list[int],
                 layout: str) -> Variant:
    owned, per_gear = make_caches(init_k, init_v, gears, layout)
    cache_views = [t for b in gears for t in per_gear[b][0] + per_gear[b][1]]
    counter = None
    if kind == "eager":
        compiled, describe = model, "the module called directly (no_grad)"
    elif kind == "torchair-gears":
        for t in cache_views:
            set_dim_gears(t, {0: gears})
            _static_except_batch(t)
        counter = torch._dynamo.testing.CompileCounterWithBackend(_torchair_backend(engine))
        compiled = torch.compile(model, backend=counter, dynamic=True, fullgraph=True)
        describe = (f"set_dim_gears({{0: {gears}}}) on x and KV caches (their other dims and "
                    f"pos mark_static), "
                    f"tiling_schedule_optimize, dynamic=True: one trace, one static unit per "
                    f"gear; {engine} engine")
    elif kind == "torchair-per-shape":
        for t in cache_views:
            torch._dynamo.mark_static(t)
        counter = torch._dynamo.testing.CompileCounterWithBackend(_torchair_backend(engine))
        compiled = torch.compile(model, backend=counter, dynamic=True, fullgraph=True)
        describe = (f"torchair path 4 without gears: every tensor mark_static, "
                    f"tiling_schedule_optimize, dynamic=True (lengths only): one trace + build "
                    f"per batch size; {engine} engine")
    elif kind == "inductor-dynamic":
        for t in cache_views:
            mark_unbacked(t, 0)
            _static_except_batch(t)
        counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
        compiled = torch.compile(model, backend=counter, dynamic=True, fullgraph=True)
        describe = ("torch.compile(backend='inductor', dynamic=True, fullgraph=True), batch dims "
                    "mark_unbacked, other dims and pos mark_static: one shape-generic graph")
    else:
        raise ValueError(kind)
    return Variant(name, kind, engine, describe, compiled, counter, owned, per_gear)


def variant_specs(args: argparse.Namespace) -> list[tuple[str, str, str | None]]:
    """(name, kind, engine) of each variant to run; eager first."""
    specs = [("eager", "eager", None)]
    for kind in args.variants:
        if kind == "eager":
            continue
        if kind.startswith("torchair"):
            for engine in args.engine:
                suffix = "" if engine == "inductor" else f"-{engine}"
                specs.append((kind + suffix, kind, engine))
        else:
            specs.append((kind, kind, None))
    return specs


# ------------------------------------------------------------------------------ run

def _gear_entries(report: Any) -> list[dict[str, Any]]:
    return [dict(g) for g in getattr(report, "gears", [])]


def warm_and_check(v: Variant, schedule: list[StepInput], gears: list[int], n_check: int,
                   init_k, init_v, ref: dict[str, Any], sync, rtol: float,
                   atol: float) -> None:
    """Compile (first pass over the gears, timed call by call), a second pass (recompiles?), then
    the check passes from the initial caches against eager."""
    res = v.result
    G = len(gears)
    reports0 = len(torchair.graph_reports())
    first_calls = {}
    for i in range(G):
        s = schedule[i]
        x = v.mark_x(s.x, gears)
        gc.collect()
        sync()
        t0 = time.perf_counter()
        v(s, x)
        sync()
        first_calls[s.batch] = time.perf_counter() - t0
    res["first_call_per_gear_s"] = first_calls
    res["first_call_s"] = first_calls[gears[0]]
    res["compile_total_s"] = sum(first_calls.values())
    res["traces_first_pass"] = v.traces
    second = {}
    for i in range(G, 2 * G):
        s = schedule[i]
        sync()
        t0 = time.perf_counter()
        v(s)
        sync()
        second[s.batch] = time.perf_counter() - t0
    res["second_call_per_gear_s"] = second
    reports = torchair.graph_reports()[reports0:]
    if reports:
        res["torchair_reports"] = [{**report_dict(r), "gears": _gear_entries(r)}
                                   for r in reports]
    if v.kind == "torchair-gears" and reports:
        builds = {g["gear"]: g.get("build_seconds") for g in reports[-1].gears}
        res["gear_build_s"] = builds
        first_build = next(iter(builds.values()), None)
        if first_build is not None:
            # the first call = Dynamo trace + AOT + torchair analysis + the first gear's build
            res["trace_s"] = res["first_call_s"] - first_build
    elif v.kind == "torchair-per-shape" and reports:
        res["graph_build_s"] = [r.build_seconds for r in reports]

    # correctness against eager, from the initial caches
    reset_caches(v, init_k, init_v)
    outs = [v(s).clone() for s in schedule[2 * G:2 * G + n_check]]
    sync()
    caches = [t.clone() for t in v.caches]
    if v.kind == "eager":
        ref["outs"], ref["caches"] = outs, caches
        res["check"] = "reference"
    else:
        err = max([(o.float() - r.float()).abs().max().item()
                   for o, r in zip(outs, ref["outs"])] + [0.0])
        cache_err = max([(c.float() - r.float()).abs().max().item()
                         for c, r in zip(caches, ref["caches"])] + [0.0])
        ok = (len(outs) == len(ref["outs"])
              and all(torch.allclose(o, r, rtol=rtol, atol=atol)
                      for o, r in zip(outs, ref["outs"]))
              and all(torch.allclose(c, r, rtol=rtol, atol=atol)
                      for c, r in zip(caches, ref["caches"])))
        res.update(check="ok" if ok else "MISMATCH", max_abs_err=err,
                   cache_max_abs_err=cache_err, rtol=rtol, atol=atol)
    reset_caches(v, init_k, init_v)


def run(args: argparse.Namespace, cfg: ModelConfig, device: str,
        dtype: torch.dtype) -> dict[str, Any]:
    torch._dynamo.reset()
    sync = H.synchronizer(device)
    gears = args.gears
    G = len(gears)
    torch.manual_seed(args.seed)
    model = DecoderStep(cfg).to(device=device, dtype=dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(args.seed + 1)
    bmax = max(gears)
    init_k = [torch.randn(bmax, cfg.capacity, cfg.kv_hidden, generator=gen)
              .to(device=device, dtype=dtype) for _ in range(cfg.layers)]
    init_v = [torch.randn(bmax, cfg.capacity, cfg.kv_hidden, generator=gen)
              .to(device=device, dtype=dtype) for _ in range(cfg.layers)]

    n_check = args.check_passes * G
    passes = 2 + args.check_passes + args.rounds * args.steps
    schedule = make_schedule(cfg, gears, passes, device, dtype, args.seed + 2)
    timed_start = 2 * G + n_check
    rtol, atol = (1e-4, 1e-4) if dtype == torch.float32 else (2e-2, 2e-2)

    variants = [make_variant(n, k, e, model, init_k, init_v, gears, args.cache)
                for n, k, e in variant_specs(args)]
    print(f"\n== gears {gears}: {cfg.layers} layers, hidden {cfg.hidden}, heads {cfg.heads}/"
          f"{cfg.kv_heads} kv, head dim {cfg.head_dim}, MLP {cfg.intermediate}, KV capacity "
          f"{cfg.capacity} ({args.cache}), {dtype}, lengths {schedule[0].lens[0]}.."
          f"{schedule[-1].lens[0]} (one per call)", flush=True)

    ref: dict[str, Any] = {}
    with torch.no_grad():
        for v in variants:
            res = v.result
            res.update(describe=v.describe, kind=v.kind, engine=v.engine)
            try:
                warm_and_check(v, schedule, gears, n_check, init_k, init_v, ref, sync, rtol,
                               atol)
                res["ok_to_time"] = True
            except Exception as exc:  # noqa: BLE001 - record and go on with the other variants
                H.record_failure(res, v.name, exc)
                if v.kind == "eager":
                    raise
                continue
            firsts = " ".join(f"{b}:{t:.2f}" for b, t in res["first_call_per_gear_s"].items())
            print(f"  {v.name:22s} traces {res['traces_first_pass']}, first call of each gear "
                  f"(s) {firsts}, total {res['compile_total_s']:.2f} s, check {res['check']}",
                  flush=True)

        timed = {v.name: v for v in variants if v.result.get("ok_to_time")}
        traces_before = {name: v.traces for name, v in timed.items()}

        def steps_of_round(r: int) -> range:
            start = timed_start + r * args.steps * G
            return range(start, start + args.steps * G)

        fns = {name: (lambda i, v=v: v(schedule[i])) for name, v in timed.items()}
        t0 = time.perf_counter()
        rounds = H.interleaved_rounds(fns, steps_of_round, args.rounds, sync)
        print(f"  timed {args.rounds} rounds x {args.steps} passes x {G} gears x {len(fns)} "
              f"variants in {time.perf_counter() - t0:.1f} s", flush=True)

    # split every round's calls by gear: by_gear[name][b][r] = that round's times at batch b
    by_gear: dict[str, dict[int, list[list[float]]]] = {}
    for name, per_round in rounds.items():
        by_gear[name] = {b: [] for b in gears}
        for r, times in enumerate(per_round):
            idx = list(steps_of_round(r))
            for b in gears:
                by_gear[name][b].append([t for t, i in zip(times, idx)
                                         if schedule[i].batch == b])

    out: dict[str, Any] = {"gears": gears, "variants": {}}
    for v in variants:
        res = dict(v.result)
        res.pop("ok_to_time", None)
        if v.name in by_gear:
            res["traces_total"] = v.traces
            if v.counter is not None:
                res["recompiles_after_first_pass"] = v.traces - res["traces_first_pass"]
                res["recompiles_timed"] = v.traces - traces_before[v.name]
            res["cycle_us"] = H.summarize(_cycle_sums(rounds[v.name], G))
            res["per_gear"] = {}
            for b in gears:
                stats = H.summarize(by_gear[v.name][b])
                entry: dict[str, Any] = {"per_step_us": stats}
                if "eager" in by_gear:
                    eager = by_gear["eager"][b]
                    entry["speedup_vs_eager"] = H.summarize(eager)["median"] / stats["median"]
                    entry["speedup_vs_eager_paired"] = H.paired_ratios(eager, by_gear[v.name][b])
                res["per_gear"][b] = entry
        out["variants"][v.name] = res
    out["load_average_after_timing"] = H.load_average()
    return out


def _cycle_sums(per_round: list[list[float]], G: int) -> list[list[float]]:
    """Per round, the time of each pass over all gears (G consecutive calls): one cycle."""
    return [[sum(times[j:j + G]) for j in range(0, len(times), G)] for times in per_round]


# ------------------------------------------------------------------------------ main

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"),
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--gears", type=int, nargs="+", default=None,
                   help="batch gears (default 1 2 4 8 16; --quick 1 4)")
    p.add_argument("--engine", nargs="+", choices=("inductor", "fx"), default=["inductor"],
                   help="torchair engine(s) of the torchair variants (default inductor; fx = "
                        "debug.run_eagerly); a non-default engine suffixes the variant names")
    p.add_argument("--variants", nargs="+", choices=KINDS, default=None,
                   help="default: all (--quick: without inductor-dynamic); eager always runs")
    p.add_argument("--cache", choices=("views", "per-gear"), default="views",
                   help="KV caches: views cache[:b] of one cache per layer (default), or one "
                        "preallocated cache per gear")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 30)")
    p.add_argument("--steps", type=int, default=None,
                   help="passes over all gears per variant and round (default 4)")
    p.add_argument("--check-passes", type=int, default=None,
                   help="passes over the gears compared against eager (default 2)")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default 2)")
    p.add_argument("--hidden", type=int, default=None, help="hidden size (default 512)")
    p.add_argument("--heads", type=int, default=None, help="query heads (default 8)")
    p.add_argument("--kv-heads", type=int, default=None, help="kv heads, GQA (default 2)")
    p.add_argument("--intermediate", type=int, default=None, help="MLP size (default 3*hidden)")
    p.add_argument("--capacity", type=int, default=None, help="KV cache positions (default 1024)")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None,
                   help="default float32 on CPU, float16 on CUDA")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads (default: leave torch's default)")
    p.add_argument("--warm-cache", action="store_true",
                   help="let Inductor use its on-disk caches (default: disabled, cold compiles)")
    p.add_argument("--quick", action="store_true",
                   help="tiny model, gears 1 4, few rounds: a smoke run well under a minute")
    p.add_argument("--out", default=None,
                   help="JSON path (default bench/results/gears_<machine-tag>[_quick].json)")
    args = p.parse_args(argv)

    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but CUDA is not available")
    quick = dict(gears=[1, 4], rounds=3, steps=2, check_passes=1, layers=1, hidden=64,
                 heads=4, kv_heads=2, intermediate=128, capacity=128)
    full = dict(gears=[1, 2, 4, 8, 16], rounds=30, steps=4, check_passes=2, layers=2,
                hidden=512, heads=8, kv_heads=2, intermediate=None, capacity=1024)
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.intermediate is None:
        args.intermediate = 3 * args.hidden
    if args.hidden % args.heads or args.heads % args.kv_heads:
        p.error("--hidden must be a multiple of --heads, and --heads of --kv-heads")
    if len(set(args.gears)) != len(args.gears) or len(args.gears) < 2 or min(args.gears) < 1:
        p.error("--gears: at least 2 distinct positive sizes")
    if args.dtype is None:
        args.dtype = "float16" if args.device == "cuda" else "float32"
    args.engine = list(dict.fromkeys(args.engine))
    if args.variants is None:
        args.variants = [k for k in KINDS if not (args.quick and k == "inductor-dynamic")]
    args.variants = ["eager"] + [k for k in dict.fromkeys(args.variants) if k != "eager"]
    return args


def _fmt_s(values: dict[Any, float | None]) -> str:
    return " ".join(f"{k}:{v:.2f}" for k, v in values.items() if v is not None)


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    args = parse_args(argv)
    device, dtype = args.device, getattr(torch, args.dtype)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if not args.warm_cache:
        import torch._inductor.config as inductor_config
        inductor_config.force_disable_caches = True
    # every variant compiles the same forward code object; torchair-per-shape alone needs one
    # cache entry per gear, more than Dynamo's default recompile limit (8) with two engines
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit,
                                               4 * len(args.gears) + 8)
    info = H.machine_info(device)
    tag = H.machine_tag(info)
    if args.threads is not None:
        tag += f"-{args.threads}thread"
    if args.engine != ["inductor"]:
        tag += "-" + "-".join(args.engine)
    print("gears benchmark: compile time and per-step latency per batch gear, gears cycled, "
          "variants interleaved in one run")
    H.print_machine(info)
    cfg = ModelConfig(layers=args.layers, hidden=args.hidden, heads=args.heads,
                        kv_heads=args.kv_heads, intermediate=args.intermediate,
                        capacity=args.capacity)

    result = run(args, cfg, device, dtype)
    variants = result["variants"]

    print("\ncompile: traces = Dynamo traces in the first pass over the gears; first call = the "
          "first gear's first call (trace + compile + one step); trace = first call - first "
          "gear's build; builds = torchair's per-gear build_seconds (graph report); total = "
          "wall time of the first call of every gear; recompiles = traces after that pass "
          "(second warm-up pass, check, timed rounds)")
    headers = ["variant", "traces", "first call s", "trace s", "builds s", "total s",
               "recompiles", "check", "max err"]
    rows = []
    for name, res in variants.items():
        builds = res.get("gear_build_s") or (res.get("graph_build_s") and dict(
            zip(result["gears"], res["graph_build_s"])))
        rows.append([name, res.get("traces_first_pass"), res.get("first_call_s"),
                     res.get("trace_s"), sum(b or 0 for b in builds.values()) if builds else None,
                     res.get("compile_total_s"), res.get("recompiles_after_first_pass"),
                     res.get("check", "error" if "error" in res else None),
                     sci(res.get("max_abs_err"))])
    print(H.format_table(headers, rows))
    print("\nfirst call of each gear (s), in the order called:")
    for name, res in variants.items():
        if "first_call_per_gear_s" in res:
            print(f"  {name:22s} {_fmt_s(res['first_call_per_gear_s'])}")
        if res.get("gear_build_s"):
            print(f"  {'':22s} builds: " + _fmt_s(
                {b: s for b, s in zip(result['gears'], res['gear_build_s'].values())}))

    print("\nper-step latency per gear (median, p10, p90 over all timed calls at that gear; gears "
          "cycled at every call); speedup = eager median / variant median; paired = median over "
          "rounds of the same ratio within a round")
    headers = ["gear", "variant", "median us", "p10 us", "p90 us", "speedup", "paired"]
    rows = []
    for b in result["gears"]:
        for name, res in variants.items():
            entry = res.get("per_gear", {}).get(b)
            if entry is None:
                continue
            stats = entry["per_step_us"]
            rows.append([b, name, stats["median"], stats["p10"], stats["p90"],
                         entry.get("speedup_vs_eager"),
                         entry.get("speedup_vs_eager_paired", {}).get("median")])
    print(H.format_table(headers, rows))
    eager_cycle = variants.get("eager", {}).get("cycle_us", {}).get("median")
    print(f"\none cycle over all {len(result['gears'])} gears (median us, speedup vs eager):")
    for name, res in variants.items():
        if "cycle_us" in res:
            med = res["cycle_us"]["median"]
            ratio = f"{eager_cycle / med:.2f}x" if eager_cycle else "-"
            print(f"  {name:22s} {med:10.0f}  {ratio}")
    print("\nvariants:")
    for name, res in variants.items():
        print(f"  {name:22s} {res.get('describe', '')}")

    payload = {
        "benchmark": "gears",
        "command": H.command_line(),
        "machine": info,
        "machine_tag": tag,
        "config": {**dataclasses.asdict(cfg), "head_dim": cfg.head_dim, "dtype": args.dtype,
                   "device": device, "gears": args.gears, "engines": args.engine,
                   "cache_layout": args.cache, "steps_per_round": args.steps,
                   "rounds": args.rounds, "check_passes": args.check_passes,
                   "quick": args.quick, "seed": args.seed,
                   "recompile_limit": torch._dynamo.config.recompile_limit,
                   "inductor_caches": "warm (on-disk caches allowed)" if args.warm_cache
                   else "disabled (cold compiles)"},
        "method": ("compile: wall time of each gear's first call, Dynamo traces from "
                   "CompileCounterWithBackend, torchair build_seconds from graph_reports(); "
                   "latency: per-call wall time (time.perf_counter, torch.cuda.synchronize on "
                   "CUDA), variants interleaved in rounds, balanced orders, each round "
                   "--steps passes over all gears per variant, gear changing at every call, "
                   "new actual_seq_lengths ([L], one length) at every call; microseconds"),
        "results": result,
        "load_average_at_end": H.load_average(),
        "total_runtime_s": time.perf_counter() - start,
    }
    H.save_results("gears", tag, payload, quick=args.quick, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
