"""``torchair demo --serve``: continuous batching over the demo decoder, eager vs torchair.

The same seeded workload (``--requests`` prompts of ``--prompt-lens`` tokens, each generating
``--output-lens`` tokens greedily) is served by the loop of :mod:`torchair.demo.serve_loop` twice
per round: once eagerly (batches and prefill chunks at their own size) and once through torchair (decode steps
padded to ``--graph-batch-sizes`` and compiled on path 4 with those sizes as batch gears, prefill
chunks padded to ``--prefill-chunk`` and compiled as one static unit; both served with
``cache_compile``). The compiled steps are warmed up (every gear called once) before the timed
rounds, so every compile happens before; a Dynamo compile during the rounds is a recompile.

Every request's tokens are then checked against the same request generated alone, eagerly, one
token per step through the demo's own decode step (:func:`reference`; not the served step's
code), with no padding, no chunking and no speculation. A batched, padded or multi-token step may
round differently from that single-row step; where the reference's top two logits are within
``1e-4`` of the top logit's magnitude and the served token is the runner-up, the difference is a
near tie, reported as such. Any other difference is a mismatch, and the command exits with
status 1.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import statistics
import tempfile
import time
from typing import Any, Callable, Iterator

import torch

import torchair
from torchair.demo import step
from torchair.demo._progress import Bar
from torchair.demo.kv_blocks import BlockPool
from torchair.demo.model import Decoder, DemoConfig
from torchair.demo.serve_loop import Request, Runner, Stats, serve
from torchair.demo.serve_step import ServeStep
from torchair.inference import set_dim_gears

__all__ = ["NEAR_TIE", "check_tokens", "main", "reference", "workload"]

NEAR_TIE = 1e-4  # top-2 logit gap, relative to the top logit's magnitude


def workload(args) -> list[tuple[list[int], int]]:
    """``args.requests`` (prompt, max_new) pairs, lengths uniform in the given ranges (seeded)."""
    gen = torch.Generator().manual_seed(args.seed + 37)
    (p_lo, p_hi), (o_lo, o_hi) = args.prompt_lens, args.output_lens
    out = []
    for _ in range(args.requests):
        n = int(torch.randint(p_lo, p_hi + 1, (), generator=gen))
        m = int(torch.randint(o_lo, o_hi + 1, (), generator=gen))
        out.append((torch.randint(0, args.vocab, (n,), generator=gen).tolist(), m))
    return out


def max_positions(args) -> int:
    """KV positions one request can reach (its last query position included)."""
    return args.prompt_lens[1] + args.output_lens[1] + args.speculate + 1


def make_pool(args, cfg: DemoConfig, dtype: torch.dtype) -> BlockPool:
    """Enough blocks for ``--max-batch`` requests of the longest length (``cfg.max_len`` is
    :func:`max_positions`), plus the null block."""
    return BlockPool(cfg, args.max_batch * cfg.blocks_per_seq + 1, args.device, dtype,
                     poison=args.poison_freed)


def reference(args, cfg: DemoConfig, decoder: Decoder, load: list[tuple[list[int], int]],
              dtype: torch.dtype, on_progress: Callable[[int], None] | None = None
              ) -> list[tuple[list[int], list[tuple[float, int]]]]:
    """Every request generated alone, eagerly, one token per step (its prompt too) through the
    demo's own decode step (:meth:`Decoder.logits`: ``npu_incre_flash_attention``, not the
    served step's code). Returns each request's tokens and, per generated token, the reference's
    top-2 logit gap relative to the top logit's magnitude and its runner-up token."""
    pool = make_pool(args, cfg, dtype)
    width = cfg.blocks_per_seq
    dev = args.device
    out = []
    for i, (prompt, max_new) in enumerate(load):
        blocks: list[int] = []
        pool.grow(i, blocks, len(prompt) + max_new)
        table = torch.tensor([pool.table_row(blocks, width)], dtype=torch.int32, device=dev)
        tokens, ties = list(prompt), []
        for p in range(len(prompt) + max_new - 1):
            logits = decoder.logits(torch.tensor([[tokens[p]]], device=dev),
                                    torch.tensor([p], device=dev),
                                    torch.tensor([pool.slot(blocks, p)], device=dev), table,
                                    [p + 1], pool.k, pool.v)[0, -1]
            if p < len(prompt) - 1:
                continue  # a prompt token: the next one is given
            top = logits.double().topk(2)
            gap = (top.values[0] - top.values[1]) / top.values[0].abs().clamp_min(1e-30)
            ties.append((float(gap), int(top.indices[1])))
            tokens.append(int(top.indices[0]))
        pool.release(i, blocks)
        out.append((tokens[len(prompt):], ties))
        if on_progress is not None:
            on_progress(i + 1)
    return out


def check_tokens(served: list[list[int]], ref: list[tuple[list[int], list[tuple[float, int]]]]
                 ) -> dict[str, Any]:
    """Each served request against its reference: exact; a near tie (at the first difference
    the reference's top-2 gap is <= NEAR_TIE and the served token is its runner-up, the lengths
    equal); or a mismatch (anything else)."""
    if len(served) != len(ref):
        raise ValueError(f"{len(served)} served requests for {len(ref)} references")
    exact, ties, bad = 0, [], []
    for rid, (tokens, (want, near)) in enumerate(zip(served, ref)):
        at = next((i for i, (a, b) in enumerate(zip(tokens, want)) if a != b), None)
        same_len = len(tokens) == len(want)
        if at is None and same_len:
            exact += 1
        elif at is not None and same_len and near[at][0] <= NEAR_TIE and tokens[at] == near[at][1]:
            ties.append({"request": rid, "token": at, "gap": near[at][0]})
        else:
            where = at if at is not None else min(len(tokens), len(want))
            bad.append({"request": rid, "token": where,
                        "gap": near[at][0] if at is not None else None,
                        "served": tokens[:where + 4], "reference": want[:where + 4]})
    return {"all_tokens_equal": not bad, "requests_exact": exact,
            "near_tie_divergences": len(ties), "near_ties": ties, "mismatches": bad}


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))]


def metrics(reqs: list[Request], stats: Stats, wall: float) -> dict[str, Any]:
    """Throughput and latencies of one run."""
    generated = sum(len(r.generated) for r in reqs)
    tpot = [(r.done_s - r.first_token_s) / (len(r.generated) - 1) for r in reqs
            if len(r.generated) > 1]
    return {"wall_s": wall, "generated_tokens": generated,
            "throughput_tokens_per_s": generated / wall,
            "ttft_p50_ms": _percentile([r.first_token_s * 1e3 for r in reqs], 50),
            "tpot_p50_ms": _percentile([t * 1e3 for t in tpot], 50),
            "tpot_p99_ms": _percentile([t * 1e3 for t in tpot], 99),
            "padding_waste": stats.padded_rows / stats.rows if stats.rows else 0.0,
            "prefill_padding_waste": (stats.padded_prefill_tokens / stats.prefill_tokens
                                      if stats.prefill_tokens else 0.0),
            "acceptance_rate": stats.accepted / stats.drafted if stats.drafted else 0.0,
            "tokens_per_step": stats.emitted / stats.request_steps if stats.request_steps
            else 0.0,
            "stats": dataclasses.asdict(stats)}


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-metric medians over the rounds (counts and step statistics from the first timed
    round)."""
    out = dict(runs[0])
    for key in ("wall_s", "throughput_tokens_per_s", "ttft_p50_ms", "tpot_p50_ms",
                "tpot_p99_ms"):
        out[key] = statistics.median(r[key] for r in runs)
    out["rounds"] = [{k: r[k] for k in ("wall_s", "throughput_tokens_per_s")} for r in runs]
    return out


def gear_marks(graph_sizes: list[int]) -> Callable[[str, tuple], None]:
    """Marks for the torchair steps' first calls: decode inputs take the graph batch sizes as
    gears of their batch dim, everything else is static (one static unit per gear)."""
    seen: set[str] = set()

    def mark(kind: str, args: tuple) -> None:
        if kind in seen:
            return
        seen.add(kind)
        tokens, positions, slots, table, q_lens, kv_lens, k_pools, v_pools = args
        for t in (*k_pools, *v_pools):
            torch._dynamo.mark_static(t)
        for t in (tokens, positions, slots, table, q_lens, kv_lens):
            if t is None:
                continue
            if kind == "decode" and len(graph_sizes) > 1:
                set_dim_gears(t, dim_gears={0: list(graph_sizes)})
            else:
                torch._dynamo.mark_static(t)

    return mark


def _table(eager: dict[str, Any], graph: dict[str, Any], speculate: int) -> str:
    rows = [("throughput (generated tokens/s)", "throughput_tokens_per_s", "{:.1f}"),
            ("TTFT p50 (ms)", "ttft_p50_ms", "{:.1f}"),
            ("TPOT p50 (ms)", "tpot_p50_ms", "{:.2f}"),
            ("TPOT p99 (ms)", "tpot_p99_ms", "{:.2f}"),
            ("padding waste (% padded decode rows)", "padding_waste", "pct"),
            ("Dynamo compiles", "dynamo_compiles", "{}"),
            ("recompiles after warm-up", "recompiles_after_warmup", "{}")]
    if speculate:
        rows += [("acceptance rate", "acceptance_rate", "pct"),
                 ("tokens per step (per request)", "tokens_per_step", "{:.2f}")]
    cells = []
    for label, key, fmt in rows:
        vals = [run.get(key) for run in (eager, graph)]
        text = [f"{100 * v:.1f}%" if fmt == "pct" else fmt.format(v) for v in vals]
        ratio = ""
        if key == "throughput_tokens_per_s":
            ratio = f"{vals[1] / vals[0]:.2f}x"
        elif key.startswith(("ttft", "tpot")):
            ratio = f"{vals[0] / vals[1]:.2f}x"
        cells.append([label, *text, ratio])
    headers = ["", "eager", "torchair (cached)", "torchair gain"]
    return step.format_table(headers, cells, left_first=True)


def build(args, cfg: DemoConfig, model: ServeStep, dtype: torch.dtype, cache_dir: str | None
          ) -> dict[str, Runner]:
    """The eager and torchair runners, each with its own KV pool."""
    common = dict(query_len=1 + args.speculate, prefill_chunk=args.prefill_chunk,
                  table_width=cfg.blocks_per_seq, device=args.device)
    eager = Runner("eager", model.decode, model.prefill, make_pool(args, cfg, dtype),
                   graph_sizes=None, **common)
    config = step.compiler_config(args.engine)
    if cache_dir is None:
        backend = torchair.get_npu_backend(compiler_config=config)
        fns = [torch.compile(f, backend=backend, dynamic=True, fullgraph=True)
               for f in (model.decode, model.prefill)]
    else:
        fns = [torchair.inference.cache_compile(f, config=config, cache_dir=cache_dir)
               for f in (model.decode, model.prefill)]
    graph = Runner("torchair", *fns, make_pool(args, cfg, dtype),
                   graph_sizes=args.graph_batch_sizes, **common)
    graph.on_first_call = gear_marks(args.graph_batch_sizes)
    return {"eager": eager, "torchair": graph}


def run_rounds(args, runners: dict[str, Runner], load, bar: Bar) -> dict[str, Any]:
    """Warm up, then serve ``load`` ``args.rounds`` times with each runner, alternating which
    goes first. Returns per runner: the median metrics, the tokens and whether rounds agree."""
    graphs_start = step.dynamo_graphs()
    reports_start = len(torchair.graph_reports())
    with bar.waiting(f"warming up: compiling the decode step (gears {args.graph_batch_sizes}) "
                     f"and the prefill chunk ({args.engine} engine), one untimed round each"):
        for runner in runners.values():
            runner.warm_up()
        warm = step.dynamo_graphs()
        for runner in runners.values():  # one untimed round each: every shape seen once
            serve(runner, load, max_batch=args.max_batch, speculate=args.speculate)
    runs: dict[str, list] = {name: [] for name in runners}
    tokens: dict[str, list] = {name: [] for name in runners}
    names = list(runners)
    for k in range(args.rounds):
        for name in (names if k % 2 == 0 else names[::-1]):
            base = bar.done
            reqs, stats, wall = serve(
                runners[name], load, max_batch=args.max_batch, speculate=args.speculate,
                on_progress=lambda n, base=base, name=name, k=k: bar.update(
                    base + n, f"round {k + 1}/{args.rounds}, {name}: {n}/{len(load)} requests",
                    milestone=n == len(load)))
            runs[name].append(metrics(reqs, stats, wall))
            tokens[name].append([r.generated for r in reqs])
    out = {}
    for name in names:
        result = _median_run(runs[name])
        result["rounds_agree"] = all(t == tokens[name][0] for t in tokens[name])
        result["tokens"] = tokens[name][0]
        out[name] = result
    out["torchair"]["dynamo_compiles"] = step.dynamo_graphs() - graphs_start
    out["torchair"]["warmup_compiles"] = warm - graphs_start
    # the eager side compiles nothing: every graph Dynamo built after the warm-up calls is a
    # recompile of a torchair step
    out["torchair"]["recompiles_after_warmup"] = step.dynamo_graphs() - warm
    out["eager"]["dynamo_compiles"] = out["eager"]["recompiles_after_warmup"] = 0
    # what the backend built for the decode and prefill steps (none on a warm start)
    out["torchair"]["graphs"] = [
        {k: v for k, v in step.summary(r, 0, 0).items() if k not in ("dynamo_compiles",
                                                                     "recompiles")}
        for r in torchair.graph_reports()[reports_start:]]
    return out


def check_args(parser, args) -> None:
    """The serving flags' errors, naming the flag."""
    sizes = args.graph_batch_sizes
    if any(s < 1 for s in sizes) or len(set(sizes)) != len(sizes):
        parser.error(f"--graph-batch-sizes: give distinct positive sizes, got {sizes}")
    args.graph_batch_sizes = sorted(sizes)
    for flag, value in (("--requests", args.requests), ("--max-batch", args.max_batch),
                        ("--prefill-chunk", args.prefill_chunk), ("--rounds", args.rounds)):
        if value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    if args.speculate < 0:
        parser.error(f"--speculate must be >= 0 (0: no speculation), got {args.speculate}")
    for flag, (lo, hi) in (("--prompt-lens", args.prompt_lens),
                           ("--output-lens", args.output_lens)):
        if not 1 <= lo <= hi:
            parser.error(f"{flag} {lo} {hi}: give MIN MAX with 1 <= MIN <= MAX")


@contextlib.contextmanager
def cache_dir_of(args) -> Iterator[str | None]:
    """``--cache-dir`` (kept), else a temporary directory removed afterwards; None with
    ``--no-cache-compile``."""
    if args.no_cache_compile:
        yield None
    elif args.cache_dir:
        yield args.cache_dir
    else:
        tmp = tempfile.mkdtemp(prefix="torchair-serve-")
        try:
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def main(args, cfg: DemoConfig) -> int:
    """Run the serving demo (one process); 0 when every request's tokens pass the check."""
    start = time.perf_counter()
    cfg = dataclasses.replace(cfg, max_len=max_positions(args), tp=1)
    dtype = step.DTYPES[args.dtype]
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print(f"torchair demo --serve: {step.describe(args, cfg)}")
    print(f"device {args.device}, torch {torch.__version__}, torchair {torchair.__version__}, "
          f"{torch.get_num_threads()} CPU threads")
    spec = (f", speculative decode K={args.speculate} (prompt lookup, greedy acceptance)"
            if args.speculate else "")
    print(f"{args.requests} requests (prompts {args.prompt_lens[0]}..{args.prompt_lens[1]} "
          f"tokens, outputs {args.output_lens[0]}..{args.output_lens[1]}), up to "
          f"{args.max_batch} per decode batch, graph batch sizes {args.graph_batch_sizes}, "
          f"prefill chunks of {args.prefill_chunk}{spec}; {args.rounds} round(s) each, "
          f"{args.engine} engine", flush=True)
    decoder = step.seeded_decoder(args, cfg, args.device)
    model = ServeStep(decoder)
    load = workload(args)
    bar = Bar(args.requests * (2 * args.rounds + 1), enabled=not args.no_progress)
    try:
        with torch.no_grad(), cache_dir_of(args) as cache_dir:
            runners = build(args, cfg, model, dtype, cache_dir)
            results = run_rounds(args, runners, load, bar)
            base = bar.done
            ref = reference(args, cfg, decoder, load, dtype, on_progress=lambda n: bar.update(
                base + n, f"reference (each request alone, eager): {n}/{len(load)}",
                milestone=n == len(load)))
    finally:
        bar.close()
    return report(args, cfg, results, ref, runners, time.perf_counter() - start)


def report(args, cfg: DemoConfig, results: dict[str, Any], ref, runners: dict[str, Runner],
           wall: float, extra: dict[str, Any] | None = None) -> int:
    """Print the table and verdict, write the JSON (plus ``extra``; its ``ranks_agree``, when
    given, must hold too); the exit code."""
    extra = dict(extra or {})
    eager, graph = results["eager"], results["torchair"]
    checks = {name: check_tokens(results[name]["tokens"], ref) for name in ("eager", "torchair")}
    check = checks["torchair"]
    print("\nserving (medians over the rounds; eager and torchair alternate, the same workload):")
    print(_table(eager, graph, args.speculate))
    print(f"TTFT counts from the start (all requests arrive at once); TPOT = a request's time "
          f"after its first token / its later tokens; torchair = decode at graph batch sizes "
          f"{args.graph_batch_sizes} (path 4, one static unit per gear) and prefill chunks of "
          f"{args.prefill_chunk} (one static unit), served with "
          f"{'torch.compile' if args.no_cache_compile else 'cache_compile'}")
    for g in graph["graphs"]:
        print(f"built: {'static' if g['build_static'] else 'NOT static'} (path {g['path']}; "
              f"{g['launch']}, {g['engine']} engine), gears: "
              f"{'; '.join(g['built_gears']) or 'none (one shape)'}")
        for reason in g["reasons"]:
            print(f"  why not static: {reason}")
    if not graph["graphs"]:
        print("built: nothing in this process (every step came from the cache_compile entries)")
    pool, stats = runners["torchair"].pool, graph["stats"]
    print(f"KV blocks (torchair, one round): {pool.num_blocks - 1} + the null block; "
          f"{stats['blocks_handed_out']} handed out, {stats['blocks_reused']} of them reused after "
          f"a free{'; freed rows poisoned with NaN' if args.poison_freed else ''}")
    for name, c in checks.items():
        print(f"{name}: {c['requests_exact']}/{len(ref)} requests equal the request alone in "
              f"eager exactly, {c['near_tie_divergences']} near-tie divergence(s), "
              f"{len(c['mismatches'])} mismatch(es)")
        for t in c["near_ties"]:
            print(f"  near tie: request {t['request']} token {t['token']} (reference top-2 gap "
                  f"{t['gap']:.2e} of the top logit)")
        for m in c["mismatches"]:
            print(f"  MISMATCH: request {m['request']} from token {m['token']}: served "
                  f"{m['served']} vs reference {m['reference']}")
    ok = (check["all_tokens_equal"] and checks["eager"]["all_tokens_equal"]
          and graph["rounds_agree"] and eager["rounds_agree"] and extra.get("ranks_agree", True))
    if "ranks_agree" in extra:
        print(f"tensor parallel: the {extra.get('tp')} ranks generated the same tokens: "
              f"{'yes' if extra['ranks_agree'] else 'NO (MISMATCH)'}; the reference is the "
              f"unsharded (TP=1) decoder")
    ratio = graph["throughput_tokens_per_s"] / eager["throughput_tokens_per_s"]
    print(f"{'OK' if ok else 'MISMATCH'}: tokens {'pass' if ok else 'fail'} the check against "
          f"each request alone in eager; torchair throughput {ratio:.2f}x eager; recompiles "
          f"after warm-up: {graph['recompiles_after_warmup']}; wall time {wall:.1f} s")
    if args.json:
        strip = lambda run: {k: v for k, v in run.items() if k != "tokens"}  # noqa: E731
        payload = {
            "all_tokens_equal": check["all_tokens_equal"],
            "requests_exact": check["requests_exact"],
            "near_tie_divergences": check["near_tie_divergences"],
            "recompiles_after_warmup": graph["recompiles_after_warmup"],
            "throughput_tokens_per_s": {"eager": eager["throughput_tokens_per_s"],
                                        "torchair": graph["throughput_tokens_per_s"]},
            "throughput_ratio": ratio,
            "padding_waste": graph["padding_waste"],
            "speculate": {"k": args.speculate, "acceptance_rate": graph["acceptance_rate"],
                          "tokens_per_step": graph["tokens_per_step"]},
            "ok": ok, "near_ties": check["near_ties"], "mismatches": check["mismatches"],
            "eager_check": checks["eager"], "eager": strip(eager), "torchair": strip(graph),
            "kv_blocks": {"blocks": pool.num_blocks - 1,
                          "handed_out": stats["blocks_handed_out"],
                          "reused": stats["blocks_reused"], "poisoned": args.poison_freed},
            "tokens": graph["tokens"], "reference_tokens": [t for t, _ in ref],
            "config": {k: v for k, v in vars(args).items() if k != "sync"},
            "model": dataclasses.asdict(cfg), "wall_s": wall, "torch": torch.__version__,
            "torchair_version": torchair.__version__, **extra}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=1)
        print(f"results written to {args.json}")
    return 0 if ok else 1
