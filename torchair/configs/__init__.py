"""Configuration of the TorchAir backend."""

from .compiler_config import CompilerConfig

__all__ = ["CompilerConfig"]
