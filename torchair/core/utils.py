"""Shared utilities: the ``torchair`` logger.

Everything in the package logs through ``logger`` (``logging.getLogger("torchair")``), so users
control verbosity the TorchAir way: ``logger.setLevel(logging.DEBUG)``.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Iterator

logger = logging.getLogger("torchair")

if not logger.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("[torchair %(levelname)s] %(message)s"))
    logger.addHandler(_handler)
    logger.propagate = False
    logger.setLevel(os.environ.get("TORCHAIR_LOG_LEVEL", "WARNING").upper())

__all__ = ["env_switch", "logger", "progress"]


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
