"""A static CPU unit's own input check (torchair.runtime.input_layout), in place of Inductor's
per-input asserts: what it lets through, what it refuses, and the message that names the input."""
from __future__ import annotations

import pytest
import torch

from torchair.runtime.input_layout import InputLayout, InputLayoutError, plain_tensors


def _layout(*args):
    return InputLayout("graph 7", list(args), [f"in{k}" for k in range(len(args))])


def test_the_compiled_layout_and_same_metadata_pass():
    a, b = torch.randn(4, 8), torch.randn(8)
    layout = _layout(a, b)
    layout.check([a, b])
    layout.check([torch.randn(4, 8), torch.zeros(8)])  # other tensors, same layout
    assert layout.memo.holds([a, b])


@pytest.mark.parametrize("bad, says", [
    (lambda: torch.randn(8, 4).t(), "strides [1, 4]"),  # same shape, transposed strides
    (lambda: torch.randn(4, 9), "float32[4, 9]"),
    (lambda: torch.randn(4, 8, dtype=torch.float64), "float64[4, 8]"),
    (lambda: torch.randn(4, 16)[:, ::2], "strides [16, 2]"),
    (lambda: 3.0, "a float"),
])
def test_another_layout_raises_naming_the_input_and_what_was_compiled(bad, says):
    a, b = torch.randn(4, 8), torch.randn(8)
    layout = _layout(a, b)
    with pytest.raises(InputLayoutError, match=r"graph 7: launch unit input `in0` is ") as err:
        layout.check([bad(), b])
    text = str(err.value)
    assert says in text and "compiled for float32[4, 8] with strides [8, 1] on cpu" in text
    layout.check([a, b])  # the compiled layout still passes afterwards


def test_a_size_one_dimensions_stride_and_an_empty_tensors_strides_are_not_compared():
    row = torch.randn(1, 8)
    layout = _layout(row, torch.empty(0, 3))
    odd = torch.randn(8, 2)[:, :1].t()  # [1, 8] with strides (1, 2): dim 0 has size 1
    assert odd.shape == (1, 8) and odd.stride()[1] != 1
    with pytest.raises(InputLayoutError, match="strides"):  # dim 1's stride does matter
        layout.check([odd, torch.empty(0, 3)])
    same_rows = torch.randn(8).as_strided((1, 8), (99, 1))
    layout.check([same_rows, torch.empty(3, 0).t()])  # stride of a size-1 dim; empty tensor


def test_a_miss_with_the_same_layout_is_remembered_and_a_count_mismatch_is_named():
    a = torch.randn(4)
    layout = _layout(a)
    inference = None
    with torch.inference_mode():
        inference = torch.randn(4)  # other dispatch keys: the C++ memo misses
    layout.check([inference])
    assert layout.memo.holds([inference])
    with pytest.raises(InputLayoutError, match="takes 1 inputs, got 2"):
        layout.check([a, a])


def test_plain_tensors_only():
    assert plain_tensors([torch.randn(2), torch.nn.Parameter(torch.randn(2))])
    assert not plain_tensors([torch.randn(2), 3])
    assert not plain_tensors([torch.randn(2).to_sparse()])
