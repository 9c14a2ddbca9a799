"""The demo's model: a small Llama-style decoder whose decode step uses torchair's npu ops.

Per layer: ``npu_add_rms_norm`` (residual add + RMSNorm in one op) -> q/k/v projections (GQA)
-> rotary embedding -> the new token's K/V written in place into a *paged* KV cache (block pools
``[num_blocks, block_size, kv_heads * head_dim]``, slots found through a block table) ->
``npu_incre_flash_attention`` over the paged cache (``block_table``, ``actual_seq_lengths``) ->
output projection -> ``npu_add_rms_norm`` -> SwiGLU MLP. A final ``npu_add_rms_norm``, the LM
head and ``argmax`` give the next token (greedy), inside the step.

Mixture of experts (``DemoConfig.experts`` = E > 0): the MLP of every layer becomes E SwiGLU
experts of ``intermediate`` columns each, ``top_k`` per token, through torch_npu's MoE ops as
vllm-ascend's TorchAir path calls them (:class:`MoE`): router logits ->
``npu_moe_gating_top_k`` (softmax, the chosen weights renormalized) -> ``npu_moe_init_routing``
(tokens permuted by expert) -> ``npu_moe_compute_expert_tokens`` -> ``npu_grouped_matmul``
(gate | up) -> SwiGLU -> ``npu_grouped_matmul`` (down) -> ``npu_moe_finalize_routing`` (weighted
un-permute). Every shape is sized by the batch, not by the routing, so the step stays one static
graph. MoE is not combined with tensor parallelism.

Tensor parallel (``DemoConfig.tp`` > 1, :func:`shard`): Megatron style, q/k/v and gate/up
column-parallel (each rank holds ``heads / tp`` query heads, ``kv_heads / tp`` KV heads and
``intermediate / tp`` SwiGLU columns), o/down row-parallel followed by a functional
``all_reduce`` (sum) over the process group; each rank's paged KV pools hold only its KV heads.
Embedding, norms and the LM head are replicated, so every rank computes the same next token.

Weights are seeded random numbers: nothing is downloaded.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

import torchair  # noqa: F401  (registers torch.ops.npu.*)

__all__ = ["DemoConfig", "Decoder", "MoE", "PagedKVCache", "rotate", "shard"]

# A module constant, not a module attribute: Dynamo (dynamic=True) would trace a float attribute
# as a graph input and then retrace once to specialize it.
EPS = 1e-6


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """Shape of the demo decoder."""

    layers: int = 4
    hidden: int = 256
    heads: int = 8
    kv_heads: int = 2
    intermediate: int = 512
    vocab: int = 512
    block_size: int = 16
    max_len: int = 128  # positions the rotary table and the block table cover
    rope: bool = True
    tp: int = 1  # tensor-parallel ranks; the local_* sizes are one rank's shard
    experts: int = 0  # > 0: each layer's MLP is a mixture of this many SwiGLU experts
    top_k: int = 2  # experts per token (with experts > 0)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_hidden(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def local_heads(self) -> int:
        return self.heads // self.tp

    @property
    def local_kv_heads(self) -> int:
        return self.kv_heads // self.tp

    @property
    def local_kv_hidden(self) -> int:
        """Width of one rank's KV cache rows (its KV heads)."""
        return self.local_kv_heads * self.head_dim

    @property
    def local_intermediate(self) -> int:
        return self.intermediate // self.tp

    @property
    def blocks_per_seq(self) -> int:
        return math.ceil(self.max_len / self.block_size)

    def check(self) -> None:
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"hidden={self.hidden} must be a multiple of heads={self.heads}, "
                             f"and heads a multiple of kv_heads={self.kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} (hidden / heads) must be even for the "
                             f"rotary embedding")
        if self.block_size % 16:
            raise ValueError(f"block_size={self.block_size} must be a multiple of 16 (page "
                             f"attention's constraint)")
        self.check_tp()
        self.check_moe()

    def check_moe(self) -> None:
        """``experts`` >= 0; with experts, ``top_k`` in [1, experts] and no tensor parallelism."""
        if self.experts < 0:
            raise ValueError(f"--experts {self.experts} must be >= 0 (0: a dense SwiGLU MLP)")
        if self.experts and not 1 <= self.top_k <= self.experts:
            raise ValueError(f"--top-k {self.top_k} must be in [1, --experts {self.experts}]")
        if self.experts and self.tp > 1:
            raise ValueError(f"--experts {self.experts} with --tp {self.tp}: the MoE layer is not "
                             f"sharded; use --tp 1 with --experts")

    def check_tp(self) -> None:
        """The heads, KV heads and SwiGLU size must split evenly over ``tp`` ranks."""
        if self.tp < 1:
            raise ValueError(f"tp={self.tp} must be >= 1")
        for name, value in (("heads", self.heads), ("kv-heads", self.kv_heads),
                            ("intermediate", self.intermediate)):
            if value % self.tp:
                raise ValueError(f"--tp {self.tp}: --{name} {value} is not divisible by "
                                 f"{self.tp} (each rank takes an equal share)")


class Layer(torch.nn.Module):
    def __init__(self, cfg: DemoConfig, group: "dist.ProcessGroup | None" = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.group = group  # the tensor-parallel group (cfg.tp > 1)
        q_hidden = cfg.local_heads * cfg.head_dim
        self.attn_norm = torch.nn.Parameter(1.0 + 0.1 * torch.randn(cfg.hidden))
        self.q_proj = torch.nn.Linear(cfg.hidden, q_hidden, bias=False)
        self.k_proj = torch.nn.Linear(cfg.hidden, cfg.local_kv_hidden, bias=False)
        self.v_proj = torch.nn.Linear(cfg.hidden, cfg.local_kv_hidden, bias=False)
        self.o_proj = torch.nn.Linear(q_hidden, cfg.hidden, bias=False)
        self.mlp_norm = torch.nn.Parameter(1.0 + 0.1 * torch.randn(cfg.hidden))
        if cfg.experts:
            self.moe = MoE(cfg)
        else:
            self.gate_proj = torch.nn.Linear(cfg.hidden, cfg.local_intermediate, bias=False)
            self.up_proj = torch.nn.Linear(cfg.hidden, cfg.local_intermediate, bias=False)
            self.down_proj = torch.nn.Linear(cfg.local_intermediate, cfg.hidden, bias=False)

    def attention(self, a, cos, sin, slots, block_table, lens, k_pool, v_pool):
        cfg = self.cfg
        batch = a.shape[0]
        heads, kv_heads, kv_hidden = cfg.local_heads, cfg.local_kv_heads, cfg.local_kv_hidden
        q, k, v = self.q_proj(a), self.k_proj(a), self.v_proj(a)
        if cfg.rope:
            q = rotate(q.view(batch, 1, heads, cfg.head_dim), cos, sin).view(batch, 1, -1)
            k = rotate(k.view(batch, 1, kv_heads, cfg.head_dim), cos, sin).view(batch, 1, -1)
        # the new token's K/V into its slot of the paged cache, in place
        k_pool.view(-1, kv_hidden).index_copy_(0, slots, k.reshape(batch, kv_hidden))
        v_pool.view(-1, kv_hidden).index_copy_(0, slots, v.reshape(batch, kv_hidden))
        return torch.ops.npu.npu_incre_flash_attention(
            q, k_pool, v_pool, actual_seq_lengths=lens, block_table=block_table,
            block_size=cfg.block_size, num_heads=heads, num_key_value_heads=kv_heads,
            input_layout="BSH", scale_value=cfg.head_dim ** -0.5)

    def reduce_partial(self, partial: torch.Tensor) -> torch.Tensor:
        """Row-parallel output: the sum of every rank's partial result."""
        if self.cfg.tp == 1:
            return partial
        return funcol.all_reduce(partial, "sum", self.group)

    def forward(self, residual, delta, cos, sin, slots, block_table, lens, k_pool, v_pool):
        a, _, residual = torch.ops.npu.npu_add_rms_norm(residual, delta, self.attn_norm,
                                                        EPS)
        delta = self.reduce_partial(self.o_proj(self.attention(a, cos, sin, slots, block_table,
                                                               lens, k_pool, v_pool)))
        m, _, residual = torch.ops.npu.npu_add_rms_norm(residual, delta, self.mlp_norm,
                                                        EPS)
        return residual, self.mlp(m)

    def mlp(self, m: torch.Tensor) -> torch.Tensor:
        """The MLP of the normed residual ``m``: SwiGLU (row-parallel reduced) or the MoE."""
        if self.cfg.experts:
            return self.moe(m)
        return self.reduce_partial(self.down_proj(F.silu(self.gate_proj(m)) * self.up_proj(m)))


class MoE(torch.nn.Module):
    """``experts`` SwiGLU experts, ``top_k`` per token, through torch_npu's MoE ops (module doc).

    Weights as vllm-ascend lays them out for ``npu_grouped_matmul``: ``w13 [E, hidden, 2 * I]``
    (gate | up) and ``w2 [E, I, hidden]``; the router is a ``Linear(hidden, E)``.
    """

    def __init__(self, cfg: DemoConfig) -> None:
        super().__init__()
        self.cfg = cfg
        e, h, i = cfg.experts, cfg.hidden, cfg.intermediate
        self.router = torch.nn.Linear(h, e, bias=False)
        # Linear's default initialization, one matrix per expert
        self.w13 = torch.nn.Parameter(torch.empty(e, h, 2 * i).uniform_(-h ** -0.5, h ** -0.5))
        self.w2 = torch.nn.Parameter(torch.empty(e, i, h).uniform_(-i ** -0.5, i ** -0.5))

    def forward(self, m: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        x = m.reshape(-1, cfg.hidden)  # [tokens, hidden]
        tokens = x.shape[0]
        weights, ids, _ = torch.ops.npu.npu_moe_gating_top_k(self.router(x), cfg.top_k,
                                                             norm_type=0)
        # row_idx[n, k] = k * tokens + n: the (token, choice) layout init_routing expects
        row_idx = torch.arange(tokens * cfg.top_k, dtype=torch.int32, device=x.device)
        row_idx = row_idx.view(cfg.top_k, tokens).t().contiguous()
        rows, src_to_dst, sorted_ids = torch.ops.npu.npu_moe_init_routing(x, row_idx, ids,
                                                                          tokens)
        ends = torch.ops.npu.npu_moe_compute_expert_tokens(sorted_ids, cfg.experts)
        ends = ends.to(torch.int64)
        gate_up = torch.ops.npu.npu_grouped_matmul([rows], [self.w13], group_list=ends,
                                                   split_item=2, group_type=0)[0]
        gate, up = gate_up.chunk(2, dim=-1)
        down = torch.ops.npu.npu_grouped_matmul([F.silu(gate) * up], [self.w2], group_list=ends,
                                                split_item=2, group_type=0)[0]
        out = torch.ops.npu.npu_moe_finalize_routing(down, None, None, None, weights,
                                                     src_to_dst, ids)
        return out.view(m.shape)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (rotate-half form) of ``x [B, 1, heads, D]``; cos/sin ``[B, 1, 1, D/2]``."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Decoder(torch.nn.Module):
    """The decode step: ``tokens [B, 1]`` at ``positions [B]`` -> next tokens ``[B, 1]``.

    ``slots [B]`` are the cache rows the new K/V go to (``block * block_size + offset``),
    ``block_table [B, blocks_per_seq]`` int32, ``lens`` the KV lengths after this token (one
    value for all sequences, so the list keeps its length across batch gears), ``k_pools`` /
    ``v_pools`` one paged pool per layer, written in place.
    """

    def __init__(self, cfg: DemoConfig, group: "dist.ProcessGroup | None" = None) -> None:
        super().__init__()
        cfg.check()
        self.cfg = cfg
        self.embed = torch.nn.Parameter(torch.randn(cfg.vocab, cfg.hidden))
        self.layers = torch.nn.ModuleList(Layer(cfg, group) for _ in range(cfg.layers))
        self.norm = torch.nn.Parameter(1.0 + 0.1 * torch.randn(cfg.hidden))
        self.lm_head = torch.nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        freqs = 10000.0 ** (-torch.arange(0, cfg.head_dim, 2).float() / cfg.head_dim)
        angles = torch.arange(cfg.max_len).float()[:, None] * freqs[None, :]
        self.register_buffer("cos_table", angles.cos(), persistent=False)
        self.register_buffer("sin_table", angles.sin(), persistent=False)

    def forward(self, tokens, positions, slots, block_table, lens: list[int],
                k_pools: list[torch.Tensor], v_pools: list[torch.Tensor]) -> torch.Tensor:
        return self.logits(tokens, positions, slots, block_table, lens, k_pools,
                           v_pools).argmax(dim=-1)

    def logits(self, tokens, positions, slots, block_table, lens: list[int],
               k_pools: list[torch.Tensor], v_pools: list[torch.Tensor]) -> torch.Tensor:
        """The step's logits ``[B, 1, vocab]`` (``forward`` takes their argmax)."""
        batch = tokens.shape[0]
        residual = F.embedding(tokens, self.embed)  # [B, 1, hidden]
        delta = torch.zeros_like(residual)
        cos = self.cos_table[positions].view(batch, 1, 1, -1)
        sin = self.sin_table[positions].view(batch, 1, 1, -1)
        for layer, k_pool, v_pool in zip(self.layers, k_pools, v_pools):
            residual, delta = layer(residual, delta, cos, sin, slots, block_table, lens, k_pool,
                                    v_pool)
        h, _, _ = torch.ops.npu.npu_add_rms_norm(residual, delta, self.norm, EPS)
        return self.lm_head(h)


def shard(full: Decoder, tp: int, rank: int, group: "dist.ProcessGroup | None" = None
          ) -> Decoder:
    """Rank ``rank``'s tensor-parallel shard of ``full`` (a ``tp=1`` decoder): the rows of q/k/v
    and gate/up of its heads / SwiGLU columns, the matching columns of o/down, everything else
    copied. Query heads ``[r*H/tp, (r+1)*H/tp)`` use KV heads ``[r*K/tp, (r+1)*K/tp)``, the same
    GQA grouping as the full model."""
    cfg = dataclasses.replace(full.cfg, tp=tp)
    cfg.check()
    with torch.device("meta"):
        model = Decoder(cfg, group)
    d = cfg.head_dim
    q = slice(rank * cfg.local_heads * d, (rank + 1) * cfg.local_heads * d)
    kv = slice(rank * cfg.local_kv_hidden, (rank + 1) * cfg.local_kv_hidden)
    mlp = slice(rank * cfg.local_intermediate, (rank + 1) * cfg.local_intermediate)
    rows = {"q_proj": q, "k_proj": kv, "v_proj": kv, "gate_proj": mlp, "up_proj": mlp}
    cols = {"o_proj": q, "down_proj": mlp}
    state = {}
    for name, tensor in full.state_dict().items():
        module = name.split(".")[-2] if "." in name else ""
        if module in rows:
            tensor = tensor[rows[module]]
        elif module in cols:
            tensor = tensor[:, cols[module]]
        state[name] = tensor.clone()
    model.load_state_dict(state, assign=True)
    for name, buf in full.named_buffers():  # non-persistent: not in the state dict
        setattr(model, name, buf.clone())
    return model


class PagedKVCache:
    """Block pools for every layer plus the block table of one batch.

    The pools are allocated once for ``max_batch`` sequences (plus spare blocks) and keep their
    addresses for the whole run (a static launch unit uses them where they are); each sequence
    gets ``blocks_per_seq`` blocks in a shuffled order, so the table really is a page table.
    """

    SPARE_BLOCKS = 2

    def __init__(self, cfg: DemoConfig, max_batch: int, device: torch.device | str,
                 dtype: torch.dtype, seed: int) -> None:
        self.cfg = cfg
        self.num_blocks = max_batch * cfg.blocks_per_seq + self.SPARE_BLOCKS
        shape = (self.num_blocks, cfg.block_size, cfg.local_kv_hidden)  # this rank's KV heads
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.layers)]
        self.generator = torch.Generator().manual_seed(seed)
        self.device = device

    def reset(self, batch: int) -> torch.Tensor:
        """Empty the pools (in place) and return a fresh shuffled block table ``[batch, M]``."""
        for t in self.k + self.v:
            t.zero_()
        per_seq = self.cfg.blocks_per_seq
        order = torch.randperm(self.num_blocks, generator=self.generator)[: batch * per_seq]
        self.table_cpu = order.reshape(batch, per_seq).to(torch.int64)
        return self.table_cpu.to(device=self.device, dtype=torch.int32)

    def slots(self, position: int) -> torch.Tensor:
        """Cache rows of token ``position`` of every sequence (``[B]`` int64, on the device)."""
        block = self.table_cpu[:, position // self.cfg.block_size]
        return (block * self.cfg.block_size + position % self.cfg.block_size).to(self.device)
