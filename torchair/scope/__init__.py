"""Scopes that annotate a region of a compiled function (TorchAir's ``torchair.scope``).

``super_kernel(scope, options="")`` marks the ops of a region for fusion into one SuperKernel.
"""
from __future__ import annotations

from torchair.scope._super_kernel import super_kernel

__all__ = ["super_kernel"]
