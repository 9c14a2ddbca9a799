"""LowerPrimsPass: replace ``prims`` ops with their ATen equivalents.

Dynamo passes a Python float that is not specialized (e.g. an RMSNorm ``eps`` under
``dynamic=True``) as a 0-d float64 tensor, and AOT converts it with
``prims.convert_element_type``. Run eagerly, a ``prims`` op executes its Python reference
implementation: tens of microseconds per call on the host-scheduled and FX-engine paths, against a
few for the ATen kernel. The lowering keeps values, dtype, shape and strides.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from torchair.passes._base import GraphPass


class LowerPrimsPass(GraphPass):
    name = "lower_prims"

    def __call__(self, gm: fx.GraphModule) -> int:
        count = 0
        for node in gm.graph.find_nodes(op="call_function",
                                        target=torch.ops.prims.convert_element_type.default):
            source, dtype = node.args
            node.target = torch.ops.aten._to_copy.default
            node.args = (source,)
            node.kwargs = {"dtype": dtype}
            count += 1
        return count
