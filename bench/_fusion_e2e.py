"""Part 2 of the fusion benchmark, end to end: one decode step of the W8A8 decoder
(:mod:`bench._fusion_w8a8`) as ``eager``, ``eager-fused`` and torchair path 4 with the fusion pass
on and off, each checked against its eager reference (and the patterns each compile fired
recorded) before all are timed in interleaved rounds; plus the table :mod:`bench.bench_fusion`
prints.

Split out of :mod:`bench.bench_fusion`, whose docstring describes the measurement.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch
import torch._dynamo

import torchair  # (registers torch.ops.npu.*)
from bench import _harness as H
from bench._fusion_ops import DTYPES, PATTERN_KEY
from bench._fusion_w8a8 import StepInput, W8A8Step, make_schedule
from bench.model import ModelConfig
from torchair.patterns import add_rms_norm as P


@dataclasses.dataclass
class Variant:
    name: str
    describe: str
    compiled: Callable
    k_caches: list[torch.Tensor]
    v_caches: list[torch.Tensor]
    fusion: bool | None = None  # None: eager
    reference: str = "eager"  # the eager variant its outputs must match
    result: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __call__(self, s: StepInput) -> torch.Tensor:
        return self.compiled(s.res, s.h, s.pos, s.lens, self.k_caches, self.v_caches)


def make_variant(name: str, model: W8A8Step, fused_model: W8A8Step, init_k, init_v
                 ) -> Variant:
    k_caches = [t.clone() for t in init_k]
    v_caches = [t.clone() for t in init_v]
    for t in k_caches + v_caches:
        torch._dynamo.mark_static(t)
    if name == "eager":
        return Variant(name, "the module called directly (unfused chains)", model, k_caches,
                       v_caches)
    if name == "eager-fused":
        return Variant(name, "the same weights, the fused ops called by hand, eager", fused_model,
                       k_caches, v_caches, reference=name)
    engine, fusion = name.split("-")[1], name.endswith("-on")
    cfg = torchair.CompilerConfig()
    cfg.experimental_config.tiling_schedule_optimize = True
    cfg.experimental_config.pattern_fusion_pass = fusion
    cfg.debug.run_eagerly = engine == "fx"
    compiled = torch.compile(model, backend=torchair.get_npu_backend(compiler_config=cfg),
                             dynamic=True, fullgraph=True)
    describe = (f"torchair path 4 (dynamic=True + mark_static + tiling_schedule_optimize), "
                f"{'FX engine (debug.run_eagerly)' if engine == 'fx' else 'Inductor engine'}, "
                f"pattern_fusion_pass={fusion}")
    return Variant(name, describe, compiled, k_caches, v_caches, fusion,
                   "eager-fused" if fusion else "eager")


def _reset(v: Variant, init_k, init_v) -> None:
    with torch.no_grad():
        for dst, src in zip(v.k_caches + v.v_caches, init_k + init_v):
            dst.copy_(src)


def _rel_err(outs: list[torch.Tensor], refs: list[torch.Tensor]) -> float:
    return max(((o - r).norm() / r.norm()).item() for o, r in zip(outs, refs))


def _check_step(outs, caches, ref, rtol: float, atol: float) -> dict[str, Any]:
    """Outputs and final KV caches of the check steps vs a reference variant's."""
    ref_out, ref_caches = ref
    ok = (all(torch.allclose(o, r, rtol=rtol, atol=atol) for o, r in zip(outs, ref_out))
          and all(torch.allclose(c.float(), r.float(), rtol=rtol, atol=atol)
                  for c, r in zip(caches, ref_caches)))
    return {"check": "ok" if ok else "MISMATCH",
            "max_abs_err": max((o - r).abs().max().item() for o, r in zip(outs, ref_out)),
            "cache_max_abs_err": max((c.float() - r.float()).abs().max().item()
                                     for c, r in zip(caches, ref_caches)),
            "bitwise_equal": all(torch.equal(o, r) for o, r in zip(outs, ref_out))
            and all(torch.equal(c, r) for c, r in zip(caches, ref_caches)),
            "rtol": rtol, "atol": atol}


def expected_patterns(cfg: ModelConfig) -> dict[str, int]:
    return {P.SMOOTH: cfg.layers, P.FLATTEN: cfg.layers, P.CAST: 1}


def run_e2e_batch(args: argparse.Namespace, cfg: ModelConfig, batch: int, device: str,
                  dtype: torch.dtype) -> dict[str, Any]:
    torch._dynamo.reset()
    sync = H.synchronizer(device)
    model = W8A8Step(cfg, dtype, args.seed).to(device).eval()
    fused_model = W8A8Step(cfg, dtype, args.seed, fused=True).to(device).eval()  # same weights
    gen = torch.Generator().manual_seed(args.seed + 1)
    init_k = [torch.randn(batch, cfg.capacity, cfg.kv_hidden, generator=gen)
              .to(device=device, dtype=dtype) for _ in range(cfg.layers)]
    init_v = [torch.randn(batch, cfg.capacity, cfg.kv_hidden, generator=gen)
              .to(device=device, dtype=dtype) for _ in range(cfg.layers)]
    n_warm = 2
    n_calls = n_warm + args.check_steps + args.e2e_rounds * args.steps
    schedule = make_schedule(cfg, batch, n_calls, device, dtype, args.seed + batch)
    for s in schedule:
        for t in (s.res, s.h, s.pos):
            torch._dynamo.mark_static(t)
    warm, check = schedule[:n_warm], schedule[n_warm:n_warm + args.check_steps]
    timed_start = n_warm + args.check_steps
    names = ["eager", "eager-fused"] + [f"torchair-{e}-{f}" for e in args.engine
                                        for f in ("on", "off")]
    variants = [make_variant(n, model, fused_model, init_k, init_v) for n in names]
    rtol = atol = 2e-2
    print(f"\n== e2e batch {batch}: {cfg.layers} W8A8 layers, hidden {cfg.hidden}, heads "
          f"{cfg.heads}/{cfg.kv_heads} kv (head dim {cfg.head_dim}), MLP {cfg.intermediate}, KV "
          f"capacity {cfg.capacity}, {dtype}, {device}", flush=True)
    refs: dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    with torch.no_grad():
        for v in variants:
            res = v.result
            res["describe"] = v.describe
            try:
                g0, r0 = H.unique_graphs(), len(torchair.graph_reports())
                sync()
                t0 = time.perf_counter()
                v(warm[0])
                sync()
                res["first_call_s"] = time.perf_counter() - t0
                v(warm[1])
                res["graphs_compiled"] = H.unique_graphs() - g0
                reports = torchair.graph_reports()[r0:]
                if v.fusion is not None:
                    fired: dict[str, int] = {}
                    for rep in reports:
                        for k, n in rep.patterns.items():
                            fired[k] = fired.get(k, 0) + n
                    res["patterns"] = fired
                    res["reports"] = [{"graph_id": r.graph_id, "path": r.path,
                                       "build_static": r.build_static, "engine": r.engine,
                                       "launch": r.launch, "patterns": dict(r.patterns)}
                                      for r in reports]
                    want = expected_patterns(cfg) if v.fusion else {}
                    res["patterns_as_expected"] = fired == want
                _reset(v, init_k, init_v)
                outs = [v(s).clone() for s in check]
                sync()
                caches = [c.clone() for c in v.k_caches + v.v_caches]
                if v.fusion is None:
                    refs[v.name] = (outs, caches)
                if v.fusion is None:
                    res["check"] = "reference"
                else:
                    res.update(_check_step(outs, caches, refs[v.reference], rtol, atol),
                               reference=v.reference)
                # the fusion's numerics: the unfused eager model as the baseline
                res["rel_l2_err_vs_unfused_eager"] = _rel_err(outs, refs["eager"][0])
                _reset(v, init_k, init_v)
                res["ok_to_time"] = True
            except Exception as exc:  # noqa: BLE001 - record and go on
                H.record_failure(res, v.name, exc)
                continue
            pats = ", ".join(f"{PATTERN_KEY[k]} x{n}" for k, n in
                             res.get("patterns", {}).items()) or "none"
            print(f"  {v.name:20s} first call {res['first_call_s']:6.2f} s, graphs "
                  f"{res['graphs_compiled']}, check {res['check']}"
                  + (f" vs {v.reference} (max err {res['max_abs_err']:.1e}, rel err vs unfused "
                     f"eager {res['rel_l2_err_vs_unfused_eager']:.1e})"
                     if "max_abs_err" in res else "")
                  + (f", patterns fired: {pats}" if v.fusion is not None else ""), flush=True)

        timed = {v.name: v for v in variants if v.result.get("ok_to_time")}
        recompile_rounds = H.RecompileRounds(list(timed))
        recompiles = recompile_rounds.counts
        steps_of_round = H.round_steps(timed_start, args.steps)

        fns = {name: (lambda i, v=v: v(schedule[i])) for name, v in timed.items()}
        t0 = time.perf_counter()
        rounds = H.interleaved_rounds(fns, steps_of_round, args.e2e_rounds, sync,
                                      before_round=recompile_rounds.before_round,
                                      after_round=recompile_rounds.after_round)
        print(f"  timed {args.e2e_rounds} rounds x {args.steps} steps x {len(fns)} variants in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)

    out: dict[str, Any] = {"batch": batch, "variants": {}, "fusion_speedup": {}}
    for v in variants:
        res = dict(v.result)
        res.pop("ok_to_time", None)
        if v.name in rounds:
            res["per_step_us"] = H.summarize(rounds[v.name])
            res["recompiles_timed"] = recompiles[v.name]
            if "eager" in rounds:
                res["speedup_vs_eager_paired"] = H.paired_ratios(rounds["eager"],
                                                                 rounds[v.name])
        out["variants"][v.name] = res
    pairs = {"eager": ("eager-fused", "eager")}
    pairs.update({e: (f"torchair-{e}-on", f"torchair-{e}-off") for e in args.engine})
    for engine, (on, off) in pairs.items():
        if on in rounds and off in rounds:
            out["fusion_speedup"][engine] = {
                "ratio_of_medians": (H.summarize(rounds[off])["median"]
                                     / H.summarize(rounds[on])["median"]),
                "paired": H.paired_ratios(rounds[off], rounds[on])}
    out["load_average_after_timing"] = H.load_average()
    return out


def run_e2e(device: str, args: argparse.Namespace) -> dict[str, Any]:
    dtype = DTYPES[args.dtype]
    if dtype == torch.float32:  # npu_quant_matmul has no float32 output
        dtype = torch.bfloat16
    hidden = args.model_hidden or (2048 if device == "cpu" else 4096)
    heads = args.heads or max(1, hidden // 128)
    inter = args.intermediate or 256 * round(2.75 * hidden / 256)
    cfg = ModelConfig(layers=args.layers, hidden=hidden, heads=heads, kv_heads=args.kv_heads,
                      intermediate=inter, capacity=args.capacity)
    if cfg.hidden % cfg.heads or cfg.heads % cfg.kv_heads:
        raise SystemExit("--model-hidden must be a multiple of --heads, and --heads of "
                         "--kv-heads")
    batches = [run_e2e_batch(args, cfg, b, device, dtype) for b in args.batch]
    return {"config": {**dataclasses.asdict(cfg), "head_dim": cfg.head_dim,
                       "dtype": str(dtype).replace("torch.", ""), "engines": args.engine,
                       "steps_per_round": args.steps, "rounds": args.e2e_rounds,
                       "check_steps": args.check_steps,
                       "expected_patterns_fusion_on": expected_patterns(cfg)},
            "results": batches}


def e2e_table(e2e: dict) -> str:
    rows = []
    for b in e2e["results"]:
        for name, res in b["variants"].items():
            stats = res.get("per_step_us", {})
            pats = res.get("patterns")
            pat_text = None if pats is None else (
                " ".join(sorted(f"{PATTERN_KEY[k]}x{n}" for k, n in pats.items())) or "none")
            if pats is not None and not res.get("patterns_as_expected"):
                pat_text += " (UNEXPECTED)"
            check = res.get("check", "error" if "error" in res else None)
            if res.get("check") not in (None, "reference"):
                check += f" vs {res['reference']}" + (" (==)" if res["bitwise_equal"] else "")
            fusion = None
            if name.endswith("-on") or name == "eager-fused":
                key = "eager" if name == "eager-fused" else name.split("-")[1]
                fusion = b["fusion_speedup"].get(key, {}).get("paired", {}).get("median")
            rel = res.get("rel_l2_err_vs_unfused_eager")
            rows.append([b["batch"], name, res.get("first_call_s"), check,
                         None if rel is None else f"{rel:.1e}", pat_text, stats.get("median"),
                         stats.get("p10"), stats.get("p90"),
                         res.get("speedup_vs_eager_paired", {}).get("median"), fusion])
    return H.format_table(["batch", "variant", "first call s", "check", "rel err",
                           "patterns fired", "median us", "p10 us", "p90 us", "vs eager",
                           "fusion x"], rows)

