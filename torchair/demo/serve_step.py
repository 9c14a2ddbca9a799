"""The served step of ``torchair demo --serve``: S query tokens per request over a paged KV cache.

One function serves every kind of step the serving loop runs, each at a fixed shape:

* decode: ``S = 1``, a batch of requests padded up to a graph batch size;
* speculative verify: ``S = 1 + K`` (the last token and K drafts, padded to K when fewer were
  found), the same batch padding;
* a prefill chunk: one request, ``S = --prefill-chunk`` (the last chunk padded).

Inputs (``B`` requests, ``S`` tokens each, ``M`` block-table columns)::

    tokens       [B, S] int64   the query tokens
    positions    [B, S] int64   their positions (rotary)
    slots        [B, S] int64   the cache rows their K/V are written to (block * block_size +
                                offset); padding writes go to the null block 0
    block_table  [B, M] int32   each request's blocks (unused columns: the null block 0)
    q_lens       [B] int64      real query tokens of each request (<= S), or None: all S
    kv_lens      [B] int64      KV positions each request attends over, this step's included
    k_pools, v_pools            one ``[num_blocks, block_size, kv_hidden]`` pool per layer

The K/V of the S tokens are written in place first, then attention goes through TorchAir's
graph-mode ``torchair.ops.npu_fused_infer_attention_score`` (lengths as device tensors, so their
values never reach a guard) with ``sparse_mode=3`` (right-down causal: query row ``i`` of request
``b`` sees KV positions ``< kv_lens[b] - q_lens[b] + i + 1``); rows past ``q_lens`` come out 0.
A decode step (``S = 1``, ``q_lens`` None) is the plain incremental case and runs the decode
kernel. The result is the greedy next token after every query position, ``[B, S]`` int64
(:meth:`ServeStep.logits` gives the logits, for the eager reference's near-tie test).

:meth:`ServeStep.decode` and :meth:`ServeStep.prefill` are the same computation under two
names, so that ``cache_compile`` keeps one entry (one code object, one Dynamo frame) for each.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import torchair.ops
from torchair.demo.model import EPS, Decoder, rotate

__all__ = ["ServeStep"]


class ServeStep(torch.nn.Module):
    """The serving loop's step over the weights of a :class:`Decoder` (module doc)."""

    def __init__(self, decoder: Decoder) -> None:
        super().__init__()
        self.decoder = decoder
        self.cfg = decoder.cfg

    def logits(self, tokens, positions, slots, block_table, q_lens, kv_lens, k_pools, v_pools
               ) -> torch.Tensor:
        """``[B, S, vocab]`` logits after every query token (module doc for the inputs)."""
        dec, cfg = self.decoder, self.cfg
        batch, s = tokens.shape
        residual = F.embedding(tokens, dec.embed)  # [B, S, hidden]
        delta = torch.zeros_like(residual)
        cos = dec.cos_table[positions].view(batch, s, 1, -1)
        sin = dec.sin_table[positions].view(batch, s, 1, -1)
        rows = slots.view(-1)
        heads, kv_heads, kv_hidden = cfg.local_heads, cfg.local_kv_heads, cfg.local_kv_hidden
        for layer, k_pool, v_pool in zip(dec.layers, k_pools, v_pools):
            a, _, residual = torch.ops.npu.npu_add_rms_norm(residual, delta, layer.attn_norm, EPS)
            q, k, v = layer.q_proj(a), layer.k_proj(a), layer.v_proj(a)
            if cfg.rope:
                q = rotate(q.view(batch, s, heads, cfg.head_dim), cos, sin).view(batch, s, -1)
                k = rotate(k.view(batch, s, kv_heads, cfg.head_dim), cos, sin)
            k_pool.view(-1, kv_hidden).index_copy_(0, rows, k.reshape(batch * s, kv_hidden))
            v_pool.view(-1, kv_hidden).index_copy_(0, rows, v.reshape(batch * s, kv_hidden))
            attn, _ = torchair.ops.npu_fused_infer_attention_score(
                q, k_pool, v_pool, actual_seq_lengths=q_lens, actual_seq_lengths_kv=kv_lens,
                block_table=block_table, block_size=cfg.block_size, num_heads=heads,
                num_key_value_heads=kv_heads, input_layout="BSH", scale=cfg.head_dim ** -0.5,
                sparse_mode=3 if s > 1 else 0)
            delta = layer.reduce_partial(layer.o_proj(attn))
            m, _, residual = torch.ops.npu.npu_add_rms_norm(residual, delta, layer.mlp_norm, EPS)
            delta = layer.mlp(m)
        h, _, _ = torch.ops.npu.npu_add_rms_norm(residual, delta, dec.norm, EPS)
        return dec.lm_head(h)

    def decode(self, tokens, positions, slots, block_table, q_lens, kv_lens, k_pools, v_pools
               ) -> torch.Tensor:
        """Greedy next tokens ``[B, S]`` of a decode or verify step."""
        return self.logits(tokens, positions, slots, block_table, q_lens, kv_lens, k_pools,
                           v_pools).argmax(dim=-1)

    def prefill(self, tokens, positions, slots, block_table, q_lens, kv_lens, k_pools, v_pools
                ) -> torch.Tensor:
        """Greedy next tokens ``[B, S]`` of a prefill chunk (the same computation as decode)."""
        return self.logits(tokens, positions, slots, block_table, q_lens, kv_lens, k_pools,
                           v_pools).argmax(dim=-1)

    forward = decode
