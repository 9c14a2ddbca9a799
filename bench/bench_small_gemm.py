"""Few-row products on CPU: ``torchair_native::gemv`` against ATen's ``F.linear``, per row count.

A decode step's linear layers multiply a few rows (the batch) by each weight: the weight is read
once and little arithmetic is done per value. For each row count M, the weights of
``bench_decode_step.py``'s model (2 layers, hidden 512, GQA 8/2, MLP 1536: 14 matrices, 23 MiB,
more than L2, so every step streams them) are multiplied by an ``[M, in]`` input, timed side by
side in interleaved rounds (``_harness``):

* ``aten``: ``F.linear(x, W)`` for each weight (what eager and an unbound unit run);
* ``gemv``: ``torch.ops.torchair_native.gemv(x, W.t())`` (what a bound CPU static unit runs);
* ``gemv-noprefetch``: the same with the kernel's software prefetch of the weight off (on by
  default, into L2: ``torchair.ops.matmul.cpu.set_prefetch``);
* ``sum``: ``W.sum()`` for each weight: a streaming read of the same bytes, the bandwidth floor.

Both products are called from Python here, one dispatcher call per weight each. Prints per M the
median step, GB/s of weight read and the ratio ``aten / gemv``; saves JSON under
``bench/results/small_gemm_<machine>.json``. ``MIN_ROWS`` and ``MAX_ROWS`` of
:mod:`torchair.ops.matmul.cpu` (the row counts static units bind) come from these numbers.

    python -m bench.bench_small_gemm [--rows 1 2 4 8 16 24 32 48 64] [--rounds 20] [--steps 10]
"""
from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F

from bench import _harness
from torchair.ops.matmul import cpu as _mm


def _weights(hidden: int, kv_hidden: int, intermediate: int, layers: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = [(hidden, hidden), (kv_hidden, hidden), (kv_hidden, hidden), (hidden, hidden),
              (intermediate, hidden), (intermediate, hidden), (hidden, intermediate)] * layers
    return [torch.randn(*s, generator=g) for s in shapes]


def _variants(weights: list[torch.Tensor], rows: int) -> dict:
    g = torch.Generator().manual_seed(rows)
    xs = {k: torch.randn(rows, k, generator=g) for k in {w.shape[1] for w in weights}}
    pairs = [(xs[w.shape[1]], w, w.t()) for w in weights]
    op = _mm.gemv()
    for x, w, w_t in pairs:  # the variants compute the same products
        torch.testing.assert_close(op(x, w_t), F.linear(x, w), rtol=1e-4, atol=1e-4)

    def aten(_):
        for x, w, _w_t in pairs:
            F.linear(x, w)

    def gemv(_):
        for x, _w, w_t in pairs:
            op(x, w_t)

    def gemv_no_prefetch(_):
        _mm.set_prefetch(False)
        try:
            gemv(_)
        finally:
            _mm.set_prefetch(True)

    def read(_):
        for w in weights:
            w.sum()

    return {"aten": aten, "gemv": gemv, "gemv-noprefetch": gemv_no_prefetch, "sum": read}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 24, 32, 48, 64])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--kv-hidden", type=int, default=128)
    parser.add_argument("--intermediate", type=int, default=1536)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if not _mm.available():
        print("torchair_native::gemv is not available (no C++ compiler, or no AVX2/AVX-512): "
              "nothing to measure")
        return 1
    info = _harness.machine_info("cpu")
    _harness.print_machine(info)
    print(f"kernel vector width: {_mm.vector_bits()} bits; Inductor-engine static units bind "
          f"products of {_mm.MIN_ROWS} to {_mm.MAX_ROWS} rows")
    start = time.time()
    weights = _weights(args.hidden, args.kv_hidden, args.intermediate, args.layers)
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    results, table = [], []
    for rows in args.rows:
        variants = _variants(weights, rows)
        for fn in variants.values():
            fn(0)
        rounds = _harness.interleaved_rounds(variants, lambda r: range(args.steps), args.rounds,
                                             _harness.synchronizer("cpu"))
        stats = {name: _harness.summarize(r) for name, r in rounds.items()}
        paired = _harness.paired_ratios(rounds["aten"], rounds["gemv"])
        prefetch_paired = _harness.paired_ratios(rounds["gemv-noprefetch"], rounds["gemv"])
        gbps = {name: nbytes / (s["median"] * 1e-6) / 1e9 for name, s in stats.items()}
        results.append({"rows": rows, "us": stats, "gb_per_s": gbps,
                        "aten_over_gemv": stats["aten"]["median"] / stats["gemv"]["median"],
                        "aten_over_gemv_paired": paired,
                        "noprefetch_over_gemv_paired": prefetch_paired})
        table.append([rows, round(stats["aten"]["median"]), round(stats["gemv"]["median"]),
                      round(stats["gemv-noprefetch"]["median"]),
                      round(stats["sum"]["median"]), round(gbps["aten"], 1),
                      round(gbps["gemv"], 1), round(gbps["sum"], 1),
                      f"{stats['aten']['median'] / stats['gemv']['median']:.2f}x",
                      f"{prefetch_paired['median']:.2f}x",
                      "yes" if _mm.MIN_ROWS <= rows <= _mm.MAX_ROWS else "no"])
    print(f"\n{len(weights)} weights, {nbytes / 2**20:.1f} MiB; median us per step (all "
          f"products), {args.rounds} rounds x {args.steps} steps")
    print(_harness.format_table(["rows", "aten us", "gemv us", "no-prefetch us", "sum us",
                                 "aten GB/s", "gemv GB/s", "sum GB/s", "aten/gemv",
                                 "no-prefetch/gemv (paired)", "bound"], table))
    payload = {"benchmark": "small_gemm", "machine": info, "args": vars(args),
               "command": _harness.command_line(), "weight_bytes": nbytes,
               "min_rows": _mm.MIN_ROWS, "max_rows": _mm.MAX_ROWS,
               "vector_bits": _mm.vector_bits(), "results": results,
               "total_runtime_s": time.time() - start}
    _harness.save_results("small_gemm", _harness.machine_tag(info), payload, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
