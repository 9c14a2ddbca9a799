"""Per-step latency of a small decoder step: eager vs torch.compile (Inductor) vs torchair path 4.

The step (:mod:`bench.model`): ``--layers`` decoder layers of RMSNorm -> q/k/v projections
(GQA) -> in-place KV-cache write at ``pos`` (``index_copy_``) ->
``torch.ops.npu.npu_incre_flash_attention`` with ``actual_seq_lengths`` -> output projection ->
RMSNorm -> SwiGLU MLP, then a final RMSNorm. The KV caches are preallocated (``--capacity``
positions) and every call of the process, compile and check calls included, gets a new set of
lengths (each sequence grows by one per step), so no variant can reuse per-length artifacts from
an earlier call.

Variants (all measured side by side in one process, interleaved rounds, see ``_harness.py``):

- ``eager``: the module called directly.
- ``inductor``: ``torch.compile(backend="inductor", dynamic=True, fullgraph=True)`` with every
  tensor input ``mark_static``; the lengths are SymInts, so one compile serves every step (with
  ``dynamic=False`` the lengths would be constants and Inductor would recompile on every step).
- ``torchair``: torchair path 4: ``dynamic=True`` + ``mark_static`` +
  ``experimental_config.tiling_schedule_optimize`` (lengths sunk into a device buffer, one static
  launch unit), default engine (Inductor).
- ``torchair-fx``: the same with ``debug.run_eagerly=True`` (FX engine: ATen ops one by one).
- ``torchair-cache``: the same path 4 config through ``torchair.inference.cache_compile`` (a
  fresh temporary cache directory): the first call compiles and saves, the later calls run the
  launch unit from the entry without Dynamo, checking the guards on the call's arguments and
  the process state (``$TORCHAIR_CACHE_GUARDS``, default ``arguments``).
- ``torchair-skipguards``: ``torchair`` called under PyTorch's
  ``torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)`` (one stance object,
  entered around each call after the first, which compiles; ~3 us per call): Dynamo runs only the guards that tell its cache
  entries apart (none, with one entry).
  A user's opt-in, unsafe when anything guarded changes between calls; shows what Dynamo's
  guard evaluation costs per step.
- ``torchair-guardfilter``: ``torchair`` compiled with ``options={"guard_filter_fn":
  torch.compiler.skip_guard_on_all_nn_modules_unsafe}``: Dynamo keeps its guards on the
  arguments and global state and drops those on module state. Also a user's opt-in, unsafe
  when a module's attributes or parameters change (tests/core/test_guard_knobs.py).
- ``torchair-mm`` (CPU only): ``torchair`` built with ``TORCHAIR_SMALL_GEMM=0``: its products
  are ATen's ``mm`` instead of ``torchair_native::gemv`` (bound at 4-32 rows), so the kernel's
  share of the step is measured in the same run.
- ``torchair-ungrouped`` (CPU only): ``torchair-cache`` built with ``TORCHAIR_GEMV_GROUPS=0``:
  one ``torchair_native::gemv`` call per product instead of one ``gemv_cat`` for the products of
  one input (q/k/v, gate/up), so what the grouping saves is measured in the same run.
- ``torchair-nodynamo``: ``torchair``'s compiled function called directly with Dynamo's
  flattened arguments: the step minus Dynamo's per-call work (frame, guards, argument
  extraction). A diagnostic of where the time goes (nothing is guarded), not a way to call a
  model.
- ``reduce-overhead`` (CUDA only): ``torch.compile(mode="reduce-overhead", dynamic=True,
  fullgraph=True)``, KV caches ``mark_static_address``. Inductor's CUDA graphs key on the SymInt
  values, so new lengths every step mean no replay of an earlier recording.

Two rows are floors, timed interleaved with the variants, not variants:

- ``floor-gemv``: the weight GEMVs alone (on the model's weights, the product a CPU static unit
  runs for each: ``torchair_native::gemv`` where units bind it, else ``F.linear``); with the KV
  bytes at the measured read bandwidth, the step's floor (``x floor`` column).
- ``floor-gemv+dynamo`` (when a ``torch.compile`` variant runs): the same GEMVs, then a copy of
  the module called through ``torch.compile`` with a backend that does no work
  (:class:`DynamoFloor`). Minus ``floor-gemv``, it is Dynamo's per-call work, which every
  ``torch.compile`` variant pays before its backend's code runs; the summary prints it, the
  same work measured as ``torchair`` minus ``torchair-nodynamo``, and the floor plus it as a
  multiple of eager (an estimate: a unit's GEMVs, called from C++, can beat the floor's calls
  from Python).

With ``--decompose`` two more rows show where a step's time above the floor goes
(:class:`~bench._decode_variants.AttentionCalls`):

- ``attn-alone``: the step's attention calls alone (the launch kernel a CPU unit calls, one per
  layer, with the step's lengths): against the floor's KV term, the attention's own excess;
- ``gemv+attn``: the weight GEMVs, then those calls. Minus ``floor-gemv`` and ``attn-alone``,
  what running both in one step costs (the weights and the KV windows evict each other from the
  caches, which neither floor row sees); a variant minus this row is the rest of its step.

Each compiled variant is checked against eager (outputs of ``--check-steps`` steps and the final
KV caches, ``allclose``) before timing; the result is recorded, nothing about speed is asserted.

    python -m bench.bench_decode_step                 # defaults: batch 1 and 8, 2 layers
    python -m bench.bench_decode_step --quick         # tiny smoke test (< 1 minute on 2 CPU cores)
    python -m bench.bench_decode_step --device cpu --batch 1 4 --steps 30 --rounds 5
    python -m bench.bench_decode_step --batch 8 --variants torchair-cache --decompose
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import torch

from bench import _harness as H, _profile as P
from bench._decode_timing import run_batch
from bench._decode_variants import ALL_VARIANTS, ATTN, CPU_ONLY, CUDA_ONLY, DYNAMO_FLOOR, FLOOR, GEMV_ATTN
from bench.model import ModelConfig


def sci(value: float | None) -> str | None:
    return None if value is None else f"{value:.1e}"


# ------------------------------------------------------------------------------ main

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"),
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, nargs="+", default=None, help="batch sizes (default 1 8)")
    p.add_argument("--steps", type=int, default=None,
                   help="timed steps per round (default 10); each variant runs --rounds x "
                        "--steps timed steps")
    p.add_argument("--rounds", type=int, default=None,
                   help="interleaved rounds; each variant runs --steps steps per round "
                        "(default 30)")
    p.add_argument("--check-steps", type=int, default=None,
                   help="steps compared against eager before timing (default 3)")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default 2)")
    p.add_argument("--hidden", type=int, default=None, help="hidden size (default 512)")
    p.add_argument("--heads", type=int, default=None, help="query heads (default 8)")
    p.add_argument("--kv-heads", type=int, default=None, help="kv heads, GQA (default 2)")
    p.add_argument("--intermediate", type=int, default=None, help="MLP size (default 3*hidden)")
    p.add_argument("--capacity", type=int, default=None, help="KV cache positions (default 1024)")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None,
                   help="default float32 on CPU, float16 on CUDA")
    p.add_argument("--variants", nargs="+", choices=ALL_VARIANTS, default=None,
                   help="default: all (reduce-overhead only on CUDA, torchair-mm and torchair-ungrouped only "
                        "on CPU); eager is always included")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads (default: leave torch's default)")
    p.add_argument("--warm-cache", action="store_true",
                   help="let Inductor use its on-disk caches (default: caches disabled, so the "
                        "first-call times are cold compile times)")
    p.add_argument("--profile-steps", type=int, default=None,
                   help="steps of the torchair variant (torchair-fx without it) run under "
                        "torch.profiler after the timing, for the per-op table (default 20, "
                        "5 with --quick; 0: no profile)")
    p.add_argument("--decompose", action="store_true",
                   help="also time the step's attention calls alone and the GEMVs then those "
                        "calls (rows attn-alone, gemv+attn): where the time above the floor "
                        "goes (CPU)")
    p.add_argument("--quick", action="store_true",
                   help="tiny model, few steps: a smoke test that finishes in well under a minute")
    p.add_argument("--out", default=None,
                   help="JSON path (default bench/results/decode_step_<machine-tag>[_quick].json)")
    args = p.parse_args(argv)

    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but CUDA is not available")
    quick = dict(batch=[2], steps=4, rounds=3, check_steps=2, layers=1, hidden=64, heads=4,
                 kv_heads=2, intermediate=128, capacity=64, profile_steps=5)
    full = dict(batch=[1, 8], steps=10, rounds=30, check_steps=3, layers=2, hidden=512, heads=8,
                kv_heads=2, intermediate=None, capacity=1024, profile_steps=20)
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.intermediate is None:
        args.intermediate = 3 * args.hidden
    if args.hidden % args.heads or args.heads % args.kv_heads:
        p.error("--hidden must be a multiple of --heads, and --heads of --kv-heads")
    if args.dtype is None:
        args.dtype = "float16" if args.device == "cuda" else "float32"
    skip = CPU_ONLY if args.device == "cuda" else CUDA_ONLY
    variants = args.variants or [v for v in ALL_VARIANTS if v not in skip]
    args.variants = ["eager"] + [v for v in dict.fromkeys(variants) if v != "eager"]
    return args


def recompile_limit(args: argparse.Namespace) -> int:
    """Dynamo's recompile limit for this run: every compiled variant and the Dynamo floor compile
    the model's one ``forward`` code object, once per batch size, so the default run (8
    compiled variants and the floor on CPU) passed Dynamo's default limit of 8 and failed with
    ``FailOnRecompileLimitHit`` (``fullgraph=True``) at the floor's first call."""
    compiled = len([v for v in args.variants if v != "eager"]) + 1  # + the Dynamo floor
    return max(torch._dynamo.config.recompile_limit, compiled * len(args.batch) + 8)


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    args = parse_args(argv)
    device, dtype = args.device, getattr(torch, args.dtype)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if not args.warm_cache:
        import torch._inductor.config as inductor_config
        inductor_config.force_disable_caches = True
    info = H.machine_info(device)
    tag = H.machine_tag(info)
    if args.threads is not None:
        tag += f"-{args.threads}thread"
    print("decode-step benchmark: per-step latency, variants interleaved in one run")
    H.print_machine(info)
    cfg = ModelConfig(layers=args.layers, hidden=args.hidden, heads=args.heads,
                      kv_heads=args.kv_heads, intermediate=args.intermediate,
                      capacity=args.capacity)

    with torch._dynamo.config.patch(recompile_limit=recompile_limit(args)):
        batches = [run_batch(args, cfg, b, device, dtype) for b in args.batch]

    headers = ["batch", "variant", "first call s", "check", "max err", "recompiles",
               "median us", "p10 us", "p90 us", "speedup", "paired", "x floor"]
    rows = []
    for b in batches:
        fl = b["floor"]
        rows.append([b["batch"], FLOOR + " (floor)", None, None, None, None,
                     fl["gemv_us"]["median"], fl["gemv_us"]["p10"], fl["gemv_us"]["p90"], None,
                     None, None])
        dyn = b.get("dynamo_floor")
        if dyn:
            st = dyn["gemv_plus_dynamo_us"]
            rows.append([b["batch"], DYNAMO_FLOOR, None, None, None, dyn["recompiles_timed"],
                         st["median"], st["p10"], st["p90"], None, None, None])
        dec = b.get("decomposition")
        if dec:
            for name, key in ((ATTN, "attn_alone_us"), (GEMV_ATTN, "gemv_attn_us")):
                st = dec[key]
                rows.append([b["batch"], name, None, None, None, None, st["median"], st["p10"],
                             st["p90"], None, None, None])
        for name, res in b["variants"].items():
            stats = res.get("per_step_us", {})
            recompiles = None
            if "recompiles_timed" in res:
                recompiles = (res.get("recompiles_warmup", 0) + res.get("recompiles_check", 0)
                              + res["recompiles_timed"])
            rows.append([b["batch"], name, res.get("first_call_s"),
                         res.get("check", "error" if "error" in res else None),
                         sci(res.get("max_abs_err")), recompiles, stats.get("median"),
                         stats.get("p10"), stats.get("p90"), res.get("speedup_vs_eager"),
                         res.get("speedup_vs_eager_paired", {}).get("median"),
                         res.get("x_floor")])
    print("\nper-step latency (median, p10, p90 over all timed steps of all rounds); speedup ="
          " eager median / variant median, measured side by side in this run; paired = median"
          " over rounds of the same ratio within one round")
    print("first call s = the compiling call; recompiles = new graphs after the first call "
          "(every call has new lengths)")
    print(H.format_table(headers, rows))
    print("\nfloor per step = weight GEMVs alone (floor-gemv row, timed with the variants) + KV "
          "bytes read / read bandwidth; x floor = variant median / floor")
    for b in batches:
        fl = b["floor"]
        print(f"  batch {b['batch']}: floor {fl['floor_us']:.1f} us = GEMVs "
              f"{fl['gemv_us']['median']:.1f} us + KV {fl['kv_bytes_per_step'] / 2**20:.2f} MiB "
              f"at {fl['read_bandwidth_gb_per_s']:.1f} GB/s = {fl['kv_us']:.1f} us")
    for b in batches:
        dyn = b.get("dynamo_floor")
        if dyn:
            paired = dyn.get("torchair_minus_nodynamo_us")
            print(f"  batch {b['batch']}: Dynamo's per-call work {dyn['dynamo_us']:.1f} us "
                  f"({DYNAMO_FLOOR} - {FLOOR}, {dyn['graph_inputs']} graph inputs)"
                  + (f", {paired['median']:.1f} us (torchair - torchair-nodynamo, paired)"
                     if paired else "")
                  + f"; floor + it = {dyn['floor_plus_dynamo_us']:.1f} us"
                  + (f" = eager / {dyn['floor_plus_dynamo_speedup']:.2f}"
                     if dyn["floor_plus_dynamo_speedup"] else ""))
    gemvs = {b["floor"]["gemvs"]: [] for b in batches}  # per batch: which products the floor ran
    for b in batches:
        gemvs[b["floor"]["gemvs"]].append(str(b["batch"]))
    for text, sizes in gemvs.items():
        print(f"  GEMVs at batch {', '.join(sizes)}: {text}")
    if batches:
        print(f"  read bandwidth: {batches[0]['floor']['read_bandwidth']['method']}")
    for b in batches:
        dec = b.get("decomposition")
        if dec:
            fl = b["floor"]
            rest = ", ".join(f"{n} {us:+.1f}" for n, us in dec["variant_minus_gemv_attn_us"].items())
            print(f"  batch {b['batch']} decomposed: {ATTN} {dec['attn_alone_us']['median']:.1f} us "
                  f"= KV at {dec['attn_read_gb_per_s']:.1f} GB/s ({dec['attn_minus_kv_term_us']:+.1f} "
                  f"us on the floor's KV term at {fl['read_bandwidth_gb_per_s']:.1f} GB/s); "
                  f"{GEMV_ATTN} {dec['gemv_attn_us']['median']:.1f} us = {FLOOR} + {ATTN} "
                  f"{dec['together_minus_alone_us']:+.1f} us (what running both in one step costs); "
                  f"variant - {GEMV_ATTN}: {rest} us")
    for b in batches:
        prof = b.get("profile")
        if prof:
            print(f"\nper-op self CPU time, {prof['variant']} at batch {b['batch']} "
                  f"({prof['steps']} steps under torch.profiler):")
            print(P.format_op_table(prof["ops"], top=15))
    print("\nvariants:")
    for name in args.variants:
        describe = next((b["variants"][name].get("describe") for b in batches
                         if name in b["variants"]), "")
        print(f"  {name:16s} {describe}")

    payload = {
        "benchmark": "decode_step",
        "command": H.command_line(),
        "machine": info,
        "machine_tag": tag,
        "config": {**dataclasses.asdict(cfg), "head_dim": cfg.head_dim, "dtype": args.dtype,
                   "device": device, "batches": args.batch, "steps_per_round": args.steps,
                   "rounds": args.rounds, "check_steps": args.check_steps,
                   "quick": args.quick, "seed": args.seed,
                   "profile_steps": args.profile_steps,
                   "inductor_caches": "warm (on-disk caches allowed)" if args.warm_cache
                   else "disabled (cold compiles)"},
        "method": ("per-step wall time (time.perf_counter, torch.cuda.synchronize on CUDA) of "
                   "each call; variants interleaved in rounds, balanced orders; every call "
                   "uses new actual_seq_lengths; units microseconds"),
        "results": batches,
        "load_average_at_end": H.load_average(),
        "total_runtime_s": time.perf_counter() - start,
    }
    H.save_results("decode_step", tag, payload, quick=args.quick, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
