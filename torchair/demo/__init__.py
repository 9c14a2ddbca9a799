"""The built-in demo: a small Llama-style decoder generating greedily, eager vs torchair path 4.

    torchair demo [--device cpu|cuda] [--batch 1 4] [--steps 32] [--layers 4] [--hidden 256] ...
    python -m torchair.demo ...

See :mod:`torchair.demo.run` for what it does and :mod:`torchair.demo.model` for the model.
"""
from torchair.demo.run import main

__all__ = ["main"]
