"""A served decode step on a GPU against its CUDA graph replay's own host time (issue 36, item 4).

The bench decoder (:mod:`bench.model`, fp16 on CUDA) is called as a serving loop calls it, under
``torch.no_grad()``, with new lengths every step, in two input styles:

* ``persistent``: the step's ``x`` and ``pos`` are the same device buffers every step (a serving
  loop's persistent input buffers, as vLLM keeps them);
* ``fresh``: a new ``x`` and ``pos`` tensor every step (each a different allocation).

Variants (:func:`bench._decode_variants.make_variant`): ``eager``; ``torchair-cache`` (path 4
through ``cache_compile``: one CUDA graph replay per step); ``torchair`` (path 4 through
``torch.compile``, Dynamo's guards every call); ``reduce-overhead``
(``torch.compile(mode="reduce-overhead")``, timed over fewer steps: Inductor's CUDA graphs are
keyed on the lengths' values, so each new length records a graph).

For each call: ``host_us`` is the host time of the call alone (the device idle before it, the
call timed until it returns, then synchronized outside the timing); ``step_us`` is until the
device has finished it too; ``loop_us`` is the time per step of ``--steps`` calls back to back
(one synchronization at the end). ``replay`` rows time the torchair unit's captured CUDA graph
replay alone (recorded at capture), the same ways: the target is ``torchair-cache`` host time
<= 1.5x the replay's at batch 1. A profile of the cached step (``torch.profiler``) counts the
CUDA runtime calls per step: input copies (``cudaMemcpyAsync``), synchronizations, launches.

First-call times are cold (Inductor's caches off unless ``--warm-cache``). Medians over
interleaved rounds; JSON in ``bench/results/gpu_step_<machine>.json`` (or ``--out``).

    python -m bench.bench_gpu_step [--batch 1 8] [--rounds 5] [--steps 50] [--quick]

On a machine without a GPU it runs on CPU with the CPU emulation of a CUDA graph (``--quick``:
a smoke test of the bench itself; the numbers mean nothing there).
"""
from __future__ import annotations

import argparse
import contextlib
import time
from typing import Any, Callable

import torch

import torchair
from bench import _harness as H, _profile as P
from bench._decode_variants import make_variant, reset_caches
from bench.model import ModelConfig, StepInput, make_schedule, max_calls, seeded_decoder
from torchair.runtime import capture as _capture
from torchair.runtime.units import capture_mode

STYLES = ("persistent", "fresh")
VARIANTS = ("eager", "torchair-cache", "torchair", "reduce-overhead")
# CUDA runtime calls counted per step in the profile of the cached step
RUNTIME_CALLS = ("cudaMemcpyAsync", "cudaStreamSynchronize", "cudaDeviceSynchronize",
                 "cudaGraphLaunch", "cudaLaunchKernel", "cudaHostAlloc", "cudaEventRecord",
                 "cudaEventQuery", "cudaStreamWaitEvent", "cuLaunchKernel", "cuLaunchKernelEx",
                 "cudaMemcpy", "cudaMallocHost")


class _Replays:
    """Records the replay callables of the captures made while ``owner`` is set."""

    def __init__(self) -> None:
        self.owner: str | None = None
        self.found: dict[str, list[Callable[[], None]]] = {}
        self._cuda, self._emulated = _capture.capture_cuda, _capture.capture_emulated

    def __enter__(self) -> "_Replays":
        def wrap(fn):
            def capture(*args, **kwargs):
                replay, outputs, first = fn(*args, **kwargs)
                if self.owner is not None:
                    self.found.setdefault(self.owner, []).append(replay)
                return replay, outputs, first
            return capture

        _capture.capture_cuda, _capture.capture_emulated = wrap(self._cuda), wrap(self._emulated)
        return self

    def __exit__(self, *exc: Any) -> None:
        _capture.capture_cuda, _capture.capture_emulated = self._cuda, self._emulated


def _time(fn: Callable[[int], Any], steps: range, sync: Callable[[], None]) -> dict[str, list]:
    """Per call: host time, and until the device finished; then the back-to-back loop."""
    host, step = [], []
    perf = time.perf_counter
    for i in steps:
        sync()
        t0 = perf()
        fn(i)
        t1 = perf()
        sync()
        t2 = perf()
        host.append(t1 - t0)
        step.append(t2 - t0)
    sync()
    t0 = perf()
    for i in steps:
        fn(i)
    sync()
    return {"host": host, "step": step, "loop": [(perf() - t0) / len(steps)]}


def _profile_counts(fn: Callable[[int], Any], steps: range, sync: Callable[[], None]
                    ) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """CUDA runtime calls per step of ``fn`` under torch.profiler (empty without CUDA), and the
    profiler's table of self CPU time per step (top rows)."""
    sync()
    prof = P.profile_steps(fn, steps, sync)  # (a synchronization after each step)
    counts: dict[str, float] = {}
    for event in prof.events():
        if event.name in RUNTIME_CALLS:
            counts[event.name] = counts.get(event.name, 0) + 1 / len(steps)
    return ({k: round(v, 2) for k, v in sorted(counts.items())},
            P.op_table(prof, len(steps))[:15])


def _python_profile(fn: Callable[[int], Any], steps: range, sync: Callable[[], None],
                    top: int = 20) -> list[dict[str, Any]]:
    """Python functions by own time per step under cProfile (its overhead inflates every row;
    read the shares, not the microseconds)."""
    import cProfile
    import pstats

    sync()
    profiler = cProfile.Profile()
    profiler.enable()
    for i in steps:
        fn(i)
    sync()
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = [{"function": f"{'/'.join(file.rsplit('/', 2)[-2:])}:{line}({name})",
             "calls_per_step": calls / len(steps), "own_us_per_step": own * 1e6 / len(steps),
             "cumulative_us_per_step": cum * 1e6 / len(steps)}
            for (file, line, name), (_, calls, own, cum, _) in stats.items()]
    rows.sort(key=lambda r: r["own_us_per_step"], reverse=True)
    return rows[:top]


def run_batch(args: argparse.Namespace, cfg: ModelConfig, batch: int) -> dict[str, Any]:
    device, dtype = args.device, getattr(torch, args.dtype)
    torch._dynamo.reset()
    sync = H.synchronizer(device)
    model, init_k, init_v = seeded_decoder(cfg, batch, device, dtype, args.seed)
    schedule = make_schedule(cfg, batch, min(max_calls(cfg, batch), 400), device, dtype,
                             args.seed + batch)
    for s in schedule:
        torch._dynamo.mark_static(s.x)
        torch._dynamo.mark_static(s.pos)
    x_buf, pos_buf = schedule[0].x.clone(), schedule[0].pos.clone()
    torch._dynamo.mark_static(x_buf)
    torch._dynamo.mark_static(pos_buf)

    def step_input(style: str, i: int) -> StepInput:
        s = schedule[i % len(schedule)]
        return StepInput(x_buf, pos_buf, s.lens) if style == "persistent" else s

    rtol = atol = 1e-4 if dtype == torch.float32 else 2e-2
    result: dict[str, Any] = {"batch": batch, "variants": {}}
    variants = {}
    replays = _Replays()
    print(f"\n== batch {batch}: {cfg.layers} layers, hidden {cfg.hidden}, {dtype}", flush=True)
    with torch.no_grad(), replays:
        reference: dict[str, list[torch.Tensor]] = {}
        for name in args.variants:
            res = result["variants"].setdefault(name, {})
            try:
                v = make_variant(name, model, init_k, init_v, run_eagerly=args.run_eagerly)
                replays.owner = name
                reports = len(torchair.graph_reports())
                sync()
                t0 = time.perf_counter()
                v(step_input("persistent", 0))
                sync()
                res["first_call_s"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                v(step_input("fresh", 1))
                sync()
                res["second_call_s"] = time.perf_counter() - t0
                res["launch"] = [f"path {r.path}: {r.launch}" + (f" ({'; '.join(r.reasons)})"
                                                                 if r.reasons else "")
                                 for r in torchair.graph_reports()[reports:]]
                for style in STYLES:  # against eager, from the same caches
                    reset_caches(v, init_k, init_v)
                    outs = [v(step_input(style, 2 + i)).clone() for i in range(3)]
                    if name == "eager":
                        reference[style] = outs
                        continue
                    ok = all(torch.allclose(o, r, rtol=rtol, atol=atol)
                             for o, r in zip(outs, reference[style]))
                    res[f"check_{style}"] = "ok" if ok else "MISMATCH"
                reset_caches(v, init_k, init_v)
                variants[name] = v
            except Exception as exc:  # noqa: BLE001 - recorded; the other variants go on
                H.record_failure(res, name, exc)
            finally:
                replays.owner = None
            print(f"  {name:16s} first call {res.get('first_call_s', float('nan')):6.2f} s, "
                  f"checks {res.get('check_persistent', '-')}/{res.get('check_fresh', '-')}"
                  f"{' ERROR ' + res['error'] if 'error' in res else ''}", flush=True)
            for line in res.get("launch", []):
                print(f"    {line}", flush=True)

        fns: dict[str, Callable[[int], Any]] = {}
        for name, v in variants.items():
            if name == "reduce-overhead":
                continue
            for style in STYLES:
                fns[f"{name}/{style}"] = lambda i, v=v, style=style: v(step_input(style, i))
        cached = replays.found.get("torchair-cache", [])
        if cached:
            replay = cached[0]
            fns["replay"] = lambda i: replay()
            # what each piece of a served call adds to the replay: the sunk scalars' small
            # copy from pageable or from pinned host memory, and the output's clone
            device_buf = torch.zeros(4, dtype=torch.int64, device=device)
            pageable = torch.arange(4, dtype=torch.int64)
            pinned = pageable.pin_memory() if torch.cuda.is_available() else pageable
            static_out = torch.zeros(batch, 1, cfg.hidden, dtype=dtype, device=device)

            def from_host(i: int, host: torch.Tensor) -> None:
                device_buf.copy_(host, non_blocking=True)
                replay()

            fns["replay+pageable copy"] = lambda i: from_host(i, pageable)
            fns["replay+pinned copy"] = lambda i: from_host(i, pinned)
            fns["replay+clone"] = lambda i: (replay(), static_out.clone())
        samples: dict[str, dict[str, list]] = {k: {"host": [], "step": [], "loop": []}
                                               for k in fns}
        names = list(fns)
        for r in range(args.rounds):
            steps = range(3 + r * args.steps, 3 + (r + 1) * args.steps)
            for k in (names[r % len(names):] + names[:r % len(names)]):
                for key, values in _time(fns[k], steps, sync).items():
                    samples[k][key].extend(values)
        if "reduce-overhead" in variants:
            v = variants["reduce-overhead"]
            for style in STYLES:
                fn = lambda i, v=v, style=style: v(step_input(style, i))  # noqa: E731
                samples[f"reduce-overhead/{style}"] = _time(fn, range(3, 3 + args.ro_steps), sync)
        rows = {}
        for k, s in samples.items():
            rows[k] = {f"{key}_us": H.percentile(sorted(values), 50) * 1e6
                       for key, values in s.items() if values}
            rows[k]["host_p90_us"] = H.percentile(sorted(s["host"]), 90) * 1e6
            rows[k]["calls"] = len(s["host"])
        result["timings"] = rows
        if "torchair-cache" in variants:
            v = variants["torchair-cache"]
            result["profile_per_step"], result["op_table"] = {}, {}
            for style in STYLES:
                fn = lambda i, style=style: v(step_input(style, i))  # noqa: E731
                counts, ops = _profile_counts(fn, range(3, 3 + args.profile_steps), sync)
                result["profile_per_step"][style], result["op_table"][style] = counts, ops
            result["python_profile_persistent"] = _python_profile(
                lambda i: v(step_input("persistent", i)), range(3, 3 + args.steps), sync)
        if "replay" in rows:
            base = rows["replay"]["host_us"]
            result["cached_host_x_replay_host"] = {
                style: rows[f"torchair-cache/{style}"]["host_us"] / base for style in STYLES
                if f"torchair-cache/{style}" in rows}
    headers = ["variant/style", "host us", "step us", "loop us", "calls"]
    table = [[k, r.get("host_us"), r.get("step_us"), r.get("loop_us"), r["calls"]]
             for k, r in rows.items()]
    print(H.format_table(headers, table))
    for style, ratio in result.get("cached_host_x_replay_host", {}).items():
        print(f"  torchair-cache/{style}: host time {ratio:.2f}x the replay's own")
    for style, counts in result.get("profile_per_step", {}).items():
        print(f"  torchair-cache/{style} per step: {counts}")
    if "op_table" in result:
        print("  torchair-cache/persistent, torch.profiler self CPU per step:")
        print(P.format_op_table(result["op_table"]["persistent"], top=12))
        print("  torchair-cache/persistent, cProfile own time per step (inflated by cProfile):")
        print(H.format_table(["function", "calls", "own us", "cum us"], [
            [r["function"], r["calls_per_step"], r["own_us_per_step"],
             r["cumulative_us_per_step"]] for r in result["python_profile_persistent"][:15]]))
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"),
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, nargs="+", default=None, help="default 1 8")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5)")
    p.add_argument("--steps", type=int, default=None, help="steps per round (default 50)")
    p.add_argument("--ro-steps", type=int, default=None,
                   help="reduce-overhead's timed steps (default 12: each records a graph)")
    p.add_argument("--profile-steps", type=int, default=None, help="default 10")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warm-cache", action="store_true", help="Inductor's on-disk caches on")
    p.add_argument("--quick", action="store_true", help="tiny model and few steps")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but CUDA is not available")
    quick = args.quick or args.device == "cpu"
    defaults = (dict(batch=[2], rounds=2, steps=3, ro_steps=2, profile_steps=2) if quick else
                dict(batch=[1, 8], rounds=5, steps=50, ro_steps=12, profile_steps=10))
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    cuda = args.device == "cuda"
    args.variants = ["eager"] + [v for v in (args.variants or VARIANTS)
                                 if v != "eager" and (cuda or v != "reduce-overhead")]
    args.dtype = "float16" if cuda else "float32"
    args.run_eagerly = not cuda  # the CPU smoke run: the FX engine
    cfg = (ModelConfig(layers=2, hidden=512, heads=8, kv_heads=2, intermediate=1536,
                       capacity=1024) if not args.quick else
           ModelConfig(layers=1, hidden=64, heads=4, kv_heads=2, intermediate=128, capacity=64))
    if not args.warm_cache:
        import torch._inductor.config as inductor_config
        inductor_config.force_disable_caches = True
    info = H.machine_info(args.device)
    print("served decode step on a GPU: host time against the CUDA graph replay's own")
    H.print_machine(info)
    start = time.perf_counter()
    mode = contextlib.nullcontext() if cuda else capture_mode("emulate")
    batches: list[dict[str, Any]] = []
    payload = {"benchmark": "gpu_step", "machine": info, "command": H.command_line(),
               "config": vars(cfg) if hasattr(cfg, "__dict__") else str(cfg),
               "variants": args.variants, "rounds": args.rounds, "steps": args.steps,
               "batches": batches, "torchair": getattr(torchair, "__version__", None)}
    with mode, torch._dynamo.config.patch(recompile_limit=64):
        for b in args.batch:  # saved after each batch: a run cut short keeps what it measured
            batches.append(run_batch(args, cfg, b))
            payload["seconds"] = time.perf_counter() - start
            H.save_results("gpu_step", H.machine_tag(info), payload, quick=quick, out=args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
