"""A decode step's *floor*, measured on the machine at hand: the step's weight GEMVs alone plus the
KV-cache bytes it reads at a measured read bandwidth.

Used by ``torchair demo`` and ``bench/bench_decode_step.py``, which time the GEMVs in the same
loop, the same way, as the step variants, and report every variant as a multiple of the floor
(``x floor``). The floor is not a bound any real step can reach (the GEMVs' outputs feed nothing,
norms / attention arithmetic / op dispatch are left out); it says how far a step is from doing
only the unavoidable work: reading the weights (through GEMVs) and the KV cache once.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

__all__ = ["GemvFloor", "balanced_orders", "last_level_cache_bytes", "read_bandwidth",
           "kv_read_bytes", "floor_us", "x_floor"]


def last_level_cache_bytes() -> int | None:
    """Size of the largest CPU cache level Linux reports for cpu0, or None."""
    best = None
    try:
        import glob
        for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
            with open(path, encoding="utf-8") as f:
                text = f.read().strip().upper()
            mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
            size = int(text.rstrip("KMG")) * mult
            best = size if best is None else max(best, size)
    except (OSError, ValueError):
        return None
    return best


# A footprint this many times the last-level cache (CPU) or L2 (CUDA) streams from memory: at 2x and
# 4x a 32 MiB L3 still served part of a cyclic read (bench_kv_read's GEMVs over their weight sets
# streamed at 48 and 42-45 GB/s, at 8x and 16x at 37-38 GB/s, 2-core AMD EPYC, 2026-11-29).
COLD_CACHE_MULTIPLE = 8


def read_bandwidth(device: str | torch.device = "cpu", *, min_bytes: int = 256 * 2**20,
                   repeats: int = 5, sync: Callable[[], None] | None = None) -> dict[str, Any]:
    """Read bandwidth of ``buf.sum()`` over a float32 buffer of at least ``min_bytes`` and at
    least 8x the last-level cache (CPU) or the L2 cache (CUDA), so it streams from memory. One
    untimed call first (page faults, thread start-up), then ``repeats`` timed calls; the median
    time gives ``gb_per_s`` (bytes read / seconds, 1 GB = 1e9 B)."""
    device = torch.device(device)
    if sync is None:
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        cache = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or None
    else:
        cache = last_level_cache_bytes()
    nbytes = max(min_bytes, COLD_CACHE_MULTIPLE * (cache or 0))
    buf = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    buf.sum()
    sync()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        buf.sum()
        sync()
        times.append(time.perf_counter() - start)
    del buf
    med = statistics.median(times)
    where = "L2" if device.type == "cuda" else "last-level cache"
    size = (f"> 8x the {cache / 2**20:.0f} MiB {where}" if cache else "cache size unknown")
    return {"method": f"torch.sum over a {nbytes / 2**20:.0f} MiB float32 buffer ({size}), "
                      f"median of {repeats} calls",
            "bytes": nbytes, "cache_bytes": cache, "seconds": times, "median_s": med,
            "gb_per_s": nbytes / med / 1e9}


def kv_read_bytes(lens: Sequence[int], kv_hidden: int, layers: int, itemsize: int) -> int:
    """Bytes of K and V a decode step reads: every sequence's ``lens[b]`` positions of K and of V
    (``kv_hidden`` elements each), in every layer."""
    return 2 * layers * kv_hidden * itemsize * sum(int(n) for n in lens)


class GemvFloor:
    """The weight GEMVs of a step alone, on a ``[batch, in_features]`` input, for every weight
    matrix ``W`` (the model's own tensors, not copies); call it like a step. Each product is the
    one a CPU static unit (Inductor engine) runs for it:
    ``torch.ops.torchair_native.gemv(x, W.t())`` where units
    bind it (float32 CPU weights, :func:`torchair.ops.matmul.cpu.binds_rows` for ``batch``), else
    ``F.linear(x, W)``: the floor is what a unit's own products take (``bench_small_gemm.py``)."""

    def __init__(self, weights: Sequence[torch.Tensor], batch: int) -> None:
        if not weights:
            raise ValueError("GemvFloor needs at least one weight matrix")
        self.weights = list(weights)
        gen = torch.Generator().manual_seed(0)
        self.inputs = {}
        for w in self.weights:
            k = w.shape[1]
            if k not in self.inputs:
                self.inputs[k] = torch.randn(batch, k, generator=gen).to(w.device, w.dtype)
        # (kernel name, call) per weight
        self.calls = [self._call(w, batch) for w in self.weights]

    def _call(self, w: torch.Tensor, batch: int) -> tuple[str, Callable[[], Any]]:
        x = self.inputs[w.shape[1]]
        if w.device.type == "cpu" and w.dtype == torch.float32 and w.dim() == 2:
            from torchair.ops.matmul import cpu as _mm

            if _mm.binds_rows(batch):
                op, w_t = _mm.gemv(), w.t()
                return "torchair_native::gemv", lambda: op(x, w_t)
        return "F.linear", lambda: F.linear(x, w)

    @classmethod
    def of_module(cls, module: torch.nn.Module, batch: int) -> "GemvFloor":
        """The weights of every ``torch.nn.Linear`` in ``module``."""
        return cls([m.weight for m in module.modules() if isinstance(m, torch.nn.Linear)], batch)

    @property
    def weight_bytes(self) -> int:
        return sum(w.numel() * w.element_size() for w in self.weights)

    def describe(self) -> str:
        shapes = sorted({tuple(w.shape) for w in self.weights})
        kernels = " / ".join(sorted({name for name, _ in self.calls}))
        return (f"{len(self.weights)} {kernels} calls on [batch, in] inputs, weights "
                f"{', '.join('x'.join(map(str, s)) for s in shapes)} "
                f"({self.weight_bytes / 2**20:.1f} MiB)")

    def __call__(self, *_: Any) -> None:
        with torch.no_grad():
            for _, call in self.calls:
                call()


def floor_us(gemv_us: float, kv_bytes: float, gb_per_s: float) -> float:
    """The floor in microseconds: GEMV time plus the KV bytes at the read bandwidth."""
    return gemv_us + kv_bytes / (gb_per_s * 1e9) * 1e6


def x_floor(time_us: float | None, floor: float | None) -> float | None:
    """``time_us / floor`` (None when either is missing or the floor is not positive)."""
    if time_us is None or not floor or floor <= 0:
        return None
    return time_us / floor


def balanced_orders(n: int) -> list[list[int]]:
    """Orders in which to run ``n`` side-by-side variants, one order per round, so that over a
    whole cycle of the orders each variant runs at each place and right after each other variant
    equally often (a Williams design: ``n`` orders for even ``n``, ``2n`` for odd ``n > 1``, each
    order followed by its mirror image so that any two consecutive rounds already pair each
    neighbour both ways; ``[[0]]`` for one).

    What runs just before a step matters: a step right after eager's (1-2 ms of ATen calls and
    allocations) or after any pause took up to twice its time at its first step and needed five
    to ten to recover (``bench_after_pause.py``). A fixed cyclic order rotated by the round, as
    the benches used before, gives every variant the same predecessor in all rounds but one in
    ``n``: the floor rows always followed the leanest variant."""
    if n < 1:
        raise ValueError(f"balanced_orders: n must be >= 1, got {n}")
    first = [0] + [(j + 1) // 2 if j % 2 else n - j // 2 for j in range(1, n)]
    orders = [[(k + r) % n for k in first] for r in range(n)]
    if n % 2 and n > 1:  # odd: each order's mirror gives its pairs their other adjacency
        orders = [o for order in orders for o in (order, order[::-1])]
    return orders
