"""Offline export: TorchAir's ``dynamo_export`` writes an AOTInductor package.

On Ascend, ``torchair.dynamo_export`` writes the GE graph of a model as an ``.air`` file that
ATC compiles into an offline model. Here it writes an AOTInductor package (``.pt2``: a compiled
C++ shared library with the weights) that :func:`load_export` (or
``torch._inductor.aoti_load_package`` after ``import torchair``) runs in any process without the
model's Python code, plus TorchAir's readable ``dynamo.pbtxt`` beside it. See ``docs/export.md``.

Layer: this package uses ``torch.export`` and AOTInductor, not torchair's compile pipeline, so it
sits just above :mod:`torchair.plan` (it renders ``dynamo.pbtxt`` with the plan's IR dump) and
imports nothing from runtime / passes / core (only the logger) / inference.
"""
from torchair.export._export import EXTERNAL_WEIGHTS_BYTES, dynamo_export
from torchair.export._layout import DUMP_NAME, ExportLayout
from torchair.export._load import ExportedModel, load_export

__all__ = ["DUMP_NAME", "EXTERNAL_WEIGHTS_BYTES", "ExportLayout", "ExportedModel",
           "dynamo_export", "load_export"]
