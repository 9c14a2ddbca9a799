"""torchair.register_replacement: user patterns fire in the fusion pass, near misses do not, and
every candidate is validated (rejections logged at DEBUG)."""
import logging

import pytest
import torch

import torchair
from torchair.patterns import replacement
from torchair.patterns.replacement import isolated_patterns

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _isolated():
    with isolated_patterns():
        yield


@pytest.fixture
def debug_log(torchair_log):
    return torchair_log


def _compile(fn, *args, fusion=True, dynamic=False, dump_dir=None):
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    config.experimental_config.pattern_fusion_pass = fusion
    if dump_dir is not None:
        config.debug.graph_dump.type = "py"
        config.debug.graph_dump.path = str(dump_dir)
    compiled = torch.compile(fn, backend=torchair.get_npu_backend(compiler_config=config),
                             dynamic=dynamic, fullgraph=True)
    out = compiled(*args)
    return out, torchair.graph_reports()[-1]


# search: relu(x^T @ w); replace: the same value through mm + clamp_min (ops search never has)
def _search(x, w):
    return torch.relu(x.permute(1, 0) @ w)


def _replace(x, w):
    return torch.clamp_min(torch.mm(x.t(), w), 0.0)


def _register(**kwargs):
    return torchair.register_replacement(_search, _replace, [torch.randn(4, 3), torch.randn(4, 5)],
                                         **kwargs)


def _rejections(records):
    return [r.getMessage() for r in records if "rejected" in r.getMessage()]


@pytest.mark.parametrize("dynamic", [False, True])
def test_user_pattern_fires_and_keeps_results(tmp_path, dynamic):
    assert _register()

    def f(x, w):
        return _search(x, w) + 1

    x, w = torch.randn(6, 6), torch.randn(6, 7)
    out, report = _compile(f, x, w, dynamic=dynamic, dump_dir=tmp_path)
    torch.testing.assert_close(out, f(x, w))
    assert report.patterns == {"_search": 1}
    assert report.passes["pattern_fusion"] == 1
    assert "fusion patterns fired: _search x1" in str(report)
    optimized = next(p for p in report.dumps if "optimized" in p)
    text = open(optimized).read()
    assert "aten.clamp_min" in text and "aten.relu" not in text


def test_permute_near_miss_is_rejected_and_logged(debug_log):
    _register()

    def f(x, w):  # same ops, other permutation: the first (shape-blind) match must be refused
        return torch.relu(x.permute(0, 1) @ w) + 1

    x, w = torch.randn(6, 6), torch.randn(6, 7)
    out, report = _compile(f, x, w)
    torch.testing.assert_close(out, f(x, w))
    assert report.patterns == {}
    assert any("_search" in m and "differs from the pattern" in m for m in _rejections(debug_log))


def test_argument_order_matters():
    def search(a, b):
        return torch.sub(a, b) * a

    def replace(a, b):
        return torch.addcmul(torch.zeros_like(a), torch.sub(a, b), a)

    torchair.register_replacement(search, replace, [torch.randn(3), torch.randn(3)])
    a, b = torch.randn(5), torch.randn(5)

    def wrong(a, b):  # multiplies by b, not by the subtrahend's first argument
        return torch.sub(a, b) * b

    out, report = _compile(wrong, a, b)
    torch.testing.assert_close(out, wrong(a, b))
    assert report.patterns == {}

    torch._dynamo.reset()

    def swapped(a, b):  # the pattern with a and b exchanged: a legitimate match
        return torch.sub(b, a) * b

    out, report = _compile(swapped, a, b)
    torch.testing.assert_close(out, swapped(a, b))
    assert report.patterns == {"search": 1}


def test_replacement_with_another_shape_is_refused(debug_log):
    def search(x):
        return torch.tanh(x).sum(0)

    def replace(x):  # keeps the reduced dim: a different shape, must never be substituted
        return torch.tanh(x).sum(0, keepdim=True)

    torchair.register_replacement(search, replace, [torch.randn(3, 4)])

    def f(x):
        return torch.tanh(x).sum(0) * 2

    x = torch.randn(3, 4)
    out, report = _compile(f, x)
    assert out.shape == (4,)
    assert report.patterns == {}
    assert any("replace_fn's result differs" in m and "shape" in m for m in _rejections(debug_log))


def test_extra_check_can_refuse(debug_log):
    seen = []

    def check(match):
        seen.append(sorted(match.kwargs))
        return False

    _register(extra_check=check)

    def f(x, w):
        return _search(x, w)

    _, report = _compile(f, torch.randn(6, 6), torch.randn(6, 7))
    assert report.patterns == {}
    assert seen == [["w", "x"]]
    assert any("extra_check returned False" in m for m in _rejections(debug_log))


def test_switch_turns_user_patterns_off():
    _register()

    def f(x, w):
        return _search(x, w)

    _, report = _compile(f, torch.randn(6, 6), torch.randn(6, 7), fusion=False)
    assert report.patterns == {} and "pattern_fusion" not in report.passes


def test_two_matches_in_one_graph_are_counted():
    _register()

    def f(x, w, y):
        return _search(x, w) + _search(y, w)

    x, w, y = torch.randn(6, 6), torch.randn(6, 7), torch.randn(6, 6)
    out, report = _compile(f, x, w, y)
    torch.testing.assert_close(out, f(x, w, y))
    assert report.patterns == {"_search": 2}


def test_duplicates():
    assert _register()
    assert not _register(skip_duplicates=True)
    assert replacement.registered_patterns().count("_search") == 1


def test_bad_arguments_name_the_argument():
    with pytest.raises(TypeError, match="search_fn must be a function"):
        torchair.register_replacement(None, _replace, [torch.randn(2, 2), torch.randn(2, 2)])
    with pytest.raises(TypeError, match="example_inputs must be a list or tuple"):
        torchair.register_replacement(_search, _replace, torch.randn(2, 2))
    with pytest.raises(ValueError, match="search_fn takes 2 arguments but example_inputs has 1"):
        torchair.register_replacement(_search, _replace, [torch.randn(2, 2)])


def test_old_torch_warns_once_and_skips(monkeypatch, torchair_log):
    replacement._warn_unsupported.cache_clear()
    monkeypatch.setattr(torch, "__version__", "2.5.1+cpu")
    try:
        assert not _register()
        assert not _register()
    finally:
        replacement._warn_unsupported.cache_clear()
    warnings = [r.getMessage() for r in torchair_log if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "torch >= 2.6" in warnings[0]
    assert "_search" not in replacement.registered_patterns()


@pytest.mark.parametrize("dynamic", [False, True])
def test_extra_keyword_argument_is_a_near_miss(debug_log, dynamic):
    """add(x, y, alpha=2) has the pattern's ops; the matcher ignores the keyword, the replay not."""
    def search(x, y):
        return torch.relu(x + y) * 3

    def replace(x, y):
        return torch.clamp_min(torch.add(x, y), 0.0) * 3

    torchair.register_replacement(search, replace, [torch.randn(3), torch.randn(3)])

    def f(x, y):
        return torch.relu(torch.add(x, y, alpha=2)) * 3

    x, y = torch.randn(5), torch.randn(5)
    out, report = _compile(f, x, y, dynamic=dynamic)
    torch.testing.assert_close(out, f(x, y))
    assert report.patterns == {}
    assert any("computes something else" in m for m in _rejections(debug_log))
