"""Fusion patterns: the default ``npu_add_rms_norm`` fusions and user ``register_replacement``.

Both run in :class:`torchair.passes.pattern_fusion.PatternFusionPass`.
"""
from __future__ import annotations

from torchair.patterns.replacement import (
    apply_patterns,
    register_replacement,
    registered_patterns,
    torch_supported,
    trace_forward,
)


def ensure_default_patterns() -> None:
    """Register the default patterns once (tracing them needs the ``npu`` ops, so it is lazy)."""
    from torchair.patterns import add_rms_norm

    add_rms_norm.register_defaults()


__all__ = ["apply_patterns", "ensure_default_patterns", "register_replacement",
           "registered_patterns", "torch_supported", "trace_forward"]
