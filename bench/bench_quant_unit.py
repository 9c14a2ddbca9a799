"""A W8A8 decode block on CPU: eager vs a torchair static unit with the quant ops lowered to
generated code vs the same unit calling the ops' kernels.

The block (one MLP half of a W8A8 decoder layer): ``npu_add_rms_norm_dynamic_quant`` ->
``npu_quant_matmul`` (int8 GEMM, per-token and per-channel scales, bf16 out) ->
``npu_dynamic_quant`` -> ``npu_quant_matmul``. Variants, timed side by side in interleaved rounds
(``_harness``):

* ``eager``: the module called directly;
* ``torchair``: path 4 (``dynamic=True`` + ``mark_static`` + tiling sink), Inductor engine: the
  quant ops are traced as formulas into the unit's code (the default);
* ``torchair-calls``: the same with ``TORCHAIR_LOWER_QUANT=0`` at build time: the unit calls the
  ops' CPU kernels (Python) through the dispatcher, bit-exact with eager.

Prints the median per call, speedup over eager, the largest difference from eager (int8 steps for
the quantized output), and saves JSON under ``bench/results/quant_unit_<machine>.json``.

    python -m bench.bench_quant_unit [--rows 1 4] [--hidden 512] [--inner 1536] [--rounds 9]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

import torchair
from bench import _harness as H
from torchair.runtime import engines

npu = torch.ops.npu


class QuantBlock(torch.nn.Module):
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.register_buffer("gamma", torch.rand(hidden, generator=gen) + 0.5)
        self.register_buffer("w1", torch.randint(-128, 128, (inner, hidden), generator=gen,
                                                 dtype=torch.int8))
        self.register_buffer("s1", torch.rand(inner, generator=gen) / 100)
        self.register_buffer("w2", torch.randint(-128, 128, (hidden, inner), generator=gen,
                                                 dtype=torch.int8))
        self.register_buffer("s2", torch.rand(hidden, generator=gen) / 100)

    def forward(self, x, residual):
        q, _, x_out, scale, _ = npu.npu_add_rms_norm_dynamic_quant(
            x, residual, self.gamma, output_mask=[True, False])
        y = npu.npu_quant_matmul(q, self.w1.t(), self.s1, pertoken_scale=scale,
                                 output_dtype=torch.bfloat16)
        q2, scale2 = npu.npu_dynamic_quant(y.float())
        z = npu.npu_quant_matmul(q2, self.w2.t(), self.s2, pertoken_scale=scale2,
                                 output_dtype=torch.bfloat16)
        return z, x_out


def _compiled(block: QuantBlock, x, r, lower: bool):
    config = torchair.CompilerConfig()
    config.experimental_config.tiling_schedule_optimize = True
    fn = torch.compile(block, backend=torchair.get_npu_backend(compiler_config=config),
                       dynamic=True, fullgraph=True)
    old = os.environ.get(engines.ENV_LOWER_QUANT)
    os.environ[engines.ENV_LOWER_QUANT] = "1" if lower else "0"
    try:
        start = time.perf_counter()
        fn(x, r)  # builds the unit: the switch is read now
        first = time.perf_counter() - start
    finally:
        if old is None:
            del os.environ[engines.ENV_LOWER_QUANT]
        else:
            os.environ[engines.ENV_LOWER_QUANT] = old
    return fn, first


def run_rows(args, rows: int) -> dict:
    block = QuantBlock(args.hidden, args.inner).eval()
    gen = torch.Generator().manual_seed(rows)
    inputs = [(torch.randn(rows, args.hidden, generator=gen),
               torch.randn(rows, args.hidden, generator=gen)) for _ in range(args.calls)]
    for x, r in inputs:
        torch._dynamo.mark_static(x)
        torch._dynamo.mark_static(r)
    x0, r0 = inputs[0]
    fns, first = {"eager": block}, {"eager": 0.0}
    fns["torchair"], first["torchair"] = _compiled(block, x0, r0, lower=True)
    fns["torchair-calls"], first["torchair-calls"] = _compiled(block, x0, r0, lower=False)
    check = {}
    for name, fn in fns.items():
        diffs = []
        for x, r in inputs[:4]:
            got, want = fn(x, r), block(x, r)
            step = want[0].float().abs().amax(-1, keepdim=True) / 127
            diffs.append(float(((got[0].float() - want[0].float()).abs() / step).max()))
            assert torch.equal(got[1], want[1]), name
        check[name] = max(diffs)
    variants = {name: (lambda i, fn=fn: fn(*inputs[i % len(inputs)])) for name, fn in fns.items()}
    times = H.interleaved_rounds(variants, lambda r: range(args.calls), args.rounds,
                                 lambda: None)
    eager = H.summarize(times["eager"])["median"]
    out = {"rows": rows, "variants": {}}
    for name in fns:
        s = H.summarize(times[name])
        out["variants"][name] = {**s, "speedup": eager / s["median"],
                                 "paired": H.paired_ratios(times["eager"], times[name]),
                                 "first_call_s": first[name],
                                 "max_diff_in_output_steps": check[name]}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--inner", type=int, default=1536)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--quick", action="store_true", help="tiny shapes, few rounds (a smoke test)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.hidden, args.inner, args.rounds, args.calls = [2], 64, 96, 3, 10
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    info = H.machine_info("cpu")
    print("W8A8 block: eager vs torchair static unit (quant ops lowered / called)")
    print(H.format_machine(info))
    results = []
    with torch.no_grad():
        for rows in args.rows:
            results.append(run_rows(args, rows))
    table = []
    for res in results:
        for name, v in res["variants"].items():
            table.append([res["rows"], name, v["first_call_s"], v["median"], v["p10"], v["p90"],
                          v["speedup"], v["paired"]["median"], v["max_diff_in_output_steps"]])
    print(H.format_table(["rows", "variant", "first call s", "median us", "p10 us", "p90 us",
                          "speedup", "paired", "max diff (steps)"], table))
    print(f"block: hidden {args.hidden}, inner {args.inner}; max diff = largest |output - eager| "
          f"in quantization steps of the output row (amax / 127)")
    payload = {"benchmark": "quant_unit", "machine": info, "command": H.command_line(),
               "hidden": args.hidden, "inner": args.inner, "rounds": args.rounds,
               "calls": args.calls, "results": results,
               "total_runtime_s": time.perf_counter() - start}
    H.save_results("quant_unit", H.machine_tag(info), payload, quick=args.quick, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
