"""Decode attention kernels: achieved K+V bandwidth vs the measured copy bandwidth, and speed vs
``torch.nn.functional.scaled_dot_product_attention`` on equivalent inputs.

Per device (CPU always; CUDA when available), per dtype, batch B and KV length L: one query token
per sequence, GQA 8:1 (32 query heads, 4 kv heads, head dim 128), contiguous KV cache
``[B, 4, L, D]``, every sequence attending all L positions (so the bytes read are exactly
``B * Nkv * L * D * 2 * itemsize``). Variants, timed in interleaved rounds (``_harness``):

* ``kernel``: ``torchair.ops.attention.decode.decode_attention`` -- the kernel registered for the
  device (``torchair.ops.attention.cpu.decode`` on CPU, which runs the native C kernel when it is
  built; on CUDA the Triton kernel when one is registered, else skipped);
* ``blas`` (CPU): the same entry point with native kernels off (``TORCHAIR_NATIVE_KERNELS=0``):
  the chunked BLAS path;
* ``sdpa``: ``F.scaled_dot_product_attention`` with q ``[B, 32, 1, D]``, the same k/v
  (``enable_gqa=True``; else k/v repeated per query head outside the timing) and a boolean
  ``[B, 1, 1, L]`` mask built from the lengths.

Before timing, the kernel's output is compared with ``decode_attention_reference`` (on the first
two sequences: the dense float32 oracle of a B=32, 32k cache would need many GB) and SDPA's output
with the kernel's. Copy bandwidth: ``dst.copy_(src)`` of a 256 MiB tensor, bytes = 2 x size.
Read bandwidth: ``src.sum()`` of the same tensor, bytes = size (a decode kernel only reads, and
on a few CPU cores reading alone is slower than the copy's read + streamed write).

    python -m bench.bench_decode_attention --quick       # smoke run, < 60 s on 2 CPU cores
    python -m bench.bench_decode_attention               # full grid, ~6 min on 2 CPU cores
    python -m bench.bench_decode_attention --profile     # + torch.profiler of B=8, 32k
"""
from __future__ import annotations

import argparse
import math
import os
import time

import torch
import torch.nn.functional as F

import torchair.ops  # noqa: F401  (registers the kernels)
from bench import _harness as H
from torchair.ops.attention import decode as _decode
from torchair.ops.attention.cpu import native as _decode_native
from torchair.ops.toolchain import native as _native

HEADS, KV_HEADS, DIM = 32, 4, 128
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def read_bandwidth(device: str, mib: int = 256, repeats: int = 10) -> float:
    """Bytes/s of ``src.sum()`` (read only = size), median of ``repeats``."""
    sync = H.synchronizer(device)
    src = torch.ones(mib * 2 ** 20 // 4, device=device)
    src.sum()
    times = sorted(H.time_calls(lambda _: src.sum(), range(repeats), sync))
    return src.numel() * 4 / H.percentile(times, 50)


def copy_bandwidth(device: str, mib: int = 256, repeats: int = 10) -> float:
    """Bytes/s of ``dst.copy_(src)`` (read + write = 2 x size), median of ``repeats``."""
    src = torch.ones(mib * 2**20 // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    sync = H.synchronizer(device)
    dst.copy_(src)
    times = sorted(H.time_calls(lambda _: dst.copy_(src), range(repeats), sync))
    return 2 * src.numel() * 4 / H.percentile(times, 50)


def gemm_rates(device: str, repeats: int = 5) -> dict:
    """GFLOP/s of the reference matmuls (median of ``repeats``): a large square GEMM (the
    machine's BLAS ceiling) and the kernel's per-chunk thin batched matmuls ``q [32, 8, 128] @
    K^T`` / ``P [32, 8, C] @ V`` (32 = B * Nkv at B=8), with C=256 (operands cache-resident,
    as in the bf16 path after conversion) and C=32768 (K/V streamed from memory, as in the fp32
    path, which reads the cache in place)."""
    sync = H.synchronizer(device)
    rates = {}

    def rate(name, fn, flops):
        fn()
        times = sorted(H.time_calls(lambda _: fn(), range(repeats), sync))
        rates[name] = flops / H.percentile(times, 50) / 1e9

    n = 2048
    for dname, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        rate(f"gemm_{n}_{dname}", lambda a=a, b=b: a @ b, 2 * n ** 3)
    rows, group = 32, HEADS // KV_HEADS
    q = torch.randn(rows, group, DIM, device=device)
    for width in (256, 32768):
        k = torch.randn(rows, width, DIM, device=device)
        p = torch.randn(rows, group, width, device=device)
        flops = 2 * rows * group * width * DIM
        rate(f"bmm_qkT_C{width}_fp32", lambda k=k: torch.bmm(q, k.transpose(1, 2)), flops)
        rate(f"bmm_pv_C{width}_fp32", lambda k=k, p=p: torch.bmm(p, k), flops)
        del k, p
    return rates


def _sdpa_inputs(q, k, v, lengths):
    seq = k.shape[2]
    keep = torch.arange(seq, device=q.device)[None, :] < lengths[:, None]  # True = attend
    q4 = q[:, :, None, :]
    try:
        F.scaled_dot_product_attention(q4[:1], k[:1, :, :1], v[:1, :, :1],
                                       attn_mask=keep[:1, None, None, :1], enable_gqa=True)
        return (q4, k, v, keep[:, None, None, :], True)
    except TypeError:  # older torch: no enable_gqa
        group = q.shape[1] // k.shape[1]
        return (q4, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                keep[:, None, None, :], False)


def run_config(device, dtype, batch, length, rounds, budget_s, gen):
    q = torch.randn(batch, HEADS, DIM, generator=gen).to(device=device, dtype=dtype)
    k = torch.randn(batch, KV_HEADS, length, DIM, generator=gen).to(device=device, dtype=dtype)
    v = torch.randn(batch, KV_HEADS, length, DIM, generator=gen).to(device=device, dtype=dtype)
    lengths = torch.full((batch,), length, dtype=torch.long, device=device)
    scale = 1 / math.sqrt(DIM)
    row = {"device": device, "dtype": str(dtype).replace("torch.", ""), "batch": batch,
           "kv_len": length, "bytes": batch * KV_HEADS * length * DIM * 2 * k.element_size()}
    has_kernel = _decode.registered_decode_kernel(device) is not None
    variants = {}
    if has_kernel:
        variants["kernel"] = lambda _: _decode.decode_attention(q, k, v, lengths=lengths,
                                                                scale=scale)
    if device == "cpu" and _decode_native.available():
        def blas(_):
            os.environ[_native.ENV_DISABLE] = "0"
            try:
                return _decode.decode_attention(q, k, v, lengths=lengths, scale=scale)
            finally:
                del os.environ[_native.ENV_DISABLE]
        variants["blas"] = blas
    qs, ks, vs, ms, gqa = _sdpa_inputs(q, k, v, lengths)
    variants["sdpa"] = lambda _: F.scaled_dot_product_attention(qs, ks, vs, attn_mask=ms,
                                                                scale=scale, enable_gqa=gqa) \
        if gqa else F.scaled_dot_product_attention(qs, ks, vs, attn_mask=ms, scale=scale)
    row["kernel_name"] = getattr(_decode.registered_decode_kernel(device), "__name__", None)
    if device == "cpu":
        row["native"] = _decode_native.available()

    # correctness before timing
    n = min(batch, 2)
    ref = _decode.decode_attention_reference(q[:n], k[:n], v[:n], lengths=lengths[:n],
                                             scale=scale).float()
    sync = H.synchronizer(device)
    est = {}
    outs = {}
    for name, fn in variants.items():
        sync()
        t0 = time.perf_counter()
        outs[name] = fn(0)
        sync()
        est[name] = time.perf_counter() - t0
    for name in [v for v in ("kernel", "blas") if v in outs]:
        err = (outs[name][:n].float() - ref).abs().max().item()
        row[f"{name}_max_err"] = err
        row[f"{name}_check"] = bool(err <= TOL[dtype] * (1 + ref.abs().max().item()))
    sdpa_out = outs["sdpa"].reshape(batch, HEADS, DIM)[:n].float()
    row["sdpa_max_err"] = (sdpa_out - ref).abs().max().item()
    del outs

    per_round = sum(est.values())
    rounds = max(3, min(rounds, int(budget_s / max(per_round, 1e-6))))
    times = H.interleaved_rounds(variants, lambda r: [0], rounds, sync)
    stats = {name: H.summarize(t) for name, t in times.items()}
    row["rounds"] = rounds
    row["stats_us"] = stats
    for name in variants:
        med = stats[name]["median"] / 1e6
        row[f"{name}_ms"] = med * 1e3
        row[f"{name}_GBps"] = row["bytes"] / med / 1e9
        row[f"{name}_GFLOPs"] = 4 * batch * HEADS * length * DIM / med / 1e9  # QK^T + PV
    if device == "cuda":  # the GPU's own time, without the per-call launch and synchronize
        for name, fn in variants.items():
            us = H.device_time_us(fn)
            row[f"{name}_device_us"] = us
            row[f"{name}_device_GBps"] = None if us is None else row["bytes"] / us / 1e3
    if has_kernel:
        row["speedup_vs_sdpa"] = stats["sdpa"]["median"] / stats["kernel"]["median"]
        row["paired_speedup_vs_sdpa"] = H.paired_ratios(times["sdpa"], times["kernel"])["median"]
    if "blas" in variants:
        row["speedup_vs_blas"] = stats["blas"]["median"] / stats["kernel"]["median"]
    return row


def profile_kernel(device, dtype, batch, length, gen, steps=3):
    """torch.profiler table (self CPU time) of the registered kernel."""
    from torch.profiler import ProfilerActivity, profile
    q = torch.randn(batch, HEADS, DIM, generator=gen).to(device=device, dtype=dtype)
    k = torch.randn(batch, KV_HEADS, length, DIM, generator=gen).to(device=device, dtype=dtype)
    v = torch.randn(batch, KV_HEADS, length, DIM, generator=gen).to(device=device, dtype=dtype)
    lengths = torch.full((batch,), length, dtype=torch.long, device=device)
    fn = lambda: _decode.decode_attention(q, k, v, lengths=lengths, scale=DIM ** -0.5)
    fn()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            fn()
        H.synchronizer(device)()
    key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=12)


def _num(value, divisor=None) -> float:
    """``value`` (/ ``divisor``) for a table cell; NaN (printed "nan") where either is None."""
    if value is None or (divisor is not None and not divisor):
        return float("nan")
    return value / divisor if divisor is not None else value


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", nargs="+", default=None, help="cpu and/or cuda (default: cpu, "
                   "plus cuda when available)")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 4096, 32768])
    p.add_argument("--dtypes", nargs="+", default=None, choices=list(DTYPES),
                   help="default: fp32 bf16 on CPU, fp16 bf16 fp32 on CUDA")
    p.add_argument("--rounds", type=int, default=15, help="max interleaved rounds per config")
    p.add_argument("--budget", type=float, default=4.0,
                   help="seconds of timing per config (fewer rounds for big configs, min 3)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--profile", action="store_true", help="profile B=8 at the largest length")
    p.add_argument("--quick", action="store_true", help="B 1 8, L 512 4096, 3 rounds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.batch, args.lengths, args.rounds, args.budget = [1, 8], [512, 4096], 3, 0.5
    devices = args.device or (["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
    gen = torch.Generator().manual_seed(args.seed)

    payload = {"command": H.command_line(), "config": vars(args), "machines": {}, "rows": [],
               "profiles": {}}
    for device in devices:
        info = H.machine_info(device)
        payload["machines"][device] = info
        H.print_machine(info)
        bw = copy_bandwidth(device)
        info["copy_GBps"] = bw / 1e9
        print(f"{device}: copy bandwidth {bw / 1e9:.1f} GB/s (256 MiB dst.copy_(src), 2 x size)")
        rbw = read_bandwidth(device)
        info["read_GBps"] = rbw / 1e9
        print(f"{device}: read bandwidth {rbw / 1e9:.1f} GB/s (256 MiB src.sum(), 1 x size)")
        if device == "cpu":
            info["native_decode_kernel"] = _decode_native.available()
            print(f"{device}: native decode kernel "
                  f"{'built' if info['native_decode_kernel'] else 'NOT available (BLAS path)'}")
        if device == "cpu":
            info["gemm_GFLOPs"] = gemm_rates(device)
            print(f"{device}: matmul GFLOP/s " + ", ".join(
                f"{k} {v:.0f}" for k, v in info["gemm_GFLOPs"].items()))
        if _decode.registered_decode_kernel(device) is None:
            print(f"{device}: no decode kernel registered; timing SDPA only")
        dtypes = args.dtypes or (["fp32", "bf16"] if device == "cpu" else ["fp16", "bf16",
                                                                            "fp32"])
        table = []
        for dname in dtypes:
            for length in args.lengths:
                for batch in args.batch:
                    row = run_config(device, DTYPES[dname], batch, length, args.rounds,
                                     args.budget, gen)
                    row["copy_bw_fraction"] = row.get("kernel_GBps", float("nan")) * 1e9 / bw
                    row["read_bw_fraction"] = row.get("kernel_GBps", float("nan")) * 1e9 / rbw
                    payload["rows"].append(row)
                    table.append([dname, batch, length, row.get("kernel_ms", float("nan")),
                                  row.get("kernel_GBps", float("nan")), row["copy_bw_fraction"],
                                  row["read_bw_fraction"],
                                  row.get("kernel_GFLOPs", float("nan")),
                                  row.get("blas_ms", float("nan")),
                                  row.get("speedup_vs_blas", float("nan")),
                                  row["sdpa_ms"], row.get("speedup_vs_sdpa", float("nan")),
                                  row.get("paired_speedup_vs_sdpa", float("nan")),
                                  "ok" if row.get("kernel_check") else
                                  ("-" if "kernel_check" not in row else "FAIL"),
                                  row["rounds"]])
                    print(f"  {dname} B={batch} L={length}: kernel "
                          f"{row.get('kernel_ms', float('nan')):.2f} ms, sdpa "
                          f"{row['sdpa_ms']:.2f} ms", flush=True)
        print()
        print(H.format_table(["dtype", "B", "kv_len", "kernel ms", "GB/s", "x copy bw",
                              "x read bw", "GFLOP/s", "blas ms", "vs blas", "sdpa ms",
                              "vs sdpa", "paired", "check", "rounds"], table))
        print()
        if device == "cuda":
            rows = [r for r in payload["rows"] if r["device"] == device]
            print("GPU time per call (CUDA-graph replay of 20 calls, CUDA events; the table "
                  "above is wall time per call, launch and synchronize included):")
            print(H.format_table(
                ["dtype", "B", "kv_len", "kernel us", "GB/s", "x copy bw", "sdpa us", "vs sdpa"],
                [[r["dtype"], r["batch"], r["kv_len"], _num(r.get("kernel_device_us")),
                  _num(r.get("kernel_device_GBps")),
                  _num(r.get("kernel_device_GBps"), bw / 1e9),
                  _num(r.get("sdpa_device_us")),
                  _num(r.get("sdpa_device_us"), r.get("kernel_device_us"))] for r in rows]))
            print()
        if args.profile and _decode.registered_decode_kernel(device) is not None:
            for dname in dtypes:
                text = profile_kernel(device, DTYPES[dname], 8, max(args.lengths), gen)
                payload["profiles"][f"{device}-{dname}-B8-L{max(args.lengths)}"] = text
                print(f"profile {device} {dname} B=8 L={max(args.lengths)} (3 calls)")
                print(text)
        info["load_average_at_end"] = H.load_average()

    first = payload["machines"][devices[-1]]
    tag = H.machine_tag(first)
    if args.threads:
        tag += f"-{args.threads}thread"
    if args.quick:
        tag += "_quick"
    out = args.out or H.RESULTS_DIR / f"decode_attention_{tag}.json"
    print("saved", H.save_json(out, payload))


if __name__ == "__main__":
    main()
