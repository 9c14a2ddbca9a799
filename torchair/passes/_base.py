"""The pass interface: a pass rewrites an FX graph in place and returns how many rewrites it made."""
from __future__ import annotations

import hashlib
import inspect

import torch.fx as fx


class GraphPass:
    """Base of every FX pass; subclasses set ``name`` and implement ``__call__``."""

    name: str = ""

    def __call__(self, gm: fx.GraphModule) -> int:
        raise NotImplementedError

    def uuid(self) -> str:
        """A hash of the pass's own source: editing a pass invalidates compile caches."""
        return hashlib.sha256(inspect.getsource(type(self)).encode()).hexdigest()[:16]
