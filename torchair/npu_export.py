"""TorchAir's ``torchair.npu_export`` module: ``dynamo_export`` (see :mod:`torchair.export`)."""
from torchair.export import dynamo_export

__all__ = ["dynamo_export"]
