"""What one ``npu_fused_infer_attention_score`` prompt call costs inside a CPU static unit.

A prefill step's attention (causal ``sparse_mode=3``, BSH, heads / kv heads and D from the
flags, float32, query lengths and KV lengths as host lists), compiled to a static launch unit
(path 4, FX engine: the unit's own call is the same in every variant), timed side by side in
interleaved rounds (``_harness``) for each prompt length:

* ``unit-launch``: the unit as built, the FIA call bound to ``torchair_native::fia_prompt``
  (the C++ launch kernel: no Python per call);
* ``unit-general``: the same unit with the launch kernels off (``TORCHAIR_NATIVE_KERNELS=0``
  while it is built): the FIA call goes through the dispatcher into torchair's Python op
  (validation, masks, the dense formula);
* ``eager``: the op as a script calls it;
* ``sdpa``: ``F.scaled_dot_product_attention(is_causal=True)`` on the same data, the target.

Each variant's output is checked against eager first. Prints medians per call and saves JSON under
``bench/results/fia_prompt_<machine>.json``.

    python -m bench.bench_fia_prompt [--lengths 16 128 512] [--rounds 15] [--calls 20]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

import torchair
from bench import _harness
from torchair.ops.attention.cpu import launch_library as _launch

FIA = torch.ops.npu.npu_fused_infer_attention_score


class _Prefill(torch.nn.Module):
    def __init__(self, heads: int, kv_heads: int, scale: float):
        super().__init__()
        self.heads, self.kv_heads, self.scale = heads, kv_heads, scale

    def forward(self, q, k, v, q_lens, kv_lens):
        return FIA(q, k, v, num_heads=self.heads, num_key_value_heads=self.kv_heads,
                   input_layout="BSH", scale=self.scale, sparse_mode=3,
                   actual_seq_lengths=q_lens, actual_seq_lengths_kv=kv_lens)[0]


def _unit(module, tensors, native: bool):
    """A static unit of ``module`` (FX engine), built with the launch kernels on or off."""
    for t in tensors:
        torch._dynamo.mark_static(t)
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    config.experimental_config.tiling_schedule_optimize = True
    compiled = torch.compile(module, backend=torchair.get_npu_backend(compiler_config=config),
                             dynamic=True, fullgraph=True)
    old = os.environ.get("TORCHAIR_NATIVE_KERNELS")
    os.environ["TORCHAIR_NATIVE_KERNELS"] = "1" if native else "0"
    try:
        compiled(*tensors, [tensors[0].shape[1]], [tensors[1].shape[1]])  # builds the unit
        compiled(*tensors, [tensors[0].shape[1] - 1], [tensors[1].shape[1] - 1])
    finally:
        if old is None:
            del os.environ["TORCHAIR_NATIVE_KERNELS"]
        else:
            os.environ["TORCHAIR_NATIVE_KERNELS"] = old
    report = torchair.graph_reports()[-1]
    return compiled, report


def _attention_ops(fn) -> set[str]:
    """The attention operators one call of ``fn`` runs (profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name for e in prof.events()
            if e.name.startswith(("npu::npu_fused", "torchair_native::"))}


def _variants(args, length: int) -> tuple[dict, dict]:
    b, n, nkv, d = args.batch, args.heads, args.kv_heads, args.dim
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, length, n * d, generator=g)
    k = torch.randn(b, length, nkv * d, generator=g)
    v = torch.randn(b, length, nkv * d, generator=g)
    lens = [length] * b
    module = _Prefill(n, nkv, d ** -0.5)
    torch._dynamo.reset()
    with torch.no_grad():
        want = module(q, k, v, lens, lens)
        # one module instance per unit: each compiled module keeps its own Dynamo entry
        launch, launch_report = _unit(_Prefill(n, nkv, d ** -0.5), (q, k, v), native=True)
        torch.testing.assert_close(launch(q, k, v, lens, lens), want, atol=1e-5, rtol=1e-5)
        general, general_report = _unit(_Prefill(n, nkv, d ** -0.5), (q, k, v), native=False)
        torch.testing.assert_close(general(q, k, v, lens, lens), want)
        ops = (_attention_ops(lambda: launch(q, k, v, lens, lens)),
               _attention_ops(lambda: general(q, k, v, lens, lens)))
        assert ops == ({"torchair_native::fia_prompt"},
                       {"npu::npu_fused_infer_attention_score_tensor"}), ops
        qs = q.view(b, length, n, d).transpose(1, 2)
        ks = k.view(b, length, nkv, d).transpose(1, 2)
        vs = v.view(b, length, nkv, d).transpose(1, 2)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        got = sdpa(qs, ks, vs, is_causal=True, enable_gqa=True, scale=d ** -0.5)
        torch.testing.assert_close(got.transpose(1, 2).reshape(want.shape), want,
                                   atol=1e-5, rtol=1e-5)

    def repeat(call):
        def run(_):
            with torch.no_grad():
                for _ in range(args.calls):
                    call()
        return run

    variants = {
        "unit-launch": repeat(lambda: launch(q, k, v, lens, lens)),
        "unit-general": repeat(lambda: general(q, k, v, lens, lens)),
        "eager": repeat(lambda: module(q, k, v, lens, lens)),
        "sdpa": repeat(lambda: sdpa(qs, ks, vs, is_causal=True, enable_gqa=True,
                                    scale=d ** -0.5)),
    }
    return variants, {"unit-launch": launch_report.launch_kernels,
                      "unit-general": general_report.launch_kernels}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 128, 512],
                        help="prompt lengths (query tokens = KV positions)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20, help="calls per timed step")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if not _launch.available():
        print("the C++ launch kernels are not available (no C/C++ compiler?): nothing to measure")
        return 1
    info = _harness.machine_info("cpu")
    _harness.print_machine(info)
    start = time.time()
    rows, results = [], []
    for length in args.lengths:
        variants, bound = _variants(args, length)
        assert bound == {"unit-launch": 1, "unit-general": 0}, bound
        for fn in variants.values():  # warm up
            fn(0)
        rounds = _harness.interleaved_rounds(variants, lambda r: [0], args.rounds,
                                             _harness.synchronizer("cpu"))
        per_call = {name: _harness.summarize(r, scale=1e6 / args.calls)
                    for name, r in rounds.items()}
        sdpa = per_call["sdpa"]["median"]
        for name, s in per_call.items():
            rows.append([length, name, round(s["median"], 1), round(s["p10"], 1),
                         round(s["p90"], 1), round(s["median"] / sdpa, 2)])
        results.append({"length": length, "per_call_us": per_call, "launch_kernels": bound})
    print(_harness.format_table(["prompt", "variant", "us/call", "p10", "p90", "x sdpa"], rows))
    payload = {"benchmark": "fia_prompt", "machine": info, "args": vars(args),
               "command": _harness.command_line(), "results": results,
               "total_runtime_s": time.time() - start}
    _harness.save_results("fia_prompt", _harness.machine_tag(info), payload, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
