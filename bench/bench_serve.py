"""Serving throughput vs concurrency: ``torchair demo --serve`` at several ``--max-batch`` values.

For each concurrency ``c`` (``--concurrency``, default 1 2 4 8) the serving demo
(:mod:`torchair.demo.serve`) runs in its own process, ``python -m torchair demo --serve
--max-batch c --graph-batch-sizes <powers of two below c, then c> ... --json <tmp>``, so no Dynamo state
carries over from one point to the next. The demo serves the same seeded workload eagerly and
through torchair (decode steps padded to the graph batch sizes, compiled on path 4 and served
with ``cache_compile``), alternating in ``--rounds`` timed rounds after an untimed warm-up round
that compiles every gear, and checks every request's tokens against the request generated alone
in eager.

Recorded per concurrency: generated tokens/s of each side (medians over the rounds) and their
ratio, TTFT p50, TPOT p50 / p99, padding waste (share of padded decode rows), whether the tokens
pass the check, recompiles after warm-up and Dynamo compiles. Nothing is asserted: a point whose
tokens fail the check is recorded with ``all_tokens_equal`` false, one whose process fails with
its exit status and the tail of its stderr.

    python -m bench.bench_serve --quick          # tiny workload, FX engine, c = 1 4: ~15 s
    python -m bench.bench_serve                  # 32 requests, Inductor, c = 1 2 4 8: ~4 min
    python -m bench.bench_serve --concurrency 1 4 16 --speculate 2
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch

from bench import _harness as H

ROOT = H.BENCH_DIR.parent
# pass-through flags of the demo: (our dest, the demo's flag); None values are not passed
_MODEL_FLAGS = (("layers", "--layers"), ("hidden", "--hidden"), ("heads", "--heads"),
                ("kv_heads", "--kv-heads"), ("intermediate", "--intermediate"),
                ("vocab", "--vocab"), ("threads", "--threads"))


def graph_sizes(concurrency: int) -> list[int]:
    """The powers of two below ``concurrency``, then ``concurrency`` itself: the decode step's
    graph batch sizes (gears), the largest holding a full batch."""
    sizes, s = [], 1
    while s < concurrency:
        sizes.append(s)
        s *= 2
    return sizes + [concurrency]


def demo_argv(args: argparse.Namespace, concurrency: int, out: str) -> list[str]:
    """The demo's command line for one point."""
    argv = [sys.executable, "-m", "torchair", "demo", "--serve", "--device", args.device,
            "--engine", args.engine, "--requests", str(args.requests),
            "--rounds", str(args.rounds), "--max-batch", str(concurrency),
            "--graph-batch-sizes", *map(str, graph_sizes(concurrency)),
            "--prompt-lens", *map(str, args.prompt_lens),
            "--output-lens", *map(str, args.output_lens),
            "--speculate", str(args.speculate), "--seed", str(args.seed),
            "--no-progress", "--json", out]
    for dest, flag in _MODEL_FLAGS:
        if getattr(args, dest) is not None:
            argv += [flag, str(getattr(args, dest))]
    return argv


def point(result: dict[str, Any], concurrency: int) -> dict[str, Any]:
    """One concurrency's numbers from the demo's JSON."""
    eager, graph = result["eager"], result["torchair"]
    tput = result["throughput_tokens_per_s"]
    return {
        "concurrency": concurrency,
        "graph_batch_sizes": result["config"]["graph_batch_sizes"],
        "throughput_tokens_per_s": {"eager": tput["eager"], "torchair": tput["torchair"]},
        "throughput_ratio": result["throughput_ratio"],
        "ttft_p50_ms": {"eager": eager["ttft_p50_ms"], "torchair": graph["ttft_p50_ms"]},
        "tpot_p50_ms": {"eager": eager["tpot_p50_ms"], "torchair": graph["tpot_p50_ms"]},
        "tpot_p99_ms": {"eager": eager["tpot_p99_ms"], "torchair": graph["tpot_p99_ms"]},
        "padding_waste": result["padding_waste"],
        "all_tokens_equal": result["all_tokens_equal"],
        "ok": result["ok"],
        "requests_exact": result["requests_exact"],
        "near_tie_divergences": result["near_tie_divergences"],
        "recompiles_after_warmup": result["recompiles_after_warmup"],
        "dynamo_compiles": graph.get("dynamo_compiles"),
        "generated_tokens": graph.get("generated_tokens"),
        "speculate": result.get("speculate"),
        "demo_wall_s": result.get("wall_s"),
    }


def run_point(args: argparse.Namespace, concurrency: int, tmp: str) -> dict[str, Any]:
    """Run the demo at one concurrency in its own process (its output streamed); its point, or
    the concurrency with the error when it wrote no JSON."""
    out = os.path.join(tmp, f"serve_c{concurrency}.json")
    argv = demo_argv(args, concurrency, out)
    print(f"\n==== concurrency {concurrency}: {' '.join(['python', *argv[1:-2]])}", flush=True)
    start = time.perf_counter()
    try:
        proc = subprocess.run(argv, cwd=ROOT, stdout=None, stderr=subprocess.PIPE, text=True,
                              timeout=args.timeout)
        returncode, stderr = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as exc:
        returncode = None
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (
            exc.stderr or "")
        stderr += f"\ntimed out after {args.timeout:.0f} s"
    elapsed = time.perf_counter() - start
    try:
        with open(out, encoding="utf-8") as f:
            result = point(json.load(f), concurrency)
    except (OSError, ValueError, KeyError) as exc:
        tail = stderr[-3000:]
        print(f"concurrency {concurrency}: FAILED (exit status {returncode}, "
              f"{type(exc).__name__}: {exc})\n{tail}", flush=True)
        return {"concurrency": concurrency, "graph_batch_sizes": graph_sizes(concurrency),
                "error": f"exit status {returncode}; no result: {type(exc).__name__}: {exc}",
                "stderr_tail": tail, "returncode": returncode, "process_s": elapsed}
    result.update(returncode=returncode, process_s=elapsed)
    if returncode != 0:  # the demo's mismatch exit: the point is kept, flagged by its check
        print(f"concurrency {concurrency}: demo exit status {returncode}\n{stderr[-3000:]}",
              flush=True)
    return result


def _pair(d: dict[str, float] | None) -> str:
    if not d:
        return "-"
    return f"{d['eager']:.2f} / {d['torchair']:.2f}"


def print_points(points: list[dict[str, Any]]) -> None:
    headers = ["c", "gears", "eager tok/s", "torchair tok/s", "ratio", "TTFT p50 ms e/t",
               "TPOT p50 ms e/t", "TPOT p99 ms e/t", "pad waste", "tokens ok", "recompiles",
               "compiles"]
    rows = []
    for p in points:
        if "error" in p:
            rows.append([p["concurrency"], " ".join(map(str, p["graph_batch_sizes"])),
                         None, None, None, "-", "-", "-", None, "FAILED", None, None])
            continue
        tput = p["throughput_tokens_per_s"]
        rows.append([p["concurrency"], " ".join(map(str, p["graph_batch_sizes"])),
                     tput["eager"], tput["torchair"], p["throughput_ratio"],
                     _pair(p["ttft_p50_ms"]), _pair(p["tpot_p50_ms"]), _pair(p["tpot_p99_ms"]),
                     f"{100 * p['padding_waste']:.1f}%",
                     "yes" if p["all_tokens_equal"] else "NO", p["recompiles_after_warmup"],
                     p["dynamo_compiles"]])
    print("\nserving throughput vs concurrency (generated tokens/s, medians over the rounds; "
          "e/t = eager / torchair; ratio = torchair / eager; pad waste = padded decode rows):")
    print(H.format_table(headers, rows))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"),
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--concurrency", type=int, nargs="+", default=None, metavar="C",
                   help="--max-batch values, one point each (default 1 2 4 8; --quick 1 4)")
    p.add_argument("--requests", type=int, default=None, help="requests (default 32; --quick 8)")
    p.add_argument("--rounds", type=int, default=None,
                   help="timed rounds per side (default 3; --quick 1)")
    p.add_argument("--engine", choices=("inductor", "fx"), default=None,
                   help="torchair engine (default inductor; --quick fx)")
    p.add_argument("--prompt-lens", type=int, nargs=2, default=None, metavar=("MIN", "MAX"),
                   help="prompt lengths (default: the demo's, 4 128; --quick 4 32)")
    p.add_argument("--output-lens", type=int, nargs=2, default=None, metavar=("MIN", "MAX"),
                   help="generated tokens (default: the demo's, 8 64; --quick 4 16)")
    p.add_argument("--speculate", type=int, default=0, metavar="K",
                   help="K > 0: the demo's speculative decode with K drafts (default 0)")
    p.add_argument("--layers", type=int, default=None, help="passed to the demo (default 4)")
    p.add_argument("--hidden", type=int, default=None, help="passed to the demo (default 256)")
    p.add_argument("--heads", type=int, default=None, help="passed to the demo (default 8)")
    p.add_argument("--kv-heads", type=int, default=None, help="passed to the demo (default 2)")
    p.add_argument("--intermediate", type=int, default=None,
                   help="passed to the demo (default 2 x hidden)")
    p.add_argument("--vocab", type=int, default=None, help="passed to the demo (default 512)")
    p.add_argument("--threads", type=int, default=None,
                   help="the demo's torch.set_num_threads (default: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="seconds per point before its process is killed (default 1800)")
    p.add_argument("--quick", action="store_true",
                   help="8 requests, short prompts and outputs, FX engine, 1 round, c = 1 4")
    p.add_argument("--out", default=None,
                   help="JSON path (default bench/results/serve_<machine-tag>[_quick].json)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but CUDA is not available")
    quick = dict(concurrency=[1, 4], requests=8, rounds=1, engine="fx", prompt_lens=[4, 32],
                 output_lens=[4, 16])
    full = dict(concurrency=[1, 2, 4, 8], requests=32, rounds=3, engine="inductor",
                prompt_lens=[4, 128], output_lens=[8, 64])
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if min(args.concurrency) < 1 or len(set(args.concurrency)) != len(args.concurrency):
        p.error(f"--concurrency: give distinct positive values, got {args.concurrency}")
    args.concurrency = sorted(args.concurrency)
    if args.speculate < 0:
        p.error(f"--speculate must be >= 0, got {args.speculate}")
    return args


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    args = parse_args(argv)
    info = H.machine_info(args.device)
    tag = H.machine_tag(info)
    if args.threads is not None:
        tag += f"-{args.threads}thread"
    if args.engine != ("fx" if args.quick else "inductor"):  # not the mode's default engine
        tag += f"-{args.engine}"
    print("serve benchmark: torchair demo --serve at each concurrency (--max-batch), one "
          "process per point, eager vs torchair in the same process")
    H.print_machine(info)
    print(f"{args.requests} requests, prompts {args.prompt_lens[0]}..{args.prompt_lens[1]}, "
          f"outputs {args.output_lens[0]}..{args.output_lens[1]}, {args.rounds} round(s), "
          f"{args.engine} engine, concurrency {' '.join(map(str, args.concurrency))}"
          + (f", speculate {args.speculate}" if args.speculate else ""), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        points = [run_point(args, c, tmp) for c in args.concurrency]
    print_points(points)
    config = {k: v for k, v in vars(args).items() if k != "out"}
    payload = {
        "benchmark": "serve",
        "command": H.command_line(),
        "machine": info,
        "machine_tag": tag,
        "config": config,
        "method": ("one `python -m torchair demo --serve` process per concurrency: --max-batch c, "
                   "--graph-batch-sizes the powers of two below c, then c; throughput = generated tokens "
                   "/ wall time of serving the whole workload, TTFT / TPOT percentiles over the "
                   "requests, each the median over the timed rounds (eager and torchair "
                   "alternate in one process)"),
        "points": points,
        "load_average_at_end": H.load_average(),
        "total_runtime_s": time.perf_counter() - start,
    }
    H.save_results("serve", tag, payload, quick=args.quick, out=args.out)
    # a point whose tokens failed the check is a failure the report must show, like an error
    return 0 if all("error" not in p and p.get("all_tokens_equal") for p in points) else 1


if __name__ == "__main__":
    sys.exit(main())
