"""``torchair demo --tp N``: the demo's decoder split Megatron-style over N ranks.

The parent process checks the arguments, then starts N ranks with ``torch.distributed.run``
(standalone rendezvous on a free port, as ``torchair run --nproc-per-node N``), each one
``python -m torchair demo ARGS --tp-worker RESULT``. Every rank joins a gloo (CPU) or NCCL (CUDA)
process group (timeout ``$TORCHAIR_DIST_TIMEOUT`` s, default 300), builds the full seeded decoder
(the same seed as ``--tp 1``) and keeps its shard (:func:`torchair.demo.model.shard`). Rank 0 first
generates the reference tokens with the full, unsharded decoder eagerly (TP=1); then every rank
generates with the eager shard and the compiled shard side by side (the row-parallel all-reduces
inside the compiled graph). Rank 0 gathers every rank's tokens and timings, prints the table
(latency: the max over ranks of each rank's median) and writes the verdict to RESULT; the parent
exits 0 only when the compiled tokens equal eager TP's, TP=1's, and all ranks agree.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, NoReturn

import torch
import torch.distributed as dist

import torchair
from torchair.demo import serve_tp, step
from torchair.demo._progress import Bar
from torchair.demo.model import Decoder, DemoConfig, PagedKVCache, shard
from torchair.demo.roofline import read_bandwidth, x_floor

__all__ = ["launch", "worker"]


def launch(args, argv: list[str]) -> int:
    """Start ``args.tp`` ranks of this demo (``argv`` plus the resolved device and engine) and
    return 0 when rank 0 reports equal tokens, 1 otherwise (a failed rank included)."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    with tempfile.TemporaryDirectory(prefix="torchair-demo-tp-") as tmp:
        result = os.path.join(tmp, "result.json")
        ranks = [*argv, "--device", args.device, "--tp-worker", result]
        if not args.engine_defaulted:
            ranks += ["--engine", args.engine]
        try:
            torchrun.main(["--nproc-per-node", str(args.tp), "--standalone",
                           "--module", "torchair", "demo", *ranks])
        except ChildFailedError as err:
            print(f"torchair demo: a rank failed: {err}", file=sys.stderr)
            return 1
        try:
            with open(result, encoding="utf-8") as f:
                ok = json.load(f)["ok"]
        except (OSError, ValueError, KeyError):
            print("torchair demo: rank 0 wrote no result", file=sys.stderr)
            return 1
    return 0 if ok else 1


def _reference(args, cfg: DemoConfig, model: Decoder, batch: int) -> tuple[torch.Tensor, float]:
    """TP=1: the full decoder's tokens (eager, prefill then ``args.steps`` greedy tokens, the
    demo's prompt and block table for ``batch``) and its median step time."""
    cache = PagedKVCache(cfg, max(args.batch), args.device, model.embed.dtype, args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1000 + batch)
    prompt = torch.randint(0, cfg.vocab, (batch, args.prompt_len), generator=gen).to(args.device)
    run = step.Run(cache, cache.reset(batch), prompt[:, :1])
    for p in range(args.prompt_len):
        run.token = prompt[:, p:p + 1]
        out = model(*step.step_inputs(run, p, batch, args.device))
    run.token = out
    for i in range(args.steps):
        out, seconds = step.timed(model, step.step_inputs(run, args.prompt_len + i, batch,
                                                       args.device), args.sync)
        if i > 0:
            run.seconds.append(seconds)
        run.token = out
        run.tokens.append(out.clone())
    return torch.cat(run.tokens, dim=1).cpu(), statistics.median(run.seconds) * 1e3


def _table(rows: list[dict[str, Any]]) -> str:
    headers = ["batch", "TP=1 eager ms", "eager TP ms/step", "graph TP ms/step", "speedup",
               "floor ms", "graph x floor", "graph 1st call s", "ranks agree", "= eager TP",
               "= TP=1"]
    yes = lambda ok, where=None: "yes" if ok else (  # noqa: E731
        "NO" if where is None else f"NO (first at {where})")
    cells = [[str(r["batch"]), f"{r['tp1_eager_ms']:.3f}", f"{r['eager_ms']:.3f}",
              f"{r['graph_ms']:.3f}", f"{r['speedup']:.2f}x", f"{r['floor_ms']:.3f}",
              f"{r['graph_x_floor']:.1f}", f"{r['graph_first_call_s']:.2f}",
              yes(r["ranks_agree"]), yes(r["tokens_equal"], r["first_mismatch"]),
              yes(r["equal_tp1"], r["first_mismatch_tp1"])] for r in rows]
    return step.format_table(headers, cells)


def worker(args, result_path: str) -> NoReturn:
    """One rank of ``torchair demo --tp N`` (started by :func:`launch`): runs the rank and ends
    the process with its exit status (after the process group is torn down, without the
    interpreter's own teardown)."""
    from torchair.compat._distributed import default_timeout

    start = time.perf_counter()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        args.device = f"cuda:{local_rank}"
        args.sync = torch.cuda.synchronize
        backend = "nccl"
    else:
        args.sync = lambda: None
        backend = "gloo"
    dist.init_process_group(backend, timeout=default_timeout())
    try:
        code = _worker(args, result_path, rank, world, backend, start)
        # every rank is done before any tears its connections down: rank 1 leaving while rank 0
        # still wrote the results once aborted rank 0 in gloo's teardown (a failed rank skips
        # this, and the launcher stops the others)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # The rank's work is done and its results are written. It leaves without the interpreter's
    # teardown: under load, a rank still aborted there now and then ("terminate called without
    # an active exception", SIGABRT: a gloo worker asking for the GIL while Python finalized,
    # see torchair.distributed.quiesce), which made the launcher report a failed rank for a run
    # whose tokens were all equal. This process runs only our code, so skipping the teardown
    # loses nothing; scripts under `torchair run` get the exit drain instead.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _worker(args, result_path: str, rank: int, world: int, backend: str, start: float) -> int:
    if args.serve:
        return serve_tp.rank_main(args, result_path, rank, world, backend, start)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    lead = rank == 0
    say = print if lead else (lambda *a, **k: None)
    dtype = step.DTYPES[args.dtype]
    cfg = step.model_config(args, args.prompt_len + args.steps)
    say(f"torchair demo --tp {world}: {step.describe(args, cfg)}")
    say(f"tensor parallel over {world} ranks ({backend}): q/k/v and gate/up column-parallel "
        f"({cfg.heads // world} heads / {cfg.kv_heads // world} KV heads / "
        f"{cfg.intermediate // world} SwiGLU columns per rank), o/down row-parallel + all_reduce "
        f"(sum), KV cache split by KV heads; embedding, norms and LM head replicated")
    say(f"device {args.device}, torch {torch.__version__}, torchair {torchair.__version__}, "
        f"{torch.get_num_threads()} CPU thread(s) per rank; compiled step: path 4 as in "
        f"torchair demo, {args.engine} engine"
        + (" (the --tp default: Inductor builds on every rank are slow on a few CPU cores; "
           "--engine inductor to use it)" if args.engine_defaulted else ""), flush=True)

    full = step.seeded_decoder(args, cfg, args.device)  # the --tp 1 model, then this rank's shard
    model = shard(full, world, rank, dist.group.WORLD).eval()
    for param in model.parameters():
        param.requires_grad_(False)
    tp_cfg = model.cfg
    reference: dict[int, tuple[torch.Tensor, float]] = {}
    with torch.no_grad():
        if lead:  # the other ranks wait for rank 0 in their first all_reduce
            for batch in args.batch:
                reference[batch] = _reference(args, cfg, full, batch)
    del full

    compiled = step.compile_step(model, args.engine)
    graphs_before = step.dynamo_graphs()
    caches = tuple(PagedKVCache(tp_cfg, max(args.batch), args.device, dtype, args.seed)
                   for _ in range(2))
    reports_before = len(torchair.graph_reports())
    bandwidth = read_bandwidth(args.device, sync=args.sync)
    bar = Bar(len(args.batch) * args.steps, enabled=lead and not args.no_progress)
    rows = []
    try:
        with torch.no_grad():
            for k, batch in enumerate(args.batch):
                rows.append(step.generate(args, tp_cfg, model, compiled, batch, caches, k == 0,
                                           bar, args.sync, bandwidth))
    finally:
        bar.close()
    reports = torchair.graph_reports()[reports_before:]
    summary = step.summary(reports[-1] if reports else None,
                            step.dynamo_graphs() - graphs_before, len(reports))
    summary["collectives"] = getattr(reports[-1], "collectives", "") if reports else ""

    mine = [{k: r[k] for k in ("eager_ms", "graph_ms", "eager_tokens", "graph_tokens",
                               "graph_first_call_s")} for r in rows]
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, mine)
    if not lead:
        return 0

    for i, row in enumerate(rows):
        ranks = [per_rank[i] for per_rank in everyone]
        row["per_rank_eager_ms"] = [r["eager_ms"] for r in ranks]
        row["per_rank_graph_ms"] = [r["graph_ms"] for r in ranks]
        row["eager_ms"] = max(row["per_rank_eager_ms"])  # the slowest rank sets the pace
        row["graph_ms"] = max(row["per_rank_graph_ms"])
        row["graph_first_call_s"] = max(r["graph_first_call_s"] for r in ranks)
        row["speedup"] = row["eager_ms"] / row["graph_ms"]
        row["eager_x_floor"] = x_floor(row["eager_ms"], row["floor_ms"])
        row["graph_x_floor"] = x_floor(row["graph_ms"], row["floor_ms"])
        row["ranks_agree"] = all(r["eager_tokens"] == row["eager_tokens"] and
                                 r["graph_tokens"] == row["graph_tokens"] for r in ranks)
        tp1_tokens, row["tp1_eager_ms"] = reference[row["batch"]]
        graph = torch.tensor(row["graph_tokens"])
        row["tp1_tokens"] = tp1_tokens.tolist()
        row["equal_tp1"] = (torch.equal(tp1_tokens, graph)
                            and torch.equal(tp1_tokens, torch.tensor(row["eager_tokens"])))
        row["first_mismatch_tp1"] = step.first_mismatch(tp1_tokens, graph)
    ok = all(r["tokens_equal"] and r["equal_tp1"] and r["ranks_agree"] for r in rows)

    print("\nper-step latency (median over the generated tokens after the first, the max over "
          f"the {world} ranks; eager TP and graph TP alternate, side by side; TP=1 eager: the "
          "full model on rank 0 alone, generating the reference tokens):")
    print(_table(rows))
    print(f"floor = one rank's weight-shard GEMVs + its KV bytes at {bandwidth['gb_per_s']:.1f} "
          f"GB/s (rank 0; the all-reduces not counted); x floor = ms/step / floor")
    print(f"\nDynamo compiles: {summary['dynamo_compiles']}   recompiles: "
          f"{summary['recompiles']}   (rank 0)")
    print(f"built gears: {'; '.join(summary['built_gears']) or 'none (one batch size)'}")
    print(f"static build: {'yes' if summary['build_static'] else 'no'} (path "
          f"{summary['path']}; {summary['launch']}, {summary['engine']} engine)")
    for reason in summary["reasons"]:
        print(f"  why not static: {reason}")
    print(f"collectives: {summary['collectives'] or 'none'}")
    wall = time.perf_counter() - start
    total = sum(len(r["graph_tokens"]) * args.steps for r in rows)
    if ok:
        print(f"OK: tokens equal TP=1's exactly (graph TP = eager TP = TP=1, all {world} ranks "
              f"agree; {total} tokens over batch sizes {args.batch}); wall time {wall:.1f} s")
    else:
        bad = [r["batch"] for r in rows
               if not (r["tokens_equal"] and r["equal_tp1"] and r["ranks_agree"])]
        print(f"MISMATCH: tokens differ (graph TP vs eager TP vs TP=1, or between ranks) at batch "
              f"sizes {bad}; wall time {wall:.1f} s")
    payload = {"config": {k: v for k, v in vars(args).items() if k != "sync"},
               "model": dataclasses.asdict(tp_cfg), "rows": rows, **summary, "ok": ok,
               "tokens_equal": ok, "tp": world, "backend": backend, "wall_s": wall,
               "read_bandwidth": dict(bandwidth), "torch": torch.__version__,
               "torchair": torchair.__version__}
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump(payload, f)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=1)
        print(f"results written to {args.json}")
    sys.stdout.flush()
    return 0
