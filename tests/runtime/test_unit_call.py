"""The C++ call helper of static CPU units (torchair.runtime.unit_call, csrc/unit_call.cpp): it
loads only after its reading of tensor objects matched PyTorch's, and its layout check accepts
and refuses exactly what the Python check (torchair.runtime.input_layout) does."""
from __future__ import annotations

import pytest
import torch

from torchair.runtime import unit_call
from torchair.runtime.input_layout import InputLayout, InputLayoutError


@pytest.fixture(scope="module")
def mod():
    loaded = unit_call.module()
    if loaded is None:
        pytest.skip("no C++ compiler here (units call their entry from Python)")
    return loaded


def test_it_reads_tensor_objects_as_pytorch_does(mod):
    assert unit_call._unrecognized(mod) == ""
    t = torch.randn(6, 9)[1:, ::3]
    assert mod.probe(torch.Tensor, t) == (t.data_ptr(), (5, 3), (9, 3))
    assert mod.probe(torch.Tensor, 3.0) is None  # not a tensor: nothing read


CASES = [
    # (compiled, call, fits): the same rules as InputLayout
    (lambda: torch.randn(4, 8), lambda: torch.randn(4, 8), True),
    (lambda: torch.randn(4, 8), lambda: torch.randn(8, 4).t(), False),  # strides
    (lambda: torch.randn(4, 8), lambda: torch.randn(4, 9), False),  # sizes
    (lambda: torch.randn(4, 8), lambda: torch.randn(4, 8).double(), False),  # dtype
    (lambda: torch.randn(4, 8), lambda: torch.randn(32)[:8].view(1, 8).expand(4, 8), False),
    (lambda: torch.randn(4, 8), lambda: torch.nn.Parameter(torch.randn(4, 8)), True),
    (lambda: torch.randn(1, 8), lambda: torch.randn(8).as_strided((1, 8), (99, 1)), True),
    (lambda: torch.empty(0, 3), lambda: torch.empty(3, 0).t(), True),  # empty: no strides
    (lambda: torch.randn(4, 8), lambda: 2.0, False),
    (lambda: torch.randn(()), lambda: torch.tensor(5.0), True),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_the_cpp_check_decides_as_the_python_check(mod, case):
    compiled, call, fits = CASES[case]
    example = [compiled(), torch.randn(3)]
    capsule = mod.layout(torch.Tensor, example)
    args = [call(), torch.randn(3)]
    assert mod.check(capsule, args) is fits
    python = InputLayout("graph 1", example, ["a", "b"])
    if fits:
        python.check(args)
    else:
        with pytest.raises(InputLayoutError, match="input `a`"):
            python.check(args)


def test_a_count_mismatch_and_a_missing_entry_are_refused(mod):
    capsule = mod.layout(torch.Tensor, [torch.randn(2)])
    assert mod.check(capsule, [torch.randn(2), torch.randn(2)]) is False
    assert mod.check(capsule, []) is False
    assert mod.entry("/nonexistent/library.so", unit_call.ENTRY_SYMBOL, 1) is None
    with pytest.raises(TypeError, match="not a tensor"):
        mod.layout(torch.Tensor, [torch.randn(2), "x"])
