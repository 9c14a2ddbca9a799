"""The demo's decode loop, shared by the one-process demo (:mod:`torchair.demo.run`) and its
tensor-parallel ranks (:mod:`torchair.demo._tp`): the step's inputs, how each path is compiled
(torch.compile with torchair's backend, ``cache_compile``), the timed greedy generation of every
path side by side, and the summary numbers both print.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable, Sequence

import torch
import torch._dynamo

import torchair
from torchair.demo._progress import Bar
from torchair.demo.model import Decoder, DemoConfig, PagedKVCache
from torchair.demo.roofline import GemvFloor, balanced_orders, floor_us, kv_read_bytes, x_floor
from torchair.inference import set_dim_gears

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclasses.dataclass
class Run:
    """One generation (eager or compiled) of one batch size: its cache, tokens and timings."""

    cache: PagedKVCache
    table: torch.Tensor
    token: torch.Tensor
    tokens: list[torch.Tensor] = dataclasses.field(default_factory=list)
    seconds: list[float] = dataclasses.field(default_factory=list)


def model_config(args, max_len: int, tp: int = 1) -> DemoConfig:
    """The decoder's shape from the command line, covering ``max_len`` positions."""
    return DemoConfig(layers=args.layers, hidden=args.hidden, heads=args.heads,
                      kv_heads=args.kv_heads, intermediate=args.intermediate, vocab=args.vocab,
                      block_size=args.block_size, max_len=max_len, rope=not args.no_rope, tp=tp,
                      experts=args.experts, top_k=args.top_k)


def seeded_decoder(args, cfg: DemoConfig, device: str) -> Decoder:
    """The demo's decoder with ``--seed``'s random weights, in ``--dtype``, for inference."""
    torch.manual_seed(args.seed)
    model = Decoder(cfg).to(device=device, dtype=DTYPES[args.dtype]).eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model


def step_inputs(run: Run, position: int, batch: int, device: str) -> tuple:
    positions = torch.full((batch,), position, dtype=torch.int64, device=device)
    return (run.token, positions, run.cache.slots(position), run.table, [position + 1],
            run.cache.k, run.cache.v)


def timed(fn: Callable, args: tuple, sync: Callable[[], None]) -> tuple[torch.Tensor, float]:
    sync()
    start = time.perf_counter()
    out = fn(*args)
    sync()
    return out, time.perf_counter() - start


def compiler_config(engine: str) -> torchair.CompilerConfig:
    """Path 4 (tiling sink) with the given engine ("fx": debug.run_eagerly)."""
    config = torchair.CompilerConfig()
    config.experimental_config.tiling_schedule_optimize = True
    config.debug.run_eagerly = engine == "fx"
    return config


def compile_step(model: Decoder, engine: str) -> Callable:
    backend = torchair.get_npu_backend(compiler_config=compiler_config(engine))
    return torch.compile(model, backend=backend, dynamic=True, fullgraph=True)


def cache_compile_step(model: Decoder, engine: str, cache_dir: str) -> Callable:
    """The same step through ``cache_compile`` (entries in ``cache_dir``): its first call
    compiles path 4 with Dynamo as ``compile_step``'s does; later calls run the launch unit it built
    after torchair's own checks of the call (``$TORCHAIR_CACHE_GUARDS``), without Dynamo."""
    return torchair.inference.cache_compile(model.forward, config=compiler_config(engine),
                                            cache_dir=cache_dir)


def dynamo_graphs() -> int:
    """Graphs Dynamo has compiled in this process (a recompile adds one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def mark_gears(args: tuple, batches: Sequence[int]) -> None:
    """Static shapes everywhere; the batch dim of the per-sequence inputs takes the gears."""
    tokens, positions, slots, table, _, k_pools, v_pools = args
    for t in (*k_pools, *v_pools):
        torch._dynamo.mark_static(t)
    for t in (tokens, positions, slots, table):
        if len(batches) > 1:
            set_dim_gears(t, dim_gears={0: list(batches)})
        else:
            torch._dynamo.mark_static(t)


def generate(args, cfg: DemoConfig, model: Decoder, compiled: Callable, batch: int,
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
        run = Run(cache, cache.reset(batch), prompt[:, :1])
        for p in range(args.prompt_len):  # prefill, eager, one token at a time
            run.token = prompt[:, p:p + 1]
            out = model(*step_inputs(run, p, batch, args.device))
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
    orders = balanced_orders(len(names))  # each one after each other equally often
    for i in range(args.steps):
        position = args.prompt_len + i
        order = [names[k] for k in orders[i % len(orders)]]
        for name in order:
            if name == "floor":
                if i > 0:
                    gemv_s.append(timed(gemv, (), sync)[1])
                    kv_bytes.append(kv_read_bytes([position + 1] * batch, cfg.local_kv_hidden,
                                                  cfg.layers, itemsize))
                continue
            run = runs[name]
            step_args = step_inputs(run, position, batch, args.device)
            if name == "cached":
                graphs_before = dynamo_graphs()
                reports_before = len(torchair.graph_reports())
            if name != "eager" and i == 0:
                if first_compile:
                    mark_gears(step_args, args.batch)
                what = {"graph": f"batch {batch}: compiling the decode step (Dynamo + torchair, "
                                 f"{args.engine} engine)" if first_compile else
                                 f"batch {batch}: building its gear",
                        "cached": f"batch {batch}: compiling the decode step through "
                                  f"cache_compile" if first_compile else
                                  f"batch {batch}: building its gear (cache_compile)"}[name]
                with bar.waiting(what):
                    out, first_call_s[name] = timed(fns[name], step_args, sync)
            else:
                out, seconds = timed(fns[name], step_args, sync)
                if i > 0:
                    run.seconds.append(seconds)
            if name == "cached":
                cached_graphs += dynamo_graphs() - graphs_before
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
           "first_mismatch": first_mismatch(tokens["eager"], tokens["graph"]),
           "eager_tokens": tokens["eager"].tolist(), "graph_tokens": tokens["graph"].tolist()}
    if cached is not None:
        row.update(cached_ms=ms["cached"], cached_speedup=ms["eager"] / ms["cached"],
                   cached_x_floor=x_floor(ms["cached"], floor_ms),
                   cached_first_call_s=first_call_s["cached"],
                   cached_tokens_equal=torch.equal(tokens["eager"], tokens["cached"]),
                   cached_first_mismatch=first_mismatch(tokens["eager"], tokens["cached"]),
                   cached_tokens=tokens["cached"].tolist(), cached_dynamo_graphs=cached_graphs,
                   cached_report_ids=cached_reports)
    return row


def format_table(headers: Sequence[str], cells: Sequence[Sequence[str]],
                 left_first: bool = False) -> str:
    """A plain-text table: a header line, a dashed line, one line per row of ``cells``; columns
    right-aligned (the first left-aligned with ``left_first``), two spaces apart."""
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]

    def line(row: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if left_first and i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(row, widths)))

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(c) for c in cells])


def first_mismatch(a: torch.Tensor, b: torch.Tensor) -> list[int] | None:
    diff = (a != b).nonzero()
    return None if diff.numel() == 0 else diff[0].tolist()  # [sequence, token]


def describe(args, cfg: DemoConfig) -> str:
    mlp = (f"MoE {cfg.experts} experts x SwiGLU {cfg.intermediate}, top-{cfg.top_k}"
           if cfg.experts else f"SwiGLU {cfg.intermediate}")
    return (f"Llama-style decoder: {cfg.layers} layers, hidden {cfg.hidden}, {cfg.heads} heads / "
            f"{cfg.kv_heads} KV heads (GQA, head dim {cfg.head_dim}), {mlp}, "
            f"vocab {cfg.vocab}, {'rotary, ' if cfg.rope else ''}paged KV cache (block "
            f"{cfg.block_size}), {args.dtype}, random weights (seed {args.seed})")


def summary(report: Any, frames: int, n_reports: int) -> dict[str, Any]:
    gears = [g["gear"] for g in getattr(report, "gears", []) if g.get("built")]
    return {"dynamo_compiles": frames, "recompiles": max(frames - 1, 0),
            "graphs_reported": n_reports,
            "build_static": bool(report is not None and report.build_static),
            "path": getattr(report, "path", None), "launch": getattr(report, "launch", None),
            "engine": getattr(report, "engine", None), "built_gears": gears,
            "reasons": list(getattr(report, "reasons", []))}


