"""How fast one CPU core reads a decode step's K/V cache in four orders, with and without a fixed
amount of arithmetic per tile: the measurement behind the CPU decode kernel's one-pass tiles.

``bench/csrc/kv_patterns.c`` (built here with ``$CC``, default ``cc``, ``-O3 -march=native``)
reads float32 BSH caches of ``--batch`` sequences x ``--len`` positions x ``--row`` floats (kv
heads x head dim; 128 = 2 x 64, the bench decoder's) from a footprint of 8x the last-level cache
(``roofline.COLD_CACHE_MULTIPLE``), so every step reads from memory, on one thread:

* ``sequential``: a sequence's K rows in order, then its V rows, no software prefetch;
* ``interleaved``: position by position, the K row then the V row, no software prefetch;
* ``chunked``: the chunked kernel's order (``decode_attention.c``'s ``attend``): per chunk of 192
  positions, K in tiles of 4 positions (K prefetched 16 ahead, V prefetched at the tile), then
  the chunk's V rows head by head from cache;
* ``tiles``: the one-pass kernel's order (``fused_*``): per tile of 4 positions, K and V
  prefetched 8 positions ahead, the tile's K rows, then its V rows.

``--work`` FMAs per tile (on 16 registers, fed by the loaded values) stand in for the kernel's
arithmetic: with 0 the rows show the orders' read speed alone; with some, whether the reads
overlap the arithmetic (a row near its ``--work 0`` time overlaps; one near the sum does not).
GB/s = K+V bytes of a step (``2 * batch * len * row * 4``) / median step time. The read floor of
the same machine, ``torch.sum`` over a cold buffer on one thread, is printed beside them.
Saves JSON under ``bench/results/kv_patterns_<machine>[_quick].json``.

    python -m bench.bench_kv_patterns [--work 0 64 128] [--quick]
"""
from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import torch

from bench import _harness
from torchair.demo import roofline as _roofline

SOURCE = pathlib.Path(__file__).resolve().parent / "csrc" / "kv_patterns.c"
PATTERNS = ("sequential", "interleaved", "chunked", "tiles")


def build(directory: str) -> str:
    """Path of the compiled pattern program (raises RuntimeError naming the compiler)."""
    cc = os.environ.get("CC") or "cc"
    if shutil.which(cc) is None:
        raise RuntimeError(f"no C compiler: {cc!r} not found (set $CC)")
    exe = os.path.join(directory, "kv_patterns")
    cmd = [cc, "-O3", "-march=native", "-o", exe, str(SOURCE)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"`{' '.join(cmd)}` failed: {done.stderr.strip()[-2000:]}")
    return exe


def run(exe: str, sets: int, batch: int, cap: int, length: int, row: int, work: int,
        repeats: int) -> dict[str, float]:
    """Median microseconds per step of every pattern."""
    args = [exe] + [str(x) for x in (sets, batch, cap, length, row, work, repeats)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"`{' '.join(args)}` exited with {done.returncode}: {done.stderr}")
    out = {}
    for line in done.stdout.splitlines():
        name, us = line.split()
        out[name] = float(us)
    if set(out) != set(PATTERNS):
        raise RuntimeError(f"unexpected output of {exe}: {done.stdout!r}")
    return out


def read_floor_one_thread() -> dict:
    """``torch.sum`` over a cold buffer on one thread (the read bandwidth one core gets)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _roofline.read_bandwidth("cpu")
    finally:
        torch.set_num_threads(threads)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--len", type=int, default=500, help="positions read per sequence")
    parser.add_argument("--cap", type=int, default=512, help="positions per sequence's cache")
    parser.add_argument("--row", type=int, default=128,
                        help="floats per position: kv heads x head dim (a multiple of 32)")
    parser.add_argument("--work", type=int, nargs="+", default=[0, 64, 128],
                        help="FMAs per tile standing in for the arithmetic (multiples of 16)")
    parser.add_argument("--repeats", type=int, default=7, help="passes over all sets")
    parser.add_argument("--quick", action="store_true", help="a tiny run (tests)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.len, args.cap, args.work, args.repeats = 2, 40, 64, [0, 16], 3
    if args.row % 32 or args.len > args.cap or any(w % 16 or w < 0 for w in args.work):
        parser.error("--row must be a multiple of 32, --len at most --cap, --work multiples of 16")
    info = _harness.machine_info("cpu")
    _harness.print_machine(info)
    start = time.time()
    step_bytes = 2 * args.batch * args.len * args.row * 4
    set_bytes = 2 * args.batch * args.cap * args.row * 4
    llc = _roofline.last_level_cache_bytes() or 32 * 2**20
    sets = 2 if args.quick else -(-_roofline.COLD_CACHE_MULTIPLE * llc // set_bytes)
    floor = None if args.quick else read_floor_one_thread()
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(tmp)
        runs = {work: run(exe, sets, args.batch, args.cap, args.len, args.row, work, args.repeats)
                for work in args.work}
    gbps = {work: {p: step_bytes / (us * 1e3) for p, us in r.items()} for work, r in runs.items()}
    table = [[work, p, round(runs[work][p], 1), round(gbps[work][p], 1)]
             for work in args.work for p in PATTERNS]
    print(_harness.format_table(["FMAs/tile", "pattern", "us/step", "GB/s"], table))
    print(f"\none thread; {sets} sets of {set_bytes / 2**20:.1f} MiB read in turn "
          f"(last-level cache {llc / 2**20:.0f} MiB); {step_bytes / 2**20:.2f} MiB of K+V a step")
    if floor:
        print(f"read floor, one thread: {floor['gb_per_s']:.1f} GB/s ({floor['method']})")
    payload = {"benchmark": "kv_patterns", "machine": info, "args": vars(args),
               "command": _harness.command_line(), "sets": sets, "step_bytes": step_bytes,
               "us_per_step": {str(w): r for w, r in runs.items()},
               "gb_per_s": {str(w): g for w, g in gbps.items()},
               "read_floor_one_thread": floor, "total_runtime_s": time.time() - start}
    _harness.save_results("kv_patterns", _harness.machine_tag(info), payload, quick=args.quick,
                          out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
