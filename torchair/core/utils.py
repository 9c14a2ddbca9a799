"""Shared utilities: the ``torchair`` logger.

Everything in the package logs through ``logger`` (``logging.getLogger("torchair")``), so users
control verbosity the TorchAir way: ``logger.setLevel(logging.DEBUG)``.
"""
from __future__ import annotations

import logging
import os

logger = logging.getLogger("torchair")

if not logger.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("[torchair %(levelname)s] %(message)s"))
    logger.addHandler(_handler)
    logger.propagate = False
    logger.setLevel(os.environ.get("TORCHAIR_LOG_LEVEL", "WARNING").upper())

__all__ = ["logger"]
