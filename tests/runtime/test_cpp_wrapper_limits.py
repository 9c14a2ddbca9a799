"""Graphs with a Python op returning Tensor[] are kept off Inductor's C++ wrapper."""
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import torchair.ops  # noqa: F401 (registers the ops)
from torchair.runtime.cpp_wrapper_limits import tensor_list_custom_ops


def test_tensor_list_ops_are_found_and_others_are_not():
    def with_list(x, w, gl):
        out = torch.ops.npu.npu_grouped_matmul([x], [w], group_list=gl, split_item=2,
                                               group_type=0)[0]
        return torch.ops.npu.npu_rms_norm(out, torch.ones(3))[0] + torch.split(out, 1)[0]

    def without(x):
        return torch.ops.npu.npu_rms_norm(x, torch.ones(3))[0] + torch.split(x, 1)[0]

    x, w, gl = torch.randn(4, 2), torch.randn(2, 2, 3), torch.tensor([1, 4])
    assert tensor_list_custom_ops(make_fx(with_list)(x, w, gl)) == ["npu::npu_grouped_matmul"]
    assert tensor_list_custom_ops(make_fx(without)(torch.randn(4, 3))) == []  # aten.split: ATen
