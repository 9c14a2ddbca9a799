"""Test helpers for paged KV caches: a shuffled block table and a cache scattered into it."""
import math

import torch

SPARE_BLOCKS = 3  # blocks no sequence uses: a kernel that reads them reads JUNK
JUNK = 77  # fits every KV dtype (int8 too) and poisons any result that reads it


def block_table(batch: int, seq: int, block_size: int, generator: torch.Generator,
                spare: int = SPARE_BLOCKS) -> torch.Tensor:
    """A shuffled block table ``[B, ceil(S / block_size)]`` int32 over ``B * per_seq + spare``
    blocks."""
    per_seq = math.ceil(seq / block_size)
    order = torch.randperm(batch * per_seq + spare, generator=generator)[: batch * per_seq]
    return order.reshape(batch, per_seq).to(torch.int32)


def to_blocks(cache: torch.Tensor, block_size: int, table: torch.Tensor,
              spare: int = SPARE_BLOCKS) -> torch.Tensor:
    """Scatter a dense ``[B, Nkv, S, D]`` cache into the blocks ``table`` names; every other
    block and slot holds JUNK."""
    batch, nkv, seq, dim = cache.shape
    per_seq = table.shape[1]
    blocks = torch.full((table.numel() + spare, nkv, block_size, dim), JUNK, dtype=cache.dtype,
                        device=cache.device)
    padded = torch.full((batch, nkv, per_seq * block_size, dim), JUNK, dtype=cache.dtype,
                        device=cache.device)
    padded[:, :, :seq] = cache
    chunks = padded.reshape(batch, nkv, per_seq, block_size, dim).permute(0, 2, 1, 3, 4)
    blocks[table.long().reshape(-1).to(cache.device)] = chunks.reshape(-1, nkv, block_size, dim)
    return blocks


def paged(cache: torch.Tensor, block_size: int, generator: torch.Generator):
    """``(blocks, table)`` for ``cache`` laid out in shuffled blocks."""
    table = block_table(cache.shape[0], cache.shape[2], block_size, generator)
    return to_blocks(cache, block_size, table), table
