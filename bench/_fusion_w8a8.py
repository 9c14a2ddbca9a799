"""The W8A8 decode step of the fusion benchmark's part 2: an int8-weight decoder layer carrying
the three fusion patterns in their unfused form (or, ``fused=True``, the fused ops called by hand),
the step that stacks them, and its per-call inputs with lengths that are new at every call.

Split out of :mod:`bench.bench_fusion` (whose docstring lists the step's ops); the variants and
timing of the step are :mod:`bench._fusion_e2e`.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

import torchair  # noqa: F401  (registers torch.ops.npu.*)
from bench._fusion_ops import ONLY_Y1
from bench.model import ModelConfig

npu = torch.ops.npu


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

