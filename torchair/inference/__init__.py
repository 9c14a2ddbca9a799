"""Inference features: dynamic gears (``set_dim_gears``), padding a batch to a graph batch size
(``pad_batch``, ``graph_batch_size``, ``split_batch``) and the compile cache (``cache_compile``,
``readable_cache``, ``mark_static``)."""
from __future__ import annotations

from torchair.inference.gears import get_dim_gears, set_dim_gears
from torchair.inference.padding import PaddedBatch, graph_batch_size, pad_batch, split_batch


def __getattr__(name: str):
    # the compile cache loads the runtime and engines: on first use, so `import torchair` stays light
    if name in ("cache_compile", "readable_cache", "mark_static", "CachedFunction"):
        from torchair.inference import cache

        return getattr(cache, name)
    raise AttributeError(f"module 'torchair.inference' has no attribute {name!r}")


__all__ = ["PaddedBatch", "cache_compile", "get_dim_gears", "graph_batch_size", "mark_static",
           "pad_batch", "readable_cache", "set_dim_gears", "split_batch"]
