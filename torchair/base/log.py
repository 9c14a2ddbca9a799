"""Logging and switches: the ``torchair`` logger (with TorchAir's ``EVENT_LEVEL``, ``logger.event``
and ``logger.warning_once``).

Everything in the package logs through ``logger`` (``logging.getLogger("torchair")``), so users
control verbosity the TorchAir way: ``logger.setLevel(logging.DEBUG)``.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from typing import Iterator

logger = logging.getLogger("torchair")

# TorchAir's EVENT level (between WARNING and ERROR) and ``logger.event(msg, *args)``: scripts log
# their own milestones through it. Attached to this logger only: the process's logger class is
# left alone (TorchAir replaces it for every logger created afterwards).
EVENT_LEVEL = 35
logging.addLevelName(EVENT_LEVEL, "EVENT")


def _event(msg: object, *args: object, **kwargs: object) -> None:
    if logger.isEnabledFor(EVENT_LEVEL):
        logger._log(EVENT_LEVEL, msg, args, **kwargs)


@functools.lru_cache(maxsize=None)
def _warning_once(msg: str) -> None:
    logger.warning(msg)


logger.event = _event  # type: ignore[attr-defined]
logger.warning_once = _warning_once  # type: ignore[attr-defined]

if not logger.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("[torchair %(levelname)s] %(message)s"))
    logger.addHandler(_handler)
    logger.propagate = False
    logger.setLevel(os.environ.get("TORCHAIR_LOG_LEVEL", "WARNING").upper())

__all__ = ["EVENT_LEVEL", "env_switch", "logger", "progress"]


def env_switch(name: str) -> bool:
    """An on/off environment switch that is on unless set to ``0`` / ``false`` / ``off`` / ``no``
    (any case, surrounding spaces ignored)."""
    return os.environ.get(name, "1").strip().lower() not in ("0", "false", "off", "no")


@contextlib.contextmanager
def progress(what: str, every: float = 10.0) -> Iterator[None]:
    """Log ``what`` at INFO, then a "still ..." line every ``every`` seconds until the block ends,
    and the time it took: long compiles show they are alive."""
    start = time.perf_counter()
    done = threading.Event()

    def tick() -> None:
        while not done.wait(every):
            logger.info("%s: still running (%.0f s)", what, time.perf_counter() - start)

    logger.info("%s ...", what)
    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        logger.info("%s: done in %.1f s", what, time.perf_counter() - start)
