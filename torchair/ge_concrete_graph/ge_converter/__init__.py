"""TorchAir's ``ge_converter`` import path (see :mod:`torchair.ge_concrete_graph`)."""
