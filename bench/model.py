"""The benches' decoder step: the small Llama-like model most benches time, and its inputs.

``--layers`` decoder layers of RMSNorm -> q/k/v projections (GQA) -> in-place KV-cache write at
``pos`` (``index_copy_`` into a dense BSH cache ``[B, capacity, kv_hidden]``) ->
``torch.ops.npu.npu_incre_flash_attention`` with ``actual_seq_lengths`` -> output projection ->
RMSNorm -> SwiGLU MLP, then a final RMSNorm. Used by ``bench_decode_step`` (the variants),
``bench_gears`` (batch gears), ``bench_cache_compile`` (cold start) and ``bench_tp`` (its
tensor-parallel shard, :meth:`DecoderLayer.all_reduce`); ``bench_fusion`` shares
:class:`ModelConfig` (its W8A8 step is a different model on purpose: its docstring says why).

Why not :mod:`torchair.demo.model`: the demo's decoder is a serving step (token embedding, rotary
embedding, a *paged* KV cache behind a block table, fused ``npu_add_rms_norm``, LM head and
``argmax``), and the benches' recorded numbers are of this plainer step (dense cache, one
``index_copy_`` column per call, plain RMSNorm): swapping models would change what every saved
result and README table measured.

Weights are drawn from torch's global generator (seed it first: ``torch.manual_seed``), in a
fixed order, so a seed gives the same model in every bench.
"""
from __future__ import annotations

import dataclasses
import random

import torch
import torch.nn.functional as F

import torchair  # noqa: F401  (registers torch.ops.npu.*)

__all__ = ["ModelConfig", "RMSNorm", "DecoderLayer", "DecoderStep", "StepInput",
           "host_bench_decoder", "make_schedule", "max_calls", "seeded_decoder"]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape of the decoder step: ``capacity`` is the KV cache's positions per sequence."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    capacity: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_hidden(self) -> int:
        return self.kv_heads * self.head_dim


class RMSNorm(torch.nn.Module):
    """RMSNorm computed in float32, weight ``1 + 0.1 * randn``."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(1.0 + 0.1 * torch.randn(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return x32.to(x.dtype) * self.weight


class DecoderLayer(torch.nn.Module):
    """One layer (module doc). ``heads`` / ``kv_heads`` are the heads this module computes: all
    of them here, one rank's share in a tensor-parallel shard (``bench_tp``), which also
    overrides :meth:`all_reduce`."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.heads, self.kv_heads = cfg.heads, cfg.kv_heads
        self.attn_norm = RMSNorm(cfg.hidden)
        self.q = torch.nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.k = torch.nn.Linear(cfg.hidden, cfg.kv_hidden, bias=False)
        self.v = torch.nn.Linear(cfg.hidden, cfg.kv_hidden, bias=False)
        self.o = torch.nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.mlp_norm = RMSNorm(cfg.hidden)
        self.gate = torch.nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.up = torch.nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.down = torch.nn.Linear(cfg.intermediate, cfg.hidden, bias=False)

    def all_reduce(self, y: torch.Tensor) -> torch.Tensor:
        """The sum over tensor-parallel ranks of a row-parallel output (o, down): ``y`` itself
        in the unsplit model (no op)."""
        return y

    def forward(self, h, pos, lens: list[int], k_cache, v_cache):
        cfg = self.cfg
        a = self.attn_norm(h)
        q, k, v = self.q(a), self.k(a), self.v(a)
        k_cache.index_copy_(1, pos, k)  # [B, 1, H_kv] into [B, S, H_kv] at column pos, in place
        v_cache.index_copy_(1, pos, v)
        attn = torch.ops.npu.npu_incre_flash_attention(
            q, k_cache, v_cache, actual_seq_lengths=lens, num_heads=self.heads,
            num_key_value_heads=self.kv_heads, input_layout="BSH",
            scale_value=cfg.head_dim ** -0.5)
        h = h + self.all_reduce(self.o(attn))
        m = self.mlp_norm(h)
        return h + self.all_reduce(self.down(F.silu(self.gate(m)) * self.up(m)))


class DecoderStep(torch.nn.Module):
    """One decode step of a ``cfg.layers``-layer decoder: ``x [B, 1, hidden]`` -> same shape."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden)

    def forward(self, x, pos, lens: list[int], k_caches: list[torch.Tensor],
                v_caches: list[torch.Tensor]):
        h = x
        for i, layer in enumerate(self.layers):
            h = layer(h, pos, lens, k_caches[i], v_caches[i])
        return self.norm(h)


def host_bench_decoder(quick: bool, batch: int) -> tuple[ModelConfig, DecoderStep,
                                                         list[torch.Tensor]]:
    """The decoder the host-cost benches time (``bench_cached_call``, ``bench_after_pause``,
    ``bench_host_cold``): 2 layers of hidden 512 with 1024 KV positions, or with ``quick`` a tiny
    one (1 layer, hidden 64, 64 positions); seeded weights, in eval mode, and zeroed KV caches
    for ``batch``."""
    cfg = (ModelConfig(layers=1, hidden=64, heads=4, kv_heads=2, intermediate=128, capacity=64)
           if quick else
           ModelConfig(layers=2, hidden=512, heads=8, kv_heads=2, intermediate=1536,
                       capacity=1024))
    torch.manual_seed(0)
    model = DecoderStep(cfg).eval()
    init = [torch.zeros(batch, cfg.capacity, cfg.kv_hidden) for _ in range(cfg.layers)]
    return cfg, model, init


def seeded_decoder(cfg: ModelConfig, batch: int, device: str, dtype: torch.dtype, seed: int
                   ) -> tuple[DecoderStep, list[torch.Tensor], list[torch.Tensor]]:
    """The decoder seeded with ``seed`` on ``device`` in ``dtype`` (eval mode, no grad on its
    parameters) and random initial K and V caches for ``batch`` (seeded with ``seed + 1``)."""
    torch.manual_seed(seed)
    model = DecoderStep(cfg).to(device=device, dtype=dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(seed + 1)
    init_k = [torch.randn(batch, cfg.capacity, cfg.kv_hidden, generator=gen)
              .to(device=device, dtype=dtype) for _ in range(cfg.layers)]
    init_v = [torch.randn(batch, cfg.capacity, cfg.kv_hidden, generator=gen)
              .to(device=device, dtype=dtype) for _ in range(cfg.layers)]
    return model, init_k, init_v


@dataclasses.dataclass
class StepInput:
    """One call's inputs: ``x [B, 1, hidden]``, the cache column ``pos [1]`` and the lengths."""

    x: torch.Tensor
    pos: torch.Tensor
    lens: list[int]


def max_calls(cfg: ModelConfig, batch: int) -> int:
    """The most calls :func:`make_schedule` fits in ``cfg``'s KV cache at ``batch`` (each call
    grows every sequence by one; ``batch + 2`` positions stay for the distinct first lengths)."""
    return cfg.capacity - 2 - batch


def make_schedule(cfg: ModelConfig, batch: int, n_calls: int, device: str, dtype: torch.dtype,
                  seed: int) -> list[StepInput]:
    """``n_calls`` step inputs whose lengths are new at every call: sequence ``b`` has length
    ``base_b + i`` at call ``i``; the new token goes to column ``pos = min(lens) - 1`` (one
    column for the whole batch, as ``index_copy_`` writes). Bases are distinct and >= 2, so the
    first call's lengths are distinct values >= 2 (Dynamo specializes 0 and 1)."""
    room = cfg.capacity - n_calls
    if n_calls > max_calls(cfg, batch):
        raise SystemExit(f"--capacity {cfg.capacity} is too small for {n_calls} calls at batch "
                         f"{batch}; raise --capacity or lower --steps/--rounds")
    rng = random.Random(seed)
    lo = max(2, room // 2)
    if room - lo + 1 < batch:
        lo = 2
    bases = rng.sample(range(lo, room + 1), batch)
    gen = torch.Generator().manual_seed(seed)
    steps = []
    for i in range(n_calls):
        lens = [b + i for b in bases]
        x = torch.randn(batch, 1, cfg.hidden, generator=gen).to(device=device, dtype=dtype)
        pos = torch.tensor([min(lens) - 1], dtype=torch.int64, device=device)
        steps.append(StepInput(x, pos, lens))
    return steps
