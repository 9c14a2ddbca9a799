"""Static units call Inductor's compiled graph without compile_fx's AOT runtime wrapper only where
that wrapper would pass the arguments through; everywhere else (outputs aliasing inputs,
deduplicated inputs, a graph compiled under autocast) the wrapper runs."""
from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from torchair.runtime import engines

pytestmark = pytest.mark.inductor


def _engine(fn, *inputs):
    gm = make_fx(fn)(*inputs)
    engine, name = engines.inductor_engine(gm, list(inputs), "test graph")
    assert name == "inductor"
    return engine


def _matmul(x, w):
    return [(x @ w).relu() + 1]


def test_plain_graph_is_called_directly_and_equals_eager():
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    engine = _engine(_matmul, x, w)
    assert getattr(engine, "direct", False)
    for _ in range(3):
        x = torch.randn(4, 8)
        assert torch.equal(engine([x, w])[0], _matmul(x, w)[0])


def test_input_mutation_in_the_graph_happens_once():
    def write(cache, index, value):
        cache.index_copy_(0, index, value)
        return [cache.sum(0)]

    cache, index, value = torch.zeros(6, 4), torch.tensor([2]), torch.ones(1, 4)
    engine = _engine(write, cache.clone(), index, value)
    assert getattr(engine, "direct", False)
    mine, want = torch.zeros(6, 4), torch.zeros(6, 4)
    before = (mine._version, want._version)
    out = engine([mine, index, 3 * value])
    expected = write(want, index, 3 * value)
    assert torch.equal(mine, want) and torch.equal(out[0], expected[0])
    # the version counter moves as in eager (autograd's check of in-place edits relies on it)
    assert mine._version - before[0] == want._version - before[1] == 1


def test_output_aliasing_an_input_keeps_the_wrapper():
    def view(x):
        return [x.view(-1)[:3], x * 2]

    x = torch.randn(2, 4)
    engine = _engine(view, x)
    assert not getattr(engine, "direct", False)
    got = engine([x])
    assert got[0]._base is x or got[0].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert torch.equal(got[0], x.view(-1)[:3]) and torch.equal(got[1], x * 2)


def test_graph_compiled_under_autocast_keeps_the_wrapper():
    """AOT's wrapper turns autocast off around a graph compiled under it."""
    x, w = torch.randn(16, 32), torch.randn(32, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        engine = _engine(_matmul, x, w)
        assert not getattr(engine, "direct", False)
        got = engine([x, w])[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = _matmul(x, w)[0]
    assert got.dtype == want.dtype and torch.allclose(got.float(), want.float(), atol=1e-2)


def test_duplicated_input(monkeypatch):
    """The same tensor passed twice: the build is for that aliasing (Dynamo guards it), and the
    direct call answers as the wrapper does."""
    def add(a, b):
        return [a + b * 2]

    x, y = torch.randn(4), torch.randn(4)
    direct = _engine(add, x, x)
    monkeypatch.setenv(engines.ENV_DIRECT, "0")
    wrapped = _engine(add, x, x)
    assert torch.equal(direct([y, y])[0], y + y * 2)
    assert torch.equal(direct([y, y])[0], wrapped([y, y])[0])


def test_switch_off_keeps_the_wrapper(monkeypatch):
    monkeypatch.setenv(engines.ENV_DIRECT, "0")
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    engine = _engine(_matmul, x, w)
    assert not getattr(engine, "direct", False)
    assert torch.equal(engine([x, w])[0], _matmul(x, w)[0])
