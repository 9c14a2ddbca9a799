"""TorchAir's import path for the logger: ``from torchair.core.utils import logger``.

The logger, ``env_switch`` and ``progress`` live in :mod:`torchair.base.log` (the bottom layer, so
every layer may log); this module keeps the path TorchAir's users and scripts write.
"""
from torchair.base.log import EVENT_LEVEL, env_switch, logger, progress

__all__ = ["EVENT_LEVEL", "env_switch", "logger", "progress"]
