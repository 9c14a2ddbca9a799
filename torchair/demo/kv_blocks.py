"""The serving loop's paged KV cache: one pool per layer and a block allocator.

Block 0 is the null block (vllm-ascend pads block tables with zeros the same way): padded rows
and padded query positions write their K/V there and read only there, so they never touch a
request's blocks. The other blocks are handed out on demand as a request grows and returned when
it finishes (or when a speculative step's rejected positions give a whole block back); the free
list is last-in first-out, so a freed block is the next one handed out.

With ``poison=True`` (the tests' and ``--poison-freed``'s adversarial mode) every row that stops
being live is filled with NaN: whole freed blocks and the rolled-back rows of a partly kept
block. A request that read a row it does not own (another request's freed block, its own
rejected drafts) would then produce NaN logits, and its tokens would not match the reference.
"""
from __future__ import annotations

import math

import torch

from torchair.demo.model import DemoConfig

__all__ = ["BlockPool", "NULL_BLOCK"]

NULL_BLOCK = 0


class BlockPool:
    """K/V pools ``[num_blocks, block_size, kv_hidden]`` per layer plus their free list."""

    def __init__(self, cfg: DemoConfig, num_blocks: int, device: torch.device | str,
                 dtype: torch.dtype, poison: bool = False) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks={num_blocks}: the pool needs the null block and at "
                             f"least one block to hand out")
        self.cfg = cfg
        self.block_size = cfg.block_size
        self.num_blocks = num_blocks
        self.poison = poison
        shape = (num_blocks, cfg.block_size, cfg.local_kv_hidden)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.layers)]
        self.free: list[int] = list(range(num_blocks - 1, NULL_BLOCK, -1))  # pops 1, 2, ...
        self.owner: dict[int, int] = {}  # block -> the request holding it
        self.handed_out = 0  # allocations over the pool's life
        self.reused = 0  # allocations of a block that had been freed before
        self._freed_once: set[int] = set()

    @property
    def in_use(self) -> int:
        return len(self.owner)

    def blocks_for(self, positions: int) -> int:
        return math.ceil(positions / self.block_size)

    def grow(self, rid: int, blocks: list[int], positions: int) -> None:
        """Give request ``rid`` (holding ``blocks``) enough blocks for ``positions`` KV rows."""
        while len(blocks) * self.block_size < positions:
            if not self.free:
                raise RuntimeError(f"KV cache out of blocks: request {rid} needs "
                                   f"{self.blocks_for(positions)} blocks for {positions} positions "
                                   f"and all {self.num_blocks - 1} are held; the pool is sized "
                                   f"for its batch of requests at their longest length, so a "
                                   f"request outgrew it or blocks leaked (a bug of the loop)")
            block = self.free.pop()
            self.handed_out += 1
            if block in self._freed_once:
                self.reused += 1
            self.owner[block] = rid
            blocks.append(block)

    def shrink(self, rid: int, blocks: list[int], positions: int, written: int) -> None:
        """Keep only ``positions`` live rows of ``blocks`` (``written`` rows hold data): the rows
        past ``positions`` are poisoned (poison mode) and whole blocks past them freed."""
        keep = self.blocks_for(positions)
        if self.poison and written > positions:
            self._poison_rows(blocks, positions, min(written, len(blocks) * self.block_size))
        self.release(rid, blocks[keep:])
        del blocks[keep:]

    def release(self, rid: int, blocks: list[int]) -> None:
        """Return ``blocks`` of request ``rid`` to the free list (poisoned in poison mode)."""
        for block in blocks:
            if self.owner.pop(block, None) != rid:
                raise RuntimeError(f"block {block} freed by request {rid}, which does not hold "
                                   f"it")
            if self.poison:
                for pool in self.k + self.v:
                    pool[block].fill_(float("nan"))
            self._freed_once.add(block)
            self.free.append(block)

    def _poison_rows(self, blocks: list[int], start: int, stop: int) -> None:
        for pos in range(start, stop):
            block, offset = blocks[pos // self.block_size], pos % self.block_size
            for pool in self.k + self.v:
                pool[block, offset].fill_(float("nan"))

    def slot(self, blocks: list[int], position: int) -> int:
        """The cache row of ``position`` in a request holding ``blocks``."""
        return blocks[position // self.block_size] * self.block_size + position % self.block_size

    def table_row(self, blocks: list[int], width: int) -> list[int]:
        """``blocks`` padded with the null block to ``width`` columns."""
        return blocks + [NULL_BLOCK] * (width - len(blocks))
