"""PatternFusionPass: replace op chains by fused ops (seed 003's FX fusion passes).

Runs every registered pattern once: the three default ``npu_add_rms_norm`` fusions of
:mod:`torchair.patterns.add_rms_norm` and the user's ``torchair.register_replacement``
patterns. On by default; ``experimental_config.pattern_fusion_pass = False`` leaves it out of the
pass list (defaults and user patterns alike, as in TorchAir). ``fired`` holds the rewrites per
pattern of the last run, for the graph report.
"""
from __future__ import annotations

import torch.fx as fx

from torchair.passes._base import GraphPass


class PatternFusionPass(GraphPass):
    name = "pattern_fusion"

    def __init__(self) -> None:
        self.fired: dict[str, int] = {}

    def __call__(self, gm: fx.GraphModule) -> int:
        from torchair.patterns import (
            apply_patterns,
            ensure_default_patterns,
            registered_patterns,
            torch_supported,
        )
        from torchair.patterns.add_rms_norm import has_anchor

        if not torch_supported():
            return 0
        if not registered_patterns() and not has_anchor(gm):
            return 0  # nothing can match: skip loading PyTorch's matcher (seconds on first use)
        ensure_default_patterns()
        self.fired = apply_patterns(gm)
        if self.fired:
            gm.graph.eliminate_dead_code()
        return sum(self.fired.values())
