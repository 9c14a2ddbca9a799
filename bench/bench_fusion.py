"""Pattern fusion: fused norm/quant ops vs the unfused chains, op by op and in a W8A8 decode step.

Part 1, op level (eager op calls, the device's kernels): the three default fusion patterns of
``torchair/patterns/add_rms_norm.py``, each timed as the unfused chain and as the fused op,
interleaved in rounds (``_harness``):

* ``a`` ``npu_add_rms_norm`` -> ``npu_dynamic_quant(y, smooth_scales=s)`` vs
  ``npu_add_rms_norm_dynamic_quant(..., smooth_scale1=s, output_mask=[True, False])``;
* ``b`` ``npu_add_rms_norm`` -> ``y.flatten(0, 1)`` -> ``npu_dynamic_quant`` ->
  ``scale.view(-1, 1)`` vs the fused op (``output_mask=[True, False]``) + the same flatten and
  view; inputs ``[1, T, H]``;
* ``c`` ``npu_add_rms_norm`` -> ``y.view(-1, H).to(torch.float32)`` vs ``npu_add_rms_norm_cast``.

Inputs are ``[T, H]`` (``b``: ``[1, T, H]``) for T in ``--tokens`` and H in ``--hidden``. Before
timing, the fused results are compared with the unfused chain's (int8 within +-1 on at most
``FLIP_BOUND`` of the elements, scales rtol 1e-2, ``x_out`` and the float32 cast close, bit
equality recorded) and with the fused op's plain-PyTorch reference; the check is recorded.
Reported: median us of each, ratio unfused / fused (of the medians, and paired per round), and the
fused op's effective bandwidth: the minimal bytes it must move (read x1, x2, gamma (, smooth),
write its outputs) / time, also as a fraction of the copy bandwidth (``dst.copy_(src)``, 256 MiB).

Part 2, end to end: one decode step of a ``--layers``-layer W8A8 decoder. Per layer:
``npu_add_rms_norm`` -> ``npu_dynamic_quant(y.flatten(0, 1))`` + ``scale.view(-1, 1)`` (pattern b)
-> ``npu_quant_matmul`` qkv (bf16 out, per-token scale) -> KV cache ``index_copy_`` ->
``npu_incre_flash_attention`` (GQA, ``actual_seq_lengths`` a Python list, new at every call) ->
o_proj bf16 matmul -> ``npu_add_rms_norm`` -> ``npu_dynamic_quant(y, smooth_scales=s)`` (pattern
a) -> gate_up int8 GEMM (``torch._int_mm``, int32: ``npu_quant_matmul`` has no int32 output) ->
``npu_dequant_swiglu_quant`` (dynamic per-token int8) -> ``npu_quant_matmul`` down. Then a final
``npu_add_rms_norm`` -> ``view(-1, H).to(float32)`` (pattern c). Variants: ``eager`` (the
unfused chains), ``eager-fused`` (the same weights, fused ops called by hand), and torchair path 4
(``dynamic=True``, ``mark_static``, ``tiling_schedule_optimize``) with the fusion pass on and off
(``torchair-<engine>-on|off``). The patterns each compile fired are recorded from
``torchair.graph_reports()``; fusion off is checked against ``eager`` and fusion on against
``eager-fused`` before timing, then all are timed in interleaved rounds.

    python -m bench.bench_fusion --quick     # smoke run, < 60 s on 2 CPU cores
    python -m bench.bench_fusion             # full grid + decode step, 6-10 min on 2 CPU cores
    python -m bench.bench_fusion --parts op --tokens 1 4096 --hidden 7168 --dtype fp16
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch

from bench import _harness as H
from bench._fusion_e2e import e2e_table, run_e2e
from bench._fusion_ops import DTYPES, PATTERNS, op_table, run_op_level
from bench.bench_decode_attention import copy_bandwidth

# ============================================================================== main

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", nargs="+", choices=("cpu", "cuda"), default=None,
                   help="default: cpu, plus cuda when available")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16",
                   help="activation dtype (default bf16; the decode step uses bf16 for fp32)")
    p.add_argument("--parts", nargs="+", choices=("op", "e2e"), default=["op", "e2e"])
    p.add_argument("--patterns", nargs="+", choices=sorted(PATTERNS), default=sorted(PATTERNS))
    p.add_argument("--tokens", type=int, nargs="+", default=None,
                   help="op level: rows T (default 1 4 16 64 256 1024 4096)")
    p.add_argument("--hidden", type=int, nargs="+", default=None,
                   help="op level: row width H (default 4096 7168)")
    p.add_argument("--rounds", type=int, default=None,
                   help="op level: max interleaved rounds per case (default 15)")
    p.add_argument("--budget", type=float, default=None,
                   help="op level: seconds of timing per case (default 2.5)")
    p.add_argument("--max-calls", type=int, default=50, help="op level: max calls per round")
    p.add_argument("--layers", type=int, default=None, help="decode step: layers (default 2)")
    p.add_argument("--model-hidden", type=int, default=None,
                   help="decode step: hidden size (default 2048 on CPU, 4096 on CUDA)")
    p.add_argument("--heads", type=int, default=None, help="query heads (default hidden/128)")
    p.add_argument("--kv-heads", type=int, default=None, help="kv heads (default 4)")
    p.add_argument("--intermediate", type=int, default=None,
                   help="MLP size (default 2.75 x hidden rounded to 256)")
    p.add_argument("--capacity", type=int, default=None, help="KV positions (default 1024)")
    p.add_argument("--batch", type=int, nargs="+", default=None,
                   help="decode step: sequences per step (default 1 16)")
    p.add_argument("--steps", type=int, default=None, help="decode step: steps per round (8)")
    p.add_argument("--e2e-rounds", type=int, default=None, help="decode step: rounds (15)")
    p.add_argument("--check-steps", type=int, default=None, help="steps checked vs eager (3)")
    p.add_argument("--engine", nargs="+", choices=("fx", "inductor"), default=["fx"],
                   help="torchair engine(s) of the decode step (default fx: debug.run_eagerly)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true",
                   help="tiny shapes and few rounds: a smoke run of < 60 s")
    p.add_argument("--out", default=None,
                   help="JSON path (default bench/results/fusion_<machine-tag>[_quick].json)")
    args = p.parse_args(argv)
    quick = dict(tokens=[1, 64], hidden=[512], rounds=3, budget=0.2, layers=1, model_hidden=256,
                 heads=4, kv_heads=2, intermediate=512, capacity=64, batch=[2], steps=3,
                 e2e_rounds=3, check_steps=2)
    full = dict(tokens=[1, 4, 16, 64, 256, 1024, 4096], hidden=[4096, 7168], rounds=15,
                budget=2.5, layers=2, model_hidden=None, heads=None, kv_heads=4,
                intermediate=None, capacity=1024, batch=[1, 16], steps=8, e2e_rounds=15,
                check_steps=3)
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.device is None:
        args.device = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if "cuda" in args.device and not torch.cuda.is_available():
        p.error("--device cuda but CUDA is not available")
    return args


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print("fusion benchmark: unfused chains vs fused ops (op level), fusion pass on vs off "
          "(decode step); variants interleaved in one run")
    payload: dict[str, Any] = {"benchmark": "fusion", "command": H.command_line(),
                               "config": {k: v for k, v in vars(args).items()}, "machines": {},
                               "op_level": [], "e2e": {}}
    for device in args.device:
        info = H.machine_info(device)
        payload["machines"][device] = info
        H.print_machine(info)
        bw = copy_bandwidth(device)
        info["copy_GBps"] = bw / 1e9
        print(f"{device}: copy bandwidth {bw / 1e9:.1f} GB/s (256 MiB dst.copy_(src), 2 x size)",
              flush=True)
        if "op" in args.parts:
            print(f"\n== op level, {device}, {args.dtype}")
            rows = run_op_level(device, args, bw)
            payload["op_level"] += rows
            print(f"\nop level ({device}, {args.dtype}): median us per call; ratio = unfused / "
                  f"fused medians, paired = median over rounds of the per-round ratio; fused GB/s"
                  f" = minimal bytes of the fused op / its time; copy bandwidth "
                  f"{bw / 1e9:.1f} GB/s")
            for key, text in PATTERNS.items():
                if key in args.patterns:
                    print(f"  {key}: {text}")
            print(op_table(rows), flush=True)
        if "e2e" in args.parts:
            e2e = run_e2e(device, args)
            payload["e2e"][device] = e2e
            print(f"\ndecode step ({device}): per-step latency (us); check = outputs and KV "
                  f"caches vs the eager variant of the same ops (==: bit for bit); rel err = "
                  f"relative L2 error vs the unfused eager model (the fusion's numerics); vs "
                  f"eager = paired per-round ratio eager / variant; fusion x = paired ratio "
                  f"unfused / fused (eager-fused: vs eager; torchair-*-on: vs -off); > 1: the "
                  f"fusion is faster")
            print(e2e_table(e2e), flush=True)
        info["load_average_at_end"] = H.load_average()
    payload["total_runtime_s"] = time.perf_counter() - start
    tag = H.machine_tag(payload["machines"][args.device[-1]])
    if args.threads is not None:
        tag += f"-{args.threads}thread"
    if args.dtype not in ("bf16", "bfloat16"):
        tag += f"-{args.dtype}"
    H.save_results("fusion", tag, payload, quick=args.quick, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
