"""TorchAir's ``torchair.experimental``: :mod:`torchair.experimental.inference`."""
from torchair.experimental import inference

__all__ = ["inference"]
