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
own KV cache, rotating which goes first), and the demo prints per-step latency, compile counts,
the gears and whether the tokens match. Exit code 0 only when every compiled step's tokens equal
eager's exactly. ``--experts E --top-k K`` makes every layer's MLP a mixture of experts through
torch_npu's MoE ops (:class:`torchair.demo.model.MoE`), in the same one static graph.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

import torch
import torch._dynamo

import torchair
from torchair.demo._progress import Bar
from torchair.demo.roofline import GemvFloor, floor_us, kv_read_bytes, read_bandwidth, x_floor
from torchair.demo.model import DemoConfig, Decoder, PagedKVCache
from torchair.inference import set_dim_gears

__all__ = ["main"]

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


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
    p.add_argument("--dtype", choices=tuple(_DTYPES), default="float32")
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
    args.engine_defaulted = args.engine is None
    if args.engine is None:
        args.engine = "fx" if args.tp > 1 else "inductor"


@dataclasses.dataclass
class _Run:
    """One generation (eager or compiled) of one batch size: its cache, tokens and timings."""

    cache: PagedKVCache
    table: torch.Tensor
    token: torch.Tensor
    tokens: list[torch.Tensor] = dataclasses.field(default_factory=list)
    seconds: list[float] = dataclasses.field(default_factory=list)


def _inputs(run: _Run, position: int, batch: int, device: str) -> tuple:
    positions = torch.full((batch,), position, dtype=torch.int64, device=device)
    return (run.token, positions, run.cache.slots(position), run.table, [position + 1],
            run.cache.k, run.cache.v)


def _timed(fn: Callable, args: tuple, sync: Callable[[], None]) -> tuple[torch.Tensor, float]:
    sync()
    start = time.perf_counter()
    out = fn(*args)
    sync()
    return out, time.perf_counter() - start


def _config(engine: str) -> torchair.CompilerConfig:
    """Path 4 (tiling sink) with the given engine ("fx": debug.run_eagerly)."""
    config = torchair.CompilerConfig()
    config.experimental_config.tiling_schedule_optimize = True
    config.debug.run_eagerly = engine == "fx"
    return config


def _compile(model: Decoder, engine: str) -> Callable:
    backend = torchair.get_npu_backend(compiler_config=_config(engine))
    return torch.compile(model, backend=backend, dynamic=True, fullgraph=True)


def _cache_compile(model: Decoder, engine: str, cache_dir: str) -> Callable:
    """The same step through ``cache_compile`` (entries in ``cache_dir``): its first call
    compiles path 4 with Dynamo as ``_compile``'s does; later calls run the launch unit it built
    after torchair's own checks of the call (``$TORCHAIR_CACHE_GUARDS``), without Dynamo."""
    return torchair.inference.cache_compile(model.forward, config=_config(engine),
                                            cache_dir=cache_dir)


def _dynamo_graphs() -> int:
    """Graphs Dynamo has compiled in this process (a recompile adds one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _mark(args: tuple, batches: Sequence[int]) -> None:
    """Static shapes everywhere; the batch dim of the per-sequence inputs takes the gears."""
    tokens, positions, slots, table, _, k_pools, v_pools = args
    for t in (*k_pools, *v_pools):
        torch._dynamo.mark_static(t)
    for t in (tokens, positions, slots, table):
        if len(batches) > 1:
            set_dim_gears(t, dim_gears={0: list(batches)})
        else:
            torch._dynamo.mark_static(t)


def _generate(args, cfg: DemoConfig, model: Decoder, compiled: Callable, batch: int,
              caches: tuple[PagedKVCache, ...], first_compile: bool, bar: Bar,
              sync: Callable[[], None], bandwidth: dict[str, Any],
              cached: Callable | None = None) -> dict[str, Any]:
    """Prefill the caches eagerly, then generate ``args.steps`` tokens with eager, the compiled
    step and (``cached``: the ``cache_compile`` step, with a third cache) side by side; each
    compiled step feeds on its own tokens. The weight GEMVs alone (the floor's compute part)
    run in the same loop, timed the same way."""
    gen = torch.Generator().manual_seed(args.seed + 1000 + batch)
    prompt = torch.randint(0, cfg.vocab, (batch, args.prompt_len), generator=gen)
    prompt = prompt.to(args.device)
    fns = {"eager": model, "graph": compiled}
    if cached is not None:
        fns["cached"] = cached
    runs = {}
    for name, cache in zip(fns, caches):
        run = _Run(cache, cache.reset(batch), prompt[:, :1])
        for p in range(args.prompt_len):  # prefill, eager, one token at a time
            run.token = prompt[:, p:p + 1]
            out = model(*_inputs(run, p, batch, args.device))
        run.token = out
        runs[name] = run
    gemv = GemvFloor.of_module(model, batch)
    gemv()  # untimed first call, as the steps' first (compiling) call
    gemv_s: list[float] = []
    kv_bytes: list[int] = []
    itemsize = caches[0].k[0].element_size()
    first_call_s: dict[str, float] = {}
    cached_graphs = 0  # Dynamo graphs the cache_compile step traced (its cold call: 1)
    cached_reports: list[int] = []  # the graph reports its calls added
    names = (*fns, "floor")
    for i in range(args.steps):
        position = args.prompt_len + i
        order = names[i % len(names):] + names[:i % len(names)]
        for name in order:
            if name == "floor":
                if i > 0:
                    gemv_s.append(_timed(gemv, (), sync)[1])
                    kv_bytes.append(kv_read_bytes([position + 1] * batch, cfg.local_kv_hidden,
                                                  cfg.layers, itemsize))
                continue
            run = runs[name]
            step_args = _inputs(run, position, batch, args.device)
            if name == "cached":
                graphs_before = _dynamo_graphs()
                reports_before = len(torchair.graph_reports())
            if name != "eager" and i == 0:
                if first_compile:
                    _mark(step_args, args.batch)
                what = {"graph": f"batch {batch}: compiling the decode step (Dynamo + torchair, "
                                 f"{args.engine} engine)" if first_compile else
                                 f"batch {batch}: building its gear",
                        "cached": f"batch {batch}: compiling the decode step through "
                                  f"cache_compile" if first_compile else
                                  f"batch {batch}: building its gear (cache_compile)"}[name]
                with bar.waiting(what):
                    out, first_call_s[name] = _timed(fns[name], step_args, sync)
            else:
                out, seconds = _timed(fns[name], step_args, sync)
                if i > 0:
                    run.seconds.append(seconds)
            if name == "cached":
                cached_graphs += _dynamo_graphs() - graphs_before
                cached_reports += [r.graph_id for r in
                                   torchair.graph_reports()[reports_before:]]
            run.token = out
            run.tokens.append(out.clone())
        bar.update(bar.done + 1, f"batch {batch}: {i + 1}/{args.steps} tokens",
                   milestone=i + 1 == args.steps)
    tokens = {name: torch.cat(run.tokens, dim=1).cpu() for name, run in runs.items()}
    ms = {name: statistics.median(run.seconds) * 1e3 for name, run in runs.items()}
    gemv_ms = statistics.median(gemv_s) * 1e3
    kv = statistics.mean(kv_bytes)
    floor_ms = floor_us(gemv_ms * 1e3, kv, bandwidth["gb_per_s"]) / 1e3
    row = {"batch": batch, "eager_ms": ms["eager"], "graph_ms": ms["graph"],
           "speedup": ms["eager"] / ms["graph"], "floor_ms": floor_ms, "gemv_ms": gemv_ms,
           "kv_bytes_per_step": kv, "eager_x_floor": x_floor(ms["eager"], floor_ms),
           "graph_x_floor": x_floor(ms["graph"], floor_ms),
           "graph_first_call_s": first_call_s["graph"],
           "tokens_equal": torch.equal(tokens["eager"], tokens["graph"]),
           "first_mismatch": _first_mismatch(tokens["eager"], tokens["graph"]),
           "eager_tokens": tokens["eager"].tolist(), "graph_tokens": tokens["graph"].tolist()}
    if cached is not None:
        row.update(cached_ms=ms["cached"], cached_speedup=ms["eager"] / ms["cached"],
                   cached_x_floor=x_floor(ms["cached"], floor_ms),
                   cached_first_call_s=first_call_s["cached"],
                   cached_tokens_equal=torch.equal(tokens["eager"], tokens["cached"]),
                   cached_first_mismatch=_first_mismatch(tokens["eager"], tokens["cached"]),
                   cached_tokens=tokens["cached"].tolist(), cached_dynamo_graphs=cached_graphs,
                   cached_report_ids=cached_reports)
    return row


def _first_mismatch(a: torch.Tensor, b: torch.Tensor) -> list[int] | None:
    diff = (a != b).nonzero()
    return None if diff.numel() == 0 else diff[0].tolist()  # [sequence, token]


def _describe(args, cfg: DemoConfig) -> str:
    mlp = (f"MoE {cfg.experts} experts x SwiGLU {cfg.intermediate}, top-{cfg.top_k}"
           if cfg.experts else f"SwiGLU {cfg.intermediate}")
    return (f"Llama-style decoder: {cfg.layers} layers, hidden {cfg.hidden}, {cfg.heads} heads / "
            f"{cfg.kv_heads} KV heads (GQA, head dim {cfg.head_dim}), {mlp}, "
            f"vocab {cfg.vocab}, {'rotary, ' if cfg.rope else ''}paged KV cache (block "
            f"{cfg.block_size}), {args.dtype}, random weights (seed {args.seed})")


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
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    line = lambda row: "  ".join(c.rjust(w) for c, w in zip(row, widths))  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(c) for c in cells])


def _summary(report: Any, frames: int, n_reports: int) -> dict[str, Any]:
    gears = [g["gear"] for g in getattr(report, "gears", []) if g.get("built")]
    return {"dynamo_compiles": frames, "recompiles": max(frames - 1, 0),
            "graphs_reported": n_reports,
            "build_static": bool(report is not None and report.build_static),
            "path": getattr(report, "path", None), "launch": getattr(report, "launch", None),
            "engine": getattr(report, "engine", None), "built_gears": gears,
            "reasons": list(getattr(report, "reasons", []))}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo with command-line ``argv`` (default ``sys.argv[1:]``); returns the exit code:
    0 when the compiled step's tokens equal eager's exactly, 1 otherwise."""
    parser = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    _check_args(parser, args)
    start = time.perf_counter()
    max_len = args.prompt_len + args.steps
    cfg = DemoConfig(layers=args.layers, hidden=args.hidden, heads=args.heads,
                     kv_heads=args.kv_heads, intermediate=args.intermediate, vocab=args.vocab,
                     block_size=args.block_size, max_len=max_len, rope=not args.no_rope,
                     tp=args.tp, experts=args.experts, top_k=args.top_k)
    try:
        cfg.check()
    except ValueError as err:
        parser.error(str(err))
    if args.tp > 1:
        from torchair.demo import _tp

        if args.tp_worker is not None:
            return _tp.worker(args, args.tp_worker)
        return _tp.launch(args, argv)
    cfg = dataclasses.replace(cfg, tp=1)
    device, dtype = args.device, _DTYPES[args.dtype]
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    print(f"torchair demo: {_describe(args, cfg)}")
    print(f"device {device}, torch {torch.__version__}, torchair {torchair.__version__}, "
          f"{torch.get_num_threads()} CPU threads")
    gears = f"batch gears {args.batch}" if len(args.batch) > 1 else f"batch {args.batch[0]}"
    print(f"compiled step: torch.compile(step, backend=torchair.get_npu_backend(config), "
          f"dynamic=True, fullgraph=True), tiling_schedule_optimize=True, mark_static, {gears}, "
          f"{args.engine} engine; {args.prompt_len} prompt tokens prefilled eagerly, "
          f"{args.steps} tokens generated greedily", flush=True)

    torch.manual_seed(args.seed)
    model = Decoder(cfg).to(device=device, dtype=dtype).eval()
    for param in model.parameters():
        param.requires_grad_(False)
    compiled = _compile(model, args.engine)
    cache_dir = None if args.no_cache_compile else tempfile.mkdtemp(prefix="torchair-demo-")
    try:
        cached = None if cache_dir is None else _cache_compile(model, args.engine, cache_dir)
        graphs_before = _dynamo_graphs()
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
                    rows.append(_generate(args, cfg, model, compiled, batch, caches, k == 0,
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
    summary = _summary(reports[-1] if reports else None,
                       _dynamo_graphs() - graphs_before - cached_graphs, len(reports))
    ok = all(r["tokens_equal"] and r.get("cached_tokens_equal", True) for r in rows)

    print("\nper-step latency (median over the generated tokens after the first; eager, graph"
          f"{'' if cached is None else ' and cached'} rotate, side by side):")
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
