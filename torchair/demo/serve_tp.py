"""``torchair demo --serve --tp N``: the serving loop on every rank of a tensor-parallel group.

Each rank serves the same workload with its shard of the decoder (:func:`torchair.demo.model.shard`:
heads, KV heads and SwiGLU columns split, o/down followed by an all-reduce) and its own KV pools
(its KV heads). The scheduler decides from the tokens alone, and every rank computes the same
tokens (the LM head is replicated after the all-reduce), so the ranks take the same steps in
the same order. Rank 0 also generates the reference, each request alone with the full (TP=1)
decoder, eagerly; at the end it gathers every rank's tokens, checks that they agree and passes
them through the same near-tie check as one process, prints the table and writes the verdict.
"""
from __future__ import annotations

import json
import time
from typing import Callable

import torch
import torch.distributed as dist

from torchair.demo import serve, step
from torchair.demo._progress import Bar
from torchair.demo.model import shard
from torchair.demo.serve_step import ServeStep

__all__ = ["rank_main"]


def _agreement(world: int, device: str) -> Callable[[str, list[list[int]]], None]:
    """A check run after every step on every rank: the ranks' tokens are gathered and compared,
    so a disagreement stops every rank at that step with an error (instead of ranks taking
    different steps and waiting on each other's collectives until the timeout)."""
    steps = [0]

    def check(kind: str, out: list[list[int]]) -> None:
        steps[0] += 1
        mine = torch.tensor([t for row in out for t in row], dtype=torch.int64, device=device)
        everyone = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(everyone, mine)
        if not all(torch.equal(t, mine) for t in everyone):
            raise RuntimeError(f"tensor-parallel ranks disagree on the tokens of {kind} step "
                               f"{steps[0]}: {[t.tolist() for t in everyone]}")

    return check


def rank_main(args, result_path: str, rank: int, world: int, backend: str, start: float) -> int:
    """One rank of the serving demo; rank 0 writes ``{"ok": ...}`` to ``result_path``."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    lead = rank == 0
    say = print if lead else (lambda *a, **k: None)
    dtype = step.DTYPES[args.dtype]
    cfg = step.model_config(args, serve.max_positions(args))
    say(f"torchair demo --serve --tp {world}: {step.describe(args, cfg)}")
    say(f"tensor parallel over {world} ranks ({backend}), {args.engine} engine; "
        f"{args.requests} requests, graph batch sizes {args.graph_batch_sizes}, prefill chunks "
        f"of {args.prefill_chunk}, speculate {args.speculate}", flush=True)
    full = step.seeded_decoder(args, cfg, args.device)
    load = serve.workload(args)
    bar = Bar(args.requests * (2 * args.rounds + 1), enabled=lead and not args.no_progress)
    try:
        with torch.no_grad(), serve.cache_dir_of(args) as cache_dir:  # entries per rank inside
            # the other ranks wait for rank 0 in their first all-reduce meanwhile
            ref = (serve.reference(args, cfg, full, load, dtype,
                                   on_progress=lambda n: bar.update(
                                       n, f"reference (TP=1, each request alone): {n}/{len(load)}",
                                       milestone=n == len(load)))
                   if lead else None)
            model = ServeStep(shard(full, world, rank, dist.group.WORLD).eval())
            del full
            runners = serve.build(args, model.cfg, model, dtype, cache_dir)
            for runner in runners.values():
                runner.on_result = _agreement(world, args.device)
            results = serve.run_rounds(args, runners, load, bar)
    finally:
        bar.close()
    mine = {name: results[name]["tokens"] for name in ("eager", "torchair")}
    everyone: list = [None] * world
    dist.all_gather_object(everyone, mine)
    if not lead:
        return 0
    agree = all(other == mine for other in everyone)
    code = serve.report(args, model.cfg, results, ref, runners,
                        time.perf_counter() - start,
                        extra={"tp": world, "backend": backend, "ranks_agree": agree})
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump({"ok": code == 0}, f)
    return code
