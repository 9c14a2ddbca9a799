"""TorchAir's ``ge_converter.experimental`` import path (see :mod:`torchair.ge_concrete_graph`)."""
