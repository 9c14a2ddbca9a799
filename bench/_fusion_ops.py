"""Part 1 of the fusion benchmark, op level: the three default fusion patterns of
``torchair/patterns/add_rms_norm.py`` (``a``, ``b``, ``c``), each as the unfused chain of eager
op calls and as the fused op, checked against each other and against the fused op's plain-PyTorch
reference, then timed in interleaved rounds; plus the table :mod:`bench.bench_fusion` prints.

Also holds what both parts of the benchmark share: the ``--dtype`` names (:data:`DTYPES`), the
pattern keys (:data:`PATTERNS`, :data:`PATTERN_KEY`) and the fused op's output mask
(:data:`ONLY_Y1`). Split out of :mod:`bench.bench_fusion`, whose docstring describes the
measurement; the decode step of part 2 is :mod:`bench._fusion_w8a8` and :mod:`bench._fusion_e2e`.
"""
from __future__ import annotations

import argparse
import dataclasses
import traceback
from collections.abc import Callable
from typing import Any

import torch

import torchair  # noqa: F401  (registers torch.ops.npu.*)
from bench import _harness as H
from torchair.ops.norm import rms_norm as _rn
from torchair.ops.quant import dynamic_quant as _dq
from torchair.patterns import add_rms_norm as P

npu = torch.ops.npu
DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
          "float16": torch.float16, "fp32": torch.float32, "float32": torch.float32}
PATTERNS = {"a": "add_rms_norm -> dynamic_quant(smooth) | add_rms_norm_dynamic_quant",
            "b": "add_rms_norm -> flatten -> dynamic_quant -> view | fused + flatten/view",
            "c": "add_rms_norm -> view -> to(float32) | add_rms_norm_cast"}
PATTERN_KEY = {P.SMOOTH: "a", P.FLATTEN: "b", P.CAST: "c"}  # fusion pattern name -> key above
ONLY_Y1 = [True, False]


@dataclasses.dataclass
class OpCase:
    unfused: Callable[[], tuple]
    fused: Callable[[], tuple]
    oracle: Callable[[], tuple]  # the fused op's plain-PyTorch reference, same outputs as fused
    fused_bytes: int


def make_op_case(pattern: str, tokens: int, hidden: int, dtype: torch.dtype, device: str,
                 gen: torch.Generator) -> OpCase:
    """The two callables of one pattern (each returns the chain's outputs) and the fused op's
    minimal bytes: its inputs read once, its outputs written once."""
    shape = (1, tokens, hidden) if pattern == "b" else (tokens, hidden)
    x1 = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    x2 = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    gamma = (0.5 + torch.rand(hidden, generator=gen)).to(device=device, dtype=dtype)
    smooth = (0.5 + torch.rand(hidden, generator=gen)).to(device=device, dtype=dtype)
    e = x1.element_size()
    n = tokens * hidden
    read = 2 * n * e + hidden * e

    if pattern == "a":
        def unfused():
            y, _, x_out = npu.npu_add_rms_norm(x1, x2, gamma)
            yq, scale = npu.npu_dynamic_quant(y, smooth_scales=smooth)
            return yq, scale, x_out

        def fused():
            y1, _, x_out, s1, _ = npu.npu_add_rms_norm_dynamic_quant(
                x1, x2, gamma, smooth_scale1=smooth, output_mask=ONLY_Y1)
            return y1, s1, x_out

        def oracle():
            y1, _, x_out, s1, _ = _dq.add_rms_norm_dynamic_quant_reference(
                x1, x2, gamma, smooth_scale1=smooth, output_mask=ONLY_Y1)
            return y1, s1, x_out
        # + smooth; writes int8 y1, x_out, float32 scale1
        return OpCase(unfused, fused, oracle, read + hidden * e + n + n * e + 4 * tokens)
    if pattern == "b":
        def unfused():
            y, _, x_out = npu.npu_add_rms_norm(x1, x2, gamma)
            yq, scale = npu.npu_dynamic_quant(y.flatten(0, 1))
            return yq, scale.view(-1, 1), x_out

        def fused():
            y1, _, x_out, s1, _ = npu.npu_add_rms_norm_dynamic_quant(x1, x2, gamma,
                                                                     output_mask=ONLY_Y1)
            return y1.flatten(0, 1), s1.view(-1, 1), x_out

        def oracle():
            y1, _, x_out, s1, _ = _dq.add_rms_norm_dynamic_quant_reference(
                x1, x2, gamma, output_mask=ONLY_Y1)
            return y1.flatten(0, 1), s1.view(-1, 1), x_out
        return OpCase(unfused, fused, oracle, read + n + n * e + 4 * tokens)
    if pattern == "c":
        def unfused():
            y, _, x_out = npu.npu_add_rms_norm(x1, x2, gamma)
            return y.view(-1, hidden).to(torch.float32), x_out

        def fused():
            y32, _, _, x_out = npu.npu_add_rms_norm_cast(x1, x2, gamma)
            return y32.view(-1, hidden), x_out

        def oracle():
            y32, _, _, x_out = _rn.add_rms_norm_cast_reference(x1, x2, gamma)
            return y32.view(-1, hidden), x_out
        # writes y32 (float32), y, rstd (float32), x_out
        return OpCase(unfused, fused, oracle, read + 4 * n + n * e + 4 * tokens + n * e)
    raise ValueError(pattern)


# Share of int8 elements that may differ by one step between the fused op and the unfused chain.
# The chain quantizes y rounded to the input dtype, the fused op the float32 y: an element flips
# when its quotient y / scale lies within that rounding of a .5 boundary, so the share scales with
# the dtype's rounding error. 1 % for float16 (measured ~0.4 %) and float32 (equal); bfloat16
# has 3 fewer mantissa bits, 8x the rounding error: 8 % (measured ~3.5 % on random rows).
FLIP_BOUND = {torch.float32: 0.01, torch.float16: 0.01, torch.bfloat16: 0.08}
ORACLE_FLIP_BOUND = 1e-3  # fused kernel vs its reference: equal up to summation order


def compare(pattern: str, ref: tuple, out: tuple, flip_bound: float) -> dict[str, Any]:
    """``out`` vs ``ref`` (both ``(int8 y, scale, x_out)`` or ``(y float32, x_out)``): int8 within
    +-1 on at most ``flip_bound`` of the elements, scales rtol 1e-2, x_out and the float32 y close
    (whether they are equal bit for bit is recorded)."""
    res: dict[str, Any] = {}
    if pattern in ("a", "b"):
        (qu, su, xu), (qf, sf, xf) = ref, out
        ok = qu.shape == qf.shape and su.shape == sf.shape and xu.shape == xf.shape
        diff = (qu.to(torch.int32) - qf.to(torch.int32)).abs()
        res["int8_max_diff"] = int(diff.max().item()) if diff.numel() else 0
        res["int8_frac_diff"] = (diff > 0).float().mean().item() if diff.numel() else 0.0
        rel = ((su.float() - sf.float()).abs() / su.float().abs().clamp_min(1e-12)).max().item()
        res["scale_max_rel_err"] = rel
        ok = (ok and res["int8_max_diff"] <= 1 and res["int8_frac_diff"] <= flip_bound
              and torch.allclose(su.float(), sf.float(), rtol=1e-2, atol=1e-8))
    else:
        (yu, xu), (yf, xf) = ref, out
        res["y32_equal"] = bool(torch.equal(yu, yf))
        res["y32_max_abs_err"] = (yu - yf).abs().max().item()
        ok = yu.shape == yf.shape and torch.allclose(yu, yf, rtol=1e-2, atol=1e-2)
    res["x_out_equal"] = bool(torch.equal(xu, xf))
    ok = ok and torch.allclose(xu.float(), xf.float(), rtol=1e-2, atol=1e-2)
    res["ok"] = bool(ok)
    return res


def check_op_case(pattern: str, case: OpCase, dtype: torch.dtype) -> dict[str, Any]:
    """Fused vs unfused (the fusion's numerics) and fused vs its oracle (the kernel)."""
    fused = case.fused()
    res = compare(pattern, case.unfused(), fused, FLIP_BOUND[dtype])
    res["flip_bound"] = FLIP_BOUND[dtype]
    res["vs_oracle"] = compare(pattern, case.oracle(), fused, ORACLE_FLIP_BOUND)
    res["ok"] = res["ok"] and res["vs_oracle"]["ok"]
    return res


def run_op_case(pattern: str, tokens: int, hidden: int, dtype: torch.dtype, device: str,
                args: argparse.Namespace, gen: torch.Generator, copy_bps: float
                ) -> dict[str, Any]:
    case = make_op_case(pattern, tokens, hidden, dtype, device, gen)
    sync = H.synchronizer(device)
    row: dict[str, Any] = {"device": device, "dtype": str(dtype).replace("torch.", ""),
                           "pattern": pattern, "tokens": tokens, "hidden": hidden,
                           "kernel": _rn.device_kernel(torch.empty(0, device=device), hidden),
                           "fused_bytes": case.fused_bytes}
    row["check"] = check_op_case(pattern, case, dtype)  # correctness first (also warms up)
    sync()
    est = {}
    for name, fn in (("unfused", case.unfused), ("fused", case.fused)):
        times = H.time_calls(lambda _, fn=fn: fn(), range(2), sync)
        est[name] = min(times)
    pair = est["unfused"] + est["fused"]
    rounds = args.rounds
    steps = max(1, min(args.max_calls, int(args.budget / rounds / max(pair, 1e-7))))
    if steps == 1:
        rounds = max(3, min(rounds, int(args.budget / max(pair, 1e-7))))
    variants = {"unfused": lambda _: case.unfused(), "fused": lambda _: case.fused()}
    times = H.interleaved_rounds(variants, lambda r: range(steps), rounds, sync)
    stats = {name: H.summarize(t) for name, t in times.items()}
    row.update(rounds=rounds, calls_per_round=steps, stats_us=stats,
               unfused_us=stats["unfused"]["median"], fused_us=stats["fused"]["median"])
    row["ratio"] = row["unfused_us"] / row["fused_us"]
    row["ratio_paired"] = H.paired_ratios(times["unfused"], times["fused"])
    row["fused_GBps"] = case.fused_bytes / (row["fused_us"] * 1e-6) / 1e9
    row["fused_copy_bw_fraction"] = row["fused_GBps"] * 1e9 / copy_bps
    return row


def run_op_level(device: str, args: argparse.Namespace, copy_bps: float) -> list[dict]:
    dtype = DTYPES[args.dtype]
    gen = torch.Generator().manual_seed(args.seed)
    rows = []
    for pattern in args.patterns:
        for hidden in args.hidden:
            for tokens in args.tokens:
                try:
                    row = run_op_case(pattern, tokens, hidden, dtype, device, args, gen,
                                      copy_bps)
                except Exception as exc:  # noqa: BLE001 - record and go on
                    row = {"device": device, "pattern": pattern, "tokens": tokens,
                           "hidden": hidden, "error": f"{type(exc).__name__}: {exc}",
                           "traceback": traceback.format_exc()}
                    print(f"  {pattern} T={tokens} H={hidden}: FAILED {row['error'][:200]}",
                          flush=True)
                else:
                    print(f"  {pattern} T={tokens:5d} H={hidden}: unfused {row['unfused_us']:9.1f}"
                          f" us, fused {row['fused_us']:9.1f} us, ratio {row['ratio']:.2f} "
                          f"(paired {row['ratio_paired']['median']:.2f}), check "
                          f"{'ok' if row['check']['ok'] else 'FAIL'}", flush=True)
                rows.append(row)
    return rows


def op_table(rows: list[dict]) -> str:
    table = []
    for r in rows:
        if "error" in r:
            table.append([r["pattern"], r["tokens"], r["hidden"]] + [None] * 6
                         + ["error", None])
            continue
        c = r["check"]
        o = c["vs_oracle"]
        if r["pattern"] == "c":
            detail = f"y32 {'==' if c['y32_equal'] else '~='}"
            oracle = "==" if o["y32_equal"] and o["x_out_equal"] else "~="
        else:
            detail = f"int8 d<={c['int8_max_diff']} on {100 * c['int8_frac_diff']:.2f}%"
            oracle = ("==" if o["int8_frac_diff"] == 0 and o["scale_max_rel_err"] == 0
                      and o["x_out_equal"] else f"d {100 * o['int8_frac_diff']:.3f}%")
        table.append([r["pattern"], r["tokens"], r["hidden"], r["unfused_us"], r["fused_us"],
                      r["ratio"], r["ratio_paired"]["median"], r["fused_GBps"],
                      r["fused_copy_bw_fraction"],
                      ("ok " if c["ok"] else "FAIL ") + detail, oracle])
    return H.format_table(["pat", "tokens", "hidden", "unfused us", "fused us", "ratio",
                           "paired", "fused GB/s", "x copy bw", "check (vs unfused)",
                           "vs oracle"], table)

