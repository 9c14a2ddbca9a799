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
import dataclasses
import math
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch._dynamo
import torch.nn.functional as F

import torchair  # (registers torch.ops.npu.*)
from torchair.ops.quant import dynamic_quant as _dq
from torchair.ops.norm import rms_norm as _rn
from torchair.patterns import add_rms_norm as P

from bench import _harness as H
from bench.bench_decode_attention import copy_bandwidth
from bench.model import ModelConfig

npu = torch.ops.npu
DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
          "float16": torch.float16, "fp32": torch.float32, "float32": torch.float32}
PATTERNS = {"a": "add_rms_norm -> dynamic_quant(smooth) | add_rms_norm_dynamic_quant",
            "b": "add_rms_norm -> flatten -> dynamic_quant -> view | fused + flatten/view",
            "c": "add_rms_norm -> view -> to(float32) | add_rms_norm_cast"}
PATTERN_KEY = {P.SMOOTH: "a", P.FLATTEN: "b", P.CAST: "c"}  # fusion pattern name -> key above
ONLY_Y1 = [True, False]


# ============================================================================== op level

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


# ============================================================================== end to end

def _int8_weight(k: int, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 ``[k, n]`` and a float32 per-column scale that keeps ``x @ W`` at unit size for a
    unit-size ``x`` (std of a uniform int8 value ~ 73)."""
    w = torch.randint(-127, 128, (k, n), generator=gen, dtype=torch.int8)
    scale = (0.75 + 0.5 * torch.rand(n, generator=gen)) / (73.0 * math.sqrt(k))
    return w, scale


def _int8_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact int32 ``a @ b`` of int8 matrices (``torch._int_mm``; CUDA needs more than 16 rows,
    so smaller ``a`` is zero-padded there)."""
    rows = a.shape[0]
    if a.is_cuda and rows <= 16:
        return torch._int_mm(F.pad(a, (0, 0, 0, 32 - rows)), b)[:rows]
    return torch._int_mm(a, b)


class W8A8Layer(torch.nn.Module):
    """A DeepSeek/Llama-like decoder layer with int8 weights and per-token int8 activations.

    Deliberately not :class:`bench.model.DecoderLayer` (whose :class:`~bench.model.ModelConfig`
    it shares): this layer exists to carry the three fusion patterns of
    ``torchair/patterns/add_rms_norm.py`` (residual add fused into the next norm, per-token
    dynamic quant, int8 GEMMs, the final norm's float32 cast), in both their unfused and fused
    forms (``fused``); the float decoder step has none of them."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, gen: torch.Generator,
                 fused: bool) -> None:
        super().__init__()
        self.cfg = cfg
        self.fused = fused  # call the fused ops by hand (the eager reference of fusion on)
        hid, kvh, inter = cfg.hidden, cfg.kv_hidden, cfg.intermediate

        def vec(n, spread):
            return (1.0 + spread * (2 * torch.rand(n, generator=gen) - 1)).to(dtype)

        self.register_buffer("attn_gamma", vec(hid, 0.2))
        w, s = _int8_weight(hid, hid + 2 * kvh, gen)
        self.register_buffer("w_qkv", w)
        self.register_buffer("w_qkv_scale", s)
        self.register_buffer("w_o", (torch.randn(hid, hid, generator=gen) / math.sqrt(hid))
                             .to(dtype))
        self.register_buffer("mlp_gamma", vec(hid, 0.2))
        self.register_buffer("mlp_smooth", vec(hid, 0.5))
        w, s = _int8_weight(hid, 2 * inter, gen)
        self.register_buffer("w_gate_up", w)
        self.register_buffer("w_gate_up_scale", s)
        w, s = _int8_weight(inter, hid, gen)
        self.register_buffer("w_down", w)
        self.register_buffer("w_down_scale", s)

    def forward(self, res, h, pos, lens: list[int], k_cache, v_cache):
        cfg = self.cfg
        b, hid, kvh = res.shape[0], cfg.hidden, cfg.kv_hidden
        dtype = res.dtype
        # attention block: residual add + norm + per-token quant (pattern b)
        if self.fused:
            y1, _, res, s1, _ = npu.npu_add_rms_norm_dynamic_quant(res, h, self.attn_gamma,
                                                                   output_mask=ONLY_Y1)
            xq, xs = y1.flatten(0, 1), s1.view(-1, 1)
        else:
            y, _, res = npu.npu_add_rms_norm(res, h, self.attn_gamma)
            xq, xs = npu.npu_dynamic_quant(y.flatten(0, 1))
            xs = xs.view(-1, 1)
        qkv = npu.npu_quant_matmul(xq, self.w_qkv, self.w_qkv_scale,
                                   pertoken_scale=xs.view(-1), output_dtype=dtype)
        q, k, v = qkv.split([hid, kvh, kvh], dim=-1)
        k_cache.index_copy_(1, pos, k.unsqueeze(1))  # [B, 1, kvH] at column pos, in place
        v_cache.index_copy_(1, pos, v.unsqueeze(1))
        attn = npu.npu_incre_flash_attention(
            q.unsqueeze(1), k_cache, v_cache, actual_seq_lengths=lens, num_heads=cfg.heads,
            num_key_value_heads=cfg.kv_heads, input_layout="BSH",
            scale_value=cfg.head_dim ** -0.5)
        h = torch.matmul(attn.view(b, hid), self.w_o).unsqueeze(1)  # o_proj in bf16/fp16
        # MLP block: residual add + norm + smooth per-token quant (pattern a)
        if self.fused:
            mq, _, res, ms, _ = npu.npu_add_rms_norm_dynamic_quant(
                res, h, self.mlp_gamma, smooth_scale1=self.mlp_smooth, output_mask=ONLY_Y1)
        else:
            y, _, res = npu.npu_add_rms_norm(res, h, self.mlp_gamma)
            mq, ms = npu.npu_dynamic_quant(y, smooth_scales=self.mlp_smooth)
        acc = _int8_mm(mq.view(b, hid), self.w_gate_up)  # int32 [B, 2I]
        sq, ss = npu.npu_dequant_swiglu_quant(acc, weight_scale=self.w_gate_up_scale,
                                              activation_scale=ms.view(-1), quant_mode=1)
        h = npu.npu_quant_matmul(sq, self.w_down, self.w_down_scale, pertoken_scale=ss,
                                 output_dtype=dtype).unsqueeze(1)
        return res, h


class W8A8Step(torch.nn.Module):
    """One decode step: ``(res, h) [B, 1, H]`` (the residual stream and the previous block's
    output, whose add is fused into the next norm) -> float32 ``[B, H]`` (final norm, pattern c).
    """

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, seed: int, fused: bool = False
                 ) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.fused = fused
        self.layers = torch.nn.ModuleList(W8A8Layer(cfg, dtype, gen, fused)
                                          for _ in range(cfg.layers))
        self.register_buffer("final_gamma", (0.9 + 0.2 * torch.rand(cfg.hidden, generator=gen))
                             .to(dtype))

    def forward(self, res, h, pos, lens: list[int], k_caches: list[torch.Tensor],
                v_caches: list[torch.Tensor]):
        for i, layer in enumerate(self.layers):
            res, h = layer(res, h, pos, lens, k_caches[i], v_caches[i])
        if self.fused:
            y32, _, _, _ = npu.npu_add_rms_norm_cast(res, h, self.final_gamma)
            return y32.view(-1, y32.size(-1))
        y, _, _ = npu.npu_add_rms_norm(res, h, self.final_gamma)
        return y.view(-1, y.size(-1)).to(torch.float32)


@dataclasses.dataclass
class StepInput:
    res: torch.Tensor
    h: torch.Tensor
    pos: torch.Tensor
    lens: list[int]


def make_schedule(cfg: ModelConfig, batch: int, n_calls: int, device: str, dtype: torch.dtype,
                  seed: int) -> list[StepInput]:
    """``n_calls`` inputs whose lengths are new at every call (as
    :func:`bench.model.make_schedule`): sequence ``b`` has ``base_b + i`` tokens at call ``i``,
    distinct bases >= 2; the new token goes to column ``min(lens) - 1``."""
    room = cfg.capacity - n_calls
    if room < 2 + batch:
        raise SystemExit(f"--capacity {cfg.capacity} is too small for {n_calls} calls at batch "
                         f"{batch}; raise --capacity or lower --steps/--rounds")
    gen = torch.Generator().manual_seed(seed)
    lo = max(2, room // 2) if room - max(2, room // 2) + 1 >= batch else 2
    bases = (lo + torch.randperm(room - lo + 1, generator=gen)[:batch]).tolist()
    steps = []
    for i in range(n_calls):
        lens = [b + i for b in bases]
        res = torch.randn(batch, 1, cfg.hidden, generator=gen).to(device=device, dtype=dtype)
        h = torch.randn(batch, 1, cfg.hidden, generator=gen).to(device=device, dtype=dtype)
        pos = torch.tensor([min(lens) - 1], dtype=torch.int64, device=device)
        steps.append(StepInput(res, h, pos, lens))
    return steps


@dataclasses.dataclass
class Variant:
    name: str
    describe: str
    compiled: Callable
    k_caches: list[torch.Tensor]
    v_caches: list[torch.Tensor]
    fusion: bool | None = None  # None: eager
    reference: str = "eager"  # the eager variant its outputs must match
    result: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __call__(self, s: StepInput) -> torch.Tensor:
        return self.compiled(s.res, s.h, s.pos, s.lens, self.k_caches, self.v_caches)


def make_variant(name: str, model: W8A8Step, fused_model: W8A8Step, init_k, init_v
                 ) -> Variant:
    k_caches = [t.clone() for t in init_k]
    v_caches = [t.clone() for t in init_v]
    for t in k_caches + v_caches:
        torch._dynamo.mark_static(t)
    if name == "eager":
        return Variant(name, "the module called directly (unfused chains)", model, k_caches,
                       v_caches)
    if name == "eager-fused":
        return Variant(name, "the same weights, the fused ops called by hand, eager", fused_model,
                       k_caches, v_caches, reference=name)
    engine, fusion = name.split("-")[1], name.endswith("-on")
    cfg = torchair.CompilerConfig()
    cfg.experimental_config.tiling_schedule_optimize = True
    cfg.experimental_config.pattern_fusion_pass = fusion
    cfg.debug.run_eagerly = engine == "fx"
    compiled = torch.compile(model, backend=torchair.get_npu_backend(compiler_config=cfg),
                             dynamic=True, fullgraph=True)
    describe = (f"torchair path 4 (dynamic=True + mark_static + tiling_schedule_optimize), "
                f"{'FX engine (debug.run_eagerly)' if engine == 'fx' else 'Inductor engine'}, "
                f"pattern_fusion_pass={fusion}")
    return Variant(name, describe, compiled, k_caches, v_caches, fusion,
                   "eager-fused" if fusion else "eager")


def _reset(v: Variant, init_k, init_v) -> None:
    with torch.no_grad():
        for dst, src in zip(v.k_caches + v.v_caches, init_k + init_v):
            dst.copy_(src)


def _unique_graphs() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def _rel_err(outs: list[torch.Tensor], refs: list[torch.Tensor]) -> float:
    return max(((o - r).norm() / r.norm()).item() for o, r in zip(outs, refs))


def _check_step(outs, caches, ref, rtol: float, atol: float) -> dict[str, Any]:
    """Outputs and final KV caches of the check steps vs a reference variant's."""
    ref_out, ref_caches = ref
    ok = (all(torch.allclose(o, r, rtol=rtol, atol=atol) for o, r in zip(outs, ref_out))
          and all(torch.allclose(c.float(), r.float(), rtol=rtol, atol=atol)
                  for c, r in zip(caches, ref_caches)))
    return {"check": "ok" if ok else "MISMATCH",
            "max_abs_err": max((o - r).abs().max().item() for o, r in zip(outs, ref_out)),
            "cache_max_abs_err": max((c.float() - r.float()).abs().max().item()
                                     for c, r in zip(caches, ref_caches)),
            "bitwise_equal": all(torch.equal(o, r) for o, r in zip(outs, ref_out))
            and all(torch.equal(c, r) for c, r in zip(caches, ref_caches)),
            "rtol": rtol, "atol": atol}


def expected_patterns(cfg: ModelConfig) -> dict[str, int]:
    return {P.SMOOTH: cfg.layers, P.FLATTEN: cfg.layers, P.CAST: 1}


def run_e2e_batch(args: argparse.Namespace, cfg: ModelConfig, batch: int, device: str,
                  dtype: torch.dtype) -> dict[str, Any]:
    torch._dynamo.reset()
    sync = H.synchronizer(device)
    model = W8A8Step(cfg, dtype, args.seed).to(device).eval()
    fused_model = W8A8Step(cfg, dtype, args.seed, fused=True).to(device).eval()  # same weights
    gen = torch.Generator().manual_seed(args.seed + 1)
    init_k = [torch.randn(batch, cfg.capacity, cfg.kv_hidden, generator=gen)
              .to(device=device, dtype=dtype) for _ in range(cfg.layers)]
    init_v = [torch.randn(batch, cfg.capacity, cfg.kv_hidden, generator=gen)
              .to(device=device, dtype=dtype) for _ in range(cfg.layers)]
    n_warm = 2
    n_calls = n_warm + args.check_steps + args.e2e_rounds * args.steps
    schedule = make_schedule(cfg, batch, n_calls, device, dtype, args.seed + batch)
    for s in schedule:
        for t in (s.res, s.h, s.pos):
            torch._dynamo.mark_static(t)
    warm, check = schedule[:n_warm], schedule[n_warm:n_warm + args.check_steps]
    timed_start = n_warm + args.check_steps
    names = ["eager", "eager-fused"] + [f"torchair-{e}-{f}" for e in args.engine
                                        for f in ("on", "off")]
    variants = [make_variant(n, model, fused_model, init_k, init_v) for n in names]
    rtol = atol = 2e-2
    print(f"\n== e2e batch {batch}: {cfg.layers} W8A8 layers, hidden {cfg.hidden}, heads "
          f"{cfg.heads}/{cfg.kv_heads} kv (head dim {cfg.head_dim}), MLP {cfg.intermediate}, KV "
          f"capacity {cfg.capacity}, {dtype}, {device}", flush=True)
    refs: dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    with torch.no_grad():
        for v in variants:
            res = v.result
            res["describe"] = v.describe
            try:
                g0, r0 = _unique_graphs(), len(torchair.graph_reports())
                sync()
                t0 = time.perf_counter()
                v(warm[0])
                sync()
                res["first_call_s"] = time.perf_counter() - t0
                v(warm[1])
                res["graphs_compiled"] = _unique_graphs() - g0
                reports = torchair.graph_reports()[r0:]
                if v.fusion is not None:
                    fired: dict[str, int] = {}
                    for rep in reports:
                        for k, n in rep.patterns.items():
                            fired[k] = fired.get(k, 0) + n
                    res["patterns"] = fired
                    res["reports"] = [{"graph_id": r.graph_id, "path": r.path,
                                       "build_static": r.build_static, "engine": r.engine,
                                       "launch": r.launch, "patterns": dict(r.patterns)}
                                      for r in reports]
                    want = expected_patterns(cfg) if v.fusion else {}
                    res["patterns_as_expected"] = fired == want
                _reset(v, init_k, init_v)
                outs = [v(s).clone() for s in check]
                sync()
                caches = [c.clone() for c in v.k_caches + v.v_caches]
                if v.fusion is None:
                    refs[v.name] = (outs, caches)
                if v.fusion is None:
                    res["check"] = "reference"
                else:
                    res.update(_check_step(outs, caches, refs[v.reference], rtol, atol),
                               reference=v.reference)
                # the fusion's numerics: the unfused eager model as the baseline
                res["rel_l2_err_vs_unfused_eager"] = _rel_err(outs, refs["eager"][0])
                _reset(v, init_k, init_v)
                res["ok_to_time"] = True
            except Exception as exc:  # noqa: BLE001 - record and go on
                res["error"] = f"{type(exc).__name__}: {exc}"
                res["traceback"] = traceback.format_exc()
                res["ok_to_time"] = False
                print(f"  {v.name}: FAILED: {res['error'].splitlines()[0][:300]}", flush=True)
                continue
            pats = ", ".join(f"{PATTERN_KEY[k]} x{n}" for k, n in
                             res.get("patterns", {}).items()) or "none"
            print(f"  {v.name:20s} first call {res['first_call_s']:6.2f} s, graphs "
                  f"{res['graphs_compiled']}, check {res['check']}"
                  + (f" vs {v.reference} (max err {res['max_abs_err']:.1e}, rel err vs unfused "
                     f"eager {res['rel_l2_err_vs_unfused_eager']:.1e})"
                     if "max_abs_err" in res else "")
                  + (f", patterns fired: {pats}" if v.fusion is not None else ""), flush=True)

        timed = {v.name: v for v in variants if v.result.get("ok_to_time")}
        recompiles = {name: 0 for name in timed}
        marks: dict[str, int] = {}

        def before_round(name: str, r: int) -> None:
            marks[name] = _unique_graphs()

        def after_round(name: str, r: int) -> None:
            recompiles[name] += _unique_graphs() - marks[name]

        def steps_of_round(r: int) -> range:
            start = timed_start + r * args.steps
            return range(start, start + args.steps)

        fns = {name: (lambda i, v=v: v(schedule[i])) for name, v in timed.items()}
        t0 = time.perf_counter()
        rounds = H.interleaved_rounds(fns, steps_of_round, args.e2e_rounds, sync,
                                      before_round=before_round, after_round=after_round)
        print(f"  timed {args.e2e_rounds} rounds x {args.steps} steps x {len(fns)} variants in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)

    out: dict[str, Any] = {"batch": batch, "variants": {}, "fusion_speedup": {}}
    for v in variants:
        res = dict(v.result)
        res.pop("ok_to_time", None)
        if v.name in rounds:
            res["per_step_us"] = H.summarize(rounds[v.name])
            res["recompiles_timed"] = recompiles[v.name]
            if "eager" in rounds:
                res["speedup_vs_eager_paired"] = H.paired_ratios(rounds["eager"],
                                                                 rounds[v.name])
        out["variants"][v.name] = res
    pairs = {"eager": ("eager-fused", "eager")}
    pairs.update({e: (f"torchair-{e}-on", f"torchair-{e}-off") for e in args.engine})
    for engine, (on, off) in pairs.items():
        if on in rounds and off in rounds:
            out["fusion_speedup"][engine] = {
                "ratio_of_medians": (H.summarize(rounds[off])["median"]
                                     / H.summarize(rounds[on])["median"]),
                "paired": H.paired_ratios(rounds[off], rounds[on])}
    out["load_average_after_timing"] = H.load_average()
    return out


def run_e2e(device: str, args: argparse.Namespace) -> dict[str, Any]:
    dtype = DTYPES[args.dtype]
    if dtype == torch.float32:  # npu_quant_matmul has no float32 output
        dtype = torch.bfloat16
    hidden = args.model_hidden or (2048 if device == "cpu" else 4096)
    heads = args.heads or max(1, hidden // 128)
    inter = args.intermediate or 256 * round(2.75 * hidden / 256)
    cfg = ModelConfig(layers=args.layers, hidden=hidden, heads=heads, kv_heads=args.kv_heads,
                      intermediate=inter, capacity=args.capacity)
    if cfg.hidden % cfg.heads or cfg.heads % cfg.kv_heads:
        raise SystemExit("--model-hidden must be a multiple of --heads, and --heads of "
                         "--kv-heads")
    batches = [run_e2e_batch(args, cfg, b, device, dtype) for b in args.batch]
    return {"config": {**dataclasses.asdict(cfg), "head_dim": cfg.head_dim,
                       "dtype": str(dtype).replace("torch.", ""), "engines": args.engine,
                       "steps_per_round": args.steps, "rounds": args.e2e_rounds,
                       "check_steps": args.check_steps,
                       "expected_patterns_fusion_on": expected_patterns(cfg)},
            "results": batches}


def e2e_table(e2e: dict) -> str:
    rows = []
    for b in e2e["results"]:
        for name, res in b["variants"].items():
            stats = res.get("per_step_us", {})
            pats = res.get("patterns")
            pat_text = None if pats is None else (
                " ".join(sorted(f"{PATTERN_KEY[k]}x{n}" for k, n in pats.items())) or "none")
            if pats is not None and not res.get("patterns_as_expected"):
                pat_text += " (UNEXPECTED)"
            check = res.get("check", "error" if "error" in res else None)
            if res.get("check") not in (None, "reference"):
                check += f" vs {res['reference']}" + (" (==)" if res["bitwise_equal"] else "")
            fusion = None
            if name.endswith("-on") or name == "eager-fused":
                key = "eager" if name == "eager-fused" else name.split("-")[1]
                fusion = b["fusion_speedup"].get(key, {}).get("paired", {}).get("median")
            rel = res.get("rel_l2_err_vs_unfused_eager")
            rows.append([b["batch"], name, res.get("first_call_s"), check,
                         None if rel is None else f"{rel:.1e}", pat_text, stats.get("median"),
                         stats.get("p10"), stats.get("p90"),
                         res.get("speedup_vs_eager_paired", {}).get("median"), fusion])
    return H.format_table(["batch", "variant", "first call s", "check", "rel err",
                           "patterns fired", "median us", "p10 us", "p90 us", "vs eager",
                           "fusion x"], rows)


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
