"""The continuous-batching loop of ``torchair demo --serve``: requests, the scheduler, the steps.

Every iteration of :func:`serve`:

1. requests waiting join while fewer than ``max_batch`` run (all arrive at the start);
2. the oldest request still in its prompt prefills one chunk of ``prefill_chunk`` tokens;
3. every request past its prompt decodes one step together: its last token, plus up to K
   drafts with speculation (:func:`propose`), at ``S = 1 + K`` query positions;
4. finished requests leave and give their KV blocks back (:class:`~torchair.demo.kv_blocks.BlockPool`).

A :class:`Runner` runs the steps. The eager runner calls the step at the batch's own shape; the
torchair runner pads the decode batch up to the smallest graph batch size
(:func:`torchair.inference.pad_batch`) and every prefill chunk to ``prefill_chunk`` tokens, so
its compiled steps only ever see their gears. Padded rows and padded query positions write to
the null block and their outputs are dropped.

Speculation is greedy and self-drafted (prompt lookup): the verify step's argmax after the last
token and after each draft decides; drafts are accepted while each equals the model's token
before it, then the model's next token is taken too. The rejected drafts' K/V rows roll back:
the request's length goes back, their rows are poisoned in poison mode and whole blocks past the
length are freed.
"""
from __future__ import annotations

import collections
import dataclasses
import time
from typing import Callable, Sequence

import torch

from torchair.demo.kv_blocks import NULL_BLOCK, BlockPool
from torchair.inference.padding import pad_batch, split_batch

__all__ = ["Request", "Runner", "Stats", "propose", "serve"]


@dataclasses.dataclass
class Request:
    """One request: its prompt, output budget, tokens so far and KV blocks."""

    rid: int
    prompt: list[int]
    max_new: int
    tokens: list[int] = dataclasses.field(default_factory=list)
    blocks: list[int] = dataclasses.field(default_factory=list)
    cached: int = 0  # KV positions written and live (the last token is not yet among them)
    first_token_s: float | None = None
    done_s: float | None = None

    def __post_init__(self) -> None:
        if not self.tokens:
            self.tokens = list(self.prompt)

    @property
    def generated(self) -> list[int]:
        return self.tokens[len(self.prompt):]

    @property
    def prefilling(self) -> bool:
        return self.cached < len(self.prompt)

    @property
    def done(self) -> bool:
        return len(self.tokens) - len(self.prompt) >= self.max_new


@dataclasses.dataclass
class Stats:
    """What one run of the loop did."""

    decode_steps: int = 0
    prefill_chunks: int = 0
    rows: int = 0  # decode rows run, padded ones included
    padded_rows: int = 0
    prefill_tokens: int = 0  # prefill query positions run, padded ones included
    padded_prefill_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0  # tokens the decode steps produced (the prefills' first tokens not counted)
    request_steps: int = 0  # (request, decode step) pairs
    max_blocks_in_use: int = 0
    blocks_handed_out: int = 0  # KV blocks allocated during the run
    blocks_reused: int = 0  # of them, blocks that had been freed before
    batch_sizes: dict[int, int] = dataclasses.field(default_factory=dict)  # real rows -> steps
    graph_sizes: dict[int, int] = dataclasses.field(default_factory=dict)  # run size -> steps
    drafts: dict[int, int] = dataclasses.field(default_factory=dict)  # drafts -> request-steps


def propose(tokens: Sequence[int], k: int, max_n: int = 3, min_n: int = 1) -> list[int]:
    """Prompt-lookup drafts: up to ``k`` tokens that followed the latest earlier occurrence of
    the last ``n``-gram of ``tokens`` (``n`` from ``max_n`` down to ``min_n``); [] when none."""
    if k <= 0:
        return []
    size = len(tokens)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        tail = list(tokens[size - n:])
        for start in range(size - n - 1, -1, -1):
            if list(tokens[start:start + n]) == tail:
                follow = list(tokens[start + n:start + n + k])
                if follow:
                    return follow
    return []


class Runner:
    """Runs the loop's steps on one step function pair: ``decode_fn`` / ``prefill_fn`` with
    :class:`~torchair.demo.serve_step.ServeStep`'s inputs. ``graph_sizes`` None runs every step
    at its own shape (eager); otherwise decode batches are padded to those sizes and prefill
    chunks to ``prefill_chunk`` tokens."""

    def __init__(self, name: str, decode_fn: Callable, prefill_fn: Callable, pool: BlockPool,
                 *, query_len: int, prefill_chunk: int, table_width: int,
                 graph_sizes: Sequence[int] | None, device: torch.device | str) -> None:
        self.name = name
        self.decode_fn, self.prefill_fn = decode_fn, prefill_fn
        self.pool = pool
        self.query_len = query_len  # S of a decode step: 1 + K
        self.prefill_chunk = prefill_chunk
        self.width = table_width
        self.graph_sizes = list(graph_sizes) if graph_sizes is not None else None
        self.device = device
        self.on_first_call: Callable[[str, tuple], None] | None = None  # gear marks
        # sees every step's tokens (tensor parallel: the ranks compare them at every step)
        self.on_result: Callable[[str, list[list[int]]], None] | None = None

    def inputs(self, rows: list[tuple[list[int], list[int], list[int], list[int], int, int]],
               s: int, with_q_lens: bool) -> tuple:
        """Step inputs from per-row (tokens, positions, slots, table, q_len, kv_len); each row's
        lists padded to ``s`` with null-block positions."""
        tokens, positions, slots, table, q_lens, kv_lens = [], [], [], [], [], []
        for tok, pos, slot, blocks, q_len, kv_len in rows:
            pad = s - len(tok)
            tokens.append(tok + [0] * pad)
            positions.append(pos + [0] * pad)
            slots.append(slot + [NULL_BLOCK * self.pool.block_size] * pad)
            table.append(self.pool.table_row(blocks, self.width))
            q_lens.append(q_len)
            kv_lens.append(kv_len)
        dev, i64 = self.device, torch.int64
        return (torch.tensor(tokens, dtype=i64, device=dev),
                torch.tensor(positions, dtype=i64, device=dev),
                torch.tensor(slots, dtype=i64, device=dev),
                torch.tensor(table, dtype=torch.int32, device=dev),
                torch.tensor(q_lens, dtype=i64, device=dev) if with_q_lens else None,
                torch.tensor(kv_lens, dtype=i64, device=dev), self.pool.k, self.pool.v)

    def _call(self, kind: str, fn: Callable, args: tuple) -> list[list[int]]:
        if self.on_first_call is not None:
            self.on_first_call(kind, args)
        out = fn(*args).tolist()
        if self.on_result is not None:
            self.on_result(kind, out)
        return out

    def null_rows(self, n: int) -> list:
        """``n`` padding rows: null-block writes, one position attended."""
        return [([], [], [], [], 1, 1)] * n

    def decode(self, reqs: list[Request], drafts: list[list[int]], stats: Stats
               ) -> list[list[int]]:
        """One decode (or verify) step of ``reqs``; returns each request's argmax after its last
        token and after each of its drafts."""
        rows = []
        for r, d in zip(reqs, drafts):
            n = 1 + len(d)
            pos = list(range(r.cached, r.cached + n))
            self.pool.grow(r.rid, r.blocks, r.cached + n)
            rows.append((r.tokens[-1:] + d, pos, [self.pool.slot(r.blocks, p) for p in pos],
                         r.blocks, n, r.cached + n))
        padding = 0
        if self.graph_sizes is not None:
            padded = pad_batch(len(rows), self.graph_sizes)
            padding = padded.padding
            rows += self.null_rows(padding)
        stats.decode_steps += 1
        stats.batch_sizes[len(reqs)] = stats.batch_sizes.get(len(reqs), 0) + 1
        stats.graph_sizes[len(rows)] = stats.graph_sizes.get(len(rows), 0) + 1
        for d in drafts:
            stats.drafts[len(d)] = stats.drafts.get(len(d), 0) + 1
        stats.rows += len(rows)
        stats.padded_rows += padding
        out = self._call("decode", self.decode_fn,
                         self.inputs(rows, self.query_len, self.query_len > 1))
        return [o[:1 + len(d)] for o, d in zip(out, drafts)]

    def prefill(self, r: Request, stop: int, stats: Stats) -> int:
        """Prefill ``r``'s prompt positions ``[r.cached, stop)``; the argmax after the last."""
        start = r.cached
        self.pool.grow(r.rid, r.blocks, stop)
        pos = list(range(start, stop))
        row = (r.prompt[start:stop], pos, [self.pool.slot(r.blocks, p) for p in pos], r.blocks,
               stop - start, stop)
        s = self.prefill_chunk if self.graph_sizes is not None else stop - start
        stats.prefill_chunks += 1
        stats.prefill_tokens += s
        stats.padded_prefill_tokens += s - (stop - start)
        out = self._call("prefill", self.prefill_fn, self.inputs([row], s, True))
        return out[0][stop - start - 1]

    def warm_up(self) -> None:
        """One call of every shape the runner will use (each gear, the prefill chunk), on null
        rows only: compiles and builds before the timed run."""
        if self.graph_sizes is None:
            return
        for size in self.graph_sizes:
            self._call("decode", self.decode_fn,
                       self.inputs(self.null_rows(size), self.query_len, self.query_len > 1))
        self._call("prefill", self.prefill_fn,
                   self.inputs(self.null_rows(1), self.prefill_chunk, True))


def _accept(r: Request, drafts: list[int], preds: list[int]) -> int:
    """Greedy acceptance: the drafts that equal the model's token before them, then the model's
    next token; appends them to ``r.tokens`` and returns how many drafts were accepted."""
    j = 0
    while j < len(drafts) and drafts[j] == preds[j]:
        j += 1
    r.tokens += drafts[:j] + [preds[j]]
    return j


def serve(runner: Runner, workload: Sequence[tuple[list[int], int]], *, max_batch: int,
          speculate: int, on_progress: Callable[[int], None] | None = None
          ) -> tuple[list[Request], Stats, float]:
    """Serve ``workload`` (``(prompt, max_new)`` per request, all arriving at once) to the end.

    Returns the requests (tokens, timings relative to the start), the run's :class:`Stats` and
    its wall time in seconds.
    """
    pool = runner.pool
    waiting = collections.deque(Request(i, list(p), n) for i, (p, n) in enumerate(workload))
    running: list[Request] = []
    finished: list[Request] = []
    stats = Stats()
    handed_out, reused = pool.handed_out, pool.reused
    start = time.perf_counter()
    pieces = runner.graph_sizes if runner.graph_sizes is not None else [max_batch]
    while waiting or running:
        while waiting and len(running) < max_batch:
            running.append(waiting.popleft())
        pre = next((r for r in running if r.prefilling), None)
        if pre is not None:
            stop = min(pre.cached + runner.prefill_chunk, len(pre.prompt))
            token = runner.prefill(pre, stop, stats)
            pre.cached = stop
            if not pre.prefilling:
                pre.tokens.append(token)
                pre.first_token_s = time.perf_counter() - start
        live = [r for r in running if not r.prefilling and not r.done]
        at = 0
        for size in (split_batch(len(live), pieces) if live else []):
            batch, at = live[at:at + size], at + size
            drafts = [propose(r.tokens, min(speculate, r.max_new - len(r.generated) - 1))
                      for r in batch]
            preds = runner.decode(batch, drafts, stats)
            for r, d, p in zip(batch, drafts, preds):
                accepted = _accept(r, d, p)
                written = r.cached + 1 + len(d)
                r.cached += 1 + accepted
                pool.shrink(r.rid, r.blocks, r.cached, written)
                stats.drafted += len(d)
                stats.accepted += accepted
                stats.emitted += 1 + accepted
                stats.request_steps += 1
        stats.max_blocks_in_use = max(stats.max_blocks_in_use, pool.in_use)
        now = time.perf_counter() - start
        for r in [r for r in running if r.done]:
            r.done_s = now
            del r.tokens[len(r.prompt) + r.max_new:]
            pool.release(r.rid, r.blocks)
            r.blocks = []
            running.remove(r)
            finished.append(r)
            if on_progress is not None:
                on_progress(len(finished))
    wall = time.perf_counter() - start
    stats.blocks_handed_out = pool.handed_out - handed_out
    stats.blocks_reused = pool.reused - reused
    finished.sort(key=lambda r: r.rid)
    return finished, stats, wall
