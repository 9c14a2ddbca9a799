"""Inference features: dynamic gears (``set_dim_gears``)."""
from __future__ import annotations

from torchair.inference.gears import get_dim_gears, set_dim_gears

__all__ = ["get_dim_gears", "set_dim_gears"]
