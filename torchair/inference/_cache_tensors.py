"""Tensors in a ``cache_compile`` entry: ``{name: tensor}`` to bytes and back.

Only tensors go through ``torch.save``; everything else in an entry is JSON. Reading back uses
``torch.load(weights_only=True)``, so a crafted file cannot run code. torch is imported lazily,
so the store (and its multi-process tests) start fast.
"""
from __future__ import annotations

import io
from typing import TYPE_CHECKING

from torchair.inference._cache_manifest import BrokenCacheError

if TYPE_CHECKING:
    import torch

__all__ = ["dump_tensors", "load_tensors"]


def dump_tensors(tensors: dict[str, torch.Tensor]) -> bytes:
    """Serialize ``{name: tensor}`` with ``torch.save`` (read back with ``load_tensors``)."""
    import torch

    if not isinstance(tensors, dict):
        raise TypeError(f"dump_tensors: expected dict[str, Tensor], got {type(tensors).__name__}")
    plain: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if not isinstance(name, str) or not isinstance(t, torch.Tensor):
            raise TypeError(
                f"dump_tensors: entry {name!r} is {type(t).__name__}, expected a str name and a "
                f"torch.Tensor; only tensors go through torch.save, everything else through JSON"
            )
        plain_t = t.detach()
        full = plain_t.untyped_storage().nbytes() == plain_t.numel() * plain_t.element_size()
        if plain_t.storage_offset() != 0 or not full:
            plain_t = plain_t.clone()  # a view: save its own elements, not the whole base storage
        plain[name] = plain_t
    buf = io.BytesIO()
    torch.save(plain, buf)
    return buf.getvalue()


def load_tensors(data: bytes, map_location=None) -> dict[str, torch.Tensor]:
    """Inverse of ``dump_tensors``; ``torch.load(weights_only=True)`` so a crafted file cannot
    run code. Raises ``BrokenCacheError`` when the data is not a plain ``{name: tensor}``."""
    import torch

    try:
        obj = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except Exception as e:  # any failure means the bytes are not a plain tensor file of ours
        raise BrokenCacheError(
            f"broken torchair cache tensors: torch.load(weights_only=True) refused the data "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        ) from e
    if not isinstance(obj, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()
    ):
        raise BrokenCacheError(
            f"broken torchair cache tensors: expected dict[str, Tensor], got {type(obj).__name__}"
        )
    return obj
