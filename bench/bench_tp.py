"""Tensor parallel decode step: TP=2 against TP=1 per-step latency on CPU (gloo).

The model is the benches' decoder step (:mod:`bench.model`: its ``DecoderStep``, weights and
inputs, as ``bench_decode_step`` times it), split Megatron-style for TP=2: q/k/v
column-parallel (each rank gets half the query heads and half the KV heads, contiguous, so GQA's
head grouping stays on one rank), o row-parallel + ``all_reduce``; gate/up column-parallel, down
row-parallel + ``all_reduce`` (two all_reduces per layer); each rank's KV caches hold its own KV
heads. Norms are replicated. TP=1 is the unsplit ``DecoderStep``; a shard (:class:`TPLayer`,
:class:`TPStep`) runs the same forward, its :meth:`TPLayer.all_reduce` being the real one.

The script starts its own 2-rank gloo world (``torch.multiprocessing`` spawn); every rank runs
with **one torch thread** (``torch.set_num_threads(1)``), so TP=1 uses one core and TP=2 one
core per rank. Variants, per TP size:

- ``eager``: the module called directly (``no_grad``). At TP=2 each all_reduce call is timed
  too (``perf_counter`` around it), which splits the step into time inside the collectives
  (the transfer + waiting for the other rank) and the rest (the rank's compute).
- ``torchair``: torchair path 4, as ``bench_decode_step``'s ``torchair`` variant:
  ``torch.compile(get_npu_backend(...), dynamic=True, fullgraph=True)``, tensors
  ``mark_static``, ``experimental_config.tiling_schedule_optimize`` (lengths sunk), default
  engine (Inductor). At TP=2 the all_reduces are in the graph (``--collective inplace``:
  ``dist.all_reduce`` after ``torchair.patch_for_hcom()``; ``functional``:
  ``_functional_collectives.all_reduce``).

Diagnostics timed in the same rounds: TP=1 ``eager-2threads`` (TP=1 eager with 2 torch threads
during its rounds: both cores used by intra-op parallelism instead of TP), and, at TP=2,
``allreduce-only`` (the step's ``2 x layers``
eager all_reduces of ``[B, 1, hidden]`` float32 and nothing else) and ``eager-noreduce`` (the
TP=2 shard's eager step with the all_reduces left out: the per-rank compute; its output is
wrong by design, so it is not checked).

Before timing, the TP=2 outputs and KV cache shards of ``--check-steps`` steps are compared with
the TP=1 eager ones (``allclose``, rtol = atol = 1e-4), on both ranks; TP=1 torchair too.

Timing: rounds interleaved over all variants in balanced orders (the same on both ranks), a
barrier before each variant's round; each rank times each call (``time.perf_counter``). TP=2
per-step time = **max over the two ranks** of the same step (rank 0 alone is in the JSON too);
TP=1 variants run on rank 0 while rank 1 waits in the barrier. Nothing about speed is asserted.

    python -m bench.bench_tp --quick          # tiny model, < 1 minute on 2 CPU cores
    python -m bench.bench_tp                  # decode_step's defaults: batch 1 and 8, 2 layers
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

import torchair
from bench import _harness as H
from bench._decode_variants import Variant, make_variant, reset_caches
from bench.model import DecoderLayer, DecoderStep, ModelConfig, make_schedule
from torchair.demo.roofline import balanced_orders

TP = 2
VARIANTS = (  # (tp, name): all of them in every round, in balanced orders
    (1, "eager"), (1, "torchair"), (1, "eager-2threads"), (2, "eager"), (2, "torchair"),
    (2, "allreduce-only"), (2, "eager-noreduce"))


# ------------------------------------------------------------------------------ TP model

class TPLayer(DecoderLayer):
    """One ``DecoderLayer`` shard of rank ``rank`` of ``tp``: its forward with ``1/tp`` of the
    heads / MLP columns and a real :meth:`all_reduce` after the row-parallel o and down
    projections."""

    def __init__(self, full: DecoderLayer, rank: int, tp: int, collective: str,
                 reduce: bool = True, timer: list | None = None) -> None:
        # not DecoderLayer.__init__, which draws new random weights: the shard takes full's
        torch.nn.Module.__init__(self)
        cfg = self.cfg = full.cfg
        self.timer = timer  # eager only: wall seconds of each all_reduce call appended here
        self.heads, self.kv_heads = cfg.heads // tp, cfg.kv_heads // tp
        self.collective, self.reduce = collective, reduce
        qh, kvh, ih = cfg.hidden // tp, cfg.kv_hidden // tp, cfg.intermediate // tp

        def col(lin: torch.nn.Linear, n: int) -> torch.nn.Linear:  # output rows of this rank
            w = lin.weight[rank * n:(rank + 1) * n]
            out = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
            out.weight = torch.nn.Parameter(w.clone(), requires_grad=False)
            return out

        def row(lin: torch.nn.Linear, n: int) -> torch.nn.Linear:  # input columns of this rank
            w = lin.weight[:, rank * n:(rank + 1) * n]
            out = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
            out.weight = torch.nn.Parameter(w.clone(), requires_grad=False)
            return out

        self.attn_norm, self.mlp_norm = full.attn_norm, full.mlp_norm
        self.q, self.k, self.v = col(full.q, qh), col(full.k, kvh), col(full.v, kvh)
        self.o = row(full.o, qh)
        self.gate, self.up = col(full.gate, ih), col(full.up, ih)
        self.down = row(full.down, ih)

    def all_reduce(self, y: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist
        if not self.reduce:
            return y
        if self.timer is not None:  # eager diagnostic: time inside the call (incl. peer wait)
            t0 = time.perf_counter()
            if self.collective == "functional":
                import torch.distributed._functional_collectives as fc
                y = fc.all_reduce(y, "sum", dist.group.WORLD).wait()
            else:
                dist.all_reduce(y)
            self.timer.append(time.perf_counter() - t0)
            return y
        if self.collective == "functional":
            import torch.distributed._functional_collectives as fc
            return fc.all_reduce(y, "sum", dist.group.WORLD)
        dist.all_reduce(y)
        return y


class TPStep(DecoderStep):
    """Rank ``rank``'s shard of ``full``: its layers' :class:`TPLayer` shards, the same final
    norm; :class:`~bench.model.DecoderStep`'s forward."""

    def __init__(self, full: DecoderStep, rank: int, tp: int, collective: str,
                 reduce: bool = True, timer: list | None = None) -> None:
        torch.nn.Module.__init__(self)  # not DecoderStep.__init__: no new random weights
        self.layers = torch.nn.ModuleList(TPLayer(layer, rank, tp, collective, reduce, timer)
                                          for layer in full.layers)
        self.norm = full.norm


def shard_cache(t: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    """This rank's KV heads of a ``[B, S, kv_hidden]`` (BSH) cache."""
    n = t.shape[-1] // tp
    return t[..., rank * n:(rank + 1) * n].clone()


# ------------------------------------------------------------------------------ one rank

def _report_dict(r) -> dict[str, Any]:
    return {"graph_id": r.graph_id, "path": r.path, "build_static": r.build_static,
            "engine": r.engine, "launch": r.launch, "collectives": r.collectives,
            "sunk_inputs": r.sunk_inputs}


def run_batch(args, cfg: ModelConfig, batch: int, rank: int) -> dict[str, Any]:
    import torch.distributed as dist

    torch._dynamo.reset()
    torch.manual_seed(args.seed)
    full = DecoderStep(cfg).eval()
    for p in full.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(args.seed + 1)
    init_k = [torch.randn(batch, cfg.capacity, cfg.kv_hidden, generator=gen)
              for _ in range(cfg.layers)]
    init_v = [torch.randn(batch, cfg.capacity, cfg.kv_hidden, generator=gen)
              for _ in range(cfg.layers)]
    n_warm = 2
    n_calls = n_warm + args.check_steps + args.rounds * args.steps
    schedule = make_schedule(cfg, batch, n_calls, "cpu", torch.float32, args.seed + batch)
    for s in schedule:
        torch._dynamo.mark_static(s.x)
        torch._dynamo.mark_static(s.pos)
    warm, check = schedule[:n_warm], schedule[n_warm:n_warm + args.check_steps]
    timed_start = n_warm + args.check_steps

    shard_k = [shard_cache(t, rank, TP) for t in init_k]
    shard_v = [shard_cache(t, rank, TP) for t in init_v]
    tp_model = TPStep(full, rank, TP, args.collective).eval()
    noreduce = TPStep(full, rank, TP, args.collective, reduce=False).eval()
    ar_times: list[float] = []  # the eager TP=2 step's all_reduce calls, timed
    tp_eager = TPStep(full, rank, TP, args.collective, timer=ar_times).eval()
    models = {1: full, 2: tp_model}
    inits = {1: (init_k, init_v), 2: (shard_k, shard_v)}
    if rank == 0:
        print(f"\n== batch {batch}: {cfg.layers} layers, hidden {cfg.hidden}, heads {cfg.heads}/"
              f"{cfg.kv_heads} kv (TP=2: {cfg.heads // TP}/{cfg.kv_heads // TP} per rank), head "
              f"dim {cfg.head_dim}, MLP {cfg.intermediate}, KV capacity {cfg.capacity}",
              flush=True)

    variants: dict[tuple[int, str], Variant] = {}
    results: dict[str, dict[str, Any]] = {}
    ref_out: list[torch.Tensor] = []
    ref_caches: list[torch.Tensor] = []
    with torch.no_grad():
        for tp, name in VARIANTS:
            key = f"tp{tp}/{name}"
            res = results.setdefault(key, {"tp": tp, "variant": name})
            if name == "allreduce-only":
                y = torch.randn(batch, 1, cfg.hidden)
                n_ar = 2 * cfg.layers

                def allreduce_only(step, y=y, n_ar=n_ar):
                    for _ in range(n_ar):
                        dist.all_reduce(y)

                variants[(tp, name)] = allreduce_only
                res["describe"] = (f"{n_ar} eager dist.all_reduce of [{batch}, 1, {cfg.hidden}] "
                                   "float32 per step (the TP=2 step's collectives alone)")
                allreduce_only(None)
                continue
            model = (noreduce if name == "eager-noreduce" else
                     tp_eager if (tp, name) == (2, "eager") else models[tp])
            k0, v0 = inits[tp]
            v = make_variant("torchair" if name == "torchair" else "eager", model, k0, v0)
            res["describe"] = v.describe + {
                "eager-noreduce": " [TP=2 shard, all_reduces left out: per-rank compute, "
                                  "output not checked]",
                "eager-2threads": " with 2 torch threads (both cores, as TP=2 uses) during its "
                                  "rounds"}.get(name, "")
            reports0 = len(torchair.graph_reports())
            t0 = time.perf_counter()
            v(warm[0])
            res["first_call_s"] = time.perf_counter() - t0
            v(warm[1])
            reports = torchair.graph_reports()[reports0:]
            if reports:
                res["torchair_reports"] = [_report_dict(r) for r in reports]
            reset_caches(v, k0, v0)
            if name != "eager-noreduce":
                outs = [v(s).clone() for s in check]
                caches = v.k_caches + v.v_caches
                if (tp, name) == (1, "eager"):
                    ref_out, ref_caches = outs, [c.clone() for c in caches]
                    res["check"] = "reference"
                else:
                    want = ref_caches if tp == 1 else [shard_cache(c, rank, TP)
                                                       for c in ref_caches]
                    ok = (all(torch.allclose(o, r, rtol=1e-4, atol=1e-4)
                              for o, r in zip(outs, ref_out))
                          and all(torch.allclose(c, r, rtol=1e-4, atol=1e-4)
                                  for c, r in zip(caches, want)))
                    err = max((o - r).abs().max().item() for o, r in zip(outs, ref_out))
                    res.update(check="ok" if ok else "MISMATCH", max_abs_err=err)
                reset_caches(v, k0, v0)
            variants[(tp, name)] = v

        # ---- timing: interleaved rounds, balanced orders, barrier before each variant's round
        per_step: dict[str, list[list[float]]] = {f"tp{tp}/{n}": [] for tp, n in VARIANTS}
        perf = time.perf_counter
        in_ar: list[list[float]] = []
        orders = balanced_orders(len(VARIANTS))
        for r in range(args.rounds):
            steps = schedule[timed_start + r * args.steps:timed_start + (r + 1) * args.steps]
            for k in orders[r % len(orders)]:
                tp, name = VARIANTS[k]
                fn = variants[(tp, name)]
                dist.barrier()
                if tp == 1 and rank != 0:
                    continue  # TP=1 runs on rank 0 alone; this rank waits at the next barrier
                if name == "eager-2threads":
                    torch.set_num_threads(2)
                times = []
                ar_times.clear()
                for s in steps:
                    t0 = perf()
                    fn(s)
                    times.append(perf() - t0)
                per_step[f"tp{tp}/{name}"].append(times)
                torch.set_num_threads(1)
                if (tp, name) == (2, "eager"):  # seconds inside the step's all_reduces
                    n = len(ar_times) // len(steps)
                    in_ar.append([sum(ar_times[i * n:(i + 1) * n]) for i in range(len(steps))])
        dist.barrier()
    for key in per_step:
        results[key]["rounds"] = per_step[key]
    results["tp2/eager"]["in_allreduce_rounds"] = in_ar
    return results


def worker(rank: int, world: int, port: int, args_dict: dict, out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.simplefilter("ignore")
    args = argparse.Namespace(**args_dict)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.pg_timeout))
    try:
        if args.collective == "inplace":
            torchair.patch_for_hcom()
        cfg = ModelConfig(args.layers, args.hidden, args.heads, args.kv_heads,
                          args.intermediate, args.capacity)
        info = H.machine_info("cpu")
        out = {"rank": rank, "machine": info, "batches": []}
        for batch in args.batch:
            out["batches"].append({"batch": batch, "results": run_batch(args, cfg, batch, rank)})
    except Exception:  # noqa: BLE001 - reported by the parent
        out = {"rank": rank, "error": traceback.format_exc()[-4000:]}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()


# ------------------------------------------------------------------------------ parent

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _combine(r0: dict, r1: dict, key: str) -> list[list[float]]:
    """Per-step max over the ranks (TP=2), rank 0's rounds (TP=1)."""
    a = r0[key]["rounds"]
    if r0[key]["tp"] == 1:
        return a
    b = r1[key]["rounds"]
    return [[max(x, y) for x, y in zip(ra, rb)] for ra, rb in zip(a, b)]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, nargs="+", default=None, help="batch sizes (default 1 8)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per round (default 10)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 30)")
    p.add_argument("--check-steps", type=int, default=None, help="checked steps (default 3)")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default 2)")
    p.add_argument("--hidden", type=int, default=None, help="hidden size (default 512)")
    p.add_argument("--heads", type=int, default=None, help="query heads (default 8)")
    p.add_argument("--kv-heads", type=int, default=None, help="kv heads (default 2)")
    p.add_argument("--intermediate", type=int, default=None, help="MLP size (default 3*hidden)")
    p.add_argument("--capacity", type=int, default=None, help="KV positions (default 1024)")
    p.add_argument("--collective", choices=("inplace", "functional"), default="inplace",
                   help="dist.all_reduce after patch_for_hcom (default) or the functional one")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pg-timeout", type=int, default=60, help="process group timeout, s")
    p.add_argument("--timeout", type=int, default=None,
                   help="seconds for the whole 2-rank run (default 600; 170 with --quick)")
    p.add_argument("--quick", action="store_true", help="tiny model, few steps (< 1 minute)")
    p.add_argument("--out", default=None,
                   help="JSON path (default bench/results/tp_<machine-tag>[_quick].json)")
    args = p.parse_args(argv)
    full = dict(batch=[1, 8], steps=10, rounds=30, check_steps=3, layers=2, hidden=512,
                heads=8, kv_heads=2, intermediate=None, capacity=1024, timeout=600)
    quick = dict(batch=[2], steps=4, rounds=3, check_steps=2, layers=1, hidden=64, heads=4,
                 kv_heads=2, intermediate=128, capacity=64, timeout=170)
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.intermediate is None:
        args.intermediate = 3 * args.hidden
    if args.heads % TP or args.kv_heads % TP or args.intermediate % TP:
        p.error(f"heads, kv heads and intermediate must divide by {TP}")
    return args


def main(argv: list[str] | None = None) -> int:
    import torch.multiprocessing as mp

    args = parse_args(argv)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.start_processes(worker, args=(TP, _free_port(), vars(args), tmp), nprocs=TP,
                                 join=False, start_method="spawn")
        failed = None
        try:
            while not ctx.join(timeout=2):
                if time.perf_counter() - start > args.timeout:
                    failed = f"the {TP}-rank run did not finish in {args.timeout} s"
                    break
        except Exception as exc:  # noqa: BLE001 - a rank died
            failed = f"{type(exc).__name__}: {exc}"
        for proc in ctx.processes:
            if proc.is_alive():
                proc.kill()
        ranks = []
        for r in range(TP):
            path = Path(tmp) / f"rank{r}.json"
            ranks.append(json.loads(path.read_text()) if path.exists() else
                         {"error": "no result"})
    for r, res in enumerate(ranks):
        if "error" in res:
            print(f"rank {r} failed:\n{res['error']}", file=sys.stderr)
            failed = failed or f"rank {r} failed"
    if failed:
        print(f"FAILED: {failed}", file=sys.stderr)
        return 1

    info = ranks[0]["machine"]
    tag = H.machine_tag(info)
    print(H.format_machine(info))
    print(f"world    : {TP} gloo ranks on this machine, 1 torch thread per rank (eager-2threads: 2); TP=1 runs on "
          f"rank 0 (one core), TP=2 on both; collectives: {args.collective}")
    headers = ["batch", "TP", "variant", "median us", "p10", "p90", "speedup vs eager TP=1",
               "paired", "check", "first call s"]
    rows, batches = [], []
    for b0, b1 in zip(ranks[0]["batches"], ranks[1]["batches"]):
        r0, r1 = b0["results"], b1["results"]
        base = _combine(r0, r1, "tp1/eager")
        base_median = H.summarize(base)["median"]
        out = {"batch": b0["batch"], "variants": {}}
        for tp, name in VARIANTS:
            key = f"tp{tp}/{name}"
            rounds = _combine(r0, r1, key)
            stats = H.summarize(rounds)
            entry = {k: v for k, v in r0[key].items() if k != "rounds"}
            entry["per_step_us"] = stats
            if tp == 2:
                entry["per_step_us_rank0"] = H.summarize(r0[key]["rounds"])
                entry["per_step_us_rank1"] = H.summarize(r1[key]["rounds"])
                entry["check_rank1"] = r1[key].get("check")
                if r0[key].get("check") in ("ok", "MISMATCH"):
                    entry["check"] = ("ok" if r0[key]["check"] == r1[key]["check"] == "ok"
                                      else "MISMATCH")
            entry["speedup_vs_eager_tp1"] = base_median / stats["median"]
            entry["speedup_vs_eager_tp1_paired"] = H.paired_ratios(base, rounds)
            if key == "tp2/eager":
                entry.pop("in_allreduce_rounds", None)
                for rk, rr in ((0, r0), (1, r1)):
                    inside = H.summarize(rr[key]["in_allreduce_rounds"])
                    outside = H.summarize([[t - a for t, a in zip(ts, ars)] for ts, ars in
                                           zip(rr[key]["rounds"], rr[key]["in_allreduce_rounds"])])
                    entry[f"breakdown_rank{rk}"] = {"in_allreduce_us": inside,
                                                    "outside_allreduce_us": outside}
            out["variants"][key] = entry
            rows.append([b0["batch"], tp, name, stats["median"], stats["p10"], stats["p90"],
                         entry["speedup_vs_eager_tp1"],
                         entry["speedup_vs_eager_tp1_paired"]["median"],
                         entry.get("check", "-"), entry.get("first_call_s")])
        batches.append(out)
    print("\nper-step latency, us (median, p10, p90 over all timed steps of all rounds); TP=2: "
          "per step the max over the 2 ranks; speedup = TP=1 eager median / row median, "
          "measured side by side in this run; paired = median over rounds of the same ratio")
    print(H.format_table(headers, rows))
    for b in batches:
        rep = b["variants"]["tp2/torchair"].get("torchair_reports", [])
        for r in rep:
            print(f"  batch {b['batch']} TP=2 torchair graph: path {r['path']}, build "
                  f"{'static' if r['build_static'] else 'dynamic'}, {r['engine']} engine, "
                  f"{r['collectives']}")
    print("\nTP=2 eager step split per rank (per-step medians, us): time inside its "
          f"{2 * args.layers} all_reduce calls (the collective + waiting for the peer) | the rest "
          "(the rank's compute)")
    for b in batches:
        e = b["variants"]["tp2/eager"]
        ar = b["variants"]["tp2/allreduce-only"]["per_step_us"]["median"]
        parts = [f"rank {rk}: {e[f'breakdown_rank{rk}']['in_allreduce_us']['median']:.0f} | "
                 f"{e[f'breakdown_rank{rk}']['outside_allreduce_us']['median']:.0f}"
                 for rk in (0, 1)]
        print(f"  batch {b['batch']}: " + ";  ".join(parts) + f"   (allreduce-only: {ar:.0f})")
    print("\nvariants:")
    for tp, name in VARIANTS:
        print(f"  TP={tp} {name:15s} {batches[0]['variants'][f'tp{tp}/{name}']['describe']}")
    payload = {
        "benchmark": "tp",
        "command": H.command_line(),
        "machine": info,
        "machine_tag": tag,
        "config": {"layers": args.layers, "hidden": args.hidden, "heads": args.heads,
                   "kv_heads": args.kv_heads, "intermediate": args.intermediate,
                   "capacity": args.capacity, "dtype": "float32", "device": "cpu",
                   "batches": args.batch, "steps_per_round": args.steps, "rounds": args.rounds,
                   "check_steps": args.check_steps, "collective": args.collective,
                   "tp": [1, TP], "torch_threads_per_rank": 1, "backend": "gloo",
                   "quick": args.quick, "seed": args.seed},
        "method": ("2 spawned gloo ranks, 1 torch thread each; per-call time.perf_counter on "
                   "each rank; variants interleaved in rounds, balanced orders, and a barrier "
                   "before each variant's round; TP=2 per-step time = max over ranks of the "
                   "same step (per-rank statistics also saved); TP=1 on rank 0 while rank 1 "
                   "waits in the barrier; every call uses new actual_seq_lengths; units us"),
        "results": batches,
        "load_average_at_end": H.load_average(),
        "total_runtime_s": time.perf_counter() - start,
    }
    H.save_results("tp", tag, payload, quick=args.quick, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
