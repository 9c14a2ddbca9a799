"""Per-step latency of a small decoder step: eager vs torch.compile (Inductor) vs torchair path 4.

The step (:mod:`bench.model`): ``--layers`` decoder layers of RMSNorm -> q/k/v projections
(GQA) -> in-place KV-cache write at ``pos`` (``index_copy_``) ->
``torch.ops.npu.npu_incre_flash_attention`` with ``actual_seq_lengths`` -> output projection ->
RMSNorm -> SwiGLU MLP, then a final RMSNorm. The KV caches are preallocated (``--capacity``
positions) and every call of the process, compile and check calls included, gets a new set of
lengths (each sequence grows by one per step), so no variant can reuse per-length artifacts from
an earlier call.

Variants (all measured side by side in one process, interleaved rounds, see ``_harness.py``):

- ``eager``: the module called directly.
- ``inductor``: ``torch.compile(backend="inductor", dynamic=True, fullgraph=True)`` with every
  tensor input ``mark_static``; the lengths are SymInts, so one compile serves every step (with
  ``dynamic=False`` the lengths would be constants and Inductor would recompile on every step).
- ``torchair``: torchair path 4: ``dynamic=True`` + ``mark_static`` +
  ``experimental_config.tiling_schedule_optimize`` (lengths sunk into a device buffer, one static
  launch unit), default engine (Inductor).
- ``torchair-fx``: the same with ``debug.run_eagerly=True`` (FX engine: ATen ops one by one).
- ``torchair-cache``: the same path 4 config through ``torchair.inference.cache_compile`` (a
  fresh temporary cache directory): the first call compiles and saves, the later calls run the
  launch unit from the entry without Dynamo, checking the guards on the call's arguments and
  the process state (``$TORCHAIR_CACHE_GUARDS``, default ``arguments``).
- ``torchair-skipguards``: ``torchair`` called under PyTorch's
  ``torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)`` (one stance object,
  entered around each call after the first, which compiles; ~3 us per call): Dynamo runs only the guards that tell its cache
  entries apart (none, with one entry).
  A user's opt-in, unsafe when anything guarded changes between calls; shows what Dynamo's
  guard evaluation costs per step.
- ``torchair-mm`` (CPU only): ``torchair`` built with ``TORCHAIR_SMALL_GEMM=0``: its products
  are ATen's ``mm`` instead of ``torchair_native::gemv`` (bound at 4-32 rows), so the kernel's
  share of the step is measured in the same run.
- ``torchair-nodynamo``: ``torchair``'s compiled function called directly with Dynamo's
  flattened arguments: the step minus Dynamo's per-call work (frame, guards, argument
  extraction). A diagnostic of where the time goes (nothing is guarded), not a way to call a
  model.
- ``reduce-overhead`` (CUDA only): ``torch.compile(mode="reduce-overhead", dynamic=True,
  fullgraph=True)``, KV caches ``mark_static_address``. Inductor's CUDA graphs key on the SymInt
  values, so new lengths every step mean no replay of an earlier recording.

Two rows are floors, timed interleaved with the variants, not variants:

- ``floor-gemv``: the weight GEMVs alone (on the model's weights, the product a CPU static unit
  runs for each: ``torchair_native::gemv`` where units bind it, else ``F.linear``); with the KV
  bytes at the measured read bandwidth, the step's floor (``x floor`` column).
- ``floor-gemv+dynamo`` (when a ``torch.compile`` variant runs): the same GEMVs, then a copy of
  the module called through ``torch.compile`` with a backend that does no work
  (:class:`DynamoFloor`). Minus ``floor-gemv``, it is Dynamo's per-call work, which every
  ``torch.compile`` variant pays before its backend's code runs; the summary prints it, the
  same work measured as ``torchair`` minus ``torchair-nodynamo``, and the floor plus it as a
  multiple of eager (an estimate: a unit's GEMVs, called from C++, can beat the floor's calls
  from Python).

Each compiled variant is checked against eager (outputs of ``--check-steps`` steps and the final
KV caches, ``allclose``) before timing; the result is recorded, nothing about speed is asserted.

    python -m bench.bench_decode_step                 # defaults: batch 1 and 8, 2 layers
    python -m bench.bench_decode_step --quick         # tiny smoke test (< 1 minute on 2 CPU cores)
    python -m bench.bench_decode_step --device cpu --batch 1 4 --steps 30 --rounds 5
"""
from __future__ import annotations

import argparse
import atexit
import dataclasses
import os
import shutil
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

import torch

import torchair  # (registers torch.ops.npu.*)
from torchair.demo.roofline import GemvFloor, floor_us, kv_read_bytes, read_bandwidth, x_floor
from torchair.ops.matmul import cpu as _mm

from bench import _harness as H
from bench import _profile as P
from bench.model import DecoderStep, ModelConfig, StepInput, make_schedule

FLOOR = "floor-gemv"  # the pseudo-variant timed with the variants: the weight GEMVs alone
# the weight GEMVs, then Dynamo's per-call work on the same module with a backend that does
# nothing: what any torch.compile backend's step costs at least (see DynamoFloor)
DYNAMO_FLOOR = "floor-gemv+dynamo"
# variants called through Dynamo (torch.compile): the Dynamo floor is timed when one runs
_THROUGH_DYNAMO = ("inductor", "torchair", "torchair-fx", "torchair-skipguards", "torchair-mm",
                   "reduce-overhead")

ALL_VARIANTS = ("eager", "inductor", "torchair", "torchair-cache", "torchair-fx",
                "torchair-skipguards", "torchair-mm", "torchair-nodynamo",
                "reduce-overhead")
_CUDA_ONLY, _CPU_ONLY = ("reduce-overhead",), ("torchair-mm",)


# ------------------------------------------------------------------------------ variants

@dataclasses.dataclass
class Variant:
    name: str
    describe: str
    compiled: Callable
    k_caches: list[torch.Tensor]
    v_caches: list[torch.Tensor]
    before_call: Callable[[], None] | None = None
    result: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __call__(self, step: StepInput) -> torch.Tensor:
        if self.before_call is not None:
            self.before_call()
        return self.compiled(step.x, step.pos, step.lens, self.k_caches, self.v_caches)


def _torchair_backend(run_eagerly: bool) -> Callable:
    cfg = torchair.CompilerConfig()
    cfg.experimental_config.tiling_schedule_optimize = True
    cfg.debug.run_eagerly = run_eagerly
    return torchair.get_npu_backend(compiler_config=cfg)


class _NoDynamo:
    """torchair path 4's compiled function called directly with Dynamo's flattened arguments:
    the step without Dynamo's per-call work (frame evaluation, guards, argument extraction).
    A diagnostic of where the step's time goes, not a way to call a model: nothing is guarded.

    The first call runs the Dynamo-compiled module (compiling it) and records the flat
    arguments the backend's function got; later calls rebuild them from the step's inputs: the
    step's ``x`` and ``pos`` where the first call had its own, the lengths at the int
    positions (checked against the first call's lengths, in order), everything else (weights,
    KV caches) as recorded."""

    def __init__(self) -> None:
        self.fn: Callable | None = None
        self.flat: tuple = ()

    def backend(self, gm, example_inputs):
        fn = _torchair_backend(False)(gm, example_inputs)

        def record(*flat):
            self.flat = flat
            return fn(*flat)

        self.fn = fn
        return record

    def bind(self, model: DecoderStep) -> Callable:
        compiled = torch.compile(model, backend=self.backend, dynamic=True, fullgraph=True)
        slots: dict[str, Any] = {}

        def call(x, pos, lens, k_caches, v_caches):
            if not slots:
                out = compiled(x, pos, lens, k_caches, v_caches)
                ints = [j for j, a in enumerate(self.flat) if isinstance(a, int)]
                if [self.flat[j] for j in ints] != list(lens):
                    raise RuntimeError(f"the flat arguments' ints {[self.flat[j] for j in ints]}"
                                       f" are not the lengths {list(lens)}")
                slots.update(x=[j for j, a in enumerate(self.flat) if a is x],
                             pos=[j for j, a in enumerate(self.flat) if a is pos], ints=ints)
                return out
            flat = list(self.flat)
            for j in slots["x"]:
                flat[j] = x
            for j in slots["pos"]:
                flat[j] = pos
            for j, n in zip(slots["ints"], lens):
                flat[j] = n
            return self.fn(*flat)[0]

        return call


class DynamoFloor:
    """Dynamo's own per-call work on the step: a copy of the module through
    ``torch.compile(dynamic=True, fullgraph=True)`` (KV caches ``mark_static``, as the
    variants) with a backend that runs the graph once and then hands back that first result.
    Called right after the weight GEMVs (``floor-gemv+dynamo`` row), so Dynamo's frame
    evaluation, guards and argument gathering run with the caches the step's weights evicted,
    as in a real step. This row minus ``floor-gemv`` is the work every ``torch.compile`` variant
    pays before its backend's code runs, measured in the same run."""

    def __init__(self, model: DecoderStep, init_k: list[torch.Tensor],
                 init_v: list[torch.Tensor], gemv: GemvFloor) -> None:
        import copy

        self.k_caches = [t.clone() for t in init_k]
        self.v_caches = [t.clone() for t in init_v]
        for t in self.k_caches + self.v_caches:
            torch._dynamo.mark_static(t)
        self.gemv = gemv
        self.graph_inputs = 0
        self.compiled = torch.compile(copy.deepcopy(model), backend=self._backend, dynamic=True,
                                      fullgraph=True)

    def _backend(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        self.graph_inputs = len(example_inputs)
        saved: list = []

        def first_result(*flat: Any) -> Any:
            if not saved:
                saved.append(gm.forward(*flat))
            return saved[0]

        return first_result

    def __call__(self, step: StepInput) -> None:
        self.gemv()
        self.compiled(step.x, step.pos, step.lens, self.k_caches, self.v_caches)


def make_variant(name: str, model: DecoderStep, init_k: list[torch.Tensor],
                 init_v: list[torch.Tensor]) -> Variant:
    k_caches = [t.clone() for t in init_k]
    v_caches = [t.clone() for t in init_v]
    for t in k_caches + v_caches:
        torch._dynamo.mark_static(t)
    before_call = None
    if name == "eager":
        compiled, describe = model, "the module called directly (no_grad)"
    elif name == "inductor":
        compiled = torch.compile(model, backend="inductor", dynamic=True, fullgraph=True)
        describe = ("torch.compile(backend='inductor', dynamic=True, fullgraph=True), tensors "
                    "mark_static, lengths SymInts (one compile for all lengths)")
    elif name == "torchair":
        compiled = torch.compile(model, backend=_torchair_backend(False), dynamic=True,
                                 fullgraph=True)
        describe = ("torchair path 4: dynamic=True + mark_static + tiling_schedule_optimize, "
                    "default engine (Inductor)")
    elif name == "torchair-cache":
        config = torchair.CompilerConfig()
        config.experimental_config.tiling_schedule_optimize = True
        cache_dir = tempfile.mkdtemp(prefix="bench-decode-cache-")
        atexit.register(shutil.rmtree, cache_dir, True)
        compiled = torchair.inference.cache_compile(model.forward, config=config,
                                                    cache_dir=cache_dir)
        describe = (f"torchair path 4 through cache_compile (later calls from the entry, "
                    f"TORCHAIR_CACHE_GUARDS={os.environ.get('TORCHAIR_CACHE_GUARDS', 'arguments')})")
    elif name == "torchair-fx":
        compiled = torch.compile(model, backend=_torchair_backend(True), dynamic=True,
                                 fullgraph=True)
        describe = "torchair path 4 with debug.run_eagerly=True (FX engine)"
    elif name == "torchair-skipguards":
        inner = torch.compile(model, backend=_torchair_backend(False), dynamic=True,
                              fullgraph=True)

        stance: list = []

        def compiled(*args):
            if not stance:  # the stance refuses to compile: the first call compiles outside it
                # building a set_stance object costs ~90 us (it sets the stance; __exit__ puts
                # the previous one back): built once, then entered around each call (~3 us)
                stance.append(torch.compiler.set_stance("default", skip_guard_eval_unsafe=True))
                stance[0].__exit__(None, None, None)
                return inner(*args)
            with stance[0]:
                return inner(*args)

        describe = ("torchair path 4 under torch.compiler.set_stance(skip_guard_eval_unsafe="
                    "True): only the guards that tell cache entries apart (a user's opt-in, "
                    "unsafe if guarded state changes)")
    elif name == "torchair-mm":
        compiled = built_with(torch.compile(model, backend=_torchair_backend(False),
                                             dynamic=True, fullgraph=True),
                               {_mm.ENV_SWITCH: "0"})
        describe = (f"torchair path 4 built with {_mm.ENV_SWITCH}=0: its products are ATen's mm, "
                    f"not torchair_native::gemv")
    elif name == "torchair-nodynamo":
        compiled = _NoDynamo().bind(model)
        describe = ("torchair path 4's compiled function called directly with Dynamo's flat "
                    "arguments: the step minus Dynamo's per-call work (diagnostic: unguarded)")
    elif name == "reduce-overhead":
        for t in k_caches + v_caches:
            torch._dynamo.mark_static_address(t)
        compiled = torch.compile(model, mode="reduce-overhead", dynamic=True, fullgraph=True)
        before_call = torch.compiler.cudagraph_mark_step_begin
        describe = ("torch.compile(mode='reduce-overhead', dynamic=True, fullgraph=True), "
                    "tensors mark_static, KV caches mark_static_address")
    else:
        raise ValueError(name)
    return Variant(name, describe, compiled, k_caches, v_caches, before_call)


def built_with(compiled: Callable, env: dict[str, str]) -> Callable:
    """``compiled`` whose first (compiling) call runs with ``env`` set in ``os.environ``; the
    variables are put back after it."""
    built: list[bool] = []

    def call(*args):
        if built:
            return compiled(*args)
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            return compiled(*args)
        finally:
            built.append(True)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    return call


def reset_caches(variant: Variant, init_k: list[torch.Tensor],
                 init_v: list[torch.Tensor]) -> None:
    """Back to the initial cache content, in place (static units keep the same buffers)."""
    with torch.no_grad():
        for dst, src in zip(variant.k_caches + variant.v_caches, init_k + init_v):
            dst.copy_(src)


def _unique_graphs() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def _cudagraph_counters() -> dict[str, Any]:
    out = {}
    for key, counter in torch._dynamo.utils.counters.get("inductor", {}).items():
        if "cudagraph" in key:
            out[key] = counter
    return out


# ------------------------------------------------------------------------------ one batch size

def run_batch(args: argparse.Namespace, cfg: ModelConfig, batch: int, device: str,
              dtype: torch.dtype) -> dict[str, Any]:
    torch._dynamo.reset()
    sync = H.synchronizer(device)
    torch.manual_seed(args.seed)
    model = DecoderStep(cfg).to(device=device, dtype=dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(args.seed + 1)
    init_k = [torch.randn(batch, cfg.capacity, cfg.kv_hidden, generator=gen)
              .to(device=device, dtype=dtype) for _ in range(cfg.layers)]
    init_v = [torch.randn(batch, cfg.capacity, cfg.kv_hidden, generator=gen)
              .to(device=device, dtype=dtype) for _ in range(cfg.layers)]

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
                graphs0, reports0 = _unique_graphs(), len(torchair.graph_reports())
                sync()
                t0 = time.perf_counter()
                v(warm[0])
                sync()
                res["first_call_s"] = time.perf_counter() - t0
                graphs1 = _unique_graphs()
                t0 = time.perf_counter()
                v(warm[1])
                sync()
                res["second_call_s"] = time.perf_counter() - t0
                res["graphs_compiled"] = graphs1 - graphs0
                res["recompiles_warmup"] = _unique_graphs() - graphs1
                reports = torchair.graph_reports()[reports0:]
                if reports:
                    res["torchair_reports"] = [report_dict(r) for r in reports]
                if v.name == "reduce-overhead":
                    res["cudagraph_counters"] = _cudagraph_counters()
                # correctness against eager, from the same initial caches
                reset_caches(v, init_k, init_v)
                graphs_before_check = _unique_graphs()
                outs = [v(s).clone() for s in check]
                sync()
                res["recompiles_check"] = _unique_graphs() - graphs_before_check
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
                res["error"] = f"{type(exc).__name__}: {exc}"
                res["traceback"] = traceback.format_exc()
                res["ok_to_time"] = False
                print(f"  {v.name}: FAILED: {res['error'].splitlines()[0][:300]}", flush=True)
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
        recompiles = {name: 0 for name in timed}
        marks: dict[str, int] = {}

        def before_round(name: str, r: int) -> None:
            marks[name] = _unique_graphs()

        def after_round(name: str, r: int) -> None:
            recompiles[name] += _unique_graphs() - marks[name]

        def steps_of_round(r: int) -> range:
            start = timed_start + r * args.steps
            return range(start, start + args.steps)

        fns = {name: (lambda i, v=v: v(schedule[i])) for name, v in timed.items()}
        gemv = GemvFloor.of_module(model, batch)
        fns[FLOOR] = lambda i: gemv()
        recompiles[FLOOR] = 0
        gemv()  # first call outside the timing, as the variants' warm-up calls
        dynamo_floor = None
        if any(name in timed for name in _THROUGH_DYNAMO):
            dynamo_floor = DynamoFloor(model, init_k, init_v, gemv)
            for s in warm:  # Dynamo traces here; the second call shows it did not recompile
                dynamo_floor(s)
            fns[DYNAMO_FLOOR] = lambda i: dynamo_floor(schedule[i])
            recompiles[DYNAMO_FLOOR] = 0
        bandwidth = [read_bandwidth(device, sync=sync)]
        t0 = time.perf_counter()
        rounds = H.interleaved_rounds(fns, steps_of_round, args.rounds, sync,
                                      before_round=before_round, after_round=after_round)
        floors = [name for name in (FLOOR, DYNAMO_FLOOR) if name in fns]
        print(f"  timed {args.rounds} rounds x {args.steps} steps x {len(fns) - len(floors)} "
              f"variants and {len(floors)} floor row(s) ({', '.join(floors)}) in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        bandwidth.append(read_bandwidth(device, sync=sync))
        gemv_rounds = rounds.pop(FLOOR)
        recompiles.pop(FLOOR, None)
        dynamo_rounds = rounds.pop(DYNAMO_FLOOR, None)
        dynamo_recompiles = recompiles.pop(DYNAMO_FLOOR, None)

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


def _paired_x_floor(variant_rounds: list[list[float]], gemv_rounds: list[list[float]],
                    kv_us: float) -> dict[str, Any]:
    """Per round: variant round median / (GEMV round median + KV time); median, p10, p90."""
    ratios = sorted(H.percentile(sorted(v), 50) * 1e6 / (H.percentile(sorted(g), 50) * 1e6
                                                           + kv_us)
                    for v, g in zip(variant_rounds, gemv_rounds) if v and g)
    return {"n_rounds": len(ratios), "median": H.percentile(ratios, 50),
            "p10": H.percentile(ratios, 10), "p90": H.percentile(ratios, 90)}


def sci(value: float | None) -> str | None:
    return None if value is None else f"{value:.1e}"


def report_dict(r: Any) -> dict[str, Any]:
    return {"graph_id": r.graph_id, "path": r.path, "fx_static": r.fx_static,
            "ir_static": r.ir_static, "build_static": r.build_static, "engine": r.engine,
            "launch": r.launch, "build_seconds": r.build_seconds,
            "sunk_inputs": list(r.sunk_inputs), "reasons": list(r.reasons)}


# ------------------------------------------------------------------------------ main

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"),
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, nargs="+", default=None, help="batch sizes (default 1 8)")
    p.add_argument("--steps", type=int, default=None,
                   help="timed steps per round (default 10); each variant runs --rounds x "
                        "--steps timed steps")
    p.add_argument("--rounds", type=int, default=None,
                   help="interleaved rounds; each variant runs --steps steps per round "
                        "(default 30)")
    p.add_argument("--check-steps", type=int, default=None,
                   help="steps compared against eager before timing (default 3)")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default 2)")
    p.add_argument("--hidden", type=int, default=None, help="hidden size (default 512)")
    p.add_argument("--heads", type=int, default=None, help="query heads (default 8)")
    p.add_argument("--kv-heads", type=int, default=None, help="kv heads, GQA (default 2)")
    p.add_argument("--intermediate", type=int, default=None, help="MLP size (default 3*hidden)")
    p.add_argument("--capacity", type=int, default=None, help="KV cache positions (default 1024)")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None,
                   help="default float32 on CPU, float16 on CUDA")
    p.add_argument("--variants", nargs="+", choices=ALL_VARIANTS, default=None,
                   help="default: all (reduce-overhead only on CUDA, torchair-mm only on CPU); eager is always included")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads (default: leave torch's default)")
    p.add_argument("--warm-cache", action="store_true",
                   help="let Inductor use its on-disk caches (default: caches disabled, so the "
                        "first-call times are cold compile times)")
    p.add_argument("--profile-steps", type=int, default=None,
                   help="steps of the torchair variant (torchair-fx without it) run under "
                        "torch.profiler after the timing, for the per-op table (default 20, "
                        "5 with --quick; 0: no profile)")
    p.add_argument("--quick", action="store_true",
                   help="tiny model, few steps: a smoke test that finishes in well under a minute")
    p.add_argument("--out", default=None,
                   help="JSON path (default bench/results/decode_step_<machine-tag>[_quick].json)")
    args = p.parse_args(argv)

    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but CUDA is not available")
    quick = dict(batch=[2], steps=4, rounds=3, check_steps=2, layers=1, hidden=64, heads=4,
                 kv_heads=2, intermediate=128, capacity=64, profile_steps=5)
    full = dict(batch=[1, 8], steps=10, rounds=30, check_steps=3, layers=2, hidden=512, heads=8,
                kv_heads=2, intermediate=None, capacity=1024, profile_steps=20)
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.intermediate is None:
        args.intermediate = 3 * args.hidden
    if args.hidden % args.heads or args.heads % args.kv_heads:
        p.error("--hidden must be a multiple of --heads, and --heads of --kv-heads")
    if args.dtype is None:
        args.dtype = "float16" if args.device == "cuda" else "float32"
    skip = _CPU_ONLY if args.device == "cuda" else _CUDA_ONLY
    variants = args.variants or [v for v in ALL_VARIANTS if v not in skip]
    args.variants = ["eager"] + [v for v in dict.fromkeys(variants) if v != "eager"]
    return args


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    args = parse_args(argv)
    device, dtype = args.device, getattr(torch, args.dtype)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if not args.warm_cache:
        import torch._inductor.config as inductor_config
        inductor_config.force_disable_caches = True
    info = H.machine_info(device)
    tag = H.machine_tag(info)
    if args.threads is not None:
        tag += f"-{args.threads}thread"
    print("decode-step benchmark: per-step latency, variants interleaved in one run")
    H.print_machine(info)
    cfg = ModelConfig(layers=args.layers, hidden=args.hidden, heads=args.heads,
                      kv_heads=args.kv_heads, intermediate=args.intermediate,
                      capacity=args.capacity)

    batches = [run_batch(args, cfg, b, device, dtype) for b in args.batch]

    headers = ["batch", "variant", "first call s", "check", "max err", "recompiles",
               "median us", "p10 us", "p90 us", "speedup", "paired", "x floor"]
    rows = []
    for b in batches:
        fl = b["floor"]
        rows.append([b["batch"], FLOOR + " (floor)", None, None, None, None,
                     fl["gemv_us"]["median"], fl["gemv_us"]["p10"], fl["gemv_us"]["p90"], None,
                     None, None])
        dyn = b.get("dynamo_floor")
        if dyn:
            st = dyn["gemv_plus_dynamo_us"]
            rows.append([b["batch"], DYNAMO_FLOOR, None, None, None, dyn["recompiles_timed"],
                         st["median"], st["p10"], st["p90"], None, None, None])
        for name, res in b["variants"].items():
            stats = res.get("per_step_us", {})
            recompiles = None
            if "recompiles_timed" in res:
                recompiles = (res.get("recompiles_warmup", 0) + res.get("recompiles_check", 0)
                              + res["recompiles_timed"])
            rows.append([b["batch"], name, res.get("first_call_s"),
                         res.get("check", "error" if "error" in res else None),
                         sci(res.get("max_abs_err")), recompiles, stats.get("median"),
                         stats.get("p10"), stats.get("p90"), res.get("speedup_vs_eager"),
                         res.get("speedup_vs_eager_paired", {}).get("median"),
                         res.get("x_floor")])
    print("\nper-step latency (median, p10, p90 over all timed steps of all rounds); speedup ="
          " eager median / variant median, measured side by side in this run; paired = median"
          " over rounds of the same ratio within one round")
    print("first call s = the compiling call; recompiles = new graphs after the first call "
          "(every call has new lengths)")
    print(H.format_table(headers, rows))
    print("\nfloor per step = weight GEMVs alone (floor-gemv row, timed with the variants) + KV "
          "bytes read / read bandwidth; x floor = variant median / floor")
    for b in batches:
        fl = b["floor"]
        print(f"  batch {b['batch']}: floor {fl['floor_us']:.1f} us = GEMVs "
              f"{fl['gemv_us']['median']:.1f} us + KV {fl['kv_bytes_per_step'] / 2**20:.2f} MiB "
              f"at {fl['read_bandwidth_gb_per_s']:.1f} GB/s = {fl['kv_us']:.1f} us")
    for b in batches:
        dyn = b.get("dynamo_floor")
        if dyn:
            paired = dyn.get("torchair_minus_nodynamo_us")
            print(f"  batch {b['batch']}: Dynamo's per-call work {dyn['dynamo_us']:.1f} us "
                  f"({DYNAMO_FLOOR} - {FLOOR}, {dyn['graph_inputs']} graph inputs)"
                  + (f", {paired['median']:.1f} us (torchair - torchair-nodynamo, paired)"
                     if paired else "")
                  + f"; floor + it = {dyn['floor_plus_dynamo_us']:.1f} us"
                  + (f" = eager / {dyn['floor_plus_dynamo_speedup']:.2f}"
                     if dyn["floor_plus_dynamo_speedup"] else ""))
    gemvs = {b["floor"]["gemvs"]: [] for b in batches}  # per batch: which products the floor ran
    for b in batches:
        gemvs[b["floor"]["gemvs"]].append(str(b["batch"]))
    for text, sizes in gemvs.items():
        print(f"  GEMVs at batch {', '.join(sizes)}: {text}")
    if batches:
        print(f"  read bandwidth: {batches[0]['floor']['read_bandwidth']['method']}")
    for b in batches:
        prof = b.get("profile")
        if prof:
            print(f"\nper-op self CPU time, {prof['variant']} at batch {b['batch']} "
                  f"({prof['steps']} steps under torch.profiler):")
            print(P.format_op_table(prof["ops"], top=15))
    print("\nvariants:")
    for name in args.variants:
        describe = next((b["variants"][name].get("describe") for b in batches
                         if name in b["variants"]), "")
        print(f"  {name:16s} {describe}")

    payload = {
        "benchmark": "decode_step",
        "command": H.command_line(),
        "machine": info,
        "machine_tag": tag,
        "config": {**dataclasses.asdict(cfg), "head_dim": cfg.head_dim, "dtype": args.dtype,
                   "device": device, "batches": args.batch, "steps_per_round": args.steps,
                   "rounds": args.rounds, "check_steps": args.check_steps,
                   "quick": args.quick, "seed": args.seed,
                   "profile_steps": args.profile_steps,
                   "inductor_caches": "warm (on-disk caches allowed)" if args.warm_cache
                   else "disabled (cold compiles)"},
        "method": ("per-step wall time (time.perf_counter, torch.cuda.synchronize on CUDA) of "
                   "each call; variants interleaved in rounds with rotated order; every call "
                   "uses new actual_seq_lengths; units microseconds"),
        "results": batches,
        "load_average_at_end": H.load_average(),
        "total_runtime_s": time.perf_counter() - start,
    }
    H.save_results("decode_step", tag, payload, quick=args.quick, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
