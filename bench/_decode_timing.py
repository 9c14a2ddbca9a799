"""One batch size of the decode-step benchmark: warm-up and check of every variant against
eager, the interleaved timed rounds (variants and floor rows), the optional per-op profile, and
the floor figures derived from the rounds (``floor``, ``dynamo_floor``, ``x_floor``).

Split out of :mod:`bench.bench_decode_step`, which parses the command line, calls
:func:`run_batch` per batch size and prints and saves what it returns; the variants are in
:mod:`bench._decode_variants`.
"""
from __future__ import annotations

import argparse
import time
from typing import Any

import torch

import torchair  # (registers torch.ops.npu.*)
from bench import _harness as H, _profile as P
from bench._decode_variants import (
    ATTN,
    DYNAMO_FLOOR,
    FLOOR,
    GEMV_ATTN,
    THROUGH_DYNAMO,
    AttentionCalls,
    DynamoFloor,
    make_variant,
    reset_caches,
)
from bench.model import ModelConfig, StepInput, make_schedule, seeded_decoder
from torchair.demo.roofline import GemvFloor, floor_us, kv_read_bytes, read_bandwidth, x_floor


def _cudagraph_counters() -> dict[str, Any]:
    out = {}
    for key, counter in torch._dynamo.utils.counters.get("inductor", {}).items():
        if "cudagraph" in key:
            out[key] = counter
    return out


def run_batch(args: argparse.Namespace, cfg: ModelConfig, batch: int, device: str,
              dtype: torch.dtype) -> dict[str, Any]:
    torch._dynamo.reset()
    sync = H.synchronizer(device)
    model, init_k, init_v = seeded_decoder(cfg, batch, device, dtype, args.seed)

    n_warm = 2  # first call compiles; the second (new lengths) shows whether anything recompiles
    n_profile = args.profile_steps if "torchair" in args.variants or "torchair-fx" in \
        args.variants else 0
    n_calls = n_warm + args.check_steps + args.rounds * args.steps + n_profile
    schedule = make_schedule(cfg, batch, n_calls, device, dtype, args.seed + batch)
    for s in schedule:
        torch._dynamo.mark_static(s.x)
        torch._dynamo.mark_static(s.pos)
    warm = schedule[:n_warm]
    check = schedule[n_warm:n_warm + args.check_steps]
    timed_start = n_warm + args.check_steps

    variants = [make_variant(n, model, init_k, init_v) for n in args.variants]
    rtol, atol = (1e-4, 1e-4) if dtype == torch.float32 else (2e-2, 2e-2)
    print(f"\n== batch {batch}: {cfg.layers} layers, hidden {cfg.hidden}, heads {cfg.heads}/"
          f"{cfg.kv_heads} kv, head dim {cfg.head_dim}, MLP {cfg.intermediate}, KV capacity "
          f"{cfg.capacity}, {dtype}, lengths {warm[0].lens[:4]}{'...' if batch > 4 else ''} "
          f"at the first call", flush=True)

    ref_out: list[torch.Tensor] = []
    ref_caches: list[torch.Tensor] = []
    with torch.no_grad():
        for v in variants:
            res = v.result
            res["describe"] = v.describe
            try:
                graphs0, reports0 = H.unique_graphs(), len(torchair.graph_reports())
                sync()
                t0 = time.perf_counter()
                v(warm[0])
                sync()
                res["first_call_s"] = time.perf_counter() - t0
                graphs1 = H.unique_graphs()
                t0 = time.perf_counter()
                v(warm[1])
                sync()
                res["second_call_s"] = time.perf_counter() - t0
                res["graphs_compiled"] = graphs1 - graphs0
                res["recompiles_warmup"] = H.unique_graphs() - graphs1
                reports = torchair.graph_reports()[reports0:]
                if reports:
                    res["torchair_reports"] = [report_dict(r) for r in reports]
                if v.name == "reduce-overhead":
                    res["cudagraph_counters"] = _cudagraph_counters()
                # correctness against eager, from the same initial caches
                reset_caches(v, init_k, init_v)
                graphs_before_check = H.unique_graphs()
                outs = [v(s).clone() for s in check]
                sync()
                res["recompiles_check"] = H.unique_graphs() - graphs_before_check
                caches = v.k_caches + v.v_caches
                if v.name == "eager":
                    ref_out, ref_caches = outs, [c.clone() for c in caches]
                    res["check"] = "reference"
                else:
                    err = max([(o.float() - r.float()).abs().max().item()
                               for o, r in zip(outs, ref_out)] + [0.0])
                    cache_err = max([(c.float() - r.float()).abs().max().item()
                                     for c, r in zip(caches, ref_caches)] + [0.0])
                    ok = (all(torch.allclose(o, r, rtol=rtol, atol=atol)
                              for o, r in zip(outs, ref_out))
                          and all(torch.allclose(c, r, rtol=rtol, atol=atol)
                                  for c, r in zip(caches, ref_caches)))
                    res.update(check="ok" if ok else "MISMATCH", max_abs_err=err,
                               cache_max_abs_err=cache_err, rtol=rtol, atol=atol)
                reset_caches(v, init_k, init_v)
                res["ok_to_time"] = True
            except Exception as exc:  # noqa: BLE001 - record and go on with the other variants
                H.record_failure(res, v.name, exc)
                continue
            extra = ""
            for r in res.get("torchair_reports", []):
                extra += (f" [graph {r['graph_id']}: path {r['path']}, build "
                          f"{'static' if r['build_static'] else 'dynamic'}, {r['engine']} "
                          f"engine, {r['launch']}]")
            print(f"  {v.name:16s} first call {res['first_call_s']:6.2f} s, second "
                  f"{res['second_call_s'] * 1e3:8.2f} ms, graphs {res['graphs_compiled']}, "
                  f"recompiles {res['recompiles_warmup'] + res['recompiles_check']}, check "
                  f"{res['check']}{extra}", flush=True)

        timed = {v.name: v for v in variants if v.result.get("ok_to_time")}
        recompile_rounds = H.RecompileRounds(list(timed))
        recompiles = recompile_rounds.counts
        steps_of_round = H.round_steps(timed_start, args.steps)

        fns = {name: (lambda i, v=v: v(schedule[i])) for name, v in timed.items()}
        gemv = GemvFloor.of_module(model, batch)
        fns[FLOOR] = lambda i: gemv()
        recompiles[FLOOR] = 0
        gemv()  # first call outside the timing, as the variants' warm-up calls
        dynamo_floor = None
        if any(name in timed for name in THROUGH_DYNAMO):
            dynamo_floor = DynamoFloor(model, init_k, init_v, gemv)
            for s in warm:  # Dynamo traces here; the second call shows it did not recompile
                dynamo_floor(s)
            fns[DYNAMO_FLOOR] = lambda i: dynamo_floor(schedule[i])
            recompiles[DYNAMO_FLOOR] = 0
        attention = None
        if args.decompose:
            attention = AttentionCalls(cfg, init_k, init_v, schedule)
            attention(schedule[0])  # first call outside the timing
            fns[ATTN] = lambda i: attention(schedule[i])
            fns[GEMV_ATTN] = lambda i: (gemv(), attention(schedule[i]))
            recompiles[ATTN] = recompiles[GEMV_ATTN] = 0
        bandwidth = [read_bandwidth(device, sync=sync)]
        t0 = time.perf_counter()
        rounds = H.interleaved_rounds(fns, steps_of_round, args.rounds, sync,
                                      before_round=recompile_rounds.before_round,
                                      after_round=recompile_rounds.after_round)
        floors = [name for name in (FLOOR, DYNAMO_FLOOR, ATTN, GEMV_ATTN) if name in fns]
        print(f"  timed {args.rounds} rounds x {args.steps} steps x {len(fns) - len(floors)} "
              f"variants and {len(floors)} floor row(s) ({', '.join(floors)}) in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        bandwidth.append(read_bandwidth(device, sync=sync))
        gemv_rounds = rounds.pop(FLOOR)
        recompiles.pop(FLOOR, None)
        dynamo_rounds = rounds.pop(DYNAMO_FLOOR, None)
        dynamo_recompiles = recompiles.pop(DYNAMO_FLOOR, None)
        decompose_rounds = {name: rounds.pop(name) for name in (ATTN, GEMV_ATTN) if name in rounds}
        for name in decompose_rounds:
            recompiles.pop(name, None)

        profile = None
        prof_name = next((n for n in ("torchair", "torchair-fx") if n in timed), None)
        if n_profile and prof_name:
            first = timed_start + args.rounds * args.steps
            prof = P.profile_steps(lambda i: timed[prof_name](schedule[i]),
                                   range(first, first + n_profile), sync)
            ops = P.op_table(prof, n_profile)
            profile = {"variant": prof_name, "steps": n_profile,
                       "method": "torch.profiler (CPU activity), key_averages() self CPU time "
                                 "over the profiled steps; each step has new lengths",
                       "ops": ops}

    eager_median = None
    if "eager" in rounds:
        eager_median = H.summarize(rounds["eager"])["median"]
    load = H.load_average()
    floor = _floor(schedule, timed_start, args, cfg, gemv, gemv_rounds, bandwidth,
                   torch.empty((), dtype=dtype).element_size())
    out: dict[str, Any] = {"batch": batch, "floor": floor, "variants": {}}
    if dynamo_rounds is not None:
        out["dynamo_floor"] = _dynamo_ceiling(dynamo_rounds, floor, eager_median,
                                              dynamo_recompiles, dynamo_floor.graph_inputs,
                                              rounds)
    if profile is not None:
        out["profile"] = profile
    for v in variants:
        res = dict(v.result)
        res.pop("ok_to_time", None)
        if v.name in rounds:
            stats = H.summarize(rounds[v.name])
            res["per_step_us"] = stats
            res["recompiles_timed"] = recompiles[v.name]
            if eager_median:
                res["speedup_vs_eager"] = eager_median / stats["median"]
                res["speedup_vs_eager_paired"] = H.paired_ratios(rounds["eager"],
                                                                 rounds[v.name])
            res["x_floor"] = x_floor(stats["median"], floor["floor_us"])
            res["x_floor_paired"] = _paired_x_floor(rounds[v.name], gemv_rounds,
                                                    floor["kv_us"])
        out["variants"][v.name] = res
    if decompose_rounds:
        medians = {name: res["per_step_us"]["median"] for name, res in out["variants"].items()
                   if name != "eager" and "per_step_us" in res}
        out["decomposition"] = _decomposition(decompose_rounds, floor, attention.describe,
                                              medians)
    out["load_average_after_timing"] = load
    return out


def _floor(schedule: list[StepInput], timed_start: int, args: argparse.Namespace,
           cfg: ModelConfig, gemv: GemvFloor, gemv_rounds: list[list[float]],
           bandwidth: list[dict[str, Any]], itemsize: int) -> dict[str, Any]:
    """The step's floor: median time of the weight GEMVs alone (timed with the variants) plus
    the mean KV bytes of a timed step at the read bandwidth (median of the calls before and
    after the timed rounds)."""
    timed = schedule[timed_start:timed_start + args.rounds * args.steps]
    kv_bytes = sum(kv_read_bytes(s.lens, cfg.kv_hidden, cfg.layers, itemsize)
                   for s in timed) / len(timed)
    samples = sorted(t for b in bandwidth for t in b["seconds"])
    gbps = bandwidth[0]["bytes"] / H.percentile(samples, 50) / 1e9
    gemv_stats = H.summarize(gemv_rounds)
    kv_us = kv_bytes / (gbps * 1e9) * 1e6
    return {
        "floor_us": floor_us(gemv_stats["median"], kv_bytes, gbps),
        "gemv_us": gemv_stats,
        "kv_us": kv_us,
        "kv_bytes_per_step": kv_bytes,
        "weight_bytes": gemv.weight_bytes,
        "read_bandwidth_gb_per_s": gbps,
        "read_bandwidth": {"method": bandwidth[0]["method"] + ", before and after the timed "
                                                               "rounds (median of both)",
                           "bytes": bandwidth[0]["bytes"],
                           "cache_bytes": bandwidth[0]["cache_bytes"],
                           "seconds": [t for b in bandwidth for t in b["seconds"]]},
        "gemvs": gemv.describe(),
        "method": (f"floor = median per-step time of the weight GEMVs alone ({FLOOR}: "
                   "the product a CPU static unit runs for each of the model's weight tensors "
                   "(torchair_native::gemv where units bind it, else F.linear) on a [batch, in] "
                   "input, timed interleaved with the variants) + mean KV bytes read per timed "
                   "step (K and V, lens[b] positions per sequence, every layer) / read "
                   "bandwidth"),
    }


def _dynamo_ceiling(rounds: list[list[float]], floor: dict[str, Any], eager_median: float | None,
                    recompiles: int, graph_inputs: int,
                    variant_rounds: dict[str, list[list[float]]]) -> dict[str, Any]:
    """The ``floor-gemv+dynamo`` row and what follows from it: Dynamo's per-call work (that row
    minus ``floor-gemv``, and, when both ran, ``torchair`` minus ``torchair-nodynamo`` paired
    per round), and the floor plus that work as a multiple of eager's step. An estimate, not a
    bound: the floor's GEMVs are called from Python, and a unit's GEMVs called from C++ can
    take less."""
    stats = H.summarize(rounds)
    dynamo_us = stats["median"] - floor["gemv_us"]["median"]
    out: dict[str, Any] = {
        "gemv_plus_dynamo_us": stats,
        "dynamo_us": dynamo_us,
        "floor_plus_dynamo_us": floor["floor_us"] + dynamo_us,
        "floor_plus_dynamo_speedup": (eager_median / (floor["floor_us"] + dynamo_us)
                                      if eager_median else None),
        "graph_inputs": graph_inputs,
        "recompiles_timed": recompiles,
        "method": (f"{DYNAMO_FLOOR} = per step, the weight GEMVs ({FLOOR}) then a copy of the "
                   "module called through torch.compile(dynamic=True, fullgraph=True) whose "
                   "backend returns its first result (Dynamo's frame evaluation, guards and "
                   f"argument gathering, with the caches the GEMVs evicted); dynamo_us = its "
                   f"median - the {FLOOR} median; floor_plus_dynamo_speedup = eager median / "
                   "(floor + dynamo_us)"),
    }
    with_dynamo, without = variant_rounds.get("torchair"), variant_rounds.get("torchair-nodynamo")
    if with_dynamo and without:
        diffs = sorted((H.percentile(sorted(a), 50) - H.percentile(sorted(b), 50)) * 1e6
                       for a, b in zip(with_dynamo, without) if a and b)
        out["torchair_minus_nodynamo_us"] = {
            "n_rounds": len(diffs), "median": H.percentile(diffs, 50),
            "p10": H.percentile(diffs, 10), "p90": H.percentile(diffs, 90),
            "method": "per round: torchair round median - torchair-nodynamo round median"}
    return out


def _decomposition(rounds: dict[str, list[list[float]]], floor: dict[str, Any], describe: str,
                   variant_medians: dict[str, float]) -> dict[str, Any]:
    """``--decompose``: where a step's time above the floor goes. ``attn-alone`` against the
    floor's KV term (the attention's own excess: its read speed against the floor's bandwidth);
    ``gemv+attn`` minus ``floor-gemv`` and ``attn-alone`` (what running both in one step costs:
    the GEMVs' weights and the KV windows evict each other from the caches, which neither
    floor row sees); each variant minus ``gemv+attn`` (the rest: the unit's other kernels, its
    launches, the call's own host work)."""
    attn = H.summarize(rounds[ATTN])
    both = H.summarize(rounds[GEMV_ATTN])
    gemv_us = floor["gemv_us"]["median"]
    return {
        "attention": describe,
        "attn_alone_us": attn,
        "attn_read_gb_per_s": floor["kv_bytes_per_step"] / (attn["median"] * 1e3),
        "attn_minus_kv_term_us": attn["median"] - floor["kv_us"],
        "gemv_attn_us": both,
        "together_minus_alone_us": both["median"] - gemv_us - attn["median"],
        "variant_minus_gemv_attn_us": {name: median - both["median"]
                                       for name, median in variant_medians.items()},
        "method": (f"{ATTN}: the step's attention calls alone ({describe}, one per layer, the "
                   f"step's lengths, copies of the initial caches); {GEMV_ATTN}: the weight "
                   f"GEMVs ({FLOOR}) then those calls; both timed interleaved with the variants. "
                   "attn_read_gb_per_s = mean KV bytes per step / attn-alone median; "
                   "together_minus_alone_us = gemv+attn - floor-gemv - attn-alone (medians); "
                   "variant_minus_gemv_attn_us = variant median - gemv+attn median"),
    }


def _paired_x_floor(variant_rounds: list[list[float]], gemv_rounds: list[list[float]],
                    kv_us: float) -> dict[str, Any]:
    """Per round: variant round median / (GEMV round median + KV time); median, p10, p90."""
    ratios = sorted(H.percentile(sorted(v), 50) * 1e6 / (H.percentile(sorted(g), 50) * 1e6
                                                           + kv_us)
                    for v, g in zip(variant_rounds, gemv_rounds) if v and g)
    return {"n_rounds": len(ratios), "median": H.percentile(ratios, 50),
            "p10": H.percentile(ratios, 10), "p90": H.percentile(ratios, 90)}


def report_dict(r: Any) -> dict[str, Any]:
    """One of ``torchair.graph_reports()`` as the JSON fields the decode-step benchmarks record."""
    return {"graph_id": r.graph_id, "path": r.path, "fx_static": r.fx_static,
            "ir_static": r.ir_static, "build_static": r.build_static, "engine": r.engine,
            "launch": r.launch, "build_seconds": r.build_seconds,
            "sunk_inputs": list(r.sunk_inputs), "reasons": list(r.reasons)}
