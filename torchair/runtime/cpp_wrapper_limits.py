"""What Inductor's C++ wrapper cannot run, so a static CPU unit compiles such a graph with the
Python wrapper instead.

A custom op without a C++ kernel is called from the C++ wrapper through Python; for an op that
returns a list of tensors (``Tensor[]``, e.g. ``npu_grouped_matmul``) the generated code reads
the returned list as one tensor and crashes (torch 2.11 / 2.13). Such graphs keep the Python
wrapper, which handles the list.
"""
from __future__ import annotations

import torch
from torch import fx

__all__ = ["tensor_list_custom_ops"]


def tensor_list_custom_ops(gm: fx.GraphModule) -> list[str]:
    """Names of the non-ATen ops of ``gm`` that return a list of tensors."""
    found = []
    for node in gm.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        if target.namespace in ("aten", "prims"):
            continue
        if any(isinstance(ret.type, torch._C.ListType) for ret in target._schema.returns):
            found.append(target.name())
    return found
