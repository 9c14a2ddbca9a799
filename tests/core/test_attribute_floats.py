"""Floats read from attributes or globals are constants of the graph (guarded by value); floats
passed as call arguments stay inputs. TORCHAIR_SPECIALIZE_ATTRIBUTE_FLOATS=0 keeps all inputs."""
import sys

import pytest
import torch
import torch._dynamo

import torchair
from torchair.core import backend as _backend_mod

SCALE = 0.5  # a global float the model reads


class Norm(torch.nn.Module):
    def __init__(self, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(1.0 + 0.1 * torch.randn(8))
        self.eps = eps

    def forward(self, x, gain: float):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        return y * SCALE * gain


def _compile(model):
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    return torch.compile(model, backend=torchair.get_npu_backend(compiler_config=config),
                         dynamic=True, fullgraph=True)


def _input_names(report):
    return [i.name for i in report.inputs]


def _reports_since(before):
    return torchair.graph_reports()[before:]


@pytest.fixture
def x():
    x = torch.randn(2, 8)
    torch._dynamo.mark_static(x)
    return x


def test_attribute_and_global_floats_are_constants_argument_floats_stay_inputs(x):
    torch._dynamo.reset()
    model = Norm().eval()
    compiled = _compile(model)
    before = len(torchair.graph_reports())
    with torch.no_grad():
        for gain in (1.5, 2.5, 0.75):  # an argument float: one graph for every value
            torch.testing.assert_close(compiled(x, gain), model(x, gain))
    reports = _reports_since(before)
    assert len(reports) == 1
    names = " ".join(_input_names(reports[0]))
    assert "eps" not in names  # self.eps: a constant
    assert "SCALE" not in names  # the global: a constant
    assert "gain" in names  # the argument: an input
    assert reports[0].build_static, reports[0].reasons


def test_a_changed_attribute_float_recompiles_never_stale(x):
    torch._dynamo.reset()
    model = Norm().eval()
    compiled = _compile(model)
    before = len(torchair.graph_reports())
    with torch.no_grad():
        for eps in (1e-6, 0.5, 0.5, 3.0, 1e-6):
            model.eps = eps
            torch.testing.assert_close(compiled(x, 1.0), model(x, 1.0))
    # the first value as a constant; after the change the float is an input (one more graph);
    # the constant graph's guard still selects it for its own value
    assert len(_reports_since(before)) == 2


def test_changed_global_float_recompiles_never_stale(x, monkeypatch):
    torch._dynamo.reset()
    model = Norm().eval()
    compiled = _compile(model)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, 1.0), model(x, 1.0))
        monkeypatch.setattr(sys.modules[__name__], "SCALE", 4.0)
        torch.testing.assert_close(compiled(x, 1.0), model(x, 1.0))


def test_switch_off_keeps_attribute_floats_as_inputs(x, monkeypatch):
    monkeypatch.setenv(_backend_mod.ENV_SPECIALIZE_FLOATS, "0")
    torch._dynamo.reset()
    model = Norm().eval()
    compiled = _compile(model)
    before = len(torchair.graph_reports())
    with torch.no_grad():
        for eps in (1e-6, 0.5, 3.0):
            model.eps = eps
            torch.testing.assert_close(compiled(x, 1.0), model(x, 1.0))
    reports = _reports_since(before)
    assert len(reports) == 1  # an input: one graph for every value
    assert any("eps" in n for n in _input_names(reports[0]))


def test_nan_attribute_float_is_specialized_and_still_matches_eager(x):
    """Dynamo specializes NaN/inf floats itself; the value guard still follows a change."""
    torch._dynamo.reset()
    model = Norm(eps=float("inf")).eval()
    compiled = _compile(model)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, 1.0), model(x, 1.0))
        model.eps = 1e-3
        torch.testing.assert_close(compiled(x, 1.0), model(x, 1.0))


def test_symbol_helper_ignores_tensors_and_arguments():
    """Only tensorified floats read through an attribute or a global are picked."""
    captured = {}

    def backend(gm, example_inputs):
        captured["names"] = {n.name: (_backend_mod._attribute_float(n) or (None,))[0]
                             for n in gm.graph.find_nodes(op="placeholder")}
        return gm.forward

    torch._dynamo.reset()
    model = Norm().eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        torch.compile(model, backend=backend, dynamic=True, fullgraph=True)(x, 2.0)
    names = captured["names"]
    eps = [v for k, v in names.items() if "eps" in k]
    assert eps and all(isinstance(v, str) and v.startswith("zf") for v in eps)
    assert all(v is None for k, v in names.items() if "gain" in k or k == "l_x_")
    assert all(v is None for k, v in names.items() if "weight" in k)


def test_a_float_that_keeps_changing_becomes_an_input_after_one_change(x):
    """Automatic dynamic, as Dynamo does for ints: a per-call attribute (a sampling temperature)
    costs one more graph, not one per value, and never a stale result."""
    torch._dynamo.reset()
    model = Norm().eval()
    compiled = _compile(model)
    before = len(torchair.graph_reports())
    with torch.no_grad():
        for step in range(12):
            model.eps = 1e-6 * (step + 1)
            torch.testing.assert_close(compiled(x, 1.0), model(x, 1.0))
    reports = _reports_since(before)
    assert len(reports) == 2  # the first value as a constant, then one graph with it an input
    assert not any("eps" in n for n in _input_names(reports[0]))
    assert any("eps" in n for n in _input_names(reports[1]))


def test_specialization_does_not_leak_into_other_compiles(x):
    """PyTorch keeps its set of floats to specialize after a compile and symbol names repeat
    across compiles: ours leave it when the compile has used them, also while another session
    of Dynamo's compile callbacks is open (a lazy backward compile in another thread keeps
    Dynamo's end-of-compile callbacks from running)."""
    from torch._dynamo.callback import CallbackTrigger
    from torch._dynamo.symbolic_convert import TensorifyState

    torch._dynamo.reset()
    model = Norm().eval()
    with torch._dynamo.callback_handler.install_callbacks(CallbackTrigger.LAZY_BACKWARD, "0"):
        with torch.no_grad():
            _compile(model)(x, 1.0)
        assert not _backend_mod._ours
        assert not TensorifyState.force_specializations


def test_dynamic_none_changed_float_costs_no_extra_graph(x):
    """dynamic=None: Dynamo keeps floats constant itself and passes one as an input only after
    its value changed; torchair then leaves it an input (same graph count as with the switch
    off)."""
    counts = {}
    for switch in ("1", "0"):
        os_env = {_backend_mod.ENV_SPECIALIZE_FLOATS: switch}
        with pytest.MonkeyPatch.context() as mp:
            for k, v in os_env.items():
                mp.setenv(k, v)
            torch._dynamo.reset()
            model = Norm().eval()
            config = torchair.CompilerConfig()
            config.debug.run_eagerly = True
            compiled = torch.compile(model, fullgraph=True,
                                     backend=torchair.get_npu_backend(compiler_config=config))
            before = len(torchair.graph_reports())
            with torch.no_grad():
                for eps in (1e-6, 0.5, 0.25, 3.0):
                    model.eps = eps
                    torch.testing.assert_close(compiled(x, 1.0), model(x, 1.0))
            counts[switch] = len(_reports_since(before))
    assert counts["1"] == counts["0"] == 2


def test_zero_float_stays_an_input_so_its_sign_is_seen(x):
    """A value guard cannot tell 0.0 from -0.0, and 1 / x can: a zero float is not baked in."""
    class Div(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.eps = 0.0

        def forward(self, t):
            return t / self.eps

    torch._dynamo.reset()
    model = Div()
    compiled = _compile(model)
    t = torch.ones(3)
    torch._dynamo.mark_static(t)
    with torch.no_grad():
        for eps in (0.0, -0.0, 0.0):
            model.eps = eps
            torch.testing.assert_close(compiled(t), model(t))
