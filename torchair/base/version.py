"""torchair's version, importable from every layer (``torchair.__version__`` re-exports it)."""

VERSION = "0.1.0"
