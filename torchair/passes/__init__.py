"""FX passes and the pass manager that owns their order.

Order (each pass one file):
1. ``lower_prims`` - ``prims`` ops to ATen (prims run as slow Python references when run eagerly).
2. ``remove_noops`` - drop identity ops left by functionalization (fewer host launches).
3. ``pattern_fusion`` - fused ops for registered op chains (``experimental_config.pattern_fusion_pass``);
   after ``remove_noops`` so patterns see no identity ops between the ops they match. A match
   that crosses a ``super_kernel`` marker is refused, so each fused op lies in one scope.
4. ``ascend_scope`` - the Ascend-only region markers (``limit_core_num``, ``op_never_timeout``,
   ``data_dump``, ``profiler_trace``) become node attributes (dumps and the report show them;
   nothing here runs differently) and are erased; after ``pattern_fusion`` like the next pass.
5. ``super_kernel_scope`` - ``torchair.scope.super_kernel`` markers become node attributes and are
   erased; after ``pattern_fusion`` so fused ops get the attributes of the scope they sit in.
6. ``stream_scope`` - ``torchair.scope.npu_stream_switch`` / ``npu_wait_tensor`` markers become
   node attributes (stream label, priority, waits) and are erased; reported apart from 5.
7. ``reinplace_inputs`` - last: write input mutations (KV-cache updates) in place again instead
   of copying whole inputs; it must see the final graph, so later passes go before it.
Later passes (pattern fusion, scopes) are inserted before ``reinplace_inputs``, here only.
"""
from __future__ import annotations

import torch.fx as fx

from torchair.base.log import logger
from torchair.passes._base import GraphPass
from torchair.passes.lower_prims import LowerPrimsPass
from torchair.passes.pattern_fusion import PatternFusionPass
from torchair.passes.reinplace_inputs import ReinplaceInputsPass
from torchair.passes.remove_noops import RemoveNoOpsPass
from torchair.passes.stream_scope import StreamScopePass
from torchair.passes.super_kernel_scope import SuperKernelScopePass
from torchair.scope._ascend_only import AscendScopePass


def default_passes(config) -> list[GraphPass]:
    """The ordered pass list for ``config``."""
    passes: list[GraphPass] = [LowerPrimsPass()]
    if config.experimental_config.remove_noop_ops.raw:
        passes.append(RemoveNoOpsPass())
    if config.experimental_config.pattern_fusion_pass.raw:
        passes.append(PatternFusionPass())
    passes += [AscendScopePass(), SuperKernelScopePass(), StreamScopePass(),
               ReinplaceInputsPass()]
    return passes


def run_passes(gm: fx.GraphModule, passes: list[GraphPass]) -> dict[str, int]:
    """Run ``passes`` in order on ``gm``; returns rewrites per pass (only those that fired)."""
    fired = {}
    for p in passes:
        count = p(gm)
        if count:
            fired[p.name] = count
            logger.debug("pass %s: %d rewrites", p.name, count)
    gm.graph.lint()
    gm.recompile()
    return fired


__all__ = ["AscendScopePass", "GraphPass", "LowerPrimsPass", "PatternFusionPass", "ReinplaceInputsPass", "RemoveNoOpsPass",
           "StreamScopePass", "SuperKernelScopePass", "default_passes", "run_passes"]
