"""``torchair demo``: greedy generation with a small Llama-style decoder, eager vs torchair path 4.

The decode step (:class:`torchair.demo.model.Decoder`: ``npu_add_rms_norm``, GQA attention with
``npu_incre_flash_attention`` over a paged KV cache written in place, SwiGLU MLP, rotary
embedding) is compiled once with::

    config.experimental_config.tiling_schedule_optimize = True
    torch.compile(step, backend=torchair.get_npu_backend(compiler_config=config),
                  dynamic=True, fullgraph=True)

every tensor input ``mark_static`` except the batch dim, which takes the ``--batch`` sizes as
gears (``torchair.inference.set_dim_gears``), so each batch size runs as one static launch unit.
The prompt is prefilled eagerly, token by token through the same step; then eager, the
compiled step and the same step through ``torchair.inference.cache_compile`` (TorchAir's serving
entry: the same path-4 launch unit, later calls checked by torchair's own guards instead of
Dynamo's per-call work; ``--no-cache-compile`` leaves it out) generate side by side (each with its
own KV cache, in balanced orders: each one right after each other equally often), and the demo
prints per-step latency, compile counts, the gears and whether the tokens match. Exit code 0
only when every compiled step's tokens equal eager's exactly. ``--experts E --top-k K`` makes
every layer's MLP a mixture of experts through torch_npu's MoE ops
(:class:`torchair.demo.model.MoE`), in the same one static graph.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from typing import Any, Sequence

import torch
import torch._dynamo

import torchair
from torchair.demo import _tp, serve, step
from torchair.demo._progress import Bar
from torchair.demo.model import PagedKVCache
from torchair.demo.roofline import read_bandwidth

__all__ = ["main"]



def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torchair demo",
        description="Greedy generation with a small Llama-style decoder (random weights, nothing "
                    "downloaded): eager PyTorch vs torchair path 4 (dynamic=True + mark_static + "
                    "tiling sink, batch gears), side by side.")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="default: cuda when available, else cpu")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4], metavar="N",
                   help="batch sizes, run in this order; two or more become the gears of one "
                        "compiled graph (default: 1 4)")
    p.add_argument("--steps", type=int, default=32, help="tokens generated per batch size "
                   "(default 32)")
    p.add_argument("--prompt-len", type=int, default=8, help="prompt tokens (default 8)")
    p.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    p.add_argument("--hidden", type=int, default=256, help="hidden size (default 256)")
    p.add_argument("--heads", type=int, default=8, help="query heads (default 8)")
    p.add_argument("--kv-heads", type=int, default=2, help="key/value heads, GQA (default 2)")
    p.add_argument("--intermediate", type=int, default=None,
                   help="SwiGLU size (default 2 x hidden)")
    p.add_argument("--experts", type=int, default=0, metavar="E",
                   help="E > 0: each layer's MLP is a mixture of E SwiGLU experts of "
                        "--intermediate columns, through npu_moe_gating_top_k, "
                        "npu_moe_init_routing, npu_grouped_matmul and npu_moe_finalize_routing "
                        "(default 0: a dense SwiGLU MLP)")
    p.add_argument("--top-k", type=int, default=2, metavar="K",
                   help="experts per token with --experts (default 2)")
    p.add_argument("--vocab", type=int, default=512, help="vocabulary size (default 512)")
    p.add_argument("--block-size", type=int, default=16, help="KV cache block size (default 16)")
    p.add_argument("--no-rope", action="store_true", help="leave out the rotary embedding")
    p.add_argument("--dtype", choices=tuple(step.DTYPES), default="float32")
    p.add_argument("--engine", choices=("inductor", "fx"), default=None,
                   help="how torchair builds the launch unit: inductor (generated code, the "
                        "default) or fx (debug.run_eagerly: ATen ops one by one, compiles fast; "
                        "the default with --tp N > 1)")
    p.add_argument("--tp", type=int, default=1, metavar="N",
                   help="tensor parallel: start N ranks (torch.distributed.run; gloo on cpu, "
                        "NCCL on cuda), heads / KV heads / SwiGLU split Megatron-style, and "
                        "check the tokens against the unsharded (TP=1) decoder (default 1)")
    p.add_argument("--tp-worker", metavar="RESULT", default=None, help=argparse.SUPPRESS)
    p.add_argument("--no-cache-compile", action="store_true",
                   help="leave out the cache_compile variant (the same step served through "
                        "torchair.inference.cache_compile, without Dynamo's per-call work; "
                        "--tp N > 1 runs the graph only)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads of PyTorch (torch.set_num_threads; default: PyTorch's)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights, prompts and block tables")
    p.add_argument("--json", metavar="PATH", default=None, help="also write the results as JSON")
    serving = p.add_argument_group(
        "serving (--serve)", "continuous batching over the same decoder: requests join and leave, "
        "decode batches padded to graph batch sizes, chunked prefill, optional speculative "
        "decode; eager vs torchair (docs/serving.md)")
    serving.add_argument("--serve", action="store_true",
                         help="run the serving loop instead of the fixed-batch generation")
    serving.add_argument("--requests", type=int, default=32, help="requests (default 32)")
    serving.add_argument("--max-batch", type=int, default=8,
                         help="requests per decode batch at most (default 8)")
    serving.add_argument("--graph-batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8],
                         metavar="N", help="decode batches are padded up to the smallest of "
                         "these, the gears of the compiled decode step (vllm-ascend's "
                         "graph_batch_sizes; default 1 2 4 8)")
    serving.add_argument("--prefill-chunk", type=int, default=32,
                         help="prompt tokens per prefill step (default 32)")
    serving.add_argument("--speculate", type=int, default=0, metavar="K",
                         help="K > 0: speculative decode, K prompt-lookup drafts verified per "
                              "step (default 0)")
    serving.add_argument("--prompt-lens", type=int, nargs=2, default=[4, 128],
                         metavar=("MIN", "MAX"), help="prompt lengths (default 4 128)")
    serving.add_argument("--output-lens", type=int, nargs=2, default=[8, 64],
                         metavar=("MIN", "MAX"), help="generated tokens (default 8 64)")
    serving.add_argument("--rounds", type=int, default=3,
                         help="timed rounds per side, alternating (default 3)")
    serving.add_argument("--cache-dir", default=None, metavar="DIR",
                         help="keep the cache_compile entries in DIR (default: a temporary "
                              "directory, removed at exit); a later run with the same DIR starts "
                              "warm, without Dynamo")
    serving.add_argument("--poison-freed", action="store_true",
                         help="fill freed and rolled-back KV rows with NaN (a request reading "
                              "rows it does not own then fails the token check)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def _check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: CUDA is not available here; use --device cpu")
    if any(b <= 0 for b in args.batch) or len(set(args.batch)) != len(args.batch):
        p.error(f"--batch: give distinct positive sizes, got {args.batch}")
    if args.steps < 2 or args.prompt_len < 1:
        p.error("--steps must be >= 2 and --prompt-len >= 1")
    if args.intermediate is None:
        args.intermediate = 2 * args.hidden
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads must be >= 1, got {args.threads}")
    if args.tp < 1:
        p.error(f"--tp must be >= 1, got {args.tp}")
    if args.tp > 1 and args.device == "cuda" and torch.cuda.device_count() < args.tp:
        p.error(f"--tp {args.tp} --device cuda: NCCL needs one GPU per rank, found "
                f"{torch.cuda.device_count()}")
    if args.serve:
        serve.check_args(p, args)
    args.engine_defaulted = args.engine is None
    if args.engine is None:
        args.engine = "fx" if args.tp > 1 else "inductor"


def _table(rows: list[dict[str, Any]]) -> str:
    cached = all("cached_ms" in r for r in rows)
    headers = ["batch", "eager ms/step", "graph ms/step", "graph speedup"]
    headers += ["cached ms/step", "cached speedup"] if cached else []
    headers += ["floor ms", "eager x floor", "graph x floor"]
    headers += ["cached x floor"] if cached else []
    headers += ["graph 1st call s", "tokens equal"]
    cells = []
    for r in rows:
        row = [str(r["batch"]), f"{r['eager_ms']:.3f}", f"{r['graph_ms']:.3f}",
               f"{r['speedup']:.2f}x"]
        row += [f"{r['cached_ms']:.3f}", f"{r['cached_speedup']:.2f}x"] if cached else []
        row += [f"{r['floor_ms']:.3f}", f"{r['eager_x_floor']:.1f}", f"{r['graph_x_floor']:.1f}"]
        row += [f"{r['cached_x_floor']:.1f}"] if cached else []
        equal = "yes" if r["tokens_equal"] else f"NO (first at {r['first_mismatch']})"
        if cached and not r["cached_tokens_equal"]:
            graph = "graph yes" if r["tokens_equal"] else f"graph {equal}"
            equal = f"{graph}; cached NO (first at {r['cached_first_mismatch']})"
        cells.append(row + [f"{r['graph_first_call_s']:.2f}", equal])
    return step.format_table(headers, cells)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo with command-line ``argv`` (default ``sys.argv[1:]``); returns the exit code:
    0 when the compiled step's tokens equal eager's exactly, 1 otherwise."""
    parser = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    _check_args(parser, args)
    start = time.perf_counter()
    cfg = step.model_config(args, args.prompt_len + args.steps, tp=args.tp)
    try:
        cfg.check()
    except ValueError as err:
        parser.error(str(err))
    if args.serve and args.tp == 1:
        return serve.main(args, cfg)
    if args.tp > 1:
        if args.tp_worker is not None:
            return _tp.worker(args, args.tp_worker)
        return _tp.launch(args, argv)
    cfg = dataclasses.replace(cfg, tp=1)
    device, dtype = args.device, step.DTYPES[args.dtype]
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    print(f"torchair demo: {step.describe(args, cfg)}")
    print(f"device {device}, torch {torch.__version__}, torchair {torchair.__version__}, "
          f"{torch.get_num_threads()} CPU threads")
    gears = f"batch gears {args.batch}" if len(args.batch) > 1 else f"batch {args.batch[0]}"
    print(f"compiled step: torch.compile(step, backend=torchair.get_npu_backend(config), "
          f"dynamic=True, fullgraph=True), tiling_schedule_optimize=True, mark_static, {gears}, "
          f"{args.engine} engine; {args.prompt_len} prompt tokens prefilled eagerly, "
          f"{args.steps} tokens generated greedily", flush=True)

    model = step.seeded_decoder(args, cfg, device)
    compiled = step.compile_step(model, args.engine)
    cache_dir = None if args.no_cache_compile else tempfile.mkdtemp(prefix="torchair-demo-")
    try:
        cached = None if cache_dir is None else step.cache_compile_step(model, args.engine, cache_dir)
        graphs_before = step.dynamo_graphs()
        # eager's, the graph's and the cached step's; the same block tables
        caches = tuple(PagedKVCache(cfg, max(args.batch), device, dtype, args.seed)
                       for _ in range(2 if cached is None else 3))
        reports_before = len(torchair.graph_reports())
        bandwidth = read_bandwidth(device, sync=sync)
        bar = Bar(len(args.batch) * args.steps, enabled=not args.no_progress)
        rows = []
        try:
            with torch.no_grad():
                for k, batch in enumerate(args.batch):
                    rows.append(step.generate(args, cfg, model, compiled, batch, caches, k == 0,
                                          bar, sync, bandwidth, cached=cached))
        finally:
            bar.close()
    finally:
        if cache_dir is not None:
            shutil.rmtree(cache_dir, ignore_errors=True)
    # cache_compile's own Dynamo trace and graph reports are counted apart
    cached_graphs = sum(r.get("cached_dynamo_graphs", 0) for r in rows)
    cached_ids = {i for r in rows for i in r.pop("cached_report_ids", ())}
    reports = [r for r in torchair.graph_reports()[reports_before:]
               if r.graph_id not in cached_ids]
    summary = step.summary(reports[-1] if reports else None,
                       step.dynamo_graphs() - graphs_before - cached_graphs, len(reports))
    ok = all(r["tokens_equal"] and r.get("cached_tokens_equal", True) for r in rows)

    print("\nper-step latency (median over the generated tokens after the first; eager, graph"
          f"{'' if cached is None else ' and cached'} interleaved, side by side):")
    print(_table(rows))
    if cached is not None:
        served = "" if cached_graphs == 1 else (f" (Dynamo traced it {cached_graphs} times: a "
                                                f"call did not fit the cached graph)")
        print("cached = the same step through torchair.inference.cache_compile: its first call "
              "compiles as graph's does, later calls run that launch unit after torchair's "
              f"checks of the call, without Dynamo's per-call work{served}")
    print(f"floor = the step's weight GEMVs alone (the same weights, each product as a CPU "
          f"static unit runs it: torchair_native::gemv where units bind it, else F.linear; timed "
          f"in the same loop) + the KV bytes it reads at {bandwidth['gb_per_s']:.1f} GB/s (read "
          f"bandwidth: {bandwidth['method']}); x floor = ms/step / floor")
    print(f"\nDynamo compiles: {summary['dynamo_compiles']}   recompiles: "
          f"{summary['recompiles']}")
    print(f"built gears: {'; '.join(summary['built_gears']) or 'none (one batch size)'}")
    print(f"static build: {'yes' if summary['build_static'] else 'no'} (path "
          f"{summary['path']}; {summary['launch']}, {summary['engine']} engine)")
    for reason in summary["reasons"]:
        print(f"  why not static: {reason}")
    if device == "cpu" and args.engine == "inductor":
        print("note: the Inductor engine fuses npu_add_rms_norm (lowered to its formula) with "
              "its neighbours; npu_incre_flash_attention runs the same CPU kernel as eager, "
              "called from Inductor's C++ wrapper through torchair's C++ launch kernel (no "
              "Python inside the unit)" if summary["engine"] == "inductor-cpp" else
              "note: the Inductor engine fuses npu_add_rms_norm (lowered to its formula) with "
              "its neighbours; npu_incre_flash_attention runs the same CPU kernel as eager")
    wall = time.perf_counter() - start
    total = sum(len(r["eager_tokens"]) * args.steps for r in rows)
    both = "" if cached is None else " (graph and cached)"
    if ok:
        print(f"OK: the compiled steps' tokens{both} equal eager's exactly ({total} tokens "
              f"over batch sizes {args.batch}); wall time {wall:.1f} s")
    else:
        bad = [r["batch"] for r in rows if not r["tokens_equal"]]
        bad_cached = [r["batch"] for r in rows if not r.get("cached_tokens_equal", True)]
        what = "; ".join(f"{name} at batch sizes {sizes}" for name, sizes in
                         (("graph", bad), ("cached", bad_cached)) if sizes)
        print(f"MISMATCH: the tokens differ from eager's: {what}; wall time {wall:.1f} s")
    if args.json:
        payload = {"config": vars(args), "model": dataclasses.asdict(cfg), "rows": rows,
                   **summary, "tokens_equal": ok, "wall_s": wall,
                   "read_bandwidth": {k: v for k, v in bandwidth.items()},
                   "floor_method": "weight GEMVs alone (median, timed in the generation loop) "
                                   "+ mean KV bytes per step / read bandwidth",
                   "torch": torch.__version__, "torchair": torchair.__version__}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=1)
        print(f"results written to {args.json}")
    return 0 if ok else 1
