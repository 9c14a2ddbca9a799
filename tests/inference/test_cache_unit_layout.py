"""cache_compile over an Inductor C++-wrapper unit compiled without Inductor's per-input asserts
(torchair.runtime.input_layout): a parameter whose layout changes under the entry (``.data``
assigned: the same Parameter object, no module epoch bump) is never read with the wrong
strides or shape; the call falls back to Dynamo with a warning naming the input, and the entry
serves again once the layout is back."""
from __future__ import annotations

import pytest
import torch

import torchair
from torchair.runtime import unit_call, units


class _Affine(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(4, 4, generator=g), requires_grad=False)
        self.b = torch.nn.Parameter(torch.randn(4, generator=g), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ self.w + self.b + self.w.sum(0))  # a generated kernel reads w


@pytest.mark.inductor
@pytest.mark.parametrize("call", ["cpp", "python"])
def test_a_parameter_with_another_layout_falls_back_and_the_entry_serves_again(
        tmp_path, torchair_log, monkeypatch, call):
    """``cpp``: the unit's C++ call helper where it builds; ``python``: the Python check and
    call a machine without a C++ compiler gets."""
    if call == "python":
        monkeypatch.setattr(units.NativeEntry, "of", classmethod(lambda cls, *a: None))
    model = _Affine()
    cached = torchair.inference.cache_compile(model.forward, dynamic=False,
                                              cache_dir=str(tmp_path))
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        def served() -> torch.Tensor:
            got = cached(x)
            torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-6)
            return got

        served()
        served()
        unit = cached.runtime.unit
        assert unit.layout is not None, "a CPU C++-wrapper unit checks its own inputs"
        assert (unit._fast.direct is not None) == (call == "cpp" and unit_call.module() is not None)
        assert unit._fast.parts is not None
        assert cached.runtime.unit_checks is True  # so the runtime does not check them twice
        original = model.w.data

        model.w.data = original.t().contiguous().t()  # same values and shape, strides (1, 4)
        assert model.w.stride() == (1, 4)
        served()
        fell_back = [r.getMessage() for r in torchair_log
                     if "does not fit the cached graph" in r.getMessage()]
        assert len(fell_back) == 1 and "strides [1, 4]" in fell_back[0], fell_back

        bias = model.b.data
        model.w.data, model.b.data = torch.randn(4, 6), torch.randn(6)  # other shapes: the
        # runtime's own checks say which
        assert served().shape == (2, 6)
        fell_back = [r.getMessage() for r in torchair_log
                     if "does not fit the cached graph" in r.getMessage()]
        assert len(fell_back) == 2 and "float32[4, 6]" in fell_back[1], fell_back

        model.w.data, model.b.data = original.clone(), bias  # the compiled layout again: the
        # entry serves it
        dynamo, real_dynamo = [], cached._dynamo  # the fallback compiles through it
        cached._dynamo = lambda: dynamo.append(1) or real_dynamo()
        checked = cached.runtime.guards._calls
        served()
        assert dynamo == [] and cached.runtime.guards._calls == checked + 1, \
            "the entry's unit did not serve the call"
        assert cached.runtime.fast is not None  # the served call's one generated function
