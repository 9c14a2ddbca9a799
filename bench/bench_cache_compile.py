"""cache_compile: time from process start to first output, cold vs warm, and per-call overhead.

The model is the benches' decoder step (:class:`bench.model.DecoderStep`; path 4:
``dynamic=True``, every tensor ``mark_static``, tiling sink; the default Inductor engine), its
decode method wrapped with ``torchair.inference.cache_compile``. Start-up is timed in separate
processes, from launching the interpreter to the first output printed by the child (so imports
count; the child imports torch, torchair and :mod:`bench.model`, nothing else of ``bench``):

* ``cold``: empty cache directory (Dynamo trace, AOT, passes, Inductor compile, save);
* ``warm``: the entry the cold run saved (no Dynamo: the recorded guards are checked by
  torchair's own evaluator). Without ``ge_cache`` the launch unit is compiled again by Inductor;
  with ``ge_cache=True`` the cold start built it ahead of time into a shared library kept in the
  entry and the warm start only loads it;
* ``dynamic``: no ``mark_static``, so the entry holds a shape-generic graph; the cold start runs
  batch 2, the warm starts batch 3 (a size the cold call never saw, admitted by the entry's
  symbolic shapes and guards) and compare with eager at that batch.

Inductor's own global cache is pointed at a fresh directory per run, so only ``ge_cache`` can
make code generation disappear. Per-call overhead is measured in the first warm process of each:
eager, plain ``torch.compile`` with the torchair backend (Dynamo guards on every call) and the
warm ``cache_compile`` call, in interleaved rounds with new lengths every call.

    python -m bench.bench_cache_compile --quick      # ~3 min on 2 CPU cores
    python -m bench.bench_cache_compile
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# The child imports only what a user's process would (torch, torchair, the model), inside
# _child: its imports are part of the start-up it times.


def _child(args: argparse.Namespace) -> None:
    import torch

    import torchair
    from bench.model import DecoderStep, ModelConfig

    torch.manual_seed(0)
    cfg = ModelConfig(layers=args.layers, hidden=args.hidden, heads=8, kv_heads=2,
                      intermediate=3 * args.hidden, capacity=args.capacity)

    class Cached(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.step = DecoderStep(cfg)
            config = torchair.CompilerConfig()
            config.experimental_config.tiling_schedule_optimize = True
            self.cached = torchair.inference.cache_compile(
                self.decode, config=config, cache_dir=args.cache_dir, ge_cache=args.ge_cache)

        def decode(self, x, pos, lens: list, k_caches: list, v_caches: list):
            return self.step(x, pos, lens, k_caches, v_caches)

    if args.dynamic_entry:
        _child_dynamic(args, cfg)
        return
    model = Cached().eval()
    batch = args.batch
    x = torch.randn(batch, 1, cfg.hidden)
    pos = torch.tensor([7])
    ks = [torch.randn(batch, cfg.capacity, cfg.kv_hidden) for _ in range(cfg.layers)]
    vs = [torch.randn(batch, cfg.capacity, cfg.kv_hidden) for _ in range(cfg.layers)]
    torchair.inference.mark_static(x, pos, *ks, *vs)  # Dynamo is imported only if it traces
    lens = [9, 13, 5, 21][:batch]
    with torch.no_grad():
        out = model.cached(x, pos, lens, ks, vs)
    _first_output(out, lambda: model.decode(x, pos, lens, ks, vs))
    if args.overhead:
        print("OVERHEAD", json.dumps(_overhead(model, x, pos, ks, vs, args)), flush=True)


def _first_output(out, eager) -> None:
    """Print the first output's line (the parent times it), then eager's difference."""
    import torch

    import torchair

    report = torchair.graph_reports()[-1]
    print("FIRST_OUTPUT", json.dumps({"checksum": float(out.double().sum()),
                                      "launch": report.launch, "engine": report.engine,
                                      "dynamo_imported": "torch._dynamo" in sys.modules,
                                      "inductor_imported": "torch._inductor" in sys.modules}),
          flush=True)
    with torch.no_grad():
        diff = float((out - eager()).abs().max())
    print("EAGER", json.dumps({"max_abs_diff": diff}), flush=True)


def _import_floor(runs: int) -> float:
    """Median seconds from launching ``python -c "import torch, torchair"`` to its first output:
    the part of any warm start that caching cannot remove."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", "import torch, torchair; print('up')"],
                                stdout=subprocess.PIPE, text=True)
        proc.stdout.readline()
        times.append(time.perf_counter() - start)
        proc.wait()
    return statistics.median(times)


def _child_dynamic(args: argparse.Namespace, cfg) -> None:
    """The dynamic row: the decode model's MLP blocks (RMSNorm, gated MLP, residual) on
    ``[batch, 1, hidden]`` with no marks, so batch is symbolic in the entry. (The attention
    layers take per-sequence lengths as a list, whose length Dynamo guards: one entry per
    batch size, as in TorchAir.)"""
    import torch

    import torchair

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = torch.nn.RMSNorm(cfg.hidden)
            self.gate_up = torch.nn.Linear(cfg.hidden, 2 * cfg.intermediate, bias=False)
            self.down = torch.nn.Linear(cfg.intermediate, cfg.hidden, bias=False)

        def forward(self, h):
            gate, up = self.gate_up(self.norm(h)).chunk(2, dim=-1)
            return h + self.down(torch.nn.functional.silu(gate) * up)

    class Dense(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block() for _ in range(cfg.layers))
            self.cached = torchair.inference.cache_compile(self.decode, cache_dir=args.cache_dir)

        def decode(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    model = Dense().eval()
    x = torch.randn(args.batch, 1, cfg.hidden)
    with torch.no_grad():
        out = model.cached(x)
    _first_output(out, lambda: model.decode(x))


def _overhead(model, x, pos, ks, vs, args) -> dict:
    """Median µs per call: eager, torch.compile(torchair backend), warm cache_compile."""
    import torch

    import torchair

    for t in (x, pos, *ks, *vs):
        torch._dynamo.mark_static(t)  # plain torch.compile needs Dynamo's own marks
    config = torchair.CompilerConfig()
    config.experimental_config.tiling_schedule_optimize = True
    compiled = torch.compile(model.decode, backend=torchair.get_npu_backend(
        compiler_config=config), dynamic=True, fullgraph=True)
    variants = {"eager": model.decode, "torch.compile": compiled, "cache_compile": model.cached}
    times: dict[str, list[float]] = {k: [] for k in variants}
    with torch.no_grad():
        for fn in variants.values():  # warm-up (compiles torch.compile's graph)
            fn(x, pos, [11, 17], ks, vs)
            fn(x, pos, [12, 18], ks, vs)
        for r in range(args.rounds):
            for name, fn in variants.items():
                for i in range(args.calls):
                    lens = [2 + (r * 31 + i) % 500, 3 + (r * 17 + i * 7) % 500]
                    start = time.perf_counter()
                    fn(x, pos, lens, ks, vs)
                    times[name].append(time.perf_counter() - start)
    return {k: statistics.median(v) * 1e6 for k, v in times.items()}


def _launch(args: argparse.Namespace, cache_dir: str, ge_cache: bool, overhead: bool,
            inductor_dir: str, dynamic: bool = False, batch: int = 2) -> dict:
    cmd = [sys.executable, "-m", "bench.bench_cache_compile", "--child", "--cache-dir", cache_dir,
           "--layers", str(args.layers), "--hidden", str(args.hidden),
           "--capacity", str(args.capacity), "--rounds", str(args.rounds),
           "--calls", str(args.calls), "--batch", str(batch)]
    cmd += ["--ge-cache"] if ge_cache else []
    cmd += ["--dynamic-entry"] if dynamic else []
    cmd += ["--overhead"] if overhead else []
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=inductor_dir)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    result: dict = {}
    for line in proc.stdout:
        if line.startswith("FIRST_OUTPUT"):
            result["first_output_s"] = time.perf_counter() - start
            result.update(json.loads(line.split(" ", 1)[1]))
        elif line.startswith("EAGER"):
            result.update(json.loads(line.split(" ", 1)[1]))
        elif line.startswith("OVERHEAD"):
            result["overhead_us"] = json.loads(line.split(" ", 1)[1])
    err = proc.stderr.read()
    if proc.wait() != 0:
        raise RuntimeError(f"child failed: {err[-3000:]}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", help=argparse.SUPPRESS)
    parser.add_argument("--ge-cache", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--overhead", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dynamic-entry", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--capacity", type=int, default=1024)
    parser.add_argument("--warm-runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="1 warm run each, fewer calls")
    parser.add_argument("--out", help="JSON path (default bench/results/cache_compile_<tag>.json)")
    args = parser.parse_args(argv)
    if args.child:
        _child(args)
        return 0
    if args.quick:
        args.warm_runs, args.rounds, args.calls = 1, 3, 20

    from bench import _harness as H  # here, not at the top: the child must not import it

    info = H.machine_info("cpu")
    print(H.format_machine(info))
    rows, runs = [], {}
    floor = _import_floor(max(3, args.warm_runs))
    with tempfile.TemporaryDirectory() as tmp:
        cases = [("ge_cache", True, False, 2), ("no_ge_cache", False, False, 2),
                 ("dynamic, warm at batch 3", False, True, 3)]
        for key, ge, dynamic, warm_batch in cases:
            cache = os.path.join(tmp, f"cache-{len(runs)}")
            fresh = lambda tag: tempfile.mkdtemp(dir=tmp, prefix=f"inductor-{tag}-")  # noqa: E731
            cold = _launch(args, cache, ge, False, fresh("cold"), dynamic)
            warms = [_launch(args, cache, ge, k == 0 and not dynamic, fresh("warm"), dynamic,
                             warm_batch) for k in range(args.warm_runs)]
            warm_s = statistics.median(w["first_output_s"] for w in warms)
            # same as eager at the warm call's batch (and the cold checksum when the batch is)
            same = all(w["max_abs_diff"] < 1e-3 for w in [cold] + warms) and (
                dynamic or all(abs(w["checksum"] - cold["checksum"]) < 1e-3 * max(
                    1, abs(cold["checksum"])) for w in warms))
            runs[key] = {"cold": cold, "warm": warms, "warm_median_s": warm_s,
                         "warm_over_cold": warm_s / cold["first_output_s"], "same_output": same,
                         "warm_dynamo_imported": any(w["dynamo_imported"] for w in warms)}
            rows.append([key, f"{cold['first_output_s']:.2f}", f"{warm_s:.2f}",
                         f"{100 * warm_s / cold['first_output_s']:.1f}%",
                         f"{warm_s - floor:.2f}", same,
                         runs[key]["warm_dynamo_imported"], warms[0]["launch"]])
            runs[key]["overhead_us"] = warms[0].get("overhead_us")
    print(f"floor: `import torch, torchair` in a new process takes {floor:.2f} s (median)")
    print(H.format_table(["entry", "cold s", "warm s (median)", "warm/cold", "warm - floor s",
                          "same as eager", "warm imported Dynamo", "warm launch"], rows))
    for key in ("ge_cache", "no_ge_cache"):
        overhead = runs[key]["overhead_us"] or {}
        engine = runs[key]["warm"][0]["engine"]
        print(H.format_table([f"per call, warm {key} process", "median us", "vs eager"],
                             [[k if k != "cache_compile" else f"cache_compile ({engine})",
                               f"{v:.0f}", f"{v / overhead['eager']:.2f}"]
                              for k, v in overhead.items()]))
    payload = {"machine": info, "args": vars(args), "runs": runs, "import_floor_s": floor,
               "command": H.command_line()}
    H.save_results("cache_compile", H.machine_tag(info), payload, quick=args.quick,
                   out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
