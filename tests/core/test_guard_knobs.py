"""PyTorch's guard knobs with torchair's backend, and the stale results each one allows.

``guard_filter_fn=torch.compiler.skip_guard_on_all_nn_modules_unsafe`` drops Dynamo's guards on
module state, and ``set_stance(skip_guard_eval_unsafe=True)`` evaluates only the guards that
tell cache entries apart (none with one entry). Both make a call cheaper by trusting that what
they skip does not change; these tests pin down what goes wrong when it does. Beside them,
``cache_compile``: with ``TORCHAIR_CACHE_GUARDS=all`` it sees the same change; its default
per-call checks skip plain attribute assignments too, but see parameters and buffers
(docs/compile_paths.md, "Guard knobs")."""
from __future__ import annotations

import pytest
import torch

import torchair


class Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4), requires_grad=False)
        self.scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w * self.scale


def _config() -> torchair.CompilerConfig:
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    return config


def _compiled(model: Scaled, **options):
    return torch.compile(model, backend=torchair.get_npu_backend(compiler_config=_config()),
                         fullgraph=True, options=options or None)


def _cached(tmp_path, model: Scaled):
    return torchair.inference.cache_compile(model.forward, config=_config(), dynamic=False,
                                            cache_dir=tmp_path)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    with torch.no_grad():
        yield
    torch._dynamo.reset()


def test_module_guard_filter_serves_a_stale_module_attribute():
    model, x = Scaled(), torch.ones(4)
    step = _compiled(model, guard_filter_fn=torch.compiler.skip_guard_on_all_nn_modules_unsafe)
    assert step(x).tolist() == [2.0] * 4
    model.scale = 3.0
    assert model(x).tolist() == [3.0] * 4
    assert step(x).tolist() == [2.0] * 4  # stale: the guard on model.scale was dropped


def test_module_guard_filter_keeps_the_input_guards():
    step = _compiled(Scaled(), guard_filter_fn=torch.compiler.skip_guard_on_all_nn_modules_unsafe)
    step(torch.ones(4))
    assert step(torch.full((4,), 2.0, dtype=torch.float64)).dtype == torch.float64  # retraced


def test_skip_guard_eval_serves_a_stale_module_attribute():
    model, x = Scaled(), torch.ones(4)
    step = _compiled(model)
    step(x)
    with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
        model.scale = 3.0
        assert step(x).tolist() == [2.0] * 4  # stale: no guard ran
    assert step(x).tolist() == [3.0] * 4  # the default stance checks the guards again


def test_cache_compile_all_guards_sees_the_same_change(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHAIR_CACHE_GUARDS", "all")
    model, x = Scaled(), torch.ones(4)
    step = _cached(tmp_path, model)
    assert step(x).tolist() == [2.0] * 4
    assert step(x).tolist() == [2.0] * 4  # served from the entry
    model.scale = 3.0
    assert step(x).tolist() == [3.0] * 4


def test_cache_compile_default_checks_skip_plain_attributes_but_see_parameters(tmp_path):
    """The default per-call checks (``arguments``) skip the same plain-attribute change for
    speed (documented in docs/cache_compile.md); a replaced parameter of another dtype is seen
    and falls back instead of feeding the unit."""
    model, x = Scaled(), torch.ones(4)
    step = _cached(tmp_path, model)
    step(x)
    step(x)
    model.scale = 3.0
    assert step(x).tolist() == [2.0] * 4  # a plain attribute: not re-checked per call
    model.w = torch.nn.Parameter(torch.ones(4, dtype=torch.float64), requires_grad=False)
    out = step(x)
    assert out.dtype == torch.float64 and out.tolist() == [3.0] * 4
