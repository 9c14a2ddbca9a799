"""The served call as one generated function (``Runtime.fast``, ``GuardSet.served_program``).

A warm ``cache_compile`` call under ``no_grad`` with positional arguments runs, after the first
served call, one generated function of those arguments: the same check as the generated
per-call program, the number inputs' tensors, the gear-marks test and the unit's call (a CPU
static unit's fused call). These tests hold it to the layered call it replaces: the same calls served with the same
graph inputs, every other call left to the general path (which says why), never a stale result.
"""
from __future__ import annotations

import threading

import pytest
import torch

import torchair
from tests.inference.test_guard_codegen import _calls, _warm
from torchair.inference import cache_compile
from torchair.inference._cache_runtime import MISS
from torchair.inference.guards import epoch
from torchair.runtime import units

_FLAT = object()  # what the test tail returns: the graph inputs it was given


def _served(cached):
    """``cached``'s guards as a served-call function whose tail returns the graph inputs."""
    frame = cached.frame
    holder: dict = {}

    def tail(bind):
        return [f"{bind(holder, 'h')}['flat'] = flat", f"return {bind(_FLAT)}"]

    fn = cached.runtime.guards.served_program(frame.names, frame.self_name, frame.module,
                                              frame.globals, MISS, tail)
    return fn, holder


def test_served_program_serves_exactly_the_calls_the_per_call_check_serves(tmp_path):
    """For each call of the codegen grid: the served form returns MISS exactly where the
    generated per-call program returns None, and otherwise hands its tail the very same graph
    inputs; it reads the frame from the positional arguments (no ``L[...]``, no frame dict)."""
    cached, _ = _warm(tmp_path)
    fn, holder = _served(cached)
    assert fn is not None, "the generator covers these guards"
    assert fn.source.startswith("def served(a0, a1, a2, a3, a4):"), fn.source[:80]
    assert "v0[" not in fn.source and "L[" not in fn.source
    program, served = cached.runtime.guards.program, 0
    for args, _ in _calls()[1]:
        with torch.no_grad():
            flat = program(cached.frame(args, {}), cached.frame.globals)
            holder.clear()
            got = fn(*args)
        if flat is None:
            assert got is MISS and not holder, args
        else:
            served += 1
            assert got is _FLAT and all(a is b for a, b in zip(holder["flat"], flat))
            assert len(holder["flat"]) == len(flat)
    assert served >= 2


def test_served_program_counts_and_traces_its_calls_and_leaves_a_full_check_to_the_general_path(
        tmp_path, torchair_log):
    """Each call it serves is counted and traced as the generated program's (the DEBUG trace of
    tiers); after a module assignment (a new module epoch) it serves nothing until a full check
    held again, as check_arguments."""
    cached, good = _warm(tmp_path)
    fn, _ = _served(cached)
    guards = cached.runtime.guards
    with torch.no_grad():
        before = guards._calls
        assert fn(*good) is _FLAT
        assert guards._calls == before + 1 and guards._tier == "generated program"
        cached.frame.module.register_buffer("extra", torch.ones(1))  # a new module epoch
        assert guards._checked_epoch != epoch.EPOCH[0]
        assert fn(*good) is MISS and guards._calls == before + 1  # not counted: not served
        assert guards.check_arguments(cached.frame(good, {}), cached.frame.globals)[0] == ""
        assert fn(*good) is _FLAT
    traced = [r.getMessage() for r in torchair_log if "guard check of call" in r.getMessage()]
    assert any("served by the generated program" in m for m in traced)


def test_served_program_is_not_made_without_the_generated_check(tmp_path, monkeypatch):
    """No generated per-call program (``TORCHAIR_GUARD_CODEGEN=0``): no served form either, and
    cache_compile keeps serving through the layered call."""
    monkeypatch.setenv("TORCHAIR_GUARD_CODEGEN", "0")
    cached, good = _warm(tmp_path)
    assert cached.runtime.guards.program is None
    assert _served(cached)[0] is None
    assert cached.runtime.fast is None


def test_a_frame_read_the_arguments_do_not_hold_is_not_generated(tmp_path):
    """A guard on a frame name that is no positional parameter (here: asked for with fewer
    names) leaves the served form out (None), it never guesses."""
    cached, _ = _warm(tmp_path)
    frame = cached.frame
    fn = cached.runtime.guards.served_program(frame.names[:-1], frame.self_name, frame.module,
                                              frame.globals, MISS, lambda bind: ["return flat"])
    assert fn is None


# ------------------------------------------------------------------ the runtime's served call
class _Step(torch.nn.Module):
    """A decode-like step: a norm whose ``eps`` is a module float (a number input Dynamo
    passes as a tensor), a linear layer, an in-place write into a cache argument."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 8)
        self.eps = 1e-6

    def forward(self, x, pos, cache):
        h = self.lin(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))
        cache.index_copy_(0, pos, h)
        return h + cache.sum(0)


def _inductor_step(tmp_path):
    model = _Step().eval()
    config = torchair.CompilerConfig()  # path 4, as a decode step: static shapes, one unit
    config.experimental_config.tiling_schedule_optimize = True
    cached = cache_compile(model.forward, config=config, cache_dir=str(tmp_path / "c"))
    return model, cached


def _args(i, cache):
    g = torch.Generator().manual_seed(100 + i)
    x, pos = torch.randn(2, 8, generator=g), torch.tensor([i % 4, 4 + i % 4])
    for t in (x, pos, cache):  # static shapes (path 4's decode step, as the bench marks them)
        torch._dynamo.mark_static(t)
    return x, pos, cache


def _check_call(cached, model, i, cache, ref_cache):
    got = cached(*_args(i, cache))
    want = model(*_args(i, ref_cache))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cache, ref_cache, rtol=1e-5, atol=1e-5)


def _served_step(tmp_path):
    """The Inductor step after three calls checked against eager (compiled, the first served
    call, the first through ``fast``), with its cache argument and eager's."""
    model, cached = _inductor_step(tmp_path)
    cache, ref_cache = torch.zeros(8, 8), torch.zeros(8, 8)
    with torch.no_grad():
        for i in range(3):
            _check_call(cached, model, i, cache, ref_cache)
    assert cached.runtime.fast is not None
    return model, cached, cache, ref_cache


@pytest.mark.inductor
def test_the_served_call_is_one_function_and_matches_eager(tmp_path):
    """After the first call serve() served, the runtime's calls go through ``fast``: neither
    ``Runtime.serve`` nor the unit's ``__call__`` runs, and every result and cache write
    equals eager's, step after step with fresh arguments."""
    model, cached, cache, ref_cache = _served_step(tmp_path)
    runtime = cached.runtime
    with torch.no_grad():
        assert isinstance(runtime.unit, units.StaticUnit) and runtime.fast is not None
        assert runtime.wrap.keys, "eps is a number input: the tail puts its tensor in"
        layered = []
        serve, unit_call = runtime.serve, units.StaticUnit.__call__
        runtime.serve = lambda *a: layered.append("serve") or serve(*a)
        units.StaticUnit.__call__ = lambda self, a: layered.append("unit") or unit_call(self, a)
        try:
            for i in range(3, 12):
                _check_call(cached, model, i, cache, ref_cache)
        finally:
            units.StaticUnit.__call__ = unit_call
            del runtime.serve
        assert layered == []


@pytest.mark.inductor
def test_the_served_call_leaves_every_changed_call_to_the_general_path(tmp_path, torchair_log):
    """Adversarial calls through ``fast``: a new ``eps`` float on the module (the number input's
    tensor made anew), a weight replaced by another of the same shape (a new module epoch), a
    weight of another layout through ``.data`` (no epoch, no guard: the unit's own input check
    refuses it), an argument of another shape, gear marks on an argument and grad mode on. Each
    result equals eager's; the calls the entry cannot serve say why and compile."""
    model, cached, cache, ref_cache = _served_step(tmp_path)
    runtime = cached.runtime
    with torch.no_grad():
        model.eps = 0.25  # a module float: no epoch; the number input changes
        for i in range(3, 5):
            _check_call(cached, model, i, cache, ref_cache)
        assert runtime.fast(*_args(5, cache)) is not MISS  # served: the new eps's tensor
        ref_cache.copy_(cache)
        model.lin.weight = torch.nn.Parameter(torch.randn(8, 8))  # a new epoch
        assert runtime.fast(*_args(6, cache)) is MISS
        ref_cache.copy_(cache)
        for i in range(6, 9):
            _check_call(cached, model, i, cache, ref_cache)
        assert runtime.fast(*_args(9, cache)) is not MISS  # full check held: served again
        ref_cache.copy_(cache)
        model.lin.weight.data = model.lin.weight.data.t().contiguous().t()
        assert runtime.fast(*_args(10, cache)) is MISS  # the unit refused it before running
        _check_call(cached, model, 10, cache, ref_cache)
        x, pos = torch.randn(3, 8), torch.tensor([1, 5, 6])  # another batch: a new graph
        assert runtime.fast(x, pos, cache) is MISS
        torch.testing.assert_close(cached(x, pos, cache), model(x, pos, ref_cache))
        marked = _args(12, cache)
        torchair.inference.set_dim_gears(marked[0], {0: [2, 4]})
        assert runtime.fast(*marked) is MISS  # an entry built without gears: marks refused
        assert "has gears" in runtime.check(cached.frame(marked, {}), cached.frame.globals)[0]
    with torch.enable_grad():
        _check_call(cached, model, 13, cache, ref_cache)
    fell_back = [r.getMessage() for r in torchair_log
                 if "does not fit the cached graph" in r.getMessage()]
    assert any("strides" in m for m in fell_back), fell_back
    assert any("[3, 8]" in m for m in fell_back), fell_back


@pytest.mark.inductor
def test_the_served_call_from_two_threads(tmp_path):
    """Two threads serving calls at once, each with its own cache argument: the unit runs under
    its lock, each thread gets its own results."""
    model, cached = _inductor_step(tmp_path)
    with torch.no_grad():
        for i in range(3):
            cached(*_args(i, torch.zeros(8, 8)))
        assert cached.runtime.fast is not None
    errors = []

    def worker(seed):
        cache, ref_cache = torch.zeros(8, 8), torch.zeros(8, 8)
        try:
            with torch.no_grad():
                for i in range(seed, seed + 40):
                    _check_call(cached, model, i, cache, ref_cache)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(s,)) for s in (0, 1000)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads) and errors == []


def test_a_unit_without_a_fused_call_is_served_by_its_own_call(tmp_path):
    """An FX-engine unit (no fused call, no input check of its own): the served function runs
    the runtime's input checks and the unit's own call, and serves the grid's calls with
    eager's results."""
    cached, good = _warm(tmp_path)
    runtime = cached.runtime
    assert runtime.fast is not None and not runtime.unit_checks
    source = runtime.fast.source
    assert "with " not in source.split("flat = [")[1], "no fused call, no lock of its own"
    model = cached.frame.module
    with torch.no_grad():
        for args, expected in _calls()[1][:2]:
            assert expected and runtime.fast(*args) is not MISS
            torch.testing.assert_close(cached(*args), model.step(*args))
