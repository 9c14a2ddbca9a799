"""How fast CPU decode attention reads its KV cache, against how fast a decode step's weights stream.

A decode step reads two things from memory once per step: its weights (the linear layers) and its
KV cache (attention). Both are plain streaming reads, so attention should read K/V about as fast
as the products read the weights; this bench measures both in the same process, side by side in
interleaved rounds (``_harness``), and prints the ratio (issue 36's target: >= 0.8).

Variants (one step each):

* ``kv-b<B>``: one ``torchair_native::ifa_decode`` call (the C++ launch kernel: what a CPU static
  unit and the eager op run) at batch ``--batch`` (and ``kv-b1`` at batch 1, unless
  ``--batch 1``): ``--len`` positions of a ``--kv``-long cache, ``--heads`` / ``--kv-heads``
  heads, head dim ``--dim``, float32, layout ``--layout``. Every step reads the next of
  ``--sets`` K/V caches in turn, so a call reads KV that the previous ``--sets - 1`` calls have
  pushed out of cache (cold, as in a model whose layers each have their own cache); counted
  bytes: the attended K and V, ``2 * B * len * kv_heads * dim * 4``.
* ``weights-gemv``: ``torchair_native::gemv`` of ``--weight-rows`` rows (default 1) by each of
  ``bench_small_gemm``'s 14 weights (2 layers, hidden 512, 23 MiB, more than L2): the weights
  streamed once per step, as a decode step streams them;
* ``weights-linear``: ``F.linear`` of the same rows by the same weights (ATen's GEMV).

Both sides read from memory, not from a cache: the weights are copied into as many sets as it
takes to fill 8x the last-level cache (``roofline.COLD_CACHE_MULTIPLE``, as the roofline's read
bandwidth; at least the weights once), each step reads the next set, and ``--sets`` is raised
until the KV caches fill the same footprint. (One set of the 23 MiB weights fits a 32 MiB L3:
compared with it, KV read from DRAM looked 3x slower than it is. At 2x and 4x the L3 still served
part of the weights' cyclic read: they streamed at 48 and 42-45 GB/s, at 8x and 16x at 37-38.)
GB/s = counted bytes / median step time. The
ratio is the KV's GB/s at batch ``--batch`` over the faster of the two weight variants, from the
median steps (``ratio``) and from the 10th-percentile steps (``ratio_p10``: steadier when other
processes share the CPUs). Saves JSON under ``bench/results/kv_read_<machine>[_quick].json``.

    python -m bench.bench_kv_read [--batch 8] [--len 500] [--layout BSH] [--threads N] [--quick]
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Callable

import torch
import torch.nn.functional as F

import torchair  # noqa: F401  (registers the ops)
from bench import _harness
from torchair.demo import roofline as _roofline
from torchair.ops.attention.cpu import launch_fakes as _fakes, launch_library as _launch
from torchair.ops.matmul import cpu as _mm


def _kv_variant(args, batch: int, min_bytes: int) -> tuple[Callable[[int], object], int, int]:
    """(step function, attended K/V bytes per call, number of cache sets) at ``batch``."""
    n, nkv, d, s, length = args.heads, args.kv_heads, args.dim, args.kv, args.len
    layout = _launch.LAYOUTS[args.layout]
    shape = (batch, s, nkv * d) if args.layout == "BSH" else \
        (batch, nkv, s, d) if args.layout == "BNSD" else (batch, s, nkv, d)
    q_shape = (batch, 1, n * d) if args.layout == "BSH" else \
        (batch, n, 1, d) if args.layout == "BNSD" else (batch, 1, n, d)
    set_bytes = 2 * batch * s * nkv * d * 4
    sets = max(args.sets, -(-min_bytes // set_bytes))
    g = torch.Generator().manual_seed(batch)
    q = torch.randn(*q_shape, generator=g)
    caches = [(torch.randn(*shape, generator=g), torch.randn(*shape, generator=g))
              for _ in range(sets)]
    lengths = torch.full((batch,), length, dtype=torch.long)
    op = _fakes.ifa_decode()
    scale = d ** -0.5

    def step(i: int) -> object:
        k, v = caches[i % sets]
        return op(q, k, v, lengths, None, None, n, nkv, layout, 0, scale)

    return step, 2 * batch * length * nkv * d * 4, sets


def _weights() -> list[torch.Tensor]:
    """``bench_small_gemm``'s default weights: 2 layers of hidden 512, GQA 8/2, MLP 1536."""
    g = torch.Generator().manual_seed(0)
    hidden, kv_hidden, inter = 512, 128, 1536
    shapes = [(hidden, hidden), (kv_hidden, hidden), (kv_hidden, hidden), (hidden, hidden),
              (inter, hidden), (inter, hidden), (hidden, inter)] * 2
    return [torch.randn(*s, generator=g) for s in shapes]


def _cold_bytes(weight_bytes: int, quick: bool) -> int:
    """The footprint each side reads in turn: ``COLD_CACHE_MULTIPLE`` (8) times the last-level
    cache (32 MiB when Linux does not say), at least the weights once; 0 (one set each) for
    ``--quick``."""
    if quick:
        return 0
    llc = _roofline.last_level_cache_bytes() or 32 * 2**20
    return max(weight_bytes, _roofline.COLD_CACHE_MULTIPLE * llc)


def _weight_variants(rows: int, quick: bool
                     ) -> tuple[dict[str, Callable[[int], object]], int, int, int]:
    """(variants, weight bytes per step, number of weight sets, bytes of all sets)."""
    weights = _weights()
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    cold = _cold_bytes(nbytes, quick)
    sets = [weights] + [[w.clone() for w in weights] for _ in range(-(-cold // nbytes) - 1)]
    g = torch.Generator().manual_seed(1)
    xs = {k: torch.randn(rows, k, generator=g) for k in {w.shape[1] for w in weights}}
    pairs = [[(xs[w.shape[1]], w, w.t()) for w in ws] for ws in sets]

    def linear(i: int) -> None:
        for x, w, _w_t in pairs[i % len(pairs)]:
            F.linear(x, w)

    variants = {"weights-linear": linear}
    if _mm.available():
        op = _mm.gemv()

        def gemv(i: int) -> None:
            for x, _w, w_t in pairs[i % len(pairs)]:
                op(x, w_t)

        variants = {"weights-gemv": gemv, **variants}
    return variants, nbytes, len(sets), nbytes * len(sets)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--kv", type=int, default=512, help="KV cache length S")
    parser.add_argument("--len", type=int, default=500, help="attended length per sequence")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layout", choices=sorted(_launch.LAYOUTS), default="BSH")
    parser.add_argument("--sets", type=int, default=8, help="KV caches read in turn")
    parser.add_argument("--weight-rows", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=16, help="timed steps per round")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's own); 1 is steadier on a busy machine")
    parser.add_argument("--quick", action="store_true", help="a tiny run (tests)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.kv, args.len, args.sets, args.rounds, args.steps = 64, 40, 2, 1, 2
    if args.threads:
        torch.set_num_threads(args.threads)
    if not _launch.available():
        print("torchair_native::ifa_decode is not available (no C/C++ compiler?): nothing to "
              "measure")
        return 1
    info = _harness.machine_info("cpu")
    _harness.print_machine(info)
    start = time.time()
    variants, weight_bytes, weight_sets, footprint = _weight_variants(args.weight_rows,
                                                                      args.quick)
    llc = _roofline.last_level_cache_bytes()  # for the output (the footprint reads it too)
    nbytes = {name: weight_bytes for name in variants}
    sets = {name: weight_sets for name in variants}
    for batch in dict.fromkeys([args.batch, 1]):
        name = f"kv-b{batch}"
        variants[name], nbytes[name], sets[name] = _kv_variant(args, batch, footprint)
    for fn in variants.values():  # warm up (loads and binds every kernel)
        fn(0)
    # the step numbers run on across rounds, so every variant keeps cycling through its sets
    rounds = _harness.interleaved_rounds(variants,
                                         lambda r: range(r * args.steps, (r + 1) * args.steps),
                                         args.rounds,
                                         _harness.synchronizer("cpu"))
    stats = {name: _harness.summarize(r) for name, r in rounds.items()}
    gbps = {name: nbytes[name] / (s["median"] * 1e-6) / 1e9 for name, s in stats.items()}
    kv_name = f"kv-b{args.batch}"
    weights_best = max((n for n in gbps if n.startswith("weights-")), key=gbps.get)
    ratio = gbps[kv_name] / gbps[weights_best]
    table = [[name, round(stats[name]["median"], 1), round(stats[name]["p10"], 1),
              round(stats[name]["p90"], 1), round(nbytes[name] / 1e6, 2), round(gbps[name], 1),
              sets.get(name, "-")] for name in variants]
    print(_harness.format_table(["variant", "us/step", "p10", "p90", "MB read", "GB/s",
                                 "cache sets"], table))
    # the same ratio from the 10th-percentile steps: on a busy machine some steps wait for a
    # descheduled OpenMP thread (milliseconds); the fast steps show the code rather than the load
    fast = {name: nbytes[name] / (s["p10"] * 1e-6) / 1e9 for name, s in stats.items()}
    ratio_p10 = fast[kv_name] / max(fast[n] for n in fast if n.startswith("weights-"))
    print(f"\nK/V read speed at batch {args.batch} ({args.layout}) / weights' ({weights_best}): "
          f"{gbps[kv_name]:.1f} / {gbps[weights_best]:.1f} GB/s = {ratio:.2f} (medians; "
          f"p10 steps: {ratio_p10:.2f})")
    print(f"each side reads {footprint / 2**20:.0f} MiB in turn (last-level cache: "
          f"{f'{llc / 2**20:.0f} MiB' if llc else 'not reported'})")
    payload = {"benchmark": "kv_read", "machine": info, "args": vars(args),
               "command": _harness.command_line(), "bytes_per_step": nbytes,
               "cache_sets": sets, "footprint_bytes": footprint,
               "last_level_cache_bytes": llc, "us_per_step": stats, "gb_per_s": gbps,
               "kv_variant": kv_name, "weights_variant": weights_best, "ratio": ratio,
               "ratio_p10": ratio_p10,
               "total_runtime_s": time.time() - start}
    _harness.save_results("kv_read", _harness.machine_tag(info), payload, quick=args.quick,
                          out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
