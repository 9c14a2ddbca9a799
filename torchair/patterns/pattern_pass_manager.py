"""TorchAir's module path ``torchair.patterns.pattern_pass_manager``: ``register_replacement``
is ``torchair.register_replacement`` (defined in :mod:`torchair.patterns.replacement`)."""
from torchair.patterns.replacement import register_replacement

__all__ = ["register_replacement"]
