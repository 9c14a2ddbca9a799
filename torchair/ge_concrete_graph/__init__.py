"""TorchAir's ``torchair.ge_concrete_graph`` import path, kept for scripts that import from it.

TorchAir converts FX graphs to GE graphs here; torchair builds no GE graph, so only the module
paths scripts import are provided: ``ge_converter.experimental.patch_for_hcom_allreduce``.
"""
