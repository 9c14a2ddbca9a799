"""Inference features: dynamic gears (``set_dim_gears``) and the compile cache
(``cache_compile``, ``readable_cache``, ``mark_static``)."""
from __future__ import annotations

from torchair.inference.gears import get_dim_gears, set_dim_gears


def __getattr__(name: str):
    # the compile cache loads the runtime and engines: on first use, so `import torchair` stays light
    if name in ("cache_compile", "readable_cache", "mark_static", "CachedFunction"):
        from torchair.inference import cache

        return getattr(cache, name)
    raise AttributeError(f"module 'torchair.inference' has no attribute {name!r}")


__all__ = ["cache_compile", "get_dim_gears", "mark_static", "readable_cache", "set_dim_gears"]
