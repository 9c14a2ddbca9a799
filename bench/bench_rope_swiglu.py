"""Decode-sized rope and SwiGLU on CPU: the fused kernels against their fp32 references.

One decode step of a Qwen-like layer: ``npu_apply_rotary_pos_emb`` on ``query [T, 1, 32, 128]``
and ``key [T, 1, 8, 128]`` with ``cos`` / ``sin [T, 1, 1, 128]`` (vllm-ascend's TorchAir decode
shapes), and ``npu_swiglu`` on the MLP's ``[T, 2 * 2816]``, bfloat16, ``T`` tokens. Variants,
timed side by side in interleaved rounds (``_harness``):

* ``rope_ref``: :func:`rope_reference` on query and key, then the copies into them (what an
  in-place op built on the reference would do);
* ``rope_fused``: the fused kernel ``torchair.ops.rope.cpu.rope_cpu`` in place on query and key;
* ``rope_op``: the op ``torch.ops.npu.npu_apply_rotary_pos_emb`` (the fused kernel plus the
  argument checks and the dispatcher's call of a Python kernel, ~15-20 us here);
* ``swiglu_ref`` / ``swiglu_fused`` / ``swiglu_op``: :func:`swiglu_reference`,
  ``torchair.ops.activation.cpu.swiglu_cpu``, ``torch.ops.npu.npu_swiglu``.

Prints the median per call and the paired ratios ``ref / fused`` and ``ref / op`` and saves them
(JSON, ``results/rope_swiglu_<machine>.json`` or ``--out``); it asserts nothing.

    python -m bench.bench_rope_swiglu [--tokens 1 8 32] [--rounds 15] [--steps 50] [--threads 1]
"""
from __future__ import annotations

import argparse

import torch

import torchair.ops  # noqa: F401 (registers the ops)
from bench import _harness
from torchair.ops.activation.cpu import swiglu_cpu
from torchair.ops.activation.swiglu import swiglu_reference
from torchair.ops.rope.common import rope_reference
from torchair.ops.rope.cpu import rope_cpu


def _variants(tokens: int, dtype: torch.dtype) -> dict:
    g = torch.Generator().manual_seed(tokens)
    q = torch.randn(tokens, 1, 32, 128, generator=g).to(dtype)
    k = torch.randn(tokens, 1, 8, 128, generator=g).to(dtype)
    cos, sin = (torch.randn(tokens, 1, 1, 128, generator=g).to(dtype) for _ in range(2))
    x = torch.randn(tokens, 2 * 2816, generator=g).to(dtype)
    op_rope, op_swiglu = torch.ops.npu.npu_apply_rotary_pos_emb, torch.ops.npu.npu_swiglu

    def rope_ref(_):
        q.copy_(rope_reference(q, cos, sin))
        k.copy_(rope_reference(k, cos, sin))

    def rope_fused(_):
        rope_cpu(q, cos, sin, "half", q)
        rope_cpu(k, cos, sin, "half", k)

    return {"rope_ref": rope_ref, "rope_fused": rope_fused,
            "rope_op": lambda _: op_rope(q, k, cos, sin),
            "swiglu_ref": lambda _: swiglu_reference(x),
            "swiglu_fused": lambda _: swiglu_cpu(x, 1), "swiglu_op": lambda _: op_swiglu(x)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--out", default=None, help="JSON path (default results/rope_swiglu_<machine>"
                                               ".json)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    info = _harness.machine_info("cpu")
    _harness.print_machine(info)
    rows = []
    for tokens in args.tokens:
        variants = _variants(tokens, dtype)
        for fn in variants.values():  # warm up
            fn(0)
        res = _harness.interleaved_rounds(variants, lambda r: range(args.steps), args.rounds,
                                          lambda: None)
        med = {n: _harness.summarize(t)["median"] for n, t in res.items()}
        for op in ("rope", "swiglu"):
            ratio = [_harness.paired_ratios(res[f"{op}_ref"], res[f"{op}_{v}"])["median"]
                     for v in ("fused", "op")]
            rows.append([op, tokens, *(round(med[f"{op}_{v}"], 1) for v in ("ref", "fused", "op")),
                         *(round(r, 2) for r in ratio)])
    headers = ["op", "T", "ref us", "fused us", "op us", "ref/fused", "ref/op"]
    print(_harness.format_table(headers, rows))
    _harness.save_results("rope_swiglu", _harness.machine_tag(info),
                          {"machine": info, "command": _harness.command_line(),
                           "dtype": args.dtype, "threads": torch.get_num_threads(),
                           "rows": [dict(zip(headers, r)) for r in rows]}, out=args.out)


if __name__ == "__main__":
    main()
