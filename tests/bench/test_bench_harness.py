"""bench._harness: the order and garbage handling of interleaved rounds, the GPU timer (device
time of a CUDA-graph replay)."""
from __future__ import annotations

import gc
import itertools
from collections import Counter

import pytest
import torch

from bench import _harness as H
from torchair.demo.roofline import balanced_orders


@pytest.mark.parametrize("n", range(1, 10))
def test_balanced_orders_put_each_variant_after_each_other_equally_often(n):
    orders = balanced_orders(n)
    assert len(orders) == (n if n % 2 == 0 or n == 1 else 2 * n)
    assert all(sorted(order) == list(range(n)) for order in orders)
    places = Counter((v, k) for order in orders for k, v in enumerate(order))
    assert set(places.values()) == {len(orders) // n} and len(places) == n * n
    after = Counter(pair for order in orders for pair in itertools.pairwise(order))
    assert len(after) == n * (n - 1)  # every ordered pair, each as often
    assert len(set(after.values())) <= 1


@pytest.mark.parametrize("n", [3, 5, 7])
def test_odd_orders_come_with_their_mirror_next(n):
    # two consecutive rounds already pair each neighbour both ways
    orders = balanced_orders(n)
    assert all(orders[k + 1] == orders[k][::-1] for k in range(0, len(orders), 2))


def test_balanced_orders_refuse_an_empty_set():
    with pytest.raises(ValueError, match="n must be >= 1"):
        balanced_orders(0)


def test_interleaved_rounds_follow_the_balanced_orders_and_freeze_the_heap_once():
    runs: list[tuple[str, int, bool, int]] = []  # (variant, step, gc on, frozen objects)

    def variant(name):
        return lambda step: runs.append((name, step, gc.isenabled(), gc.get_freeze_count()))

    names = ["a", "b", "c", "d"]
    result = H.interleaved_rounds({n: variant(n) for n in names}, lambda r: [10 * r, 10 * r + 1],
                                  rounds=8, sync=lambda: None)
    assert {n: len(rows) for n, rows in result.items()} == {n: 8 for n in names}
    assert all(len(row) == 2 and min(row) >= 0 for rows in result.values() for row in rows)
    orders = balanced_orders(4)
    expected = [(names[k], s) for r in range(8) for k in orders[r % 4] for s in (10 * r, 10 * r + 1)]
    assert [(n, s) for n, s, _, _ in runs] == expected
    # the collector is off while a variant runs, and what it kept before the rounds is frozen
    # (collections between rounds skip it); afterwards it is on and nothing stays frozen
    assert not any(on for _, _, on, _ in runs)
    assert min(frozen for _, _, _, frozen in runs) > 0
    assert gc.isenabled() and gc.get_freeze_count() == 0
    runs.clear()
    H.interleaved_rounds({"a": variant("a")}, lambda r: [r], rounds=2, sync=lambda: None,
                         collect_garbage=False)
    assert [(n, on, frozen) for n, _, on, frozen in runs] == [("a", True, 0), ("a", True, 0)]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_device_time_is_the_gpus_own_time_per_call():
    a = torch.randn(4096, 4096, device="cuda")
    small = H.device_time_us(lambda _: a[:256, :256] @ a[:256, :256])
    large = H.device_time_us(lambda _: a @ a)
    assert small is not None and large is not None and 0 < small < large
    assert 2 * 4096 ** 3 / (large * 1e-6) < 5e15  # below any GPU's fp32 peak: real time
    assert H.device_time_us(lambda _: a.sum().item()) is None  # a host sync cannot be captured
    assert H.device_time_us(lambda _: a @ a) is not None  # and CUDA is usable afterwards


def test_frozen_heap_with_the_collector_off_puts_it_back():
    assert gc.isenabled() and gc.get_freeze_count() == 0
    with H.frozen_heap(collector_off=True):
        assert not gc.isenabled() and gc.get_freeze_count() > 0
    assert gc.isenabled() and gc.get_freeze_count() == 0
    with pytest.raises(ZeroDivisionError), H.frozen_heap(collector_off=True):
        1 / 0
    assert gc.isenabled() and gc.get_freeze_count() == 0
    with H.frozen_heap():  # without it, the collector stays as the caller had it
        assert gc.isenabled()


def test_interleaved_rounds_keep_the_callers_collector_state():
    seen = []

    def variant(step):
        seen.append((gc.isenabled(), gc.get_freeze_count()))

    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    gc.disable()
    unfrozen = [[] for _ in range(1000)]  # made after the caller's freeze: a second freeze adds them
    try:
        H.interleaved_rounds({"a": variant, "b": variant}, lambda r: [r], rounds=2,
                             sync=lambda: None)
        assert not gc.isenabled()  # off before, off after
        # the caller's freeze is kept, not added to (frozen objects that die leave it)
        assert 0 < gc.get_freeze_count() <= frozen
        assert all(not on and 0 < count <= frozen for on, count in seen)
        assert len(unfrozen) == 1000
    finally:
        gc.unfreeze()
        gc.enable()
    with pytest.raises(ZeroDivisionError):  # a variant that raises leaves nothing behind
        H.interleaved_rounds({"a": lambda step: 1 / 0}, lambda r: [r], rounds=1,
                             sync=lambda: None)
    assert gc.isenabled() and gc.get_freeze_count() == 0
